//! What the app layer answers with: plain serializable records (the HTTP API's JSON, and the
//! CLI's `--json`), documented for the OpenAPI schema.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::jobs::{Job, JobState};
use crate::types::{ContextWindow, FreshState, FreshnessReport, Mode, SummaryRow};

/// A message as posted: the JSON-lines shape `abridge ingest` reads.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct MessageIn {
    /// `system`, `user`, `assistant` or `tool` (`developer`, `human`, `model`, `function`
    /// are accepted as their usual equivalents).
    pub role: String,
    /// The text.
    pub content: String,
    /// When it was said: ms since the epoch, or an RFC 3339 string (`created_at` is taken
    /// too).
    #[serde(default, alias = "created_at", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub timestamp: Option<serde_json::Value>,
    /// A client id: a message whose id the session already holds is skipped, so posting
    /// again is safe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub id: Option<serde_json::Value>,
    /// The speaker's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The client's own record of the message (any JSON, at most 256 KiB compact: an agent
    /// framework's item with its type, ids and content parts). Stored beside the message,
    /// sealed like its text, never summarized, and handed back as given by the message
    /// list, the context and the removal of the newest message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub item: Option<serde_json::Value>,
}

/// What storing messages did.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Appended {
    /// The session.
    pub session: String,
    /// Each message's id: the client's, or one given by the server.
    pub ids: Vec<String>,
    /// Messages received.
    pub received: u32,
    /// Messages stored (new).
    pub stored: u32,
    /// Messages skipped because their id was already stored.
    pub duplicates: u32,
    /// Episodes the session now holds.
    pub episodes: u64,
    /// The refresh job queued (or already active) for the session, if one is due.
    pub job: Option<JobView>,
}

/// One conversation of an imported transcript.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Imported {
    /// The session it went to.
    pub session: String,
    /// Its title, when the format has one.
    pub title: Option<String>,
    /// Episodes read.
    pub episodes: u64,
    /// Episodes new to the session.
    pub stored: u64,
    /// The job that summarizes it (none when everything was already covered).
    pub job: Option<JobView>,
}

impl From<crate::ConversationImport> for Imported {
    fn from(c: crate::ConversationImport) -> Self {
        Imported {
            session: c.session,
            title: c.title,
            episodes: c.read,
            stored: u64::from(c.added),
            job: c.job,
        }
    }
}

/// A job's progress.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ProgressView {
    /// `map` or `reduce`.
    pub stage: String,
    /// 0 for map, 1.. for reduce levels.
    pub level: u32,
    /// Answers of the stage in hand.
    pub done: u32,
    /// Answers the stage needs.
    pub total: u32,
}

/// A summarization job.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct JobView {
    /// Job id.
    pub id: u64,
    /// The session it summarizes.
    pub session: String,
    /// The last episode it covers when it succeeds.
    pub target: u64,
    /// `queued`, `running`, `succeeded`, `failed` or `cancelled`.
    pub state: String,
    /// Where it stands.
    pub progress: ProgressView,
    /// Model calls the plan expected.
    pub calls_planned: u32,
    /// Model answers received over all attempts.
    pub answers: u64,
    /// Attempts started.
    pub attempts: u32,
    /// The last attempt's error.
    pub error: Option<String>,
    /// Whether a cancel was asked for while it ran.
    pub cancel_requested: bool,
    /// Created, ms since the epoch.
    pub created_ms: u64,
    /// First started.
    pub started_ms: Option<u64>,
    /// Reached its final state.
    pub finished_ms: Option<u64>,
    /// Last changed.
    pub updated_ms: u64,
    /// The model it summarizes with (`extractive`: no model, sentence selection).
    pub model: String,
    /// That model's context length, in tokens.
    pub context_length: u32,
    /// The worker that holds it while it runs (`host:pid`), and until when.
    pub lease: Option<LeaseView>,
}

/// Who holds a running job.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct LeaseView {
    /// The worker, `host:pid`.
    pub worker: String,
    /// Its lease ends then (ms since the epoch) unless it beats again.
    pub until_ms: Option<u64>,
}

