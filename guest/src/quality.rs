//! The quality gate: a summary that fails it is never written.

use crate::types::Finish;

/// Check cleaned model output for a prompt of `prompt_tokens` (estimated; 0 when unknown).
/// `Err` carries the reason, phrased for a log line.
pub fn check(
    cleaned: &str,
    finish: Finish,
    max_output_tokens: u32,
    prompt_tokens: u32,
) -> Result<(), String> {
    if finish == Finish::Length {
        return Err(format!(
            "the model stopped at the output limit ({max_output_tokens} tokens), so the summary \
             is cut off; raise max-output-tokens or lower the summary length"
        ));
    }
    if !cleaned.chars().any(char::is_alphanumeric) {
        return Err("the model returned no text once template tokens were removed".into());
    }
    // The server was asked for at most `max_output_tokens`; text far past that (a server that
    // ignores the limit, a babbling model) is no summary, and storing it would blow every
    // budget that reads the chain. The estimator over-counts BPE tokens a little, hence the
    // margin.
    let tokens = crate::tokens::estimate_tokens(cleaned);
    let ceiling = output_ceiling(max_output_tokens);
    if tokens > ceiling {
        return Err(format!(
            "the output is about {tokens} tokens, far over the {max_output_tokens}-token \
             output limit; the server ignored the limit or the model ran on"
        ));
    }
    if let Some(what) = degenerate(cleaned) {
        return Err(format!("the output repeats itself ({what})"));
    }
    if transcript_copy(cleaned) {
        return Err("the model copied the conversation (\"User: … Assistant: …\") instead of summarizing it".into());
    }
    if let Some(opening) = chatter(cleaned) {
        return Err(format!(
            "the model answered the conversation (\"{opening}…\") instead of summarizing it"
        ));
    }
    // A sentence or two standing for a long conversation says almost nothing of it. The
    // prompt's fixed part (instructions, framing) is about 200 tokens.
    let conversation = prompt_tokens.saturating_sub(200);
    if tokens < 16 && conversation >= tokens.saturating_mul(60).max(600) {
        return Err(format!(
            "the output is {tokens} tokens for about {conversation} tokens of conversation: too short to stand for it"
        ));
    }
    Ok(())
}

/// Text folded for comparing quotes: lower case, curly quotes and apostrophes made straight,
/// whitespace runs made one space.
fn fold(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut space = false;
    for c in text.chars() {
        let c = match c {
            '‘' | '’' | '`' => '\'',
            '“' | '”' => '"',
            c => c,
        };
        if c.is_whitespace() {
            space = !out.is_empty();
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// Spans between double quotes (straight or curly) of `text`, trimmed; at most 300
/// characters each, on one line.
pub fn quoted_spans(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let close = match chars[i] {
            '"' => '"',
            '“' => '”',
            _ => {
                i += 1;
                continue;
            }
        };
        let Some(len) = chars[i + 1..]
            .iter()
            .take(300)
            .position(|&c| c == close || c == '\n')
        else {
            i += 1;
            continue;
        };
        if chars[i + 1 + len] == '\n' {
            i += 1 + len;
            continue;
        }
        let inner: String = chars[i + 1..i + 1 + len].iter().collect();
        let inner = inner
            .trim()
            .trim_end_matches(['.', ',', ';', ':', '!', '?'])
            .to_string();
        if inner.chars().any(char::is_alphanumeric) {
            out.push(inner);
        }
        i += len + 2;
    }
    out
}

/// Provenance: the first quoted span of `summary` that occurs in none of `sources` (compared
/// case-insensitively, with whitespace and quote styles folded), if any. A summary may
/// paraphrase freely, but a quotation claims exact words, and words nobody said are an
/// invention. The third-person prompt examples (`"The user ..."`) are not quotes of the
/// conversation and are allowed.
pub fn unsupported_quote(summary: &str, sources: &[&str]) -> Option<String> {
    let spans = quoted_spans(summary);
    if spans.is_empty() {
        return None;
    }
    let folded: Vec<String> = sources.iter().map(|s| fold(s)).collect();
    spans.into_iter().find(|q| {
        let f = fold(q);
        let f = f.trim_end_matches("...").trim_end_matches('…').trim();
        !matches!(f, "the user" | "the assistant") && !folded.iter().any(|src| src.contains(f))
    })
}

/// The longest output (estimated tokens) the gate lets through for an output limit.
pub fn output_ceiling(max_output_tokens: u32) -> u32 {
    max_output_tokens
        .saturating_add(max_output_tokens / 2)
        .max(64)
}

/// Speaker labels that start the lines of a transcript.
const SPEAKERS: &[&str] = &["user:", "assistant:", "system:", "tool:", "human:", "ai:"];

/// Whether the text is mostly conversation lines ("User: …", "Assistant: …") rather than a
/// summary: at least two such lines making up half of the non-empty lines.
fn transcript_copy(text: &str) -> bool {
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.trim().trim_start_matches(['*', '-', ' ']).to_lowercase())
        .filter(|l| !l.is_empty())
        .collect();
    let labelled = lines
        .iter()
        .filter(|l| SPEAKERS.iter().any(|s| l.starts_with(s)))
        .count();
    labelled >= 2 && labelled * 2 >= lines.len()
}

/// Openings of a reply to the user (not a summary of the conversation).
const CHATTER: &[&str] = &[
    "i'm glad",
    "i am glad",
    "glad you",
    "glad to hear",
    "thank you for",
    "thanks for",
    "you're welcome",
    "you are welcome",
    "i hope this helps",
    "hope this helps",
    "is there anything else",
    "let me know if",
    "feel free to",
    "great question",
    "i'd be happy to",
    "i would be happy to",
    "i'm happy to",
    "happy to help",
    "i'm sorry",
    "i apologize",
    "as an ai",
];

/// The chatty opening the text starts with, if any.
fn chatter(text: &str) -> Option<&'static str> {
    let lower = text.trim_start().to_lowercase().replace('’', "'");
    CHATTER.iter().copied().find(|c| lower.starts_with(c))
}

