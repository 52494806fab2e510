//! Text from outside (transcript titles, conversation ids, model output) on its way to a
//! terminal or into a session name: control characters never reach either raw.

use std::borrow::Cow;

/// Most characters in a session id.
pub const MAX_SESSION_ID_CHARS: usize = 200;

/// Whether `c` must not be printed raw: C0 and C1 controls (ESC starts terminal escape
/// sequences), DEL, and the bidirectional overrides that make text read differently from
/// how it is stored.
fn is_unsafe(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Whether `c` is invisible where it stands: zero-width spaces and joiners, direction marks,
/// word joiners and invisible operators, the byte-order mark, soft hyphens. Two session ids
/// that differ only by one look the same, so ids refuse them (text may hold them).
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{034f}'
            | '\u{061c}'
            | '\u{115f}'
            | '\u{1160}'
            | '\u{17b4}'
            | '\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fff8}'
    )
}

/// `s` made safe to print on one terminal line: every control character (ESC, NUL, CR, LF,
/// tab, DEL, C1, bidi overrides) shown as a visible escape such as `\u001b` instead (the same escape
/// JSON uses, so JSON output stays valid JSON).
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_unsafe(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s` with control and invisible characters shown as escapes (for an id refused for them).
fn escaped(s: &str) -> String {
    s.chars()
        .map(|c| {
            if is_unsafe(c) || is_invisible(c) {
                format!("\\u{:04x}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Like [`printable`], but keeps line breaks and tabs: for multi-line text such as a summary.
pub fn printable_lines(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| is_unsafe(c) && c != '\n' && c != '\t') {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.split('\n')
            .map(|l| {
                l.split('\t')
                    .map(|p| printable(p).into_owned())
                    .collect::<Vec<_>>()
                    .join("\t")
            })
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// Bytes as lower-case hexadecimal.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Check a session id a user typed. An id is 1 to 200 characters with no control characters
/// and no leading or trailing white space, so every id can be named on a command line and
/// printed as is.
pub fn check_session_id(id: &str) -> Result<(), String> {
    let why = if id.is_empty() {
        "is empty"
    } else if id.chars().count() > MAX_SESSION_ID_CHARS {
        "is longer than 200 characters"
    } else if id.chars().any(is_unsafe) {
        "holds control characters"
    } else if id.chars().any(is_invisible) {
        "holds invisible characters (zero-width spaces or joiners, direction marks, soft hyphens)"
    } else if id.trim() != id {
        "starts or ends with white space"
    } else {
        return Ok(());
    };
    Err(format!(
        "session id '{}' {why}; a session id is 1 to {MAX_SESSION_ID_CHARS} characters with no control or invisible characters and no leading or trailing space",
        escaped(id)
    ))
}

/// A valid session id made from an untrusted one (a conversation id or a file name): control
/// characters become `_`, white space at the ends is dropped, and it is cut to 200 characters.
/// `None` when nothing usable is left.
pub fn session_id_from(raw: &str) -> Option<String> {
    let cleaned: String = raw
        .trim()
        .chars()
        .filter(|c| !is_invisible(*c))
        .map(|c| if is_unsafe(c) { '_' } else { c })
        .take(MAX_SESSION_ID_CHARS)
        .collect();
    let cleaned = cleaned.trim().to_string();
    (!cleaned.is_empty() && cleaned.chars().any(|c| c != '_')).then_some(cleaned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_shown_not_obeyed() {
        assert_eq!(printable("plain – ünïcode"), "plain – ünïcode");
        assert_eq!(
            printable("\u{1b}[2J\u{1b}]0;pwned\u{7}title\0"),
            "\\u001b[2J\\u001b]0;pwned\\u0007title\\u0000"
        );
        assert_eq!(printable("a\u{202e}b\nc"), "a\\u202eb\\u000ac");
    }

    #[test]
    fn session_ids() {
        assert!(check_session_id("my-session 1").is_ok());
        assert!(check_session_id("é/ü:2").is_ok());
        for bad in ["", " x", "x ", "a\0b", "a\u{1b}[31mb", &"x".repeat(201)] {
            let e = check_session_id(bad).unwrap_err();
            assert!(!e.contains('\u{1b}') && !e.contains('\0'), "{e}");
        }
        // Invisible characters: two ids that look the same are not allowed to differ.
        for bad in [
            "a\u{200b}b",
            "a\u{200d}b",
            "\u{feff}ab",
            "ab\u{2060}",
            "a\u{00ad}b",
            "a\u{200e}b",
        ] {
            let e = check_session_id(bad).unwrap_err();
            assert!(e.contains("invisible") && e.contains("\\u"), "{e}");
        }
        assert_eq!(session_id_from("a\u{200b}b").as_deref(), Some("ab"));
        assert_eq!(session_id_from("ab\0c\u{1b}").as_deref(), Some("ab_c_"));
        assert_eq!(session_id_from(" \0 "), None);
        assert_eq!(session_id_from(&"y".repeat(300)).unwrap().len(), 200);
    }
}