impl From<&Job> for JobView {
    /// The job as its tenant sees it (its session by the tenant's own id).
    fn from(j: &Job) -> Self {
        JobView {
            id: j.id,
            session: j.session.clone(),
            target: j.target,
            state: j.state.as_str().to_string(),
            progress: ProgressView {
                stage: if j.level == 0 { "map" } else { "reduce" }.into(),
                level: j.level,
                done: j.done,
                total: j.total,
            },
            calls_planned: j.calls_planned,
            answers: j.answers,
            attempts: j.attempts,
            error: j.error.clone(),
            cancel_requested: j.cancel_requested && j.state == JobState::Running,
            created_ms: j.created_ms,
            started_ms: j.started_ms,
            finished_ms: j.finished_ms,
            updated_ms: j.updated_ms,
            // An extractive run calls no model: it names none.
            model: match j.config.engine {
                crate::types::Engine::Extractive => "extractive".into(),
                crate::types::Engine::Llm => j.config.model.clone(),
            },
            context_length: j.config.context_length,
            lease: j
                .lease_owner
                .as_ref()
                .filter(|_| j.state == JobState::Running)
                .map(|w| LeaseView {
                    worker: w.clone(),
                    until_ms: j.lease_until_ms,
                }),
        }
    }
}

/// The name of a freshness state.
pub fn state_name(s: FreshState) -> &'static str {
    match s {
        FreshState::Empty => "empty",
        FreshState::Fresh => "fresh",
        FreshState::Waiting => "waiting",
        FreshState::Due => "due",
        FreshState::BackingOff => "backing-off",
        FreshState::GaveUp => "gave-up",
    }
}

/// A session and how fresh its summary is.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct SessionView {
    /// Session id.
    pub id: String,
    /// `empty`, `fresh`, `waiting`, `due`, `backing-off` or `gave-up`.
    pub state: String,
    /// Why, in words.
    pub reason: String,
    /// `eager` or `idle`.
    pub mode: String,
    /// Whether the mode is the session's own setting (else the global one).
    pub own_mode: bool,
    /// Episodes stored.
    pub episodes: u64,
    /// Episodes the summary chain covers.
    pub covered: u64,
    /// Estimated tokens not yet covered.
    pub backlog_tokens: u64,
    /// The newest episode's own time, ms since the epoch.
    pub last_activity_ms: Option<i64>,
    /// The newest covered episode's own time, ms since the epoch.
    pub covered_until_ms: Option<i64>,
    /// When a waiting or backing-off session becomes due.
    pub due_at_ms: Option<u64>,
    /// Consecutive failed refreshes.
    pub failures: u32,
    /// The last failure's reason.
    pub last_error: Option<String>,
    /// The queued or running job, if any.
    pub active_job: Option<u64>,
    /// Estimated tokens of the whole history as a model call carries it (each message's
    /// framing counted): the context's `full_tokens`.
    pub history_tokens: u64,
    /// Estimated tokens of the active summary chain.
    pub summary_tokens: u64,
    /// Tokens a context saves against the whole history: what the chain covers, less the
    /// chain itself.
    pub tokens_saved: u64,
    /// The conversation's title (a Claude Code summary line, a ChatGPT title), when it has
    /// one: a display name, never part of the id.
    pub title: Option<String>,
    /// The project folder its transcript file lies in, when it came from one.
    pub project: Option<String>,
}

impl SessionView {
    /// The view of a freshness report.
    pub fn new(
        id: &str,
        f: &FreshnessReport,
        (mode, own_mode): (Mode, bool),
        active_job: Option<u64>,
        (history_tokens, summary_tokens): (u64, u64),
    ) -> Self {
        let covered_tokens = history_tokens.saturating_sub(f.backlog_tokens);
        SessionView {
            id: id.to_string(),
            state: state_name(f.state).into(),
            reason: f.reason.clone(),
            mode: mode.as_str().into(),
            own_mode,
            episodes: f.episodes,
            covered: f.covered,
            backlog_tokens: f.backlog_tokens,
            last_activity_ms: f.last_activity_ms,
            covered_until_ms: f.covered_until_ms,
            due_at_ms: f.due_at_ms,
            failures: f.failures,
            last_error: f.last_error.clone(),
            active_job,
            history_tokens,
            summary_tokens,
            tokens_saved: covered_tokens.saturating_sub(summary_tokens),
            title: None,
            project: None,
        }
    }
}

