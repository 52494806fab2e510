//! abridge's MCP server: a thin shell over the app layer ([`abridge_app::Scoped`]) for coding
//! agents, with the official Rust SDK (`rmcp`). Seven tools, each described so an agent calls
//! it unprompted; every result fits the `budget_tokens` it is given; a bad argument is a tool
//! error that says how to fix it (never a protocol error).
//!
//! Over stdio (`abridge mcp`) every call acts for the local database's default tenant. Over
//! Streamable HTTP (`/mcp` on `abridge serve`) the server's own edge authenticates the request
//! first (the same tokens as the HTTP API, the Host and Origin checks) and hands the tenant's
//! [`Scoped`] to the tool in the request's extensions: a session of another tenant is not
//! found, as everywhere else.

use std::sync::Arc;

use abridge_app::memories::{MemoryInput, Summaries};
use abridge_app::{AppError, ContextAsk, ErrorKind, Scoped};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

pub use rmcp;

/// Default and largest `budget_tokens` of a tool result.
const DEFAULT_BUDGET: u32 = 2_000;
const MAX_BUDGET: u32 = 20_000;

/// What the server tells an agent about itself at initialization.
const INSTRUCTIONS: &str = "abridge keeps exact, provenance-linked summaries of your coding sessions (Claude Code, Codex) and of any conversation, outside your context window, so nothing is lost when you compact. Call `context` at the start of a task or after a compaction to get back what the session asked for, the files it edited, the commands it ran and the pinned rules. Call `context` with `query` set to what you are about to do to get the earlier messages about it too. Call `search` to find earlier sessions and the exact messages about a topic, file path or error, and `expand` to read the exact messages behind a summary line. `remember`/`recall`/`forget` keep durable facts (decisions, preferences, conventions) across sessions.";

/// Where tools find the tenant they act for.
#[derive(Clone)]
enum Tenancy {
    /// One tenant for every call (stdio).
    Fixed(Scoped),
    /// The tenant the HTTP edge authenticated, in the request's extensions.
    PerRequest,
}

/// The MCP server.
#[derive(Clone)]
pub struct AbridgeMcp {
    tenancy: Arc<Tenancy>,
    /// The project a memory belongs to when `remember` names none: the folder the agent
    /// started the server in (stdio), as the hooks name it, so the next session's start
    /// there shows it. None over HTTP (a shared server has no folder of the agent's).
    project: Option<String>,
}

impl AbridgeMcp {
    /// A server whose every call acts for `scoped` (stdio), in the agent's folder `cwd`.
    pub fn fixed(scoped: Scoped, cwd: Option<&std::path::Path>) -> Self {
        AbridgeMcp {
            tenancy: Arc::new(Tenancy::Fixed(scoped)),
            project: cwd.map(|c| abridge_app::hook::project_key(&c.to_string_lossy())),
        }
    }

    /// A server that acts for the tenant the HTTP edge put in each request's extensions.
    pub fn per_request() -> Self {
        AbridgeMcp {
            tenancy: Arc::new(Tenancy::PerRequest),
            project: None,
        }
    }

    /// The project a tool's `project` argument names (see `hook::project_named`); none
    /// given, the server's own.
    fn project(&self, given: Option<&str>) -> Option<String> {
        given
            .and_then(abridge_app::hook::project_named)
            .or_else(|| self.project.clone())
    }

    fn scoped(&self, ctx: &RequestContext<RoleServer>) -> Result<Scoped, ErrorData> {
        match &*self.tenancy {
            Tenancy::Fixed(s) => Ok(s.clone()),
            Tenancy::PerRequest => ctx
                .extensions
                .get::<http::request::Parts>()
                .and_then(|p| p.extensions.get::<Scoped>())
                .cloned()
                .ok_or_else(|| {
                    ErrorData::internal_error("the request carries no authenticated tenant", None)
                }),
        }
    }
}

/// A tool error: the message and its hint, as text the agent reads.
fn tool_error(e: AppError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(error_text(&e))])
}

