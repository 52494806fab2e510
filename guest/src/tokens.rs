//! The token estimator.
//!
//! abridge never sees the model's tokenizer, so it estimates. The rule is simple enough to
//! state in one line and to reimplement in any host:
//!
//! * a run of ASCII letters counts one token per started 4 characters (`the` = 1,
//!   `summarization` = 4);
//! * every ASCII digit counts one token (Qwen and Llama-3 tokenizers split numbers);
//! * every other ASCII character that is not whitespace (punctuation) counts one token;
//! * every non-ASCII character counts one token (CJK is about one token a character, and
//!   accented Latin over-counts, which is the safe side);
//! * whitespace is free.
//!
//! On English prose this over-estimates BPE tokenizers by roughly 10–40 %, which keeps
//! budgets on the safe side; the model's own counts are stored with every summary.

/// Tokens a chat message costs beyond its content (role markers and separators).
pub const MESSAGE_OVERHEAD: u32 = 4;

/// Estimate the tokens of `text` (see the module docs for the rule).
pub fn estimate_tokens(text: &str) -> u32 {
    let mut total: u64 = 0;
    let mut letters: u64 = 0;
    for b in text.bytes() {
        if b.is_ascii_alphabetic() {
            letters += 1;
            continue;
        }
        total += letters.div_ceil(4);
        letters = 0;
        if b.is_ascii_whitespace() {
            continue;
        }
        // Continuation bytes of a multi-byte character (10xxxxxx) are not counted, so each
        // non-ASCII character counts once, via its lead byte.
        if !(0x80..0xC0).contains(&b) {
            total += 1;
        }
    }
    total += letters.div_ceil(4);
    total.min(u32::MAX as u64) as u32
}

/// Estimated tokens of a chat message, overhead included.
pub fn message_tokens(content: &str) -> u32 {
    estimate_tokens(content).saturating_add(MESSAGE_OVERHEAD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_examples() {
        let cases = [
            ("", 0),
            ("   \n\t", 0),
            ("the", 1),
            ("summarization", 4),
            ("Hello, world!", 6),
            ("12345", 5),
            ("v2.5", 4),
            ("日本語", 3),
            ("café", 2),
            ("a b c d", 4),
        ];
        for (text, want) in cases {
            assert_eq!(estimate_tokens(text), want, "estimate_tokens({text:?})");
        }
    }

    #[test]
    fn over_estimates_typical_english() {
        // 44 words; cl100k/Qwen tokenizers give about 50 tokens for this sentence pair.
        let text = "The user asked how to configure the database connection pool for the \
                    staging server, and the assistant explained the maximum connection \
                    setting, the idle timeout, and why the pool should be smaller than the \
                    database's own connection limit to avoid exhausting it under load.";
        let est = estimate_tokens(text);
        assert!((50..=80).contains(&est), "estimate {est}");
    }

    #[test]
    fn additive_over_whitespace_splits() {
        let a = "first part of a text, ";
        let b = "second part.";
        assert_eq!(
            estimate_tokens(&format!("{a}{b}")),
            estimate_tokens(a) + estimate_tokens(b)
        );
    }
}