/// One summary row.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct SummaryView {
    /// Row id.
    pub id: u64,
    /// First episode covered.
    pub first_episode: u64,
    /// Last episode covered.
    pub last_episode: u64,
    /// Estimated tokens of the content.
    pub tokens: u32,
    /// The summary.
    pub content: String,
    /// The model that wrote it (`extractive` for the model-free engine).
    pub model: String,
    /// Prompt tokens the model reported.
    pub prompt_tokens: u32,
    /// Output tokens the model reported.
    pub output_tokens: u32,
    /// Episode ranges a map-reduce could not summarize.
    pub skipped: Vec<[u64; 2]>,
    /// 0 for a summary of episodes; n + 1 for an "earlier" row compacting rows of level n.
    pub level: u32,
    /// The row that compacted this one (it then left the active chain), if any.
    pub compacted_into: Option<u64>,
    /// The facts ledger: identifiers kept verbatim, each with the episode it was last seen in.
    pub ledger: Vec<LedgerView>,
    /// Ledger entries the budget dropped so far.
    pub ledger_dropped: u32,
    /// What the row covers of the transcript (asked for with `?coverage=true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<CoverageView>,
}

/// What a summary row covers of the transcript.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct CoverageView {
    /// The time of its last exchange (its last episode's own time), ms since the epoch.
    pub last_exchange_ms: Option<i64>,
    /// UTF-8 bytes of the covered messages' text.
    pub transcript_bytes: u64,
    /// Messages covered.
    pub messages: u64,
    /// How far into its transcript file the row reaches, when the session came from one.
    pub source: Option<SourceMarkView>,
}

/// How far into a transcript file a summary row reaches.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct SourceMarkView {
    /// The file.
    pub path: String,
    /// Bytes of it read when the row's last episode was stored.
    pub bytes: u64,
}

/// A page of a session's messages.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct MessagesView {
    /// Session id.
    pub session: String,
    /// Oldest first.
    pub messages: Vec<MessageView>,
    /// Messages stored in all.
    pub total: u64,
    /// Pass as `after` for the next page, when there is one.
    pub next_after: Option<u64>,
}

/// What removing a session's newest message did.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct RemovedView {
    /// The session.
    pub session: String,
    /// The message removed (its id is free: the next message takes it).
    pub message: MessageView,
    /// Summary rows deleted because they covered it (a row of several messages is folded
    /// again without it by the refresh in `job`).
    pub dropped_rows: Vec<u64>,
    /// Rows that an earlier compaction had folded into a deleted row, active again.
    pub reopened_rows: Vec<u64>,
    /// Messages the session holds now (0: the session is gone with its last message).
    pub episodes: u64,
    /// The refresh that folds again what the deleted rows covered, if any.
    pub job: Option<JobView>,
}

/// One stored message and the summary row that covers it.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct MessageView {
    /// Per-session id (episode id), from 1.
    pub id: u64,
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// When it was said, ms since the epoch, if known.
    pub timestamp_ms: Option<i64>,
    /// The speaker's name, if the transcript gave one.
    pub speaker: Option<String>,
    /// Estimated tokens.
    pub tokens: u32,
    /// The active summary row that covers it; none while it lies beyond the summary.
    pub covered_by: Option<u64>,
    /// The item its client stored with it, as given (see `MessageIn.item`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub item: Option<serde_json::Value>,
}

/// A stored item as the JSON value its client gave (text that no longer parses, as a string).
pub fn item_value(text: String) -> serde_json::Value {
    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
}

impl MessageView {
    /// A stored episode as a message, with the row that covers it (if any).
    pub fn of(e: crate::types::Episode, covered_by: Option<u64>) -> Self {
        MessageView {
            id: e.id,
            role: e.role.as_str().to_string(),
            content: e.content,
            timestamp_ms: e.timestamp_ms,
            speaker: e.speaker,
            tokens: e.tokens,
            covered_by,
            item: None,
        }
    }
}