/// Why a tool's body stopped early: a tool error, which the model reads and may act on (an
/// app error, or an argument it can fix), or a protocol error (no tenant on the request).
enum Stop {
    Tool(CallToolResult),
    Protocol(ErrorData),
}

impl From<AppError> for Stop {
    fn from(e: AppError) -> Stop {
        Stop::Tool(tool_error(e))
    }
}

impl From<CallToolResult> for Stop {
    fn from(r: CallToolResult) -> Stop {
        Stop::Tool(r)
    }
}

impl From<ErrorData> for Stop {
    fn from(e: ErrorData) -> Stop {
        Stop::Protocol(e)
    }
}

/// A tool body's result as the protocol answers it: a tool error is an answer.
fn answered(r: Result<CallToolResult, Stop>) -> Result<CallToolResult, ErrorData> {
    match r {
        Ok(answer) | Err(Stop::Tool(answer)) => Ok(answer),
        Err(Stop::Protocol(e)) => Err(e),
    }
}

/// A tool error's text: the app's message, its hint, and what lists the kind of thing not
/// found.
fn error_text(e: &AppError) -> String {
    let mut text = e.message.clone();
    if let Some(h) = &e.hint {
        text.push_str(" — ");
        text.push_str(h);
    }
    // What lists the kind of thing not found: memories by `recall`, sessions by `search`.
    if matches!(e.kind, ErrorKind::NotFound) {
        if e.message.contains("memory") || e.message.contains("cluster") {
            if !text.contains("`recall`") {
                text.push_str(" (`recall` finds memories)");
            }
        } else if e.message.contains("session") && !text.contains("`search`") {
            text.push_str(" (`search` finds sessions)");
        }
    }
    text
}

