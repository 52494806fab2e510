//! The cost of sealing vectors (`ABRIDGE_SEAL_VECTORS=1`): one SQLite store with a master key,
//! N memories of 384-dimension lexical vectors written and searched with vectors plain, then
//! sealed, in the same run. Prints the write time per memory and the search p50 of each, and
//! their ratios.
//!
//! ```text
//! cargo bench --bench sealed -- [--memories 10000] [--queries 50]
//! ```

use std::sync::Arc;
use std::time::Instant;

use abridge_engine::types::{MemoryFilter, NewMemory, Scope};
use abridge_guest::embed::{LEXICAL_DIM, lexical};
use abridge_store::crypto::Secret;
use abridge_store::{RecallStore, SqliteStore};

fn memory(i: usize) -> NewMemory {
    let text = format!(
        "fact {i}: the service {} runs on host {} and deploys on {}",
        i % 97,
        i % 13,
        ["monday", "tuesday", "friday"][i % 3]
    );
    NewMemory {
        id: format!("m{i}"),
        scope: Scope {
            user: format!("u{}", i % 10),
            project: "p".into(),
            environment: "e".into(),
            kind: "fact".into(),
            key: format!("k{}", i % 50),
        },
        vector: lexical(&text, LEXICAL_DIM),
        text,
        importance: 0.5,
        tokens: 12,
        created_ms: i as u64,
        model: "abridge-lexical-v1+keyed".into(),
        cluster: None,
        fact_key: String::new(),
        replaces: None,
    }
}

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

async fn run(sealed: bool, n: usize, queries: usize) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let key = Secret::random().unwrap();
    let mut s = SqliteStore::open(&dir.path().join("v.db"))
        .unwrap()
        .with_master_key(key);
    if sealed {
        s = s.with_sealed_vectors();
    }
    let db: Arc<dyn RecallStore> = Arc::new(s);
    let started = Instant::now();
    for i in 0..n {
        db.put_memory("acme", memory(i)).await.unwrap();
    }
    let write_us = started.elapsed().as_secs_f64() * 1e6 / n as f64;
    let mut t = Vec::new();
    for q in 0..queries {
        let v = lexical(&format!("which host runs service {}", q % 97), LEXICAL_DIM);
        let started = Instant::now();
        let hits = db
            .search(
                "acme",
                &v,
                "abridge-lexical-v1+keyed",
                &MemoryFilter::default(),
                5,
            )
            .await
            .unwrap();
        t.push(started.elapsed().as_secs_f64() * 1e3);
        assert!(!hits.is_empty());
    }
    (write_us, p50(t))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let v: Vec<String> = std::env::args().collect();
    if v.iter().any(|a| a == "--list") {
        return;
    }
    let num = |flag: &str, default: usize| {
        v.iter()
            .position(|a| a == flag)
            .and_then(|i| v.get(i + 1)?.parse().ok())
            .unwrap_or(default)
    };
    let (n, q) = (num("--memories", 10_000), num("--queries", 50));
    let (pw, ps) = run(false, n, q).await;
    let (sw, ss) = run(true, n, q).await;
    println!("{n} memories, {LEXICAL_DIM}-dimension vectors, SQLite with a master key:");
    println!(
        "write per memory: plain {pw:.0} µs, sealed {sw:.0} µs  ×{:.2}",
        sw / pw
    );
    println!(
        "search p50 (exact scan of every vector): plain {ps:.2} ms, sealed {ss:.2} ms  ×{:.2}",
        ss / ps
    );
}