/// One identifier of a summary row's facts ledger.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct LedgerView {
    /// The identifier, verbatim.
    pub text: String,
    /// `path`, `url`, `command`, `code`, `number`, `version`, `date`, `email`, `ticket` or
    /// `name`.
    pub kind: String,
    /// The episode it was last seen in.
    pub episode: u64,
    /// Mentions in the covered episodes.
    pub count: u32,
}

/// A summary row and exactly the episodes it covers.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ExpansionView {
    /// The row.
    pub row: SummaryView,
    /// The episodes it covers, in order (one page), or the identifier's episode.
    pub episodes: Vec<EpisodeView>,
    /// The rows it compacted, oldest first (an "earlier" row).
    pub compacted: Vec<SummaryView>,
    /// Pass as `after` for the next page, when the page was cut.
    pub next_after: Option<u64>,
}

/// A person's fact as it stands, with what it replaced (see the WIT `summarizer.fact`).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct FactView {
    /// Whose (a speaker's name, or `the user` / `the assistant`).
    pub who: String,
    /// What (`lives in`, `works at`, `phone number`, …).
    pub key: String,
    /// The value that holds now; `null` when the fact ended.
    pub current: Option<String>,
    /// Every value it had, oldest first.
    pub values: Vec<FactValueView>,
    /// How it ended, if it did.
    pub ended: Option<FactEndView>,
    /// The fact as a context shows it.
    pub line: String,
}

impl FactView {
    /// The episodes that said it: each value's, oldest first, then its ending's.
    pub fn episodes(&self) -> impl Iterator<Item = u64> + '_ {
        self.values
            .iter()
            .map(|v| v.episode)
            .chain(self.ended.as_ref().map(|e| e.episode))
    }
}

/// One value a fact had, and the episode that said it (expand it with the session's messages).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct FactValueView {
    /// The value.
    pub value: String,
    /// When it was first said, ms since the epoch, if known.
    pub from_ms: Option<i64>,
    /// The episode that said it.
    pub episode: u64,
}

/// How a fact ended.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct FactEndView {
    /// When, ms since the epoch, if known.
    pub at_ms: Option<i64>,
    /// The episode that said it.
    pub episode: u64,
    /// The sentence that said it.
    pub sentence: String,
}

impl From<&crate::types::Fact> for FactView {
    fn from(f: &crate::types::Fact) -> Self {
        FactView {
            who: f.who.clone(),
            key: f.key.clone(),
            current: match f.ended {
                Some(_) => None,
                None => f.values.last().map(|v| v.value.clone()),
            },
            values: f
                .values
                .iter()
                .map(|v| FactValueView {
                    value: v.value.clone(),
                    from_ms: v.from_ms,
                    episode: v.episode,
                })
                .collect(),
            ended: f.ended.as_ref().map(|e| FactEndView {
                at_ms: e.at_ms,
                episode: e.episode,
                sentence: e.sentence.clone(),
            }),
            line: f.line.clone(),
        }
    }
}

/// One stored episode.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct EpisodeView {
    /// Per-session id, from 1.
    pub id: u64,
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// When it was said, ms since the epoch, if known.
    pub timestamp_ms: Option<i64>,
}

impl From<&crate::types::Expansion> for ExpansionView {
    fn from(x: &crate::types::Expansion) -> Self {
        ExpansionView {
            row: SummaryView::from(&x.row),
            episodes: x
                .episodes
                .iter()
                .map(|e| EpisodeView {
                    id: e.id,
                    role: e.role.as_str().to_string(),
                    content: e.content.clone(),
                    timestamp_ms: e.timestamp_ms,
                })
                .collect(),
            compacted: x.compacted.iter().map(SummaryView::from).collect(),
            next_after: x.next_after,
        }
    }
}

impl From<&SummaryRow> for SummaryView {
    fn from(r: &SummaryRow) -> Self {
        SummaryView {
            id: r.id,
            first_episode: r.first_episode,
            last_episode: r.last_episode,
            tokens: r.tokens,
            content: r.content.clone(),
            model: r.model.clone(),
            prompt_tokens: r.prompt_tokens,
            output_tokens: r.output_tokens,
            skipped: r.skipped.iter().map(|x| [x.first, x.last]).collect(),
            level: r.level,
            compacted_into: r.compacted_into,
            ledger: r
                .ledger
                .iter()
                .map(|e| LedgerView {
                    text: e.text.clone(),
                    kind: e.kind.as_str().to_string(),
                    episode: e.episode,
                    count: e.count,
                })
                .collect(),
            ledger_dropped: r.ledger_dropped,
            coverage: None,
        }
    }
}

