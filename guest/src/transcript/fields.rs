//! Fields every format shares: roles, speakers, times, text content, source keys, and the
//! harness markup stripped from a message.

#[allow(unused_imports)]
use super::*;

/// A speaker's name from a `name` field: a non-empty string of at most 64 characters, control
/// characters and surrounding space removed.
pub(super) fn speaker_name(v: Option<&Value>) -> Option<String> {
    let name: String = v?
        .as_str()?
        .chars()
        .filter(|c| !c.is_control())
        .take(64)
        .collect();
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// Which line format a JSON object belongs to, if any.
pub(super) fn line_format(v: &Value) -> Option<Format> {
    if v.get("type").and_then(Value::as_str).is_some()
        && v.get("payload").is_some_and(Value::is_object)
    {
        Some(Format::Codex)
    } else if v.get("type").is_some()
        && (v.get("sessionId").is_some() || v.get("uuid").is_some() || v.get("leafUuid").is_some())
    {
        Some(Format::ClaudeCode)
    } else if v.get("role").is_some() {
        Some(Format::Jsonl)
    } else {
        None
    }
}

/// A stable key for an episode without an id of its own: its position and a content hash
/// (the first 8 bytes of SHA-256 over role, NUL, content).
pub fn position_key(index: u64, role: Role, content: &str) -> String {
    let mut h = Sha256::new();
    h.update(role.wire());
    h.update([0]);
    h.update(content);
    let d = h.finalize();
    let hex: String = d.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{index}:{hex}")
}

pub(super) fn parse_role(s: &str) -> Option<Role> {
    Some(match s {
        "system" | "developer" => Role::System,
        "user" | "human" => Role::User,
        "assistant" | "ai" | "model" => Role::Assistant,
        "tool" | "function" => Role::Tool,
        _ => return None,
    })
}

/// Parse an RFC 3339 / ISO 8601 time (`2025-09-19T17:34:29.181Z`, offsets allowed) to ms.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let b = s.trim().as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        if part.iter().all(u8::is_ascii_digit) {
            std::str::from_utf8(part).ok()?.parse().ok()
        } else {
            None
        }
    };
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (y, mo, d, h, mi, sec) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let frac = std::str::from_utf8(&b[start..i]).ok()?;
        let frac3: String = frac.chars().chain("000".chars()).take(3).collect();
        ms = frac3.parse().ok()?;
    }
    let offset_min = match b.get(i) {
        None | Some(b'Z') | Some(b'z') => 0,
        Some(&sign @ (b'+' | b'-')) => {
            let oh = num(i + 1..i + 3)?;
            let om = if b.get(i + 3) == Some(&b':') {
                num(i + 4..i + 6)?
            } else {
                num(i + 3..i + 5)?
            };
            let m = oh * 60 + om;
            if sign == b'+' { m } else { -m }
        }
        _ => return None,
    };
    let days = crate::dates::days_from_civil(y, mo as u32, d as u32);
    Some((((days * 24 + h) * 60 + mi - offset_min) * 60 + sec) * 1000 + ms)
}

/// A message's time from whichever field its format names it by: `timestamp`, `created_at`
/// (OpenAI-style objects), `time`, `create_time` (ChatGPT) or `created`.
pub(super) fn message_time(v: &Value) -> Option<i64> {
    ["timestamp", "created_at", "time", "create_time", "created"]
        .iter()
        .find_map(|k| timestamp_value(v.get(*k)))
}

/// A timestamp field: an RFC 3339 string, or epoch seconds / milliseconds as a number.
pub(super) fn timestamp_value(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::String(s) => parse_timestamp(s),
        Value::Number(n) => {
            let f = n.as_f64()?;
            if !f.is_finite() {
                return None;
            }
            // Values past 1e11 are milliseconds (1e11 seconds is the year 5138).
            Some(if f.abs() >= 1e11 {
                f as i64
            } else {
                (f * 1000.0) as i64
            })
        }
        _ => None,
    }
}

/// Text of a content field: a string, or an array of parts with `text`.
pub(super) fn content_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                Value::Object(_)
                    if p.get("type")
                        .and_then(Value::as_str)
                        .is_none_or(|t| t == "text" || t == "input_text" || t == "output_text") =>
                {
                    p.get("text").and_then(Value::as_str)
                }
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Harness-generated text in Claude Code user lines, removed with its content.
pub(super) const HARNESS_TAGS: &[&str] = &[
    "command-name",
    "command-message",
    "command-args",
    "local-command-stdout",
    "local-command-stderr",
    "local-command-caveat",
    "system-reminder",
    "user-prompt-submit-hook",
];

/// Remove every harness block (`<tag>…</tag>`, or `<tag>…` to the end when unclosed) in one
/// left-to-right pass: linear in the text, whatever it holds.
pub fn strip_harness(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(lt) = rest.find('<') {
        let after = &rest[lt + 1..];
        let tag = HARNESS_TAGS
            .iter()
            .find(|t| after.starts_with(**t) && after[t.len()..].starts_with('>'));
        match tag {
            Some(tag) => {
                out.push_str(&rest[..lt]);
                let body = &after[tag.len() + 1..];
                let close = format!("</{tag}>");
                rest = body.find(&close).map_or("", |c| &body[c + close.len()..]);
            }
            None => {
                out.push_str(&rest[..=lt]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.trim().to_string()
}
