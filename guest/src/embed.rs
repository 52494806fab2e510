//! The offline embedder: a deterministic lexical embedding that needs no model server and no
//! download, so memories cluster and recall works on a fresh machine.
//!
//! A text becomes its features: content words (lowercased, stop words left out, a light
//! suffix stemming so "deploys" and "deployed" meet "deploy"), adjacent word pairs, and the
//! character trigrams of each word (so "postgres" and "postgresql" share most of theirs).
//! Each feature is hashed (FNV-1a, 64 bits) to one of `dim` buckets with a sign taken from the
//! hash, so collisions cancel out on average instead of piling up; a feature's weight grows
//! with the square root of its count; the vector is scaled to unit length, so cosine
//! similarity is a dot product.
//!
//! Only exactly rounded arithmetic is used (sums, products, square roots; no logarithms), so
//! the vectors are bit-for-bit the same natively and in the component, in every host.

use std::collections::BTreeMap;

/// The name stamped on vectors this embedder makes; a change to the features is a new name,
/// so stored vectors from the old one are re-embedded rather than mixed.
pub const LEXICAL_MODEL: &str = "abridge-lexical-v1";

/// The name of vectors made with a tenant's key (see [`lexical_keyed`]).
pub const LEXICAL_KEYED_MODEL: &str = "abridge-lexical-v1+keyed";

/// Its dimension.
pub const LEXICAL_DIM: usize = 384;

/// Words too common to tell memories apart.
const STOP: &[&str] = &[
    "a", "about", "after", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be",
    "been", "before", "being", "but", "by", "can", "could", "did", "do", "does", "doing", "for",
    "from", "had", "has", "have", "having", "he", "her", "here", "hers", "him", "his", "how", "i",
    "if", "in", "into", "is", "it", "its", "just", "me", "more", "most", "my", "no", "not", "now",
    "of", "on", "once", "only", "or", "other", "our", "out", "over", "own", "same", "she",
    "should", "so", "some", "such", "than", "that", "the", "their", "them", "then", "there",
    "these", "they", "this", "those", "to", "too", "under", "until", "up", "very", "was", "we",
    "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with",
    "would", "you", "your",
];

/// Weights of the three kinds of feature.
const WORD: f32 = 1.0;
const PAIR: f32 = 0.5;
const TRIGRAM: f32 = 0.25;

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A light stemmer: plural and tense endings only, and only on words long enough to keep a
/// stem ("is", "bus" and "class" stay as they are).
fn stem(w: &str) -> String {
    let n = w.chars().count();
    let cut = |suffix: &str, keep: usize| -> Option<String> {
        (w.ends_with(suffix) && n >= keep + suffix.len())
            .then(|| w[..w.len() - suffix.len()].to_string())
    };
    if let Some(s) = cut("ies", 3) {
        return s + "y";
    }
    // "running" and "stopped" meet "run" and "stop"; "falling" keeps its "ll".
    let undouble = |s: String| {
        let b = s.as_bytes();
        let n = b.len();
        if n >= 3
            && b[n - 1] == b[n - 2]
            && b[n - 1].is_ascii_alphabetic()
            && !b"aeioulsz".contains(&b[n - 1])
        {
            s[..n - 1].to_string()
        } else {
            s
        }
    };
    if let Some(s) = cut("ing", 3) {
        return undouble(s);
    }
    if let Some(s) = cut("ed", 3) {
        return undouble(s);
    }
    if w.ends_with("ss") || w.ends_with("us") || w.ends_with("is") {
        return w.to_string();
    }
    cut("s", 3).unwrap_or_else(|| w.to_string())
}

/// The content words of `text`, stemmed, in order.
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| !STOP.contains(&w.as_str()))
        .map(|w| stem(&w))
        .collect()
}

/// The lexical embedding of `text`: `dim` numbers of unit length, or all zeros for a text
/// with no content word.
pub fn lexical(text: &str, dim: usize) -> Vec<f32> {
    lexical_keyed(text, dim, None)
}

/// A feature's hash: FNV-1a unkeyed; with a key, the first 8 bytes of SHA-256 over the key
/// and the feature, so which bucket and sign a word lands in is the key's secret. Without
/// it, ranking guessed words against stored vectors (hashing each guess the public way)
/// recovers nothing.
fn feature_hash(key: Option<&sha2::Sha256>, feature: &[u8]) -> u64 {
    use sha2::Digest;
    match key {
        None => fnv1a(feature),
        Some(k) => {
            let d = k.clone().chain_update(feature).finalize();
            u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
        }
    }
}

/// [`lexical`], keyed by `key` when given (a tenant's secret; see [`feature_hash`]).
pub fn lexical_keyed(text: &str, dim: usize, key: Option<&[u8]>) -> Vec<f32> {
    use sha2::Digest;
    let keyed = key.map(|k| {
        sha2::Sha256::new()
            .chain_update(b"abridge-lexical-key\0")
            .chain_update((k.len() as u32).to_le_bytes())
            .chain_update(k)
    });
    let dim = dim.max(1);
    let words = words(text);
    let mut features: BTreeMap<String, (f32, u32)> = BTreeMap::new();
    let mut add = |key: String, weight: f32| {
        features.entry(key).or_insert((weight, 0)).1 += 1;
    };
    for w in &words {
        add(format!("w:{w}"), WORD);
        let chars: Vec<char> = format!("^{w}$").chars().collect();
        for t in chars.windows(3) {
            add(format!("c:{}", t.iter().collect::<String>()), TRIGRAM);
        }
    }
    for p in words.windows(2) {
        add(format!("p:{} {}", p[0], p[1]), PAIR);
    }
    let mut v = vec![0f32; dim];
    for (feature, (weight, count)) in &features {
        let h = feature_hash(keyed.as_ref(), feature.as_bytes());
        let slot = (h % dim as u64) as usize;
        let sign = if h >> 63 == 1 { -1.0 } else { 1.0 };
        v[slot] += sign * weight * (*count as f32).sqrt();
    }
    normalize(&mut v);
    v
}

