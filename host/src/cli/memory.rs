//! `abridge memory …`, `abridge recall` and `abridge clusters …`: thin shells over the app's
//! memory operations.

use std::io::BufRead;

use anyhow::anyhow;
use clap::{Args, Subcommand};

use abridge_app::engine::types::{ClusterOutcome, MemoryConfig, MemoryFilter};
use abridge_app::memories::{
    ClusterView, MemoryInput, MemoryView, Summaries, Written, action_name, filter,
};
use abridge_app::{AppError, Scoped};

use super::app::fail;
use super::commands::{choose_backend, note};
use super::{Exit, Failure, Settings};

/// Which memories: every field given must match.
#[derive(Args, Debug, Clone, Default)]
pub struct ScopeFilter {
    /// Only this user's
    #[arg(long)]
    user: Option<String>,
    /// Only this project's
    #[arg(long)]
    project: Option<String>,
    /// Only this environment's
    #[arg(long)]
    environment: Option<String>,
    /// Only this type of fact (preference, fact, relationship, …)
    #[arg(long = "type")]
    kind: Option<String>,
    /// Only this subject
    #[arg(long)]
    key: Option<String>,
}

impl ScopeFilter {
    fn filter(&self) -> MemoryFilter {
        let c = self.clone();
        filter(c.user, c.project, c.environment, c.kind, c.key)
    }
}

#[derive(Args, Debug)]
pub struct MemoryArgs {
    #[command(subcommand)]
    cmd: MemoryCmd,
}

#[derive(Subcommand, Debug)]
enum MemoryCmd {
    /// Store one memory; a cluster it brings to the minimum (or changes) is summarized now.
    Add {
        /// The fact
        text: String,
        /// Whose memory
        #[arg(long)]
        user: String,
        /// The project
        #[arg(long, default_value = "")]
        project: String,
        /// The environment
        #[arg(long, default_value = "")]
        environment: String,
        /// The type of fact (preference, fact, relationship, …)
        #[arg(long = "type", default_value = abridge_app::memories::DEFAULT_TYPE)]
        kind: String,
        /// The subject (a person, topic or entity); related facts cluster by meaning within it
        #[arg(long, default_value = abridge_app::memories::DEFAULT_KEY)]
        key: String,
        /// 0 to 1 [default: the engine's, 0.5]
        #[arg(long)]
        importance: Option<f32>,
        /// A client id: writing it again is a no-op
        #[arg(long)]
        id: Option<String>,
        /// The id of a memory this one replaces (kept, marked); without it a fact that
        /// changes ("I moved to Lyon" after "I live in Porto") replaces the earlier one itself
        #[arg(long)]
        replaces: Option<String>,
    },
    /// Store many memories from JSON lines ({"user", "text", "type"?, "key"?, "project"?,
    /// "environment"?, "importance"?, "id"?, "replaces"?}) in FILE, or stdin with '-'.
    Import {
        /// The file
        file: String,
    },
    /// List memories (oldest first).
    List {
        #[command(flatten)]
        scope: ScopeFilter,
        /// Most to list
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print JSON lines
        #[arg(long)]
        json: bool,
    },
    /// Show one memory.
    Show {
        /// Its id
        id: String,
    },
    /// Delete a memory; a summary that covered it is deleted and rebuilt from the rest.
    Delete {
        /// Its id
        id: String,
    },
}

#[derive(Args, Debug)]
pub struct RecallArgs {
    /// What to recall
    query: String,
    #[command(flatten)]
    scope: ScopeFilter,
    /// How many results
    #[arg(short, long, default_value_t = 5)]
    k: u32,
    /// Rank by the exact scan of every matching vector instead of the approximate index
    /// (slower on a large tenant; what the index is measured against)
    #[arg(long)]
    exact: bool,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ClustersArgs {
    #[command(subcommand)]
    cmd: ClustersCmd,
}

#[derive(Subcommand, Debug)]
enum ClustersCmd {
    /// List clusters with their members and summary.
    List {
        #[command(flatten)]
        scope: ScopeFilter,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Summarize every cluster whose summary is missing, stale or failed, once.
    Sweep {
        /// Most clusters per user and project in this run
        #[arg(long, default_value_t = 20)]
        per_scope: usize,
    },
    /// Show a cluster summary and its sources.
    Show {
        /// The summary id
        id: u64,
    },
}

/// A number from the environment; `None` when unset or empty.
fn env_number<T: std::str::FromStr>(name: &str) -> Result<Option<T>, Failure> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().map(Some).map_err(|_| {
            Failure::new(
                Exit::Input,
                anyhow!("{name}='{v}' is not a valid number; unset it or give one"),
            )
        }),
        _ => Ok(None),
    }
}