/// Describe degenerate repetition, if any: a line or sentence said three times or more,
/// one word ten times in a row, or a long text made mostly of repeated three-word phrases.
pub fn degenerate(text: &str) -> Option<String> {
    let norm = |s: &str| {
        s.split_whitespace()
            .map(|w| {
                w.trim_matches(|c: char| !c.is_alphanumeric())
                    .to_lowercase()
            })
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
    };
    let mut seen: std::collections::BTreeMap<Vec<String>, u32> = Default::default();
    for unit in text.split(['\n', '.', '!', '?']) {
        let words = norm(unit);
        if words.len() < 3 {
            continue;
        }
        let n = seen.entry(words).or_insert(0);
        *n += 1;
        if *n >= 3 {
            return Some("the same sentence three times".into());
        }
    }
    let words = norm(text);
    let mut run = 1;
    for pair in words.windows(2) {
        run = if pair[0] == pair[1] { run + 1 } else { 1 };
        if run >= 10 {
            return Some(format!("\"{}\" ten times in a row", pair[0]));
        }
    }
    if words.len() >= 40 {
        let grams: Vec<&[String]> = words.windows(3).collect();
        let distinct: std::collections::BTreeSet<&[String]> = grams.iter().copied().collect();
        if distinct.len() * 2 < grams.len() {
            return Some(format!(
                "only {} distinct three-word phrases in {}",
                distinct.len(),
                grams.len()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_a_normal_summary() {
        let s = "The user asked how to rotate logs. The assistant suggested logrotate with a \
                 weekly schedule. They agreed to keep four weeks of history.";
        assert_eq!(check(s, Finish::Stop, 500, 900), Ok(()));
        // A short summary of a short conversation is fine.
        assert_eq!(
            check("The user booked a room.", Finish::Stop, 500, 260),
            Ok(())
        );
    }

    #[test]
    fn rejects() {
        let rep = "The user asked about logs. ".repeat(3);
        let loop_words = "and then ".repeat(30);
        // 50,000 characters of varied prose that a server returned as "stop".
        let long: String = (0..2500)
            .map(|i| format!("Item {i} was reviewed. "))
            .collect();
        let cases = [
            ("", Finish::Stop, "no text"),
            ("  ... ", Finish::Stop, "no text"),
            ("The user asked about", Finish::Length, "output limit"),
            (rep.as_str(), Finish::Stop, "same sentence"),
            (
                "ok ok ok ok ok ok ok ok ok ok ok",
                Finish::Stop,
                "ten times",
            ),
            (loop_words.as_str(), Finish::Stop, "three-word"),
            (long.as_str(), Finish::Stop, "far over the 500-token"),
        ];
        for (text, finish, why) in cases {
            let err = check(text, finish, 500, 0).expect_err(text);
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn rejects_what_real_small_models_returned_instead_of_a_summary() {
        // Outputs seen from real small models (qwen2.5:0.5b, llama3.2:1b) on real transcripts.
        let cases = [
            (
                "User: How do I rotate the logs?\nAssistant: Use logrotate with a weekly schedule.\nUser: Thanks.",
                800,
                "copied the conversation",
            ),
            (
                "I'm glad you enjoyed the walkthrough! Let me know if you need anything else.",
                800,
                "answered the conversation",
            ),
            (
                "Thank you for sharing the logs; the issue is the stale lockfile.",
                800,
                "answered the conversation",
            ),
            // A 9-token sentence standing for 15 episodes.
            ("They discussed the upgrade plan.", 1100, "too short"),
        ];
        for (text, prompt, why) in cases {
            let err = check(text, Finish::Stop, 500, prompt).expect_err(text);
            assert!(err.contains(why), "{text:?}: {err}");
        }
        // Summaries that mention these words are kept.
        for ok in [
            "The user thanked the assistant after logrotate was set up weekly, keeping four weeks.",
            "User and assistant agreed: logs rotate weekly; four weeks are kept; alerts go to ops.",
        ] {
            assert_eq!(check(ok, Finish::Stop, 500, 700), Ok(()), "{ok}");
        }
    }

    #[test]
    fn quotes_must_occur_in_the_sources() {
        let src = [
            "The user said: deploy to staging first, then prod.",
            "Assistant: OK.",
        ];
        assert_eq!(
            unsupported_quote("The user asked to \"deploy to staging first\".", &src),
            None
        );
        assert_eq!(
            unsupported_quote("The user said “Deploy  to STAGING first”.", &src),
            None,
            "case, curly quotes and spacing are folded"
        );
        assert_eq!(
            unsupported_quote("The user said \"delete the production database\".", &src),
            Some("delete the production database".into())
        );
        assert_eq!(unsupported_quote("No quotes at all.", &src), None);
        assert_eq!(
            unsupported_quote("Summaries say \"The user ...\" in the third person.", &src),
            None
        );
    }
}