/// A message of a context window.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ContextMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// The stored message this is (none for the summary's system message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub episode: Option<u64>,
    /// The item its client stored with it, as given (see `MessageIn.item`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub item: Option<serde_json::Value>,
}

/// The estimated tokens of each part of a context (message costs included).
#[derive(Clone, Copy, Debug, Default, Serialize, ToSchema)]
pub struct ContextParts {
    /// The summary's text: its rows, or the chosen lines of an offline summary.
    pub summary: u32,
    /// The ledger of identifiers beside it.
    pub ledger: u32,
    /// A coding session's digest.
    pub digest: u32,
    /// Pinned episodes.
    pub pinned: u32,
    /// Recent turns, verbatim.
    pub recent: u32,
    /// The day marks before the turns that open a new day.
    pub days: u32,
    /// The earlier turns the query found, with their episode numbers and times.
    pub found: u32,
}

impl ContextParts {
    /// The parts as a front end words them: "summary 1198, ledger 333, …, day marks 10".
    pub fn describe(&self) -> String {
        format!(
            "summary {}, ledger {}, digest {}, pinned {}, found turns {}, recent turns {}, day marks {}",
            self.summary, self.ledger, self.digest, self.pinned, self.found, self.recent, self.days
        )
    }
}

/// The context for a chat app's next model call.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ContextView {
    /// Session id.
    pub session: String,
    /// A system message with the summary (when there is one), then recent messages.
    pub messages: Vec<ContextMessage>,
    /// Their estimated tokens.
    pub tokens: u32,
    /// Estimated tokens of the whole history sent verbatim.
    pub full_tokens: u64,
    /// Episodes the session holds.
    pub episodes: u64,
    /// Percent saved against the full history.
    pub saving_percent: f64,
    /// Episodes the included summary covers.
    pub covered: u64,
    /// Recent messages included verbatim.
    pub recent: u32,
    /// Episodes neither summarized nor included.
    pub omitted: u64,
    /// Those episodes as inclusive ranges `[first, last]`; empty when the context covers the
    /// whole conversation.
    pub omitted_ranges: Vec<[u64; 2]>,
    /// The first episode the context reflects (1: it reaches back to the start).
    pub covered_from: u64,
    /// The highest summary level used (0: episode summaries; n: an "earlier" row n folds deep).
    pub level: u32,
    /// Ledger identifiers included beside the summary.
    pub identifiers: u32,
    /// Pinned episodes included verbatim.
    pub pinned: u32,
    /// Earlier turns included because they match the query (their short replies included).
    pub found: u32,
    /// The budget asked for (`tokens` is at most this).
    pub budget: u32,
    /// Percent of the budget used.
    pub budget_used_percent: f64,
    /// The estimated tokens of each part; they add up to `tokens`.
    pub parts: ContextParts,
    /// The leading messages every later context begins with, byte for byte, until the next
    /// fold: a prompt cache's breakpoint goes at the end of them (docs/context.md).
    pub stable: StableView,
    /// The per-call part the newest message carries before its own text (the turns a query
    /// found, a coding session's digest, what unshown newer turns say), given apart for a
    /// client that keeps its own copy of each message; none when there is none.
    pub note: Option<String>,
    /// Whether a refresh is queued or running now (this context is from the summary as it is).
    pub refresh_pending: bool,
    /// Whether episodes left out of this context are waiting for a refresh that is not
    /// running (idle mode's quiet window, or a failing model's backoff).
    pub refresh_due: bool,
    /// Whether the caller asked to wait for a due refresh first.
    pub waited: bool,
    /// The refresh job, if one is queued, running or was waited for.
    pub job: Option<JobView>,
}

