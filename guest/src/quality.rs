//! The quality gate: a summary that fails it is never written.

use crate::types::Finish;

/// Check cleaned model output. `Err` carries the reason, phrased for a log line.
pub fn check(cleaned: &str, finish: Finish, max_output_tokens: u32) -> Result<(), String> {
    if finish == Finish::Length {
        return Err(format!(
            "the model stopped at the output limit ({max_output_tokens} tokens), so the summary \
             is cut off; raise max-output-tokens or lower the summary length"
        ));
    }
    if !cleaned.chars().any(char::is_alphanumeric) {
        return Err("the model returned no text once template tokens were removed".into());
    }
    if let Some(what) = degenerate(cleaned) {
        return Err(format!("the output repeats itself ({what})"));
    }
    Ok(())
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
        assert_eq!(check(s, Finish::Stop, 500), Ok(()));
    }

    #[test]
    fn rejects() {
        let rep = "The user asked about logs. ".repeat(3);
        let loop_words = "and then ".repeat(30);
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
        ];
        for (text, finish, why) in cases {
            let err = check(text, finish, 500).expect_err(text);
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }
}
