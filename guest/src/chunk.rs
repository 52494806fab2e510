//! Splitting text that is too large for one prompt.
//!
//! Pieces break at the coarsest boundary that works: paragraphs, then lines, then sentences,
//! then words, and only as a last resort between characters (never inside one). The pieces
//! concatenate back to exactly the input.

use crate::tokens::estimate_tokens;

/// Split `text` into pieces of at most `max_tokens` estimated tokens each (a single
/// character heavier than that, impossible for `max_tokens >= 1`, would stand alone).
pub fn split_to_fit(text: &str, max_tokens: u32) -> Vec<&str> {
    let max = max_tokens.max(1);
    let mut segments = Vec::new();
    segment(text, max, 0, &mut segments);
    pack(text, &segments, max)
}

/// Boundary kinds, coarsest first.
const LEVELS: usize = 4;

/// Byte offsets just after each boundary of the given level inside `text`.
fn boundaries(text: &str, level: usize) -> Vec<usize> {
    let mut cuts = Vec::new();
    match level {
        0 => cuts.extend(text.match_indices("\n\n").map(|(i, _)| i + 2)),
        1 => cuts.extend(text.match_indices('\n').map(|(i, _)| i + 1)),
        2 => {
            let b = text.as_bytes();
            for i in 0..b.len().saturating_sub(1) {
                if matches!(b[i], b'.' | b'!' | b'?') && b[i + 1] == b' ' {
                    cuts.push(i + 2);
                }
            }
        }
        _ => cuts.extend(text.match_indices(' ').map(|(i, _)| i + 1)),
    }
    cuts.retain(|&c| c < text.len());
    cuts
}

/// Recursively cut `text` into (offset-free) segments each under `max`, appending them.
fn segment<'a>(text: &'a str, max: u32, level: usize, out: &mut Vec<&'a str>) {
    if estimate_tokens(text) <= max {
        out.push(text);
        return;
    }
    if level >= LEVELS {
        // Between characters: greedy, by character.
        let mut start = 0;
        let mut tokens = 0;
        for (i, ch) in text.char_indices() {
            let mut buf = [0u8; 4];
            let t = estimate_tokens(ch.encode_utf8(&mut buf)).max(1);
            if tokens + t > max && i > start {
                out.push(&text[start..i]);
                start = i;
                tokens = 0;
            }
            tokens += t;
        }
        out.push(&text[start..]);
        return;
    }
    let cuts = boundaries(text, level);
    if cuts.is_empty() {
        segment(text, max, level + 1, out);
        return;
    }
    let mut start = 0;
    for c in cuts.into_iter().chain(std::iter::once(text.len())) {
        segment(&text[start..c], max, level + 1, out);
        start = c;
    }
}

/// Merge adjacent segments greedily while they fit. Segments are contiguous slices of `text`.
fn pack<'a>(text: &'a str, segments: &[&'a str], max: u32) -> Vec<&'a str> {
    let mut pieces = Vec::new();
    let mut start = 0usize;
    let mut end = 0usize;
    let mut tokens = 0u32;
    for seg in segments {
        let t = estimate_tokens(seg);
        if end > start && tokens + t > max {
            pieces.push(&text[start..end]);
            start = end;
            tokens = 0;
        }
        end += seg.len();
        tokens += t;
    }
    if end > start {
        pieces.push(&text[start..end]);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, max: u32) -> Vec<&str> {
        let pieces = split_to_fit(text, max);
        assert_eq!(
            pieces.concat(),
            text,
            "pieces must concatenate to the input"
        );
        for p in &pieces {
            assert!(
                estimate_tokens(p) <= max,
                "piece over budget: {} > {max}: {p:?}",
                estimate_tokens(p)
            );
        }
        pieces
    }

    #[test]
    fn small_text_is_one_piece() {
        assert_eq!(check("Short text.", 100), vec!["Short text."]);
        assert_eq!(check("", 10), Vec::<&str>::new());
    }

    #[test]
    fn prefers_paragraphs() {
        let text = "First paragraph here.\n\nSecond paragraph here.\n\nThird one.";
        let pieces = check(text, 8);
        assert_eq!(pieces[0], "First paragraph here.\n\n");
    }

    #[test]
    fn falls_back_to_sentences_words_and_chars() {
        let text = "One sentence is here. Another follows it! And a third? Yes.";
        check(text, 6);
        check(&"word ".repeat(200), 7);
        check(&"x".repeat(1000), 3);
        check(&"日本語のテキスト".repeat(50), 5);
    }
}
