//! Cleaning model output: leaked chat-template tokens, reasoning blocks, wrapping code
//! fences and "Summary:" preambles.
//!
//! Small local models regularly leak parts of their chat template into the text (a ChatML
//! `<|im_end|>` followed by an invented next turn, Llama-3 header tokens, Gemma turn markers)
//! or wrap the answer in a fence. Everything here is idempotent: stripping clean text returns
//! it unchanged.

/// ChatML and Llama-3 style turn headers: the header token, a role, and the end of the header.
const ROLE_BLOCKS: &[(&str, &str)] = &[
    ("<|im_start|>", "<|im_end|>"),
    ("<start_of_turn>", "<end_of_turn>"),
];

/// Tokens removed wherever they appear.
const STRAY_TOKENS: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|im_sep|>",
    "<|endoftext|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "<eos>",
    "[INST]",
    "[/INST]",
    "<<SYS>>",
    "<</SYS>>",
    "<s>",
    "</s>",
];

/// Reasoning blocks removed with their content.
const REASONING: &[(&str, &str)] = &[("<think>", "</think>"), ("<thinking>", "</thinking>")];

/// Preambles removed from the start (compared case-insensitively, after markdown emphasis
/// and heading marks are ignored).
const PREAMBLES: &[&str] = &[
    "here is the updated summary",
    "here's the updated summary",
    "here is a summary of the conversation",
    "here's a summary of the conversation",
    "here is the summary",
    "here's the summary",
    "here is a summary",
    "here's a summary",
    "updated summary",
    "summary",
];

/// Tokens that end a turn: text after the first one (once the summary has begun) is an
/// invented continuation of the conversation and is discarded.
const END_OF_TURN: &[&str] = &[
    "<|im_end|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
];

/// Headers that open the model's own turn; the text after them is kept.
const MODEL_HEADERS: &[&str] = &[
    "<|im_start|>assistant",
    "<start_of_turn>model",
    "<|start_header_id|>assistant<|end_header_id|>",
];

/// Strip leaked template tokens and wrappers from model output (see module docs).
pub fn strip_template_tokens(text: &str) -> String {
    let mut s = text.replace("\r\n", "\n");
    for (open, close) in REASONING {
        s = remove_blocks(&s, open, close);
    }
    s = cut_at_end_of_turn(&s);
    for (open, close) in ROLE_BLOCKS {
        s = remove_foreign_turns(&s, open, close);
    }
    s = remove_llama3_headers(&s);
    for tok in STRAY_TOKENS {
        if s.contains(tok) {
            s = s.replace(tok, "");
        }
    }
    let mut s = s.trim().to_string();
    // Fences and preambles can nest ("Summary:\n```\n…\n```"), so peel until stable.
    loop {
        let before = s.len();
        s = unwrap_fence(&s);
        s = drop_preamble(&s);
        s = drop_lead_in(&s);
        s = drop_echoes(&s);
        if s.len() == before {
            break;
        }
    }
    collapse_blank_lines(&s)
}

/// Keep only the model's first turn: drop leading headers of its own turn, then cut at the
/// first end-of-turn token that follows some text.
fn cut_at_end_of_turn(text: &str) -> String {
    let mut s = text.trim_start();
    loop {
        let before = s.len();
        for h in MODEL_HEADERS {
            if let Some(rest) = s.strip_prefix(h) {
                s = rest.trim_start();
            }
        }
        for t in END_OF_TURN {
            // An end-of-turn token before any text is noise; skip it.
            if let Some(rest) = s.strip_prefix(t) {
                s = rest.trim_start();
            }
        }
        if s.len() == before {
            break;
        }
    }
    let cut = END_OF_TURN.iter().filter_map(|t| s.find(t)).min();
    match cut {
        Some(i) => s[..i].to_string(),
        None => s.to_string(),
    }
}