/// The master key from ABRIDGE_MASTER_KEY_FILE (a file holding 64 hex digits) or
/// ABRIDGE_MASTER_KEY; `None` when neither is set.
pub fn master_key() -> Result<Option<abridge_app::Secret>, Failure> {
    let bad = |what: String| Failure::new(Exit::Input, anyhow!(what));
    if let Some(path) = std::env::var_os("ABRIDGE_MASTER_KEY_FILE").filter(|p| !p.is_empty()) {
        let text = std::fs::read_to_string(&path).map_err(|e| {
            bad(format!(
                "cannot read the master key file {} (ABRIDGE_MASTER_KEY_FILE): {e}",
                std::path::Path::new(&path).display()
            ))
        })?;
        return abridge_app::Secret::from_hex(&text)
            .map(Some)
            .map_err(|e| bad(format!("ABRIDGE_MASTER_KEY_FILE: {e}")));
    }
    match std::env::var("ABRIDGE_MASTER_KEY") {
        Ok(v) if !v.trim().is_empty() => abridge_app::Secret::from_hex(&v)
            .map(Some)
            .map_err(|e| bad(format!("ABRIDGE_MASTER_KEY: {e}"))),
        _ => Ok(None),
    }
}

/// The monthly ceiling from ABRIDGE_MONTHLY_TOKENS and/or ABRIDGE_MONTHLY_COST (with
/// ABRIDGE_PRICE_INPUT and ABRIDGE_PRICE_OUTPUT, per million tokens); `None` when neither
/// limit is set.
pub fn ceiling() -> Result<Option<abridge_app::Ceiling>, Failure> {
    let tokens: Option<u64> = env_number("ABRIDGE_MONTHLY_TOKENS")?;
    let cost: Option<f64> = env_number("ABRIDGE_MONTHLY_COST")?;
    let price_input: f64 = env_number("ABRIDGE_PRICE_INPUT")?.unwrap_or(0.0);
    let price_output: f64 = env_number("ABRIDGE_PRICE_OUTPUT")?.unwrap_or(0.0);
    if cost.is_some() && price_input == 0.0 && price_output == 0.0 {
        return Err(Failure::new(
            Exit::Input,
            anyhow!(
                "ABRIDGE_MONTHLY_COST needs prices: set ABRIDGE_PRICE_INPUT and ABRIDGE_PRICE_OUTPUT (per million tokens)"
            ),
        ));
    }
    if tokens.is_none() && cost.is_none() {
        return Ok(None);
    }
    Ok(Some(abridge_app::Ceiling {
        tokens,
        cost,
        price_input,
        price_output,
    }))
}

/// `abridge usage`: this month's model usage for cluster summaries, against the ceiling.
pub async fn usage_cmd(s: &Settings, a: UsageArgs) -> Result<(), Failure> {
    let local = super::app::local_read(s)?;
    let u = local.usage().await.map_err(|e| fail(s, e))?;
    if a.json {
        println!("{}", serde_json::to_string(&u).expect("serialize"));
        return Ok(());
    }
    let limit = match (u.limit_tokens, u.limit_cost) {
        (Some(t), Some(c)) => format!(" of {t} tokens or {c:.2}"),
        (Some(t), None) => format!(" of {t} tokens"),
        (None, Some(c)) => format!(" of {c:.2}"),
        (None, None) => " (no ceiling)".into(),
    };
    println!(
        "{}: {} model calls, {} prompt + {} output tokens, cost {:.4}{limit}{}",
        u.month,
        u.calls,
        u.prompt_tokens,
        u.output_tokens,
        u.cost,
        if u.exhausted {
            " — reached: clusters are not summarized until the month ends"
        } else {
            ""
        }
    );
    Ok(())
}

