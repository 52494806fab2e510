//! Memories and cluster summaries, measured in one run on a real SQLite file:
//!
//! 1. memory writes per second with inline clustering (one memory per write, each placed in
//!    its cluster by the guest), once the tenant holds 10k and then 100k memories;
//! 2. recall p50/p99 at the largest size, over the whole tenant and within one user;
//! 3. model calls and prompt tokens to keep one cluster summarized as it grows from 3 to 50
//!    members, refreshing in place against summarizing the whole cluster from scratch;
//! 4. the cost of encryption at rest: the same writes and recalls with a master key.
//!
//! ```text
//! cargo bench --bench memories -- [--sizes 10000,100000] [--writes 1000] [--queries 200]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use abridge_app::memories::{Summaries, scope};
use abridge_app::{App, AppConfig, Limits, Scoped};
use abridge_engine::types::{
    Config, Error, FinishReason, MemoryFilter, MemoryIn, Request, Response,
};
use abridge_engine::{ComponentSource, LlmBackend, Runtime, SystemClock};
use abridge_store::SqliteStore;
use abridge_store::{AppStore, RecallStore};

struct Args {
    sizes: Vec<usize>,
    writes: usize,
    queries: usize,
}

fn args() -> Args {
    let mut a = Args {
        sizes: vec![10_000, 100_000],
        writes: 1000,
        queries: 200,
    };
    let v: Vec<String> = std::env::args().collect();
    for (i, arg) in v.iter().enumerate() {
        let next = || v.get(i + 1).cloned().unwrap_or_default();
        match arg.as_str() {
            "--sizes" => {
                a.sizes = next()
                    .split(',')
                    .map(|s| s.trim().parse().expect("--sizes N,M"))
                    .collect()
            }
            "--writes" => a.writes = next().parse().expect("--writes N"),
            "--queries" => a.queries = next().parse().expect("--queries N"),
            _ => {}
        }
    }
    a
}

/// The test server's model in process, cut to 40 words (as a real summary stays short), and reports the prompt's length in tokens (one per four bytes), counting calls
/// and prompt tokens.
#[derive(Default)]
struct Counting {
    calls: AtomicU64,
    prompt_tokens: AtomicU64,
}

#[async_trait::async_trait]
impl LlmBackend for Counting {
    async fn generate(&self, req: Request) -> Result<Response, Error> {
        let p = req.prompt.text();
        let tokens = (p.len() / 4) as u32;
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.prompt_tokens
            .fetch_add(u64::from(tokens), Ordering::SeqCst);
        let restated = abridge_test_llm::summarize(&p);
        // Like a real model, the summary stays short whatever the input: its first 40 words.
        let words: Vec<&str> = restated.split_whitespace().collect();
        let mut text = words[..words.len().min(40)].join(" ");
        if !text.ends_with('.') {
            text.push('.');
        }
        Ok(Response {
            text,
            finish_reason: FinishReason::Stop,
            prompt_tokens: Some(tokens),
            output_tokens: Some(40),
            server_ms: None,
        })
    }

    fn name(&self) -> &str {
        "counting"
    }
}

fn open(db: Arc<dyn AppStore>, runtime: Arc<Runtime>, llm: Arc<Counting>) -> App {
    App::open_with(
        AppConfig {
            db: "bench".into(),
            config: Config {
                model: "counting".into(),
                context_length: 32_768,
                ..Config::default()
            },
            llm,
            backend_name: "counting".into(),
            batch_concurrency: 4,
            job_lease: Duration::from_secs(60),
            clock: Arc::new(SystemClock),
            runtime,
            log: Arc::new(|_, _| {}),
            limits: Limits::unlimited(),
            events_kept: 100,
            memory: Default::default(),
            embedder: None,
            master_key: None,
            seal_vectors: false,
        },
        db,
    )
    .expect("the app opens")
}