/// Remove `open … close` blocks. An unclosed `open` removes the rest of the text; a `close`
/// with no `open` before it removes everything up to it (the block began before the output).
fn remove_blocks(text: &str, open: &str, close: &str) -> String {
    let mut s = text.to_string();
    if let Some(c) = s.find(close)
        && s.find(open).is_none_or(|o| o > c)
    {
        s = s[c + close.len()..].to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    while let Some(o) = rest.find(open) {
        out.push_str(&rest[..o]);
        match rest[o + open.len()..].find(close) {
            Some(c) => rest = &rest[o + open.len() + c + close.len()..],
            None => {
                rest = "";
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Remove whole turns of roles other than the assistant's (`<|im_start|>user … <|im_end|>`),
/// and the header of assistant turns (keeping their text).
fn remove_foreign_turns(text: &str, open: &str, close: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(o) = rest.find(open) {
        out.push_str(&rest[..o]);
        let after = &rest[o + open.len()..];
        let line_end = after.find('\n').unwrap_or(after.len());
        let role = after[..line_end].trim().to_ascii_lowercase();
        let is_model = matches!(role.as_str(), "assistant" | "model");
        let known_role = is_model || matches!(role.as_str(), "system" | "user" | "tool");
        if !known_role {
            // A stray token: drop just the token.
            rest = after;
            continue;
        }
        let body = &after[(line_end + 1).min(after.len())..];
        if is_model {
            rest = body;
        } else {
            // A leaked foreign turn is discarded up to its end (or the end of the text).
            rest = match body.find(close) {
                Some(c) => &body[c + close.len()..],
                None => "",
            };
        }
    }
    out.push_str(rest);
    out
}

/// Remove Llama-3 headers `<|start_header_id|>role<|end_header_id|>` including the role.
fn remove_llama3_headers(text: &str) -> String {
    let (open, close) = ("<|start_header_id|>", "<|end_header_id|>");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(o) = rest.find(open) {
        out.push_str(&rest[..o]);
        let after = &rest[o + open.len()..];
        match after.find(close) {
            Some(c) if c <= 32 => rest = &after[c + close.len()..],
            _ => rest = after,
        }
    }
    out.push_str(rest);
    out
}

/// Unwrap text that is entirely one fenced code block.
fn unwrap_fence(text: &str) -> String {
    let t = text.trim();
    if !(t.starts_with("```") && t.ends_with("```") && t.len() >= 6) {
        return t.to_string();
    }
    let inner = &t[3..t.len() - 3];
    if inner.contains("```") {
        return t.to_string();
    }
    // Drop an info string such as ```text on the opening line.
    let inner = match inner.find('\n') {
        Some(nl) if !inner[..nl].trim().contains(' ') => &inner[nl + 1..],
        _ => inner,
    };
    inner.trim().to_string()
}

/// Lines of abridge's own prompt framing that small models echo back.
const ECHO_LINES: &[&str] = &[
    "partial summaries, in order:",
    "conversation:",
    "current summary:",
    "new exchanges:",
    "write the summary now.",
    "write the updated summary now.",
    "write the merged summary now.",
];

/// `Episode 16:` / `Episodes 16-48:` at the start of a line (the reduce prompt's labels).
fn episode_label(line: &str) -> Option<&str> {
    let rest = line
        .strip_prefix("Episodes ")
        .or_else(|| line.strip_prefix("Episode "))?;
    let digits = rest.trim_start_matches(|c: char| c.is_ascii_digit() || c == '-' || c == '–');
    if digits.len() == rest.len() || !rest.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    digits.strip_prefix(':').map(str::trim_start)
}

/// Drop echoed prompt framing (headers, episode labels) and stray fence lines that do not wrap
/// the whole text, keeping the text around them.
fn drop_echoes(text: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if ECHO_LINES.iter().any(|e| t.eq_ignore_ascii_case(e)) {
            continue;
        }
        if let Some(rest) = episode_label(t) {
            if !rest.is_empty() {
                out.push(rest);
            }
            continue;
        }
        // A lone fence line (``` or ```lang): debris of a block that does not wrap the text.
        if let Some(info) = t.strip_prefix("```")
            && !info.contains(' ')
            && !info.contains('`')
        {
            continue;
        }
        out.push(line);
    }
    if out.len() == text.lines().count() {
        return text.to_string();
    }
    out.join("\n").trim().to_string()
}

/// Drop a chatty lead-in line such as "Here is the summary of your conversation:" or "Here's
/// a revised version of the summary:" (a short first line about the summary, ending in a colon).
fn drop_lead_in(text: &str) -> String {
    let t = text.trim_start();
    let end = t.find('\n').unwrap_or(t.len());
    let first = t[..end].trim().trim_matches(['*', '_', '#', ' ']);
    let lower = first.to_lowercase();
    let opener = [
        "here is",
        "here's",
        "here are",
        "below is",
        "sure",
        "certainly",
        "okay",
        "ok,",
        "this is",
        "the following is",
    ]
    .iter()
    .any(|o| lower.starts_with(o));
    if opener && lower.ends_with(':') && lower.contains("summar") && first.len() <= 200 {
        return t[end..].trim().to_string();
    }
    t.to_string()
}

/// Drop a leading "Summary:"-style preamble (a line on its own, or a prefix of the first line).
fn drop_preamble(text: &str) -> String {
    let t = text.trim_start();
    let first_line_end = t.find('\n').unwrap_or(t.len());
    let first = &t[..first_line_end];
    // Markdown decoration around the preamble: "## Summary", "**Summary:**".
    let undecorated = first.trim_start_matches(['#', '*', '_', ' ']);
    let lower = undecorated.to_ascii_lowercase();
    for p in PREAMBLES {
        if !lower.starts_with(p) {
            continue;
        }
        let tail = &undecorated[p.len()..];
        let tail_trim = tail.trim_start_matches(['*', '_', ' ']);
        // The preamble must end in a colon, or be the whole line: a markdown heading, or a
        // bare "Summary" line followed by the text.
        let heading = tail_trim
            .trim_end_matches(['*', '_', '.'])
            .trim()
            .is_empty()
            && first.trim_start().starts_with(['#', '*']);
        let bare_line =
            tail_trim.is_empty() && first_line_end < t.len() && p.starts_with("summary");
        let rest_of_line = if let Some(after_colon) = tail_trim.strip_prefix(':') {
            after_colon.trim_start_matches(['*', '_'])
        } else if heading || bare_line {
            ""
        } else {
            continue;
        };
        let body = format!("{}{}", rest_of_line, &t[first_line_end..]);
        return body.trim().to_string();
    }
    t.to_string()
}

/// Collapse runs of three or more newlines into one blank line and trim line ends.
fn collapse_blank_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            if blank_run > 1 {
                continue;
            }
        } else {
            blank_run = 0;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(line);
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        let cases: &[(&str, &str)] = &[
            ("The user asked about X.", "The user asked about X."),
            ("The user asked.<|im_end|>", "The user asked."),
            (
                "The user asked.<|im_end|>\n<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\nYou're welcome.",
                "The user asked.",
            ),
            (
                "<|im_start|>assistant\nThe user asked.<|im_end|>",
                "The user asked.",
            ),
            ("<|im_start|>user\nleak", ""),
            ("<|im_sep|>The user asked.", "The user asked."),
            (
                "<|start_header_id|>assistant<|end_header_id|>\n\nThe user asked.<|eot_id|>",
                "The user asked.",
            ),
            (
                "<start_of_turn>model\nThe user asked.<end_of_turn>",
                "The user asked.",
            ),
            ("[INST] The user asked. [/INST]", "The user asked."),
            (
                "<think>Let me think.\nOK.</think>\nThe user asked.",
                "The user asked.",
            ),
            ("reasoning here</think>The user asked.", "The user asked."),
            ("The user asked.<think>unfinished", "The user asked."),
            ("```\nThe user asked.\n```", "The user asked."),
            ("```text\nThe user asked.\n```", "The user asked."),
            ("Summary: The user asked.", "The user asked."),
            ("**Summary:** The user asked.", "The user asked."),
            ("## Summary\n\nThe user asked.", "The user asked."),
            (
                "Here is a summary of the conversation:\n\nThe user asked.",
                "The user asked.",
            ),
            ("Summary:\n```\nThe user asked.\n```", "The user asked."),
            ("Summary of costs is below.", "Summary of costs is below."),
            ("Summarizing is hard.", "Summarizing is hard."),
            ("a\n\n\n\nb  ", "a\n\nb"),
            ("   ", ""),
        ];
        for (input, want) in cases {
            assert_eq!(&strip_template_tokens(input), want, "input: {input:?}");
        }
    }

    #[test]
    fn real_small_model_debris_is_cleaned() {
        // Outputs seen from small local models, and what remains of them.
        let cases = [
            (
                "Here is the summary of your conversation about the migration:\nThe team moved the orders database to Postgres 16.",
                "The team moved the orders database to Postgres 16.",
            ),
            (
                "Here's a revised version of the summary:\n\nThe user chose pg_upgrade in link mode.",
                "The user chose pg_upgrade in link mode.",
            ),
            (
                "Partial summaries, in order:\n\nEpisode 16-48: The user set up the replica.\nEpisodes 49-60: They scheduled the cut-over.",
                "The user set up the replica.\nThey scheduled the cut-over.",
            ),
            (
                "The user fixed the build.\n```\nThe cache key now includes the lockfile.",
                "The user fixed the build.\nThe cache key now includes the lockfile.",
            ),
            (
                "```text\nThe user fixed the build.\n```\nThey also pinned Node 24.",
                "The user fixed the build.\nThey also pinned Node 24.",
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(strip_template_tokens(raw), want, "{raw:?}");
            assert_eq!(strip_template_tokens(want), want);
        }
        // Text that only resembles these is kept.
        for keep in [
            "Episode 4 of the podcast was discussed.",
            "The user asked for ```rust fences in docs.",
            "Here is what was decided: ship on Friday.",
        ] {
            assert_eq!(strip_template_tokens(keep), keep);
        }
    }

    #[test]
    fn idempotent() {
        let once =
            strip_template_tokens("Summary: <think>x</think>```\nThe user asked.\n```<|im_end|>");
        assert_eq!(strip_template_tokens(&once), once);
    }
}