fn bad(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

/// A `budget_tokens` argument, or the tool error that says what to give.
fn budget_of(given: Option<u32>) -> Result<u32, CallToolResult> {
    let b = given.unwrap_or(DEFAULT_BUDGET);
    if (64..=MAX_BUDGET).contains(&b) {
        Ok(b)
    } else {
        Err(bad(format!(
            "budget_tokens {b} is out of range; give 64 to {MAX_BUDGET} (default {DEFAULT_BUDGET})"
        )))
    }
}

/// `text` within `budget` tokens (about four characters each), cut at a line, saying so.
fn fit(text: String, budget: Option<u32>) -> Result<String, CallToolResult> {
    let b = budget_of(budget)?;
    let max = b as usize * 4;
    if text.chars().count() <= max {
        return Ok(text);
    }
    let cut: String = text.chars().take(max).collect();
    let at = cut
        .rfind('\n')
        .filter(|&i| i > max / 2)
        .unwrap_or(cut.len());
    Ok(format!(
        "{}\n(cut to fit budget_tokens {b}; ask with a larger budget_tokens for more)",
        &cut[..at]
    ))
}

fn ok(text: String, budget: Option<u32>) -> CallToolResult {
    match fit(text, budget) {
        Ok(t) => CallToolResult::success(vec![ContentBlock::text(t)]),
        Err(e) => e,
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextArgs {
    /// The session: its id or a unique prefix of it (a Claude Code session is its session id).
    /// Leave out for the most recently active session.
    #[serde(default)]
    #[schemars(with = "String")]
    pub session: Option<String>,
    /// Most tokens the answer may take (64 to 20000; default 2000).
    #[serde(default)]
    #[schemars(with = "u32", range(min = 64, max = 20_000))]
    pub budget_tokens: Option<u32>,
    /// What you are about to work on or were asked (usually the user's newest message): the
    /// earlier messages that best match it are included verbatim, with their numbers.
    #[serde(default)]
    #[schemars(with = "String")]
    pub query: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// Words to look for: a topic, a file path, a command, an error, an id.
    pub query: String,
    /// Only this session's messages (its id or a unique prefix); leave out to search every
    /// session.
    #[serde(default)]
    #[schemars(with = "String")]
    pub session: Option<String>,
    /// Most messages (and sessions) to list (1 to 50; default 10).
    #[serde(default)]
    #[schemars(with = "u32", range(min = 1, max = 50))]
    pub limit: Option<u32>,
    /// Most tokens the answer may take (64 to 20000; default 2000).
    #[serde(default)]
    #[schemars(with = "u32", range(min = 64, max = 20_000))]
    pub budget_tokens: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpandArgs {
    /// The session: its id or a unique prefix of it.
    pub session: String,
    /// A summary row's id (from `context` or `search`): its exact messages.
    #[serde(default)]
    #[schemars(with = "u64")]
    pub row: Option<u64>,
    /// An episode number (the `#N` of a digest or ledger line): that message and the two
    /// around it.
    #[serde(default)]
    #[schemars(with = "u64")]
    pub episode: Option<u64>,
    /// With `row`: only the message this ledger identifier was last seen in.
    #[serde(default)]
    #[schemars(with = "String")]
    pub identifier: Option<String>,
    /// Most tokens the answer may take (64 to 20000; default 2000).
    #[serde(default)]
    #[schemars(with = "u32", range(min = 64, max = 20_000))]
    pub budget_tokens: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecallArgs {
    /// What you want to know ("how do we deploy", "the user's test conventions").
    pub query: String,
    /// Only memories of this project: its folder's path or a name (default: every project).
    #[serde(default)]
    #[schemars(with = "String")]
    pub project: Option<String>,
    /// Most memories (1 to 50; default 8).
    #[serde(default)]
    #[schemars(with = "u32", range(min = 1, max = 50))]
    pub k: Option<u32>,
    /// Most tokens the answer may take (64 to 20000; default 2000).
    #[serde(default)]
    #[schemars(with = "u32", range(min = 64, max = 20_000))]
    pub budget_tokens: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RememberArgs {
    /// The fact, in one or two sentences ("Releases are cut from the release/* branches").
    pub text: String,
    /// The project it belongs to: its folder's path (`/home/me/shop`) or a name (default:
    /// the folder the agent runs in, so the next session there starts with it).
    #[serde(default)]
    #[schemars(with = "String")]
    pub project: Option<String>,
    /// What kind of fact: preference, decision, convention, fact, … (default: fact).
    #[serde(default)]
    #[schemars(with = "String")]
    pub kind: Option<String>,
    /// Its subject: a person, a component, a topic (default: general).
    #[serde(default)]
    #[schemars(with = "String")]
    pub key: Option<String>,
    /// The id of a memory this one replaces (from `recall`), kept as history. Without it, a
    /// fact that changes ("the user moved to Lyon" after "the user lives in Porto") replaces
    /// the earlier one by itself.
    #[serde(default)]
    #[schemars(with = "String")]
    pub replaces: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForgetArgs {
    /// The memory's id (from `recall` or `remember`).
    pub id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PinArgs {
    /// The session: its id or a unique prefix of it.
    pub session: String,
    /// The episode to pin (the `#N` of a message): pinned messages are in every context
    /// verbatim, so a rule the user set survives every compaction.
    pub episode: u64,
    /// Unpin it instead.
    #[serde(default)]
    #[schemars(with = "bool")]
    pub unpin: Option<bool>,
    /// `project` pins it to the session's project (it then opens every new session there),
    /// `session` (the default) to this session.
    #[serde(default)]
    #[schemars(with = "String")]
    pub scope: Option<String>,
}

/// The user memories are kept for over MCP (one user per tenant).
const MCP_USER: &str = abridge_app::hook::AGENT_USER;

#[tool_router]
impl AbridgeMcp {
    #[tool(
        name = "context",
        description = "Get back what a coding session has done so far, from outside your context window: its summary, the digest (the user's requests verbatim, the files it edited, the commands it ran and the last unresolved error, the to-do list), the identifiers it mentioned, the pinned messages and the latest turns — within budget_tokens. Call it at the start of a task and after every compaction. Without `session`, the most recently active session."
    )]
    async fn context(
        &self,
        Parameters(a): Parameters<ContextArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answered(async {
            let s = self.scoped(&ctx)?;
            let budget = budget_of(a.budget_tokens)?;
            let session = match &a.session {
                Some(name) => s.resolve(name).await?,
                None => s.session_ids().await?.into_iter().next().ok_or_else(|| {
                    bad("there are no sessions yet; import one (abridge backfill, abridge watch or the hooks of abridge setup)")
                })?,
            };
            // The answer's own framing takes a little of the budget.
            let v = s
                .context(
                    &session,
                    ContextAsk {
                        pairs: 2,
                        refresh_after: u32::MAX,
                        query: a.query.as_deref(),
                        ..ContextAsk::new(budget.saturating_sub(40).max(32))
                    },
                )
                .await?;
            let covers = if v.covered == 0 {
                "no summary covers any message yet".to_string()
            } else {
                format!("the summary covers messages 1-{}", v.covered)
            };
            let mut text = format!(
                "Session {session} (~{} tokens of history; {covers}). This context: {} of {} tokens ({}); stable until the next fold: the first {} of {} messages ({} characters).\n",
                v.full_tokens,
                v.tokens,
                v.budget,
                v.parts.describe(),
                v.stable.messages,
                v.messages.len(),
                v.stable.chars
            );
            text.push_str(&abridge_app::hook::context_text(&v));
            // Where the facts the context shows come from: each fact's episodes (`expand`
            // with `episode` reads one).
            let facts = s.facts(&session).await?;
            if !facts.is_empty() {
                let sources: Vec<String> = facts
                    .iter()
                    .map(|f| {
                        let eps: Vec<String> = f
                            .values
                            .iter()
                            .map(|x| format!("#{}", x.episode))
                            .chain(f.ended.as_ref().map(|e| format!("#{}", e.episode)))
                            .collect();
                        format!("{} {} {}", f.who, f.key, eps.join(" "))
                    })
                    .collect();
                text.push_str(&format!(
                    "\nWhere the facts come from (call expand with episode to read one): {}\n",
                    sources.join(" · ")
                ));
            }
            Ok(ok(text, Some(budget)))
        }
        .await)
    }

    #[tool(
        name = "search",
        description = "Search earlier sessions (coding sessions and conversations): the sessions whose id, summary, requests, file paths or commands hold the words, and the exact messages that best match them (full-text, every message) — e.g. a file you are about to change, an error, or a topic the user mentions. Each message comes with its session and number; call `expand` with `episode` to read it with its neighbours, or `context` on its session."
    )]
    async fn search(
        &self,
        Parameters(a): Parameters<SearchArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answered(async {
            let s = self.scoped(&ctx)?;
            let limit = a.limit.unwrap_or(10);
            if !(1..=50).contains(&limit) {
                return Err(bad(format!("limit {limit} is out of range; give 1 to 50")).into());
            }
            let session = match &a.session {
                Some(name) => Some(s.resolve(name).await?),
                None => None,
            };
            let sessions = match &session {
                Some(_) => Vec::new(),
                None => s.search_sessions(&a.query, limit as usize).await?,
            };
            let found = s.search(&a.query, session.as_deref(), 0, limit).await?;
            if sessions.is_empty() && found.hits.is_empty() {
                return Ok(ok(
                    format!("Nothing matches \"{}\". Try fewer or other words.", a.query),
                    a.budget_tokens,
                ));
            }
            let mut text = String::new();
            if !sessions.is_empty() {
                text.push_str(&format!(
                    "{} session(s) match \"{}\":\n",
                    sessions.len(),
                    a.query
                ));
                for h in sessions {
                    text.push_str(&format!(
                        "- {} ({} messages, {} summarized): {}\n",
                        h.session, h.episodes, h.covered, h.matched
                    ));
                }
            }
            if !found.hits.is_empty() {
                text.push_str(&format!(
                    "Messages that best match \"{}\" (best first; expand with session and episode):\n",
                    a.query
                ));
                for h in &found.hits {
                    let who = h.speaker.clone().unwrap_or_else(|| h.role.clone());
                    text.push_str(&format!(
                        "- {} #{} {who}: {}\n",
                        h.session, h.episode, h.excerpt
                    ));
                }
                if !found.complete {
                    text.push_str(
                        "(older messages are still being indexed; search again shortly for them)\n",
                    );
                }
            }
            Ok(ok(text, a.budget_tokens))
        }
        .await)
    }

    #[tool(
        name = "expand",
        description = "Read the exact messages behind a summary: give `row` (a summary row id) for every message it covers, or `episode` (the #N of a digest or ledger line) for that message and the two around it. Use it before relying on a summarized detail."
    )]
    async fn expand(
        &self,
        Parameters(a): Parameters<ExpandArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answered(async {
            let s = self.scoped(&ctx)?;
            let session = s.resolve(&a.session).await?;
            let mut text = String::new();
            match (a.row, a.episode) {
                (Some(row), None) => {
                    let x = s
                        .expand(&session, row, a.identifier.as_deref(), 0, 1000)
                        .await?;
                    text.push_str(&format!(
                        "Row {} of session {session} covers messages {}-{}:\n",
                        x.row.id, x.row.first_episode, x.row.last_episode
                    ));
                    for e in x.episodes {
                        text.push_str(&format!("\n#{} {}: {}\n", e.id, e.role, e.content));
                    }
                }
                (None, Some(ep)) => {
                    if ep == 0 {
                        return Err(bad("episode numbers start at 1").into());
                    }
                    let page = s.messages(&session, ep.saturating_sub(2), 3).await?;
                    if !page.messages.iter().any(|m| m.id == ep) {
                        return Err(bad(format!(
                            "session {session} has no message #{ep} (it has {}); give a number from a digest or ledger line",
                            page.total
                        ))
                        .into());
                    }
                    for m in page.messages {
                        text.push_str(&format!("\n#{} {}: {}\n", m.id, m.role, m.content));
                    }
                }
                _ => {
                    return Err(bad(
                        "give exactly one of `row` (a summary row id) or `episode` (a message number #N)",
                    )
                    .into());
                }
            }
            Ok(ok(text, a.budget_tokens))
        }
        .await)
    }

    #[tool(
        name = "recall",
        description = "Recall durable facts stored with `remember` (decisions, conventions, the user's preferences), most relevant first, each with its id and the memories it comes from. Call it before making a choice the user may have made before."
    )]
    async fn recall(
        &self,
        Parameters(a): Parameters<RecallArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answered(
            async {
                let s = self.scoped(&ctx)?;
                let k = a.k.unwrap_or(8);
                if !(1..=50).contains(&k) {
                    return Err(bad(format!("k {k} is out of range; give 1 to 50")).into());
                }
                let f = abridge_app::memories::filter(
                    Some(MCP_USER.into()),
                    a.project
                        .as_deref()
                        .and_then(abridge_app::hook::project_named),
                    None,
                    None,
                    None,
                );
                let hits = s.recall(&a.query, &f, k).await?;
                if hits.is_empty() {
                    return Ok(ok("Nothing remembered matches.".into(), a.budget_tokens));
                }
                let mut text = String::new();
                for h in hits {
                    let mark = match (&h.superseded_by, h.superseded_ms) {
                        (Some(by), Some(ms)) => format!(
                            " (no longer current: replaced by {by} on {})",
                            abridge_app::memories::day_of(ms)
                        ),
                        _ => String::new(),
                    };
                    text.push_str(&format!("- [{} {}] {}{mark}\n", h.kind, h.id, h.text));
                }
                Ok(ok(text, a.budget_tokens))
            }
            .await,
        )
    }

    #[tool(
        name = "remember",
        description = "Store a durable fact for later sessions: a decision, a convention, a preference, a hard-won finding. One or two sentences each; it is recalled by meaning with `recall`. Returns its id."
    )]
    async fn remember(
        &self,
        Parameters(a): Parameters<RememberArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answered(
            async {
                let s = self.scoped(&ctx)?;
                if a.text.trim().is_empty() {
                    return Err(bad("text is empty; give the fact to remember").into());
                }
                let project = self.project(a.project.as_deref()).unwrap_or_default();
                let m = MemoryInput {
                    id: None,
                    user: MCP_USER.into(),
                    project: project.clone(),
                    environment: String::new(),
                    kind: a
                        .kind
                        .clone()
                        .unwrap_or_else(|| abridge_app::memories::DEFAULT_TYPE.into()),
                    key: a
                        .key
                        .clone()
                        .unwrap_or_else(|| abridge_app::memories::DEFAULT_KEY.into()),
                    text: a.text.clone(),
                    importance: None,
                    replaces: a.replaces.clone(),
                };
                // Cluster summaries are a refinement: a failing model does not fail the write.
                let r = s.remember(vec![m], Summaries::Now).await?.memories;
                let m = &r[0];
                let replaced = match &m.supersedes {
                    Some(old) => format!(
                        " It replaces {old}, which is kept as history and recalled marked as no longer current."
                    ),
                    None => String::new(),
                };
                let project = if project.is_empty() {
                    String::new()
                } else {
                    format!(" for project {project}")
                };
                Ok(ok(
                    format!(
                        "Remembered as {}{}{project}.{replaced}",
                        m.id,
                        if m.created { "" } else { " (already stored)" }
                    ),
                    None,
                ))
            }
            .await,
        )
    }

    #[tool(
        name = "forget",
        description = "Delete a remembered fact by its id (from `recall` or `remember`), when it is wrong or outdated. It is gone from disk."
    )]
    async fn forget(
        &self,
        Parameters(a): Parameters<ForgetArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answered(
            async {
                let s = self.scoped(&ctx)?;
                s.forget(&a.id, Summaries::Now).await?;
                Ok(ok(format!("Forgot {}.", a.id), None))
            }
            .await,
        )
    }

    #[tool(
        name = "pin",
        description = "Pin a message of a session (the #N of a message, e.g. a rule the user set) so it is in every context verbatim and survives every compaction; `scope: \"project\"` pins it to the session's project instead, so it opens every new session there; `unpin: true` takes it out."
    )]
    async fn pin(
        &self,
        Parameters(a): Parameters<PinArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answered(
            async {
                let s = self.scoped(&ctx)?;
                let session = s.resolve(&a.session).await?;
                let pinned = !a.unpin.unwrap_or(false);
                match a.scope.as_deref() {
                    Some("project") => {
                        let project = s.pin_to_project(&session, a.episode, pinned).await?;
                        let pins = s.project_pins(&project).await?;
                        Ok(ok(
                            format!(
                                "Project {project}: {} pinned (they open every new session there).",
                                pins.len()
                            ),
                            None,
                        ))
                    }
                    None | Some("session") => {
                        let pins = s.pin(&session, a.episode, pinned).await?;
                        Ok(ok(
                            format!(
                                "Session {session} pins: {}.",
                                pins.iter()
                                    .map(|p| format!("#{p}"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                            None,
                        ))
                    }
                    Some(_) => Err(bad("scope is `session` (the default) or `project`").into()),
                }
            }
            .await,
        )
    }
}

#[tool_handler]
impl ServerHandler for AbridgeMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("abridge", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

/// The JSON-RPC answer to a message that is not JSON (its id cannot be known: null), over
/// stdio and over HTTP.
pub fn parse_error(e: &serde_json::Error) -> serde_json::Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32700, "message": format!("Parse error: the message is not JSON ({e})")},
    })
}