const SUBJECTS: [&str; 8] = [
    "the editor theme",
    "the deploy schedule",
    "the on-call rotation",
    "the database backups",
    "the release notes",
    "the staging cluster",
    "the code review rules",
    "the lunch order",
];
const DETAILS: [&str; 12] = [
    "should stay dark at night",
    "moves to Friday at noon",
    "needs two approvals",
    "runs every six hours",
    "is written by the team lead",
    "lives in the eu-west region",
    "was changed last sprint",
    "must mention the migration",
    "prefers large fonts",
    "pauses in the last week of December",
    "is owned by the platform group",
    "keeps thirty days of history",
];

/// The `i`th synthetic memory: 200 users × 50 keys, facts from a few subjects and details, so
/// related memories share words and unrelated ones mostly do not.
fn memory(i: usize) -> MemoryIn {
    let user = format!("user{}", i % 200);
    let key = format!("topic{}", (i / 200) % 50);
    let subject = SUBJECTS[(i / 7) % SUBJECTS.len()];
    let detail = DETAILS[(i / 3) % DETAILS.len()];
    MemoryIn {
        id: format!("m{i}"),
        scope: scope(&user, "web", "prod", "fact", &key),
        text: format!("For {user}, {subject} {detail} (note {i})"),
        importance: Some(((i % 10) as f32) / 10.0),
        replaces: None,
    }
}

async fn fill(me: &Scoped, from: usize, to: usize) {
    let mut i = from;
    while i < to {
        let n = (to - i).min(500);
        me.remember((i..i + n).map(memory).collect(), Summaries::Leave)
            .await
            .expect("a batch is stored");
        i += n;
    }
}