/// Scale `v` to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in v.iter_mut() {
            *x /= norm;
        }
    }
}

/// Cosine similarity of two vectors (0 when either is zero or their lengths differ).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    // Summed in f64: every step is exactly rounded, so hosts agree bit for bit.
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        (dot / (na.sqrt() * nb.sqrt())) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The golden cosines (`tests/golden/cosine/cases.json`): the stores' own arithmetic (Rust
    /// and JS) is proven equal to this one, bit for bit. `ABRIDGE_BLESS=1` writes them anew.
    #[test]
    fn golden_cosines() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/golden/cosine/cases.json"
        );
        let texts = [
            (
                "Alice prefers the dark theme in her editor",
                "Alice switched her editor to a dark color theme",
            ),
            (
                "The deploy runs on Fridays after the freeze",
                "deploys run each friday",
            ),
            (
                "the lease expires before release v3.2",
                "raise the lease to 45 seconds",
            ),
            (
                "Caroline went to the LGBTQ support group",
                "Melanie painted a sunrise last year",
            ),
            ("", "x y"),
        ];
        let mut cases = Vec::new();
        for (a, b) in texts {
            let (va, vb) = (lexical(a, 64), lexical(b, 64));
            cases.push(serde_json::json!({"a": va, "b": vb, "bits": cosine(&va, &vb).to_bits()}));
        }
        // Vectors that are not unit length, a zero vector and a mismatch.
        let odd: Vec<f32> = (0..17).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let other: Vec<f32> = (0..17)
            .map(|i| (i as f32 * 0.11 + 1.0).cos() * 0.5)
            .collect();
        for (a, b) in [
            (odd.clone(), other.clone()),
            (odd.clone(), vec![0.0; 17]),
            (odd, vec![1.0; 3]),
        ] {
            cases.push(serde_json::json!({"a": a, "b": b, "bits": cosine(&a, &b).to_bits()}));
        }
        let now =
            serde_json::to_string_pretty(&serde_json::json!({ "cases": cases })).unwrap() + "\n";
        if std::env::var_os("ABRIDGE_BLESS").is_some() {
            std::fs::create_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
            std::fs::write(path, &now).unwrap();
        }
        let kept = std::fs::read_to_string(path)
            .expect("the golden cosines (ABRIDGE_BLESS=1 writes them)");
        assert_eq!(
            kept, now,
            "the guest's cosine changed; the stores must change with it (ABRIDGE_BLESS=1)"
        );
    }

    #[test]
    fn related_facts_are_closer_than_unrelated_ones() {
        let e = |t: &str| lexical(t, LEXICAL_DIM);
        let a = e("Alice prefers the dark theme in her editor");
        let b = e("Alice switched her editor to a dark color theme");
        let c = e("The deploy runs on Fridays after the freeze");
        assert!(cosine(&a, &b) > 0.4, "{}", cosine(&a, &b));
        assert!(cosine(&a, &c) < 0.15, "{}", cosine(&a, &c));
        assert!(cosine(&a, &b) > 2.0 * cosine(&a, &c));
        // Stems and trigrams: a different form of the same word still matches.
        let d = e("deploys run each friday");
        assert!(cosine(&c, &d) > 0.3, "{}", cosine(&c, &d));
    }

    #[test]
    fn vectors_are_unit_length_deterministic_and_empty_for_stop_words() {
        let v = lexical("the deploy runs on Fridays", LEXICAL_DIM);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        assert_eq!(v, lexical("the deploy runs on Fridays", LEXICAL_DIM));
        // Keyed: another space, the same for the same key, unlike for another key.
        let k1 = lexical_keyed("the deploy runs on Fridays", LEXICAL_DIM, Some(b"k1"));
        assert_ne!(k1, v);
        assert_eq!(
            k1,
            lexical_keyed("the deploy runs on Fridays", LEXICAL_DIM, Some(b"k1"))
        );
        assert!(
            cosine(
                &k1,
                &lexical_keyed("the deploy runs on Fridays", LEXICAL_DIM, Some(b"k2"))
            ) < 0.5
        );
        // Similar texts stay similar under one key.
        let k = |t: &str| lexical_keyed(t, LEXICAL_DIM, Some(b"k1"));
        assert!(cosine(&k("deploys run on Fridays"), &k1) > 0.5);
        assert!(
            lexical("the and of to", LEXICAL_DIM)
                .iter()
                .all(|x| *x == 0.0)
        );
        assert_eq!(cosine(&lexical("", 8), &lexical("x y", 8)), 0.0);
    }

    #[test]
    fn stems_meet_and_short_words_stay() {
        assert_eq!(stem("deploys"), "deploy");
        assert_eq!(stem("deployed"), "deploy");
        assert_eq!(stem("deploying"), "deploy");
        assert_eq!(stem("libraries"), "library");
        assert_eq!(stem("class"), "class");
        assert_eq!(stem("bus"), "bus");
        assert_eq!(stem("is"), "is");
        assert_eq!(stem("stopped"), "stop");
        assert_eq!(stem("falling"), "fall");
        assert_eq!(stem("bring"), "bring");
        assert_eq!(words("The Deploys, and RUNNING!"), vec!["deploy", "run"]);
    }
}