#[derive(Args, Debug)]
pub struct UsageArgs {
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Say once per database that memory text is stored unencrypted: the first write without a
/// master key says it and leaves a mark beside the database (`abridge.db.plaintext-noted`),
/// so later calls stay quiet.
fn warn_plaintext(s: &Settings, local: &Scoped) {
    if local.sealed() {
        return;
    }
    let warning = "warning: no master key is set, so memory text is stored unencrypted (marked as such); set ABRIDGE_MASTER_KEY_FILE to a file made with 'abridge keys new' to encrypt it";
    // (A PostgreSQL database has no folder beside it: there it is said on every write.)
    if abridge_app::db::is_url(&s.db.to_string_lossy()) {
        note(s, warning);
        return;
    }
    let mut mark = s.db.clone().into_os_string();
    mark.push(".plaintext-noted");
    let mark = std::path::PathBuf::from(mark);
    if mark.exists() {
        return;
    }
    note(s, &format!("{warning} (said once for this database)"));
    let _ = std::fs::write(
        &mark,
        "abridge said once that this database's memories are stored unencrypted (no master key was set)\n",
    );
}

/// The embedding backend for memories: `ABRIDGE_EMBED_MODEL` names a model on the Ollama
/// server (`ABRIDGE_EMBED_URL`, default the model URL), or with `ABRIDGE_EMBED_API=openai` on
/// the OpenAI-compatible server (OPENAI_BASE_URL, OPENAI_API_KEY). Unset: the offline
/// lexical embedder in the guest.
pub fn embedder(
    s: &Settings,
) -> Result<Option<std::sync::Arc<dyn abridge_backend::embedding::Embedder>>, Failure> {
    use abridge_backend::embedding::{EmbedApi, ServerEmbedder};
    let Some(model) = std::env::var("ABRIDGE_EMBED_MODEL")
        .ok()
        .filter(|m| !m.trim().is_empty())
    else {
        return Ok(None);
    };
    let (api, base, key) = match std::env::var("ABRIDGE_EMBED_API").as_deref() {
        Ok("openai") => (
            EmbedApi::OpenAi,
            s.openai_base_url.clone(),
            s.openai_api_key.clone(),
        ),
        Ok("ollama") | Ok("") | Err(_) => (
            EmbedApi::Ollama,
            std::env::var("ABRIDGE_EMBED_URL").unwrap_or_else(|_| s.url.clone()),
            None,
        ),
        Ok(other) => {
            return Err(Failure::new(
                Exit::Input,
                anyhow!("ABRIDGE_EMBED_API='{other}' is not known; use 'ollama' or 'openai'"),
            ));
        }
    };
    let e = ServerEmbedder::new(api, &base, key, model.trim(), s.timeout)
        .map_err(|e| {
            Failure::new(
                Exit::Input,
                anyhow!("{}", abridge_app::engine::types::describe(&e)),
            )
        })?
        .with_retry(s.retry);
    Ok(Some(std::sync::Arc::new(e)))
}

/// Memory settings from the environment: SUMMARY_CLUSTER_MIN_SIMILARITY,
/// SUMMARY_MIN_CLUSTER_ITEMS, SUMMARY_MIN_CENTROID_SIMILARITY, SUMMARY_PROMPT_BUDGET.
pub fn memory_config() -> Result<MemoryConfig, Failure> {
    let mut c = MemoryConfig::default();
    if let Some(v) = env_number("SUMMARY_CLUSTER_MIN_SIMILARITY")? {
        c.min_similarity = v;
    }
    if let Some(v) = env_number("SUMMARY_MIN_CLUSTER_ITEMS")? {
        c.min_cluster_items = v;
    }
    if let Some(v) = env_number("SUMMARY_MIN_CENTROID_SIMILARITY")? {
        c.summary_min_similarity = v;
    }
    if let Some(v) = env_number("SUMMARY_PROMPT_BUDGET")? {
        c.prompt_budget = v;
    }
    Ok(c)
}

fn show_memory(m: &MemoryView) -> String {
    format!(
        "{}  [{} / {} / {} / {} / {}]  importance {:.2}  cluster {}\n  {}",
        m.id,
        m.user,
        if m.project.is_empty() {
            "-"
        } else {
            &m.project
        },
        if m.environment.is_empty() {
            "-"
        } else {
            &m.environment
        },
        m.kind,
        m.key,
        m.importance,
        m.cluster,
        m.text
    ) + &succession(
        m.supersedes.as_deref(),
        m.superseded_by.as_deref(),
        m.superseded_ms,
    )
}

/// A memory's place in its fact's history, as a line more (empty when it has none).
fn succession(supersedes: Option<&str>, by: Option<&str>, ms: Option<u64>) -> String {
    let mut out = String::new();
    if let Some(by) = by {
        out.push_str(&format!(
            "\n  no longer current: replaced by {by} on {}",
            abridge_app::memories::day_of(ms.unwrap_or(0))
        ));
    }
    if let Some(old) = supersedes {
        out.push_str(&format!("\n  replaced {old}"));
    }
    out
}

/// Say how the clusters a write or delete left due were summarized here.
fn said(s: &Settings, outcomes: Vec<(u64, Result<Option<ClusterOutcome>, AppError>)>) {
    for (c, r) in outcomes {
        match r {
            Ok(Some(o)) => {
                let what = action_name(o.action);
                match &o.summary {
                    Some(sum) => note(
                        s,
                        &format!(
                            "cluster {c}: summary {} {what} from {} memories ({} model calls)",
                            sum.id, sum.covered, o.calls
                        ),
                    ),
                    None => note(s, &format!("cluster {c}: {what}")),
                }
            }
            Ok(None) => note(s, &format!("cluster {c}: another worker is summarizing it")),
            Err(e) => note(
                s,
                &format!(
                    "cluster {c}: summary not made: {} — the memories are stored; 'abridge clusters sweep' retries",
                    e.message
                ),
            ),
        }
    }
}

/// The refusal of a write's summaries (the tenant's ceiling), said; the memories are stored.
fn refused(s: &Settings, w: &Written) {
    if let Some(e) = &w.refused {
        note(
            s,
            &format!(
                "no cluster summarized: {} — the memories are stored",
                e.message
            ),
        );
    }
}

fn parse_line(line: &str, n: usize) -> Result<MemoryInput, String> {
    serde_json::from_str(line).map_err(|e| {
        format!(
            "line {n}: {e} (one JSON object a line: user, type, key and text, with project, environment, id, importance and replaces optional)"
        )
    })
}

pub async fn memory_cmd(s: &Settings, a: MemoryArgs) -> Result<(), Failure> {
    match a.cmd {
        MemoryCmd::Add {
            text,
            user,
            project,
            environment,
            kind,
            key,
            importance,
            id,
            replaces,
        } => {
            let backend = choose_backend(s).await?;
            let local = super::app::local(s, Some(&backend))?;
            warn_plaintext(s, &local);
            let w = local
                .remember(
                    vec![MemoryInput {
                        id,
                        user,
                        project,
                        environment,
                        kind,
                        key,
                        text,
                        importance,
                        replaces,
                    }],
                    Summaries::Now,
                )
                .await
                .map_err(|e| fail(s, e))?;
            for m in &w.memories {
                println!(
                    "{}  cluster {} ({} memories){}{}",
                    m.id,
                    m.cluster,
                    m.members,
                    if m.created { "" } else { "  already stored" },
                    m.supersedes.as_ref().map_or(String::new(), |o| format!(
                        "  replaces {o} (kept, marked as no longer current)"
                    ))
                );
            }
            refused(s, &w);
            said(s, w.outcomes);
        }
        MemoryCmd::Import { file } => {
            let reader: Box<dyn BufRead> = if file == "-" {
                Box::new(std::io::stdin().lock())
            } else {
                Box::new(std::io::BufReader::new(
                    std::fs::File::open(&file).map_err(|e| {
                        Failure::new(Exit::Input, anyhow!("cannot read {file}: {e}"))
                    })?,
                ))
            };
            let mut items = Vec::new();
            for (i, line) in reader.lines().enumerate() {
                let line = line.map_err(|e| {
                    Failure::new(
                        Exit::Input,
                        anyhow!(
                            "{file}: line {}: {e} (the file must be UTF-8 JSON lines)",
                            i + 1
                        ),
                    )
                })?;
                if line.trim().is_empty() {
                    continue;
                }
                items.push(
                    parse_line(&line, i + 1)
                        .map_err(|e| Failure::new(Exit::Input, anyhow!("{file}: {e}")))?,
                );
            }
            if items.is_empty() {
                return Err(Failure::new(
                    Exit::Input,
                    anyhow!("{file} holds no memories; give one JSON object per line"),
                ));
            }
            let backend = choose_backend(s).await?;
            let local = super::app::local(s, Some(&backend))?;
            warn_plaintext(s, &local);
            let total = items.len();
            let w = local
                .remember(items, Summaries::Now)
                .await
                .map_err(|e| fail(s, e))?;
            let stored = w.memories.iter().filter(|m| m.created).count();
            let replaced = w.memories.iter().filter(|m| m.supersedes.is_some()).count();
            println!(
                "{stored} of {total} memories stored ({} already were; {replaced} replaced an earlier memory, kept and marked)",
                total - stored
            );
            refused(s, &w);
            said(s, w.outcomes);
        }
        MemoryCmd::List { scope, limit, json } => {
            let local = super::app::local_read(s)?;
            let (rows, total) = local
                .memories(&scope.filter(), 0, limit)
                .await
                .map_err(|e| fail(s, e))?;
            for m in &rows {
                if json {
                    println!("{}", serde_json::to_string(m).expect("memories serialize"));
                } else {
                    println!("{}", show_memory(m));
                }
            }
            if !json && total > rows.len() {
                note(s, &format!("{} of {total} shown (--limit)", rows.len()));
            }
        }
        MemoryCmd::Show { id } => {
            let local = super::app::local_read(s)?;
            let m = local.memory(&id).await.map_err(|e| not_found(s, e))?;
            println!("{}", show_memory(&m));
        }
        MemoryCmd::Delete { id } => {
            let backend = choose_backend(s).await?;
            let local = super::app::local(s, Some(&backend))?;
            let f = local
                .forget(&id, Summaries::Now)
                .await
                .map_err(|e| not_found(s, e))?;
            println!(
                "memory {id} deleted{}",
                if f.summary_deleted {
                    format!(
                        "; the summary of cluster {} that covered it was deleted",
                        f.cluster
                    )
                } else {
                    String::new()
                }
            );
            said(s, f.outcomes);
        }
    }
    Ok(())
}

fn not_found(s: &Settings, e: AppError) -> Failure {
    if e.kind == abridge_app::ErrorKind::NotFound {
        return super::app::not_found_in(s, &e.message, "abridge memory list");
    }
    fail(s, e)
}

pub async fn recall_cmd(s: &Settings, a: RecallArgs) -> Result<(), Failure> {
    let local = super::app::local_read(s)?;
    let mut f = a.scope.filter();
    f.exact = a.exact;
    let r = local
        .recall(&a.query, &f, a.k)
        .await
        .map_err(|e| fail(s, e))?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({ "results": r })).expect("serialize")
        );
        return Ok(());
    }
    if r.is_empty() {
        note(s, "nothing recalled (no memories match the scope)");
    }
    for x in &r {
        let sources = if x.sources.is_empty() {
            String::new()
        } else {
            format!("  sources: {}", x.sources.join(", "))
        };
        println!(
            "{:.3}  {} {}{sources}\n  {}{}",
            x.score,
            x.kind,
            x.id,
            x.text,
            succession(None, x.superseded_by.as_deref(), x.superseded_ms)
        );
    }
    Ok(())
}