/// Single-memory writes per second, from memory `from`.
async fn writes(me: &Scoped, from: usize, n: usize) -> f64 {
    let t = Instant::now();
    for i in from..from + n {
        me.remember(vec![memory(i)], Summaries::Leave)
            .await
            .expect("a write is stored");
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Recall latencies (ms): p50 and p99 over `n` queries, with and without a user filter.
async fn recalls(me: &Scoped, n: usize) -> ((f64, f64), (f64, f64)) {
    let mut all = Vec::new();
    let mut one = Vec::new();
    for q in 0..n {
        let query = format!(
            "{} {}",
            SUBJECTS[q % SUBJECTS.len()],
            DETAILS[(q * 5) % DETAILS.len()]
        );
        let t = Instant::now();
        me.recall(&query, &MemoryFilter::default(), 5)
            .await
            .unwrap();
        all.push(t.elapsed().as_secs_f64() * 1000.0);
        let f = MemoryFilter {
            user: Some(format!("user{}", q % 200)),
            ..MemoryFilter::default()
        };
        let t = Instant::now();
        me.recall(&query, &f, 5).await.unwrap();
        one.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    (
        (pct(&mut all, 0.5), pct(&mut all, 0.99)),
        (pct(&mut one, 0.5), pct(&mut one, 0.99)),
    )
}

/// The recall query `q` of the benchmark.
fn query(q: usize) -> String {
    format!(
        "{} {}",
        SUBJECTS[q % SUBJECTS.len()],
        DETAILS[(q * 5) % DETAILS.len()]
    )
}

/// The index against the exact scan on the same tenant: p50/p99 of each, and recall@10 of the index's memories against the exact scan's,
/// over `n` queries with no filter and with one key's filter (2 % of the tenant); then a
/// recall right after each of `n` writes (the index folds the new row in first).
async fn index_vs_exact(me: &Scoped, n: usize, from: usize) {
    let memories = |r: Vec<abridge_app::memories::RecallView>| -> Vec<String> {
        r.into_iter()
            .filter(|h| h.kind == "memory")
            .map(|h| h.id)
            .collect()
    };
    for (label, f) in [
        ("whole tenant", MemoryFilter::default()),
        (
            "one key of 50 (2 %)",
            MemoryFilter {
                key: Some("topic7".into()),
                ..MemoryFilter::default()
            },
        ),
    ] {
        let fx = MemoryFilter {
            exact: true,
            ..f.clone()
        };
        let (mut ann, mut ex) = (Vec::new(), Vec::new());
        let (mut agree, mut total) = (0usize, 0usize);
        for q in 0..n {
            let t = Instant::now();
            let a = memories(me.recall(&query(q), &f, 10).await.unwrap());
            ann.push(t.elapsed().as_secs_f64() * 1000.0);
            let t = Instant::now();
            let b = memories(me.recall(&query(q), &fx, 10).await.unwrap());
            ex.push(t.elapsed().as_secs_f64() * 1000.0);
            total += b.len();
            agree += b.iter().filter(|id| a.contains(id)).count();
        }
        println!(
            "  recall, {label}: index p50 {:.2} ms p99 {:.2} ms | exact scan p50 {:.1} ms p99 {:.1} ms | p50 exact ÷ index {:.0}× | recall@10 vs exact {:.3} ({agree}/{total})",
            pct(&mut ann, 0.5),
            pct(&mut ann, 0.99),
            pct(&mut ex, 0.5),
            pct(&mut ex, 0.99),
            pct(&mut ex, 0.5) / pct(&mut ann, 0.5),
            agree as f64 / total.max(1) as f64
        );
    }
    // A write then a recall, n times: the recall folds the new memory in.
    let mut after = Vec::new();
    let t0 = Instant::now();
    for q in 0..n {
        me.remember(vec![memory(from + q)], Summaries::Leave)
            .await
            .unwrap();
        let t = Instant::now();
        me.recall(&query(q), &MemoryFilter::default(), 10)
            .await
            .unwrap();
        after.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "  recall right after a write: p50 {:.2} ms p99 {:.2} ms ({:.0} write+recall pairs/s)",
        pct(&mut after, 0.5),
        pct(&mut after, 0.99),
        n as f64 / t0.elapsed().as_secs_f64()
    );
}

/// Twenty distinct facts about one subject.
const EDITOR_FACTS: [&str; 20] = [
    "Alice prefers the dark theme in her editor",
    "Alice uses large fonts in the editor",
    "Alice wants the editor theme dark at night",
    "Alice turned on high contrast in the editor",
    "Alice keeps the editor minimap hidden",
    "Alice indents with four spaces in the editor",
    "Alice enabled format on save in her editor",
    "Alice uses the vim keybindings in the editor",
    "Alice pinned the terminal panel below the editor",
    "Alice set the editor ruler at column 100",
    "Alice disabled editor telemetry",
    "Alice syncs her editor settings across laptops",
    "Alice runs the spell checker on markdown in the editor",
    "Alice hides whitespace markers in the editor",
    "Alice opens files in new editor tabs",
    "Alice uses a ligature font called Iosevka in the editor",
    "Alice bound the editor command palette to control p",
    "Alice lets the editor trim trailing whitespace",
    "Alice shows git blame inline in the editor",
    "Alice keeps word wrap off for code in the editor",
];

/// Calls and prompt tokens to keep one cluster summarized from 3 to `max` members.
async fn refreshes(runtime: &Arc<Runtime>, scratch: bool, max: usize) -> (u64, u64, u64) {
    let llm = Arc::new(Counting::default());
    let db = Arc::new(SqliteStore::in_memory().unwrap());
    let app = open(db.clone(), runtime.clone(), llm.clone());
    let me = app.local();
    let mut summaries = 0;
    for i in 0..max {
        let r = me
            .remember(
                vec![MemoryIn {
                    id: format!("f{i}"),
                    scope: scope("alice", "web", "prod", "preference", "editor"),
                    text: format!("{} (setting {i})", EDITOR_FACTS[i % EDITOR_FACTS.len()]),
                    importance: Some(0.5),
                    replaces: None,
                }],
                Summaries::Leave,
            )
            .await
            .unwrap()
            .memories;
        if r[0].due {
            if scratch {
                // Forget the summary first: the whole cluster is summarized again.
                db.delete_cluster_summary("local", r[0].cluster)
                    .await
                    .unwrap();
            }
            me.summarize_cluster(r[0].cluster).await.unwrap();
            summaries += 1;
        }
    }
    (
        summaries,
        llm.calls.load(Ordering::SeqCst),
        llm.prompt_tokens.load(Ordering::SeqCst),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let runtime = Arc::new(
        Runtime::load(
            &ComponentSource::Embedded,
            abridge_engine::runtime::default_cache_dir().as_deref(),
        )
        .expect("the engine loads"),
    );
    let dir = tempfile::tempdir().unwrap();
    println!("memories benchmark: SQLite file, offline lexical embedder (384 d), 2 worker threads");

    // 1 and 2: writes at each size, then recall at the largest; plain and sealed.
    let mut rows = Vec::new();
    for (label, key) in [
        ("plaintext", None),
        (
            "encrypted",
            Some(abridge_store::crypto::Secret::random().unwrap()),
        ),
    ] {
        let mut db = SqliteStore::open(&dir.path().join(format!("{label}.db"))).unwrap();
        if let Some(k) = key {
            db = db.with_master_key(k);
        }
        let app = open(Arc::new(db), runtime.clone(), Arc::new(Counting::default()));
        let me = app.local();
        let mut held = 0;
        let mut extra = 10_000_000;
        for &size in &a.sizes {
            fill(&me, held, size).await;
            held = size;
            let w = writes(&me, extra, a.writes).await;
            extra += a.writes;
            println!("  {label}: {w:>8.0} writes/s with {size} memories in the tenant");
            rows.push((label, size, w));
        }
        let t = Instant::now();
        me.recall(&query(0), &MemoryFilter::default(), 5)
            .await
            .unwrap();
        println!(
            "  {label}: first recall at {held} (reads every vector and builds the index): {:.0} ms",
            t.elapsed().as_secs_f64() * 1000.0
        );
        let ((p50, p99), (u50, u99)) = recalls(&me, a.queries).await;
        println!(
            "  {label}: recall at {held}: whole tenant p50 {p50:.1} ms p99 {p99:.1} ms; one user p50 {u50:.1} ms p99 {u99:.1} ms"
        );
        rows.push((label, usize::MAX, p50));
        index_vs_exact(&me, a.queries, extra).await;
        extra += a.queries;
        // Writes once the index exists (it takes new rows at the next recall, so a write
        // costs what it did).
        let w = writes(&me, extra, a.writes).await;
        let before = rows
            .iter()
            .find(|r| r.0 == label && r.1 == held)
            .map_or(f64::NAN, |r| r.2);
        println!(
            "  {label}: {w:>8.0} writes/s with the index built ({:.2}× the writes/s before it)",
            w / before
        );
    }
    let w = |label: &str, size: usize| {
        rows.iter()
            .find(|r| r.0 == label && r.1 == size)
            .map_or(f64::NAN, |r| r.2)
    };
    for &size in &a.sizes {
        println!(
            "  encryption overhead at {size}: writes/s encrypted ÷ plaintext = {:.2}",
            w("encrypted", size) / w("plaintext", size)
        );
    }
    println!(
        "  encryption overhead, recall p50 encrypted ÷ plaintext = {:.2}",
        w("encrypted", usize::MAX) / w("plaintext", usize::MAX)
    );

    // 3: refresh in place against from scratch.
    let (n, calls, tokens) = refreshes(&runtime, false, 50).await;
    let (sn, scalls, stokens) = refreshes(&runtime, true, 50).await;
    println!(
        "  one cluster grown from 3 to 50 members, summarized after each write ({n} summaries):"
    );
    println!(
        "    refreshed in place: {calls} calls, {tokens} prompt tokens ({:.0} per summary)",
        tokens as f64 / n as f64
    );
    println!(
        "    from scratch:       {scalls} calls, {stokens} prompt tokens ({:.0} per summary)",
        stokens as f64 / sn as f64
    );
    println!(
        "    prompt tokens in place ÷ from scratch = {:.2}",
        tokens as f64 / stokens as f64
    );
}