/// Serve `scoped` over standard input and output until the client goes (`abridge mcp`).
/// Nothing but protocol messages is written to stdout; a line that is not JSON gets a
/// JSON-RPC parse error (-32700, id null), as the specification asks, and the session goes on.
pub async fn serve_stdio(scoped: Scoped, cwd: Option<&std::path::Path>) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    // Lines go through here: JSON ones on to the protocol, the rest answered here; the
    // protocol's answers and ours share stdout a whole line at a time.
    let (mut to_server, server_in) = tokio::io::duplex(1 << 20);
    let (server_out, from_server) = tokio::io::duplex(1 << 20);
    let stdout = std::sync::Arc::new(tokio::sync::Mutex::new(tokio::io::stdout()));
    let write_line = |out: std::sync::Arc<tokio::sync::Mutex<tokio::io::Stdout>>, line: String| async move {
        let mut o = out.lock().await;
        o.write_all(line.as_bytes()).await?;
        o.write_all(b"\n").await?;
        o.flush().await
    };
    let reader = {
        let stdout = stdout.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<serde::de::IgnoredAny>(&line) {
                    Ok(_) => {
                        if to_server.write_all(line.as_bytes()).await.is_err()
                            || to_server.write_all(b"\n").await.is_err()
                        {
                            break;
                        }
                    }
                    Err(e) => {
                        if write_line(stdout.clone(), parse_error(&e).to_string())
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            // End of input: the protocol sees it too.
            let _ = to_server.shutdown().await;
        })
    };
    let writer = {
        let stdout = stdout.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(from_server).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if write_line(stdout.clone(), line).await.is_err() {
                    break;
                }
            }
        })
    };
    let running = AbridgeMcp::fixed(scoped, cwd)
        .serve((server_in, server_out))
        .await
        .map_err(|e| anyhow::anyhow!("the MCP client did not initialize: {e}"))?;
    running.waiting().await?;
    reader.abort();
    let _ = writer.await;
    Ok(())
}