fn show_cluster(c: &ClusterView) -> String {
    format!(
        "cluster {}  [{} / {} / {} / {} / {}]  {} memories: {}  summary: {}{}",
        c.id,
        c.user,
        if c.project.is_empty() {
            "-"
        } else {
            &c.project
        },
        if c.environment.is_empty() {
            "-"
        } else {
            &c.environment
        },
        c.kind,
        c.key,
        c.members.len(),
        c.members.join(", "),
        c.summary.map_or("none".into(), |x| x.to_string()),
        c.note
            .as_ref()
            .map_or(String::new(), |n| format!("  ({n})"))
    )
}

pub async fn clusters_cmd(s: &Settings, a: ClustersArgs) -> Result<(), Failure> {
    match a.cmd {
        ClustersCmd::List { scope, json } => {
            let local = super::app::local_read(s)?;
            let list = local
                .clusters(&scope.filter())
                .await
                .map_err(|e| fail(s, e))?;
            for c in &list {
                if json {
                    println!("{}", serde_json::to_string(c).expect("serialize"));
                } else {
                    println!("{}", show_cluster(c));
                }
            }
        }
        ClustersCmd::Sweep { per_scope } => {
            let backend = choose_backend(s).await?;
            let local = super::app::local(s, Some(&backend))?;
            let r = local.sweep(per_scope).await.map_err(|e| fail(s, e))?;
            println!(
                "{} clusters looked at: {} summaries written, {} deleted, {} failed, {} held by another worker, {} left for the next run ({} model calls, {} prompt tokens)",
                r.clusters,
                r.written,
                r.deleted,
                r.failed,
                r.busy,
                r.deferred,
                r.calls,
                r.prompt_tokens
            );
            if r.failed > 0 {
                return Err(Failure::new(
                    Exit::Model,
                    anyhow!(
                        "{} cluster summaries failed; 'abridge clusters list' shows why",
                        r.failed
                    ),
                ));
            }
        }
        ClustersCmd::Show { id } => {
            let local = super::app::local_read(s)?;
            let sum = local.cluster_summary(id).await.map_err(|e| fail(s, e))?;
            let sources = local.summary_sources(id).await.map_err(|e| fail(s, e))?;
            println!(
                "summary {} of cluster {} ({}, {} model calls)\n{}\n\nsources:",
                sum.id, sum.cluster, sum.model, sum.calls, sum.text
            );
            for m in &sources {
                println!("{}", show_memory(m));
            }
        }
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct KeysArgs {
    #[command(subcommand)]
    cmd: KeysCmd,
}

#[derive(Subcommand, Debug)]
enum KeysCmd {
    /// Print a new random master key (64 hex digits) for ABRIDGE_MASTER_KEY_FILE.
    New,
    /// Re-wrap every tenant's data keys under a new master key (the current one comes from
    /// ABRIDGE_MASTER_KEY_FILE); text is re-sealed under fresh data keys as it is rewritten.
    Rotate {
        /// A file holding the new master key (from 'abridge keys new')
        #[arg(long)]
        new_key_file: std::path::PathBuf,
    },
}

pub async fn keys_cmd(s: &Settings, a: KeysArgs) -> Result<(), Failure> {
    match a.cmd {
        KeysCmd::New => {
            let k = abridge_app::Secret::random()
                .map_err(|e| Failure::new(Exit::Internal, anyhow!("{e}")))?;
            println!("{}", k.to_hex());
        }
        KeysCmd::Rotate { new_key_file } => {
            let current = master_key()?.ok_or_else(|| {
                Failure::new(
                    Exit::Input,
                    anyhow!("set ABRIDGE_MASTER_KEY_FILE to the current master key first; rotation needs the old key and the new one"),
                )
            })?;
            let text = std::fs::read_to_string(&new_key_file).map_err(|e| {
                Failure::new(
                    Exit::Input,
                    anyhow!("cannot read {}: {e}", new_key_file.display()),
                )
            })?;
            let new = abridge_app::Secret::from_hex(&text).map_err(|e| {
                Failure::new(Exit::Input, anyhow!("{}: {e}", new_key_file.display()))
            })?;
            let rotated = abridge_app::db::rotate_master_key(&s.db, current, &new).await;
            let n = rotated.map_err(|e| {
                Failure::new(
                    Exit::Storage,
                    anyhow!("{}", abridge_app::engine::types::describe(&e)),
                )
            })?;
            println!(
                "{n} tenants' data keys re-wrapped under the new master key; point ABRIDGE_MASTER_KEY_FILE at {} from now on",
                new_key_file.display()
            );
        }
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct TenantsArgs {
    #[command(subcommand)]
    cmd: TenantsCmd,
}

#[derive(Subcommand, Debug)]
enum TenantsCmd {
    /// Delete a tenant: its sessions, memories, cluster summaries, usage and data keys, and
    /// revoke its tokens. Sealed text of it kept anywhere else can no longer be read.
    Delete {
        /// The tenant
        name: String,
        /// Confirm: this cannot be undone
        #[arg(long)]
        yes: bool,
    },
}

pub async fn tenants_cmd(s: &Settings, a: TenantsArgs) -> Result<(), Failure> {
    match a.cmd {
        TenantsCmd::Delete { name, yes } => {
            let t = abridge_app::Tenant::new(&name)
                .map_err(|e| Failure::new(Exit::Input, anyhow!(e)))?;
            if !yes {
                return Err(Failure::new(
                    Exit::Input,
                    anyhow!("deleting tenant '{t}' cannot be undone; pass --yes to confirm"),
                ));
            }
            let app = super::app::open_local(s, None)?;
            let d = app
                .tenant(&t)
                .delete_tenant()
                .await
                .map_err(|e| fail(s, e))?;
            println!(
                "tenant '{t}' deleted: {} sessions, {} memories, {} tokens revoked; its data keys are destroyed",
                d.sessions, d.memories, d.tokens
            );
        }
    }
    Ok(())
}