impl ContextView {
    /// The view of a context window; `(refresh_pending, refresh_due)` as the app judged them.
    pub fn new(
        session: &str,
        w: &ContextWindow,
        job: Option<JobView>,
        (refresh_pending, refresh_due): (bool, bool),
        waited: bool,
        episodes: u64,
    ) -> Self {
        let saving = if w.full_tokens == 0 {
            0.0
        } else {
            100.0 * (1.0 - f64::from(w.tokens) / w.full_tokens as f64)
        };
        // The messages after the system message are the shown episodes, in order.
        let first_shown = w.messages.len().saturating_sub(w.shown.len());
        ContextView {
            session: session.to_string(),
            messages: w
                .messages
                .iter()
                .enumerate()
                .map(|(i, m)| ContextMessage {
                    role: m.role.as_str().into(),
                    content: m.content.clone(),
                    episode: i
                        .checked_sub(first_shown)
                        .and_then(|k| w.shown.get(k).copied()),
                    item: None,
                })
                .collect(),
            tokens: w.tokens,
            full_tokens: w.full_tokens,
            episodes,
            saving_percent: (saving * 10.0).round() / 10.0,
            covered: w.covered,
            recent: w.recent,
            omitted: w.omitted,
            omitted_ranges: w.omitted_ranges.iter().map(|r| [r.first, r.last]).collect(),
            covered_from: w.covered_from,
            level: w.level,
            identifiers: w.identifiers,
            pinned: w.pinned,
            found: w.found,
            budget: w.budget,
            budget_used_percent: if w.budget == 0 {
                0.0
            } else {
                (1000.0 * f64::from(w.tokens) / f64::from(w.budget)).round() / 10.0
            },
            parts: ContextParts {
                summary: w.parts.summary,
                ledger: w.parts.ledger,
                digest: w.parts.digest,
                pinned: w.parts.pinned,
                recent: w.parts.recent,
                days: w.parts.days,
                found: w.parts.found,
            },
            stable: StableView {
                messages: w.stable.messages,
                chars: w.stable.chars,
            },
            note: w.note.clone(),
            refresh_due,
            refresh_pending,
            waited,
            job,
        }
    }
}

/// The stable prefix of a context: what a prompt cache may keep until the next fold.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct StableView {
    /// How many leading messages stay the same until the next fold.
    pub messages: u32,
    /// Their contents' characters (Unicode scalar values), added up.
    pub chars: u64,
}

/// One message a search found.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct SearchHitView {
    /// Its session.
    pub session: String,
    /// Its episode id.
    pub episode: u64,
    /// Who said it: `user`, `assistant`, `system` or `tool`.
    pub role: String,
    /// The speaker's name, when the transcript gave one.
    pub speaker: Option<String>,
    /// When it was said, ms since the Unix epoch, if known.
    pub timestamp_ms: Option<i64>,
    /// Its BM25 score against the query (higher is better).
    pub score: f64,
    /// Its text around the matches, each matching word between `**`.
    pub excerpt: String,
    /// Where to read it in full with its neighbours: the session's messages from two before
    /// it (`GET` this path).
    pub expand: String,
}

/// A page of search results.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct SearchView {
    /// The query as asked.
    pub query: String,
    /// The session searched, or none for every session.
    pub session: Option<String>,
    /// The hits, best first.
    pub hits: Vec<SearchHitView>,
    /// The offset of the next page, when more hits follow.
    pub next_offset: Option<u32>,
    /// False while messages stored before the index existed are still being indexed (they
    /// are not found yet).
    pub complete: bool,
}

impl SearchHitView {
    /// The view of a hit.
    pub fn new(h: &crate::types::SearchHit) -> Self {
        let e = &h.episode;
        SearchHitView {
            session: h.session.clone(),
            episode: e.id,
            role: e.role.as_str().into(),
            speaker: e.speaker.clone(),
            timestamp_ms: e.timestamp_ms,
            score: (h.score * 1000.0).round() / 1000.0,
            excerpt: h.excerpt.clone(),
            expand: format!(
                "/v1/sessions/{}/messages?after={}&limit=5",
                percent_encode(&h.session),
                e.id.saturating_sub(3)
            ),
        }
    }
}

/// `s` as one URL path segment.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