/// The Streamable HTTP service for `/mcp`. The caller authenticates first, puts the tenant's
/// [`Scoped`] in the request's extensions, and checks `Host` itself (abridge serve's guard does,
/// on every route); `origins` are the browser origins accepted (none: every request that
/// carries an Origin is refused).
pub fn http_service(
    origins: Vec<String>,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    AbridgeMcp,
    rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let config = StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(1 << 20)
        .disable_allowed_hosts();
    let config = if origins.is_empty() {
        config.enforce_origin_validation()
    } else {
        config.with_allowed_origins(origins)
    };
    StreamableHttpService::new(
        || Ok(AbridgeMcp::per_request()),
        LocalSessionManager::default().into(),
        config,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_schemas_use_plain_types_and_the_real_bounds() {
        let schemas = [
            serde_json::to_value(schemars::schema_for!(ContextArgs)).unwrap(),
            serde_json::to_value(schemars::schema_for!(SearchArgs)).unwrap(),
            serde_json::to_value(schemars::schema_for!(ExpandArgs)).unwrap(),
            serde_json::to_value(schemars::schema_for!(RecallArgs)).unwrap(),
            serde_json::to_value(schemars::schema_for!(RememberArgs)).unwrap(),
            serde_json::to_value(schemars::schema_for!(PinArgs)).unwrap(),
        ];
        for s in &schemas {
            for (name, p) in s["properties"].as_object().unwrap() {
                assert!(!p["type"].is_array(), "{name}: {p}");
            }
        }
        let b = &schemas[0]["properties"]["budget_tokens"];
        assert_eq!(
            (b["minimum"].as_u64(), b["maximum"].as_u64()),
            (Some(64), Some(20_000)),
            "{b}"
        );
        assert_eq!(schemas[3]["properties"]["k"]["maximum"], 50);
        assert!(
            schemas[0]["required"]
                .as_array()
                .is_none_or(|r| r.is_empty()),
            "{}",
            schemas[0]
        );
    }

    #[test]
    fn a_not_found_error_points_at_what_lists_its_kind() {
        let t = error_text(&AppError::not_found("no memory 'm9'"));
        assert!(
            t.contains("`recall` finds memories") && !t.contains("search"),
            "{t}"
        );
        let t = error_text(&AppError::not_found("no session 'chat-9'"));
        assert!(t.contains("`search` finds sessions"), "{t}");
        let t = error_text(&AppError::invalid("budget out of range"));
        assert!(!t.contains('('), "{t}");
    }
}
