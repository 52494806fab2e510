//! Records the store suites write: episodes, summary writes, scopes and memories. Shared by
//! this crate's conformance suite and the binary's PostgreSQL tests (`tests/e2e/postgres.rs`,
//! through `#[path]`), so both write the same rows.
#![allow(dead_code)]

use abridge_engine::types::{Compaction, NewEpisode, NewMemory, Role, Scope, SummaryWrite};

pub fn ep(i: usize, key: &str) -> NewEpisode {
    NewEpisode {
        role: if i.is_multiple_of(2) {
            Role::User
        } else {
            Role::Assistant
        },
        content: format!("message {i} about /srv/app/{i}.toml"),
        timestamp_ms: Some(1_000 + i as i64),
        source_key: key.to_string(),
        tokens: 10,
        ..Default::default()
    }
}

pub fn write(replaces: Option<u64>, first: u64, last: u64, text: &str) -> SummaryWrite {
    SummaryWrite {
        replaces,
        first_episode: first,
        last_episode: last,
        content: text.into(),
        tokens: 5,
        prompt_tokens: 100,
        output_tokens: 20,
        model: "m".into(),
        now_ms: 5_000,
        skipped: Vec::new(),
        ledger: Vec::new(),
        ledger_dropped: 0,
    }
}

pub fn scope(key: &str) -> Scope {
    Scope {
        user: "u".into(),
        project: "p".into(),
        environment: "e".into(),
        kind: "fact".into(),
        key: key.into(),
    }
}

pub fn memory(id: &str, text: &str, v: [f32; 3], cluster: Option<u64>) -> NewMemory {
    NewMemory {
        id: id.into(),
        scope: scope("k"),
        text: text.into(),
        importance: 0.5,
        tokens: 4,
        created_ms: 10,
        model: "emb".into(),
        vector: v.to_vec(),
        cluster,
        fact_key: String::new(),
        replaces: None,
    }
}

/// A compaction of `rows` into one "earlier" row at `now_ms`.
pub fn compaction(rows: Vec<u64>, now_ms: u64) -> Compaction {
    Compaction {
        rows,
        content: "earlier".into(),
        tokens: 3,
        prompt_tokens: 1,
        output_tokens: 1,
        model: "m".into(),
        now_ms,
        skipped: Vec::new(),
        ledger: Vec::new(),
        ledger_dropped: 0,
    }
}
