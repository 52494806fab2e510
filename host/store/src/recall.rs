//! Memories, their clusters and cluster summaries behind one trait ([`RecallStore`]), with
//! every call scoped to a tenant: a row of another tenant is simply not found. The SQLite
//! implementation is in `sqlite_recall.rs`, the PostgreSQL one in `pg/recall.rs`; the bodies
//! they share (search, and the writes that move a cluster's sum) in `search.rs` and
//! `writes.rs`; the stored forms of text and vectors here.
//!
//! A cluster keeps the sum of its members' vectors and their count, so its centroid updates
//! incrementally (add on write, subtract on delete). A membership change bumps the cluster's
//! version; a summarize run that ends settles the version it saw, so the sweeper finds the
//! clusters whose summary may be stale without the guest. A claim (owner and expiry) keeps two
//! workers from summarizing one cluster at once.

pub use abridge_engine::store::{ClusterRow, RecallStore, Unsettled, UsageDay, month_of_day};

/// Text as stored when not sealed (invalid UTF-8 is replaced, never refused).
pub(crate) fn text_in(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Vectors as stored: little-endian f32.
pub fn vector_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A stored vector back.
pub fn vector_from(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub use crate::rules::{cosine, matches, same_scope};
