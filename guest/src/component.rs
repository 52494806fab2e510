//! The export shell: implements the generated `Guest` traits, converts between WIT types and
//! the plain types in [`crate::types`], and forwards to the logic modules.

use crate::{context, engine, freshness, ledger, policy, prompt, strip, tokens, transcript, types};

#[allow(missing_docs)]
mod bindings {
    wit_bindgen::generate!({ world: "engine", path: "../wit" });
}

use bindings::abridge::engine::{clock, llm, log, store, types as wit};
use bindings::exports::abridge::engine::{summarizer, text, transcripts as tx};

struct Component;

/// The WIT imports, seen through the engine's [`engine::Host`] trait.
struct Imports;

fn role_in(r: wit::Role) -> types::Role {
    match r {
        wit::Role::System => types::Role::System,
        wit::Role::User => types::Role::User,
        wit::Role::Assistant => types::Role::Assistant,
        wit::Role::Tool => types::Role::Tool,
    }
}

fn role_out(r: types::Role) -> wit::Role {
    match r {
        types::Role::System => wit::Role::System,
        types::Role::User => wit::Role::User,
        types::Role::Assistant => wit::Role::Assistant,
        types::Role::Tool => wit::Role::Tool,
    }
}

fn err_in(e: wit::Error) -> types::Error {
    use types::Error as E;
    match e {
        wit::Error::Unreachable(m) => E::Unreachable(m),
        wit::Error::ModelNotFound(m) => E::ModelNotFound(m),
        wit::Error::Timeout(m) => E::Timeout(m),
        wit::Error::ContextOverflow(m) => E::ContextOverflow(m),
        wit::Error::Server(m) => E::Server(m),
        wit::Error::RejectedOutput(m) => E::RejectedOutput(m),
        wit::Error::Storage(m) => E::Storage(m),
        wit::Error::InvalidInput(m) => E::InvalidInput(m),
        wit::Error::Conflict(m) => E::Conflict(m),
    }
}

fn err_out(e: types::Error) -> wit::Error {
    use types::Error as E;
    match e {
        E::Unreachable(m) => wit::Error::Unreachable(m),
        E::ModelNotFound(m) => wit::Error::ModelNotFound(m),
        E::Timeout(m) => wit::Error::Timeout(m),
        E::ContextOverflow(m) => wit::Error::ContextOverflow(m),
        E::Server(m) => wit::Error::Server(m),
        E::RejectedOutput(m) => wit::Error::RejectedOutput(m),
        E::Storage(m) => wit::Error::Storage(m),
        E::InvalidInput(m) => wit::Error::InvalidInput(m),
        E::Conflict(m) => wit::Error::Conflict(m),
    }
}

fn kind_in(k: store::IdentifierKind) -> ledger::Kind {
    use store::IdentifierKind as K;
    match k {
        K::Path => ledger::Kind::Path,
        K::Url => ledger::Kind::Url,
        K::Command => ledger::Kind::Command,
        K::Code => ledger::Kind::Code,
        K::Number => ledger::Kind::Number,
        K::Version => ledger::Kind::Version,
        K::Date => ledger::Kind::Date,
        K::Email => ledger::Kind::Email,
        K::Ticket => ledger::Kind::Ticket,
        K::Request => ledger::Kind::Request,
        K::Created => ledger::Kind::Created,
        K::Edited => ledger::Kind::Edited,
        K::Read => ledger::Kind::Read,
        K::Ran => ledger::Kind::Ran,
        K::Failed => ledger::Kind::Failed,
        K::Todo => ledger::Kind::Todo,
        K::Fact => ledger::Kind::Fact,
        K::Name => ledger::Kind::Name,
    }
}

fn kind_out(k: ledger::Kind) -> store::IdentifierKind {
    use store::IdentifierKind as K;
    match k {
        ledger::Kind::Path => K::Path,
        ledger::Kind::Url => K::Url,
        ledger::Kind::Command => K::Command,
        ledger::Kind::Code => K::Code,
        ledger::Kind::Number => K::Number,
        ledger::Kind::Version => K::Version,
        ledger::Kind::Date => K::Date,
        ledger::Kind::Email => K::Email,
        ledger::Kind::Ticket => K::Ticket,
        ledger::Kind::Request => K::Request,
        ledger::Kind::Created => K::Created,
        ledger::Kind::Edited => K::Edited,
        ledger::Kind::Read => K::Read,
        ledger::Kind::Ran => K::Ran,
        ledger::Kind::Failed => K::Failed,
        ledger::Kind::Todo => K::Todo,
        ledger::Kind::Fact => K::Fact,
        ledger::Kind::Name => K::Name,
    }
}

fn ledger_in(entries: Vec<store::LedgerEntry>, dropped: u32) -> ledger::Ledger {
    ledger::Ledger {
        entries: entries
            .into_iter()
            .map(|e| ledger::Entry {
                text: e.text,
                kind: kind_in(e.kind),
                episode: e.episode,
                count: e.count,
            })
            .collect(),
        dropped,
    }
}

fn entries_out(l: &ledger::Ledger) -> Vec<store::LedgerEntry> {
    l.entries
        .iter()
        .map(|e| store::LedgerEntry {
            text: e.text.clone(),
            kind: kind_out(e.kind),
            episode: e.episode,
            count: e.count,
        })
        .collect()
}

fn ranges_out(r: Vec<(u64, u64)>) -> Vec<store::EpisodeRange> {
    r.into_iter()
        .map(|(first, last)| store::EpisodeRange { first, last })
        .collect()
}

fn episode_in(e: store::Episode) -> types::Episode {
    types::Episode {
        id: e.id,
        role: role_in(e.role),
        content: e.content,
        tokens: e.tokens,
        timestamp_ms: e.timestamp_ms,
        speaker: e.speaker,
        tokens_through: e.tokens_through,
    }
}

fn episode_out(e: types::Episode) -> store::Episode {
    store::Episode {
        id: e.id,
        role: role_out(e.role),
        content: e.content,
        tokens: e.tokens,
        timestamp_ms: e.timestamp_ms,
        speaker: e.speaker,
        tokens_through: e.tokens_through,
    }
}

fn row_in(r: store::SummaryRow) -> types::SummaryRow {
    types::SummaryRow {
        id: r.id,
        first_episode: r.first_episode,
        last_episode: r.last_episode,
        content: r.content,
        tokens: r.tokens,
        prompt_tokens: r.prompt_tokens,
        output_tokens: r.output_tokens,
        model: r.model,
        created_ms: r.created_ms,
        updated_ms: r.updated_ms,
        skipped: r.skipped.into_iter().map(|x| (x.first, x.last)).collect(),
        level: r.level,
        compacted_into: r.compacted_into,
        ledger: ledger_in(r.ledger, r.ledger_dropped),
    }
}

fn row_out(r: types::SummaryRow) -> store::SummaryRow {
    store::SummaryRow {
        id: r.id,
        first_episode: r.first_episode,
        last_episode: r.last_episode,
        content: r.content,
        tokens: r.tokens,
        prompt_tokens: r.prompt_tokens,
        output_tokens: r.output_tokens,
        model: r.model,
        created_ms: r.created_ms,
        updated_ms: r.updated_ms,
        ledger: entries_out(&r.ledger),
        ledger_dropped: r.ledger.dropped,
        skipped: ranges_out(r.skipped),
        level: r.level,
        compacted_into: r.compacted_into,
    }
}

fn msg_out(m: types::Message) -> wit::Message {
    wit::Message {
        role: role_out(m.role),
        content: m.content,
    }
}

/// A plan as the WIT spells it.
fn plan_out(p: engine::PlanReport) -> wit::PlanReport {
    wit::PlanReport {
        path: match p.path {
            engine::PlanPath::Nothing => wit::Path::Nothing,
            engine::PlanPath::Single => wit::Path::Single,
            engine::PlanPath::Rolling => wit::Path::Rolling,
            engine::PlanPath::MapReduce => wit::Path::MapReduce,
        },
        episodes: p.episodes,
        backlog_tokens: p.backlog_tokens,
        chunks: p.chunks,
        levels: p.levels,
        calls: p.calls,
        input_tokens: p.input_tokens,
        output_tokens: p.output_tokens,
    }
}

fn cfg_in(c: summarizer::Config) -> policy::Config {
    policy::Config {
        engine: match c.engine {
            summarizer::Engine::Llm => policy::Engine::Llm,
            summarizer::Engine::Extractive => policy::Engine::Extractive,
        },
        rendering: match c.rendering {
            summarizer::Rendering::Chat => policy::Rendering::Chat,
            summarizer::Rendering::Chatml => policy::Rendering::Chatml,
        },
        model: c.model,
        context_length: c.context_length,
        max_output_tokens: c.max_output_tokens,
        temperature: c.temperature,
        threshold_tokens: c.threshold_tokens,
        min_episodes_since: c.min_episodes_since,
        max_summary_tokens: c.max_summary_tokens,
        max_skipped_percent: c.max_skipped_percent,
        chunk_tokens: c.chunk_tokens,
        mode: match c.mode {
            summarizer::Mode::Eager => policy::Mode::Eager,
            summarizer::Mode::Idle => policy::Mode::Idle,
            summarizer::Mode::Window => policy::Mode::Window,
        },
        quiescence_secs: c.quiescence_secs,
        provisional_tokens: c.provisional_tokens,
        max_attempts: c.max_attempts,
        retry_base_secs: c.retry_base_secs,
        max_backlog_tokens: c.max_backlog_tokens,
        summary_budget_tokens: c.summary_budget_tokens,
        ledger_tokens: c.ledger_tokens,
        window_messages: c.window_messages,
        focus: c.focus,
    }
}

fn cfg_out(c: policy::Config) -> summarizer::Config {
    summarizer::Config {
        engine: match c.engine {
            policy::Engine::Llm => summarizer::Engine::Llm,
            policy::Engine::Extractive => summarizer::Engine::Extractive,
        },
        rendering: match c.rendering {
            policy::Rendering::Chat => summarizer::Rendering::Chat,
            policy::Rendering::Chatml => summarizer::Rendering::Chatml,
        },
        model: c.model,
        context_length: c.context_length,
        max_output_tokens: c.max_output_tokens,
        temperature: c.temperature,
        threshold_tokens: c.threshold_tokens,
        min_episodes_since: c.min_episodes_since,
        max_summary_tokens: c.max_summary_tokens,
        max_skipped_percent: c.max_skipped_percent,
        chunk_tokens: c.chunk_tokens,
        mode: match c.mode {
            policy::Mode::Eager => summarizer::Mode::Eager,
            policy::Mode::Idle => summarizer::Mode::Idle,
            policy::Mode::Window => summarizer::Mode::Window,
        },
        quiescence_secs: c.quiescence_secs,
        provisional_tokens: c.provisional_tokens,
        max_attempts: c.max_attempts,
        retry_base_secs: c.retry_base_secs,
        max_backlog_tokens: c.max_backlog_tokens,
        summary_budget_tokens: c.summary_budget_tokens,
        ledger_tokens: c.ledger_tokens,
        window_messages: c.window_messages,
        focus: c.focus,
    }
}

fn fresh_out(f: freshness::Freshness) -> summarizer::FreshnessReport {
    summarizer::FreshnessReport {
        state: match f.state {
            freshness::State::Empty => summarizer::FreshState::Empty,
            freshness::State::Fresh => summarizer::FreshState::Fresh,
            freshness::State::Waiting => summarizer::FreshState::Waiting,
            freshness::State::Due => summarizer::FreshState::Due,
            freshness::State::BackingOff => summarizer::FreshState::BackingOff,
            freshness::State::GaveUp => summarizer::FreshState::GaveUp,
        },
        reason: f.reason,
        episodes: f.episodes,
        covered: f.covered,
        backlog_tokens: f.backlog_tokens,
        last_activity_ms: f.last_activity_ms,
        covered_until_ms: f.covered_until_ms,
        due_at_ms: f.due_at_ms,
        failures: f.failures,
        last_error: f.last_error,
        fold_upto: f.fold_upto,
        fallback_rows: f.fallback_rows,
    }
}

fn outcome_out(o: engine::Outcome) -> summarizer::Outcome {
    summarizer::Outcome {
        triggered: o.triggered,
        passes: o.passes,
        written: o.written.into_iter().map(row_out).collect(),
        unsummarized: o.unsummarized,
    }
}

fn request_out(req: types::Request) -> llm::Request {
    let prompt = match req.prompt {
        types::Prompt::Chat(ms) => llm::Prompt::Chat(ms.into_iter().map(msg_out).collect()),
        types::Prompt::Raw(s) => llm::Prompt::Raw(s),
    };
    llm::Request {
        model: req.model,
        prompt,
        temperature: req.temperature,
        max_output_tokens: req.max_output_tokens,
        context_length: req.context_length,
        stop: req.stop,
        cache_key: req.cache_key,
        seed: req.seed,
    }
}

fn response_in(r: llm::Response) -> types::Response {
    types::Response {
        text: r.text,
        finish: match r.finish_reason {
            llm::FinishReason::Stop => types::Finish::Stop,
            llm::FinishReason::Length => types::Finish::Length,
            llm::FinishReason::Other => types::Finish::Other,
        },
        prompt_tokens: r.prompt_tokens,
        output_tokens: r.output_tokens,
    }
}

impl engine::Host for Imports {
    fn search_episodes(
        &mut self,
        session: Option<&str>,
        terms: &[String],
        limit: u32,
    ) -> Result<crate::search::Matches, types::Error> {
        let m = store::search_episodes(session, terms, limit).map_err(err_in)?;
        Ok(crate::search::Matches {
            docs: m.docs,
            length: m.length,
            df: m.df,
            matches: m
                .matches
                .into_iter()
                .map(|x| crate::search::Match {
                    session: x.session,
                    episode: x.episode,
                    length: x.length,
                    counts: x.counts,
                })
                .collect(),
        })
    }

    fn stats(&mut self, session: &str) -> Result<types::Stats, types::Error> {
        let s = store::stats(session).map_err(err_in)?;
        Ok(types::Stats {
            episodes: s.episodes,
            total_tokens: s.total_tokens,
            last_episode: s.last_episode,
        })
    }

    fn episodes_after(
        &mut self,
        session: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<types::Episode>, types::Error> {
        let eps = store::episodes_after(session, after, limit).map_err(err_in)?;
        Ok(eps.into_iter().map(episode_in).collect())
    }

    fn episodes(
        &mut self,
        session: &str,
        ids: &[u64],
    ) -> Result<Vec<types::Episode>, types::Error> {
        let eps = store::episodes(session, ids).map_err(err_in)?;
        Ok(eps.into_iter().map(episode_in).collect())
    }

    fn latest_summary(&mut self, session: &str) -> Result<Option<types::SummaryRow>, types::Error> {
        Ok(store::latest_summary(session).map_err(err_in)?.map(row_in))
    }

    fn write_summary(
        &mut self,
        session: &str,
        w: types::SummaryWrite,
    ) -> Result<types::SummaryRow, types::Error> {
        let w = store::SummaryWrite {
            replaces: w.replaces,
            first_episode: w.first_episode,
            last_episode: w.last_episode,
            content: w.content,
            tokens: w.tokens,
            prompt_tokens: w.prompt_tokens,
            output_tokens: w.output_tokens,
            model: w.model,
            now_ms: w.now_ms,
            ledger: entries_out(&w.ledger),
            ledger_dropped: w.ledger.dropped,
            skipped: ranges_out(w.skipped),
        };
        store::write_summary(session, &w)
            .map(row_in)
            .map_err(err_in)
    }

    fn summary_history(&mut self, session: &str) -> Result<Vec<types::SummaryRow>, types::Error> {
        Ok(store::summary_history(session)
            .map_err(err_in)?
            .into_iter()
            .map(row_in)
            .collect())
    }

    fn compact_summaries(
        &mut self,
        session: &str,
        c: types::Compaction,
    ) -> Result<types::SummaryRow, types::Error> {
        let c = store::Compaction {
            rows: c.rows,
            content: c.content,
            tokens: c.tokens,
            prompt_tokens: c.prompt_tokens,
            output_tokens: c.output_tokens,
            model: c.model,
            now_ms: c.now_ms,
            ledger: entries_out(&c.ledger),
            ledger_dropped: c.ledger.dropped,
            skipped: ranges_out(c.skipped),
        };
        store::compact_summaries(session, &c)
            .map(row_in)
            .map_err(err_in)
    }

    fn generate(&mut self, req: types::Request) -> Result<types::Response, types::Error> {
        llm::generate(&request_out(req))
            .map(response_in)
            .map_err(err_in)
    }

    fn generate_batch(
        &mut self,
        reqs: Vec<types::Request>,
    ) -> Vec<Result<types::Response, types::Error>> {
        let reqs: Vec<llm::Request> = reqs.into_iter().map(request_out).collect();
        llm::generate_batch(&reqs)
            .into_iter()
            .map(|r| r.map(response_in).map_err(err_in))
            .collect()
    }

    fn partial(&mut self, key: &str) -> Result<Option<types::Cached>, types::Error> {
        store::partial(key).map_err(err_in).map(|c| {
            c.map(|c| types::Cached {
                text: c.text,
                prompt_tokens: c.prompt_tokens,
                output_tokens: c.output_tokens,
            })
        })
    }

    fn progress(&mut self, level: u32, done: u32, total: u32) {
        log::progress(level, done, total);
    }

    fn planned(&mut self, report: &engine::PlanReport) {
        log::planned(&plan_out(report.clone()));
    }

    fn calibration(&mut self, model: &str) -> Result<Option<(u64, u64)>, types::Error> {
        Ok(store::calibration(model)
            .map_err(err_in)?
            .map(|c| (c.estimated, c.reported)))
    }

    fn record_calibration(
        &mut self,
        model: &str,
        estimated: u32,
        reported: u32,
    ) -> Result<(), types::Error> {
        store::record_calibration(model, estimated, reported).map_err(err_in)
    }

    fn summaries(&mut self, session: &str) -> Result<Vec<types::SummaryRow>, types::Error> {
        Ok(store::summaries(session)
            .map_err(err_in)?
            .into_iter()
            .map(row_in)
            .collect())
    }

    fn failure(&mut self, session: &str) -> Result<Option<types::FailureMarker>, types::Error> {
        Ok(store::failure(session)
            .map_err(err_in)?
            .map(|m| types::FailureMarker {
                failures: m.failures,
                last_error: m.last_error,
                retry_after_ms: m.retry_after_ms,
                failed_ms: m.failed_ms,
            }))
    }

    fn set_failure(
        &mut self,
        session: &str,
        marker: Option<types::FailureMarker>,
    ) -> Result<(), types::Error> {
        let m = marker.map(|m| store::FailureMarker {
            failures: m.failures,
            last_error: m.last_error,
            retry_after_ms: m.retry_after_ms,
            failed_ms: m.failed_ms,
        });
        store::set_failure(session, m.as_ref()).map_err(err_in)
    }

    fn reset_session(&mut self, session: &str) -> Result<(), types::Error> {
        store::reset_session(session).map_err(err_in)
    }

    fn now_ms(&mut self) -> u64 {
        clock::now_ms()
    }

    fn log(&mut self, level: types::Level, msg: &str) {
        let level = match level {
            types::Level::Debug => log::Level::Debug,
            types::Level::Info => log::Level::Info,
            types::Level::Warn => log::Level::Warn,
        };
        log::write(level, msg);
    }
}

/// Store episodes: `stamp` dates an episode without a timestamp with its arrival (a message
/// as it arrives), not an imported one.
fn append(
    session: String,
    episodes: Vec<store::NewEpisode>,
    stamp: bool,
) -> Result<u32, wit::Error> {
    if session.trim().is_empty() {
        return Err(wit::Error::InvalidInput(
            "the session id is empty; pass a session id".into(),
        ));
    }
    // abridge's own output fed back in is never stored (nor summarized); with `stamp`, an
    // episode without a timestamp is stamped with its arrival time (idle mode measures from
    // it).
    let now = clock::now_ms() as i64;
    // A newest message given back with the per-call note a context put on it is stored
    // as the message itself.
    let mut episodes = episodes;
    for e in &mut episodes {
        let bare = context::without_note(&e.content);
        if bare.len() != e.content.len() {
            e.content = bare.to_string();
        }
    }
    let own = episodes
        .iter()
        .filter(|e| context::is_own_output(&e.content))
        .count();
    if own > 0 {
        log::write(
            log::Level::Warn,
            &format!(
                "session {session}: skipped {own} episode(s) that are abridge's own summaries or prompts"
            ),
        );
    }
    let episodes: Vec<store::NewEpisode> = episodes
        .into_iter()
        .filter(|e| !context::is_own_output(&e.content))
        .map(|mut e| {
            e.tokens = tokens::estimate_tokens(&e.content);
            if stamp {
                e.timestamp_ms = e.timestamp_ms.or(Some(now));
            }
            e.terms = crate::search::doc(e.speaker.as_deref(), &e.content);
            e
        })
        .collect();
    store::append_episodes(&session, &episodes)
}

impl summarizer::Guest for Component {
    fn append(session: String, episodes: Vec<store::NewEpisode>) -> Result<u32, wit::Error> {
        append(session, episodes, true)
    }

    fn append_imported(
        session: String,
        episodes: Vec<store::NewEpisode>,
    ) -> Result<u32, wit::Error> {
        append(session, episodes, false)
    }

    fn post(
        session: String,
        messages: Vec<summarizer::PostedMessage>,
        keys: Vec<String>,
        cfg: Option<summarizer::Config>,
    ) -> Result<summarizer::Posted, wit::Error> {
        if keys.len() != messages.len() {
            return Err(wit::Error::InvalidInput(format!(
                "{} messages but {} keys: give a key for each message",
                messages.len(),
                keys.len()
            )));
        }
        // Every message is checked before any is stored.
        let mut episodes = Vec::with_capacity(messages.len());
        for (i, (m, key)) in messages.into_iter().zip(keys).enumerate() {
            let posted = transcript::Posted {
                role: m.role,
                content: m.content,
                timestamp: m.timestamp,
                id: m.id.clone(),
                name: m.name,
                item: m.item,
            };
            let Some(mut ep) = transcript::posted_episode(i as u32 + 1, &posted)
                .map_err(wit::Error::InvalidInput)?
            else {
                continue;
            };
            if m.id.is_none() {
                ep.source_key = key;
            }
            episodes.extend(transcript::in_parts(
                ep,
                transcript::DEFAULT_MAX_EPISODE_BYTES as usize,
            ));
        }
        let keys: Vec<String> = episodes.iter().map(|e| e.source_key.clone()).collect();
        let episodes: Vec<store::NewEpisode> = episodes
            .into_iter()
            .map(|e| store::NewEpisode {
                role: role_out(e.role),
                content: e.content,
                timestamp_ms: e.timestamp_ms,
                source_key: e.source_key,
                tokens: 0,
                speaker: e.speaker,
                terms: String::new(),
                item: e.item,
            })
            .collect();
        let stored = append(session.clone(), episodes, true)?;
        let verdict = match cfg {
            Some(cfg) => Some(fresh_out(
                engine::freshness(&mut Imports, &session, &cfg_in(cfg)).map_err(err_out)?,
            )),
            None => None,
        };
        Ok(summarizer::Posted {
            keys,
            stored,
            verdict,
        })
    }

    fn after_episode_written(
        session: String,
        cfg: summarizer::Config,
    ) -> Result<summarizer::Outcome, wit::Error> {
        engine::after_episode_written(&mut Imports, &session, &cfg_in(cfg))
            .map(outcome_out)
            .map_err(err_out)
    }

    fn summarize_now(
        session: String,
        cfg: summarizer::Config,
    ) -> Result<summarizer::Outcome, wit::Error> {
        engine::summarize_now(&mut Imports, &session, &cfg_in(cfg))
            .map(outcome_out)
            .map_err(err_out)
    }

    fn default_config() -> (summarizer::Config, summarizer::ContextRequest) {
        let r = engine::ContextRequest::default();
        (
            cfg_out(policy::Config::default()),
            summarizer::ContextRequest {
                budget: r.budget,
                pairs: r.pairs,
                refresh_after: r.refresh_after,
                pins: r.pins,
                query: r.query,
                verdict_after: None,
            },
        )
    }

    fn catch_up(
        session: String,
        cfg: summarizer::Config,
        upto: u64,
    ) -> Result<summarizer::Outcome, wit::Error> {
        engine::catch_up_to(&mut Imports, &session, &cfg_in(cfg), upto)
            .map(outcome_out)
            .map_err(err_out)
    }

    fn plan(session: String, cfg: summarizer::Config) -> Result<wit::PlanReport, wit::Error> {
        engine::plan_report(&mut Imports, &session, &cfg_in(cfg))
            .map(plan_out)
            .map_err(err_out)
    }

    fn chain(session: String) -> Result<Vec<store::SummaryRow>, wit::Error> {
        store::summaries(&session)
    }

    fn freshness(
        session: String,
        cfg: summarizer::Config,
    ) -> Result<summarizer::FreshnessReport, wit::Error> {
        let f = engine::freshness(&mut Imports, &session, &cfg_in(cfg)).map_err(err_out)?;
        Ok(fresh_out(f))
    }

    fn context_freshness(
        session: String,
        cfg: summarizer::Config,
        refresh_after: u32,
        budget: u32,
    ) -> Result<summarizer::FreshnessReport, wit::Error> {
        let f =
            engine::context_freshness(&mut Imports, &session, &cfg_in(cfg), refresh_after, budget)
                .map_err(err_out)?;
        Ok(fresh_out(f))
    }

    fn refresh(
        session: String,
        cfg: summarizer::Config,
    ) -> Result<summarizer::Outcome, wit::Error> {
        engine::refresh(&mut Imports, &session, &cfg_in(cfg))
            .map(outcome_out)
            .map_err(err_out)
    }

    fn context(
        session: String,
        req: summarizer::ContextRequest,
        cfg: summarizer::Config,
    ) -> Result<summarizer::ContextWindow, wit::Error> {
        let req_verdict_after = req.verdict_after;
        let req = engine::ContextRequest {
            budget: req.budget,
            pairs: req.pairs,
            refresh_after: req.refresh_after,
            pins: req.pins,
            query: req.query,
        };
        let (c, verdict) =
            engine::context_judged(&mut Imports, &session, req, &cfg_in(cfg), req_verdict_after)
                .map_err(err_out)?;
        Ok(summarizer::ContextWindow {
            messages: c.window.messages.into_iter().map(msg_out).collect(),
            tokens: c.window.tokens,
            full_tokens: c.full_tokens,
            covered: c.window.covered,
            recent: c.window.recent,
            omitted: c.window.omitted,
            refreshed: c.refreshed,
            refresh_due: c.refresh_due,
            level: c.window.level,
            covered_from: c.window.covered_from,
            omitted_ranges: ranges_out(c.window.omitted_ranges),
            identifiers: c.window.identifiers,
            pinned: c.window.pinned,
            found: c.window.found,
            budget: c.window.budget,
            parts: summarizer::ContextParts {
                summary: c.window.parts.summary,
                ledger: c.window.parts.ledger,
                digest: c.window.parts.digest,
                pinned: c.window.parts.pinned,
                recent: c.window.parts.recent,
                days: c.window.parts.days,
                found: c.window.parts.found,
            },
            shown: c.window.shown,
            stable: summarizer::StablePrefix {
                messages: c.window.stable.messages,
                chars: c.window.stable.chars,
            },
            note: c.window.note,
            behind: verdict.as_ref().is_some_and(|v| v.1),
            verdict: verdict.map(|v| fresh_out(v.0)),
        })
    }

    fn search(
        session: Option<String>,
        query: String,
        offset: u32,
        limit: u32,
    ) -> Result<summarizer::SearchPage, wit::Error> {
        let page = engine::search(&mut Imports, session.as_deref(), &query, offset, limit)
            .map_err(err_out)?;
        Ok(summarizer::SearchPage {
            hits: page
                .hits
                .into_iter()
                .map(|h| summarizer::SearchHit {
                    session: h.session,
                    episode: episode_out(h.episode),
                    score: h.score,
                    excerpt: h.excerpt,
                })
                .collect(),
            more: page.more,
        })
    }

    fn reset(session: String) -> Result<(), wit::Error> {
        engine::reset(&mut Imports, &session).map_err(err_out)
    }

    fn history(session: String) -> Result<Vec<store::SummaryRow>, wit::Error> {
        store::summary_history(&session)
    }

    fn facts(session: String) -> Result<Vec<summarizer::Fact>, wit::Error> {
        let facts = engine::facts(&mut Imports, &session).map_err(err_out)?;
        Ok(facts
            .iter()
            .map(|f| summarizer::Fact {
                who: f.who.clone(),
                key: f.key.clone(),
                values: f
                    .values
                    .iter()
                    .map(|v| summarizer::FactValue {
                        value: v.value.clone(),
                        from_ms: v.from_ms,
                        episode: v.episode,
                    })
                    .collect(),
                ended: f
                    .ended
                    .as_ref()
                    .map(|(at_ms, episode, sentence)| summarizer::FactEnd {
                        at_ms: *at_ms,
                        episode: *episode,
                        sentence: sentence.clone(),
                    }),
                line: crate::facts::line(f),
            })
            .collect())
    }

    fn expand(
        session: String,
        row: u64,
        identifier: Option<String>,
        after: u64,
        limit: u32,
    ) -> Result<summarizer::Expansion, wit::Error> {
        let x = engine::expand(
            &mut Imports,
            &session,
            row,
            identifier.as_deref(),
            after,
            limit,
        )
        .map_err(err_out)?;
        Ok(summarizer::Expansion {
            row: row_out(x.row),
            episodes: x.episodes.into_iter().map(episode_out).collect(),
            compacted: x.compacted.into_iter().map(row_out).collect(),
            next_after: x.next_after,
        })
    }
}

impl text::Guest for Component {
    fn estimate_tokens(text: String) -> u32 {
        tokens::estimate_tokens(&text)
    }

    fn build_prompt(
        conversation: Vec<wit::Message>,
        previous_summary: Option<String>,
    ) -> text::BuiltPrompt {
        let conv: Vec<types::Message> = conversation
            .into_iter()
            .map(|m| types::Message::new(role_in(m.role), m.content))
            .collect();
        let b = prompt::build(&conv, previous_summary.as_deref());
        text::BuiltPrompt {
            messages: b.messages.into_iter().map(msg_out).collect(),
            chatml: b.chatml,
        }
    }

    fn strip_template_tokens(text: String) -> String {
        strip::strip_template_tokens(&text)
    }

    fn index_terms(episodes: Vec<(Option<String>, String)>) -> Vec<String> {
        episodes
            .iter()
            .map(|(speaker, content)| crate::search::doc(speaker.as_deref(), content))
            .collect()
    }

    fn identifiers(text: String) -> Vec<store::LedgerEntry> {
        ledger::extract(&text)
            .into_iter()
            .map(|(kind, text)| store::LedgerEntry {
                text,
                kind: kind_out(kind),
                episode: 0,
                count: 1,
            })
            .collect()
    }
}

impl tx::Guest for Component {
    type Parser = ParserResource;

    fn describe_error(name: String, error: tx::ParseError, format_flag: String) -> String {
        use transcript::ParseError as P;
        let e = match error {
            tx::ParseError::InvalidUtf8((line, offset)) => P::Utf8 { line, offset },
            tx::ParseError::Malformed((line, message)) => P::Malformed { line, message },
            tx::ParseError::UnknownFormat => P::UnknownFormat,
            tx::ParseError::EmptyFile => P::EmptyFile,
            tx::ParseError::NoMessages(f) => P::NoMessages(format_in(f)),
            tx::ParseError::TooManyEpisodes(n) => P::TooManyEpisodes(n),
        };
        transcript::describe(&name, &e, &format_flag)
    }
}

/// The `parser` resource: one streaming [`transcript::Parser`] per file.
struct ParserResource(std::cell::RefCell<transcript::Parser>);

fn format_in(f: tx::Format) -> transcript::Format {
    match f {
        tx::Format::Jsonl => transcript::Format::Jsonl,
        tx::Format::Openai => transcript::Format::OpenAi,
        tx::Format::ClaudeCode => transcript::Format::ClaudeCode,
        tx::Format::Chatgpt => transcript::Format::ChatGpt,
        tx::Format::Codex => transcript::Format::Codex,
    }
}

fn format_out(f: transcript::Format) -> tx::Format {
    match f {
        transcript::Format::Jsonl => tx::Format::Jsonl,
        transcript::Format::OpenAi => tx::Format::Openai,
        transcript::Format::ClaudeCode => tx::Format::ClaudeCode,
        transcript::Format::ChatGpt => tx::Format::Chatgpt,
        transcript::Format::Codex => tx::Format::Codex,
    }
}

fn batch_out(
    r: Result<transcript::Batch, transcript::ParseError>,
) -> Result<tx::Batch, tx::ParseError> {
    use transcript::ParseError as P;
    match r {
        Ok(b) => Ok(tx::Batch {
            format: b.format.map(format_out),
            conversations: b
                .conversations
                .into_iter()
                .map(|c| tx::ConversationPart {
                    index: c.index,
                    id: c.id,
                    title: c.title,
                    episodes: c
                        .episodes
                        .into_iter()
                        .map(|e| tx::ParsedEpisode {
                            role: role_out(e.role),
                            content: e.content,
                            timestamp_ms: e.timestamp_ms,
                            source_key: e.source_key,
                            speaker: e.speaker,
                            item: e.item,
                        })
                        .collect(),
                })
                .collect(),
            warnings: b.warnings,
        }),
        Err(P::Utf8 { line, offset }) => Err(tx::ParseError::InvalidUtf8((line, offset))),
        Err(P::Malformed { line, message }) => Err(tx::ParseError::Malformed((line, message))),
        Err(P::UnknownFormat) => Err(tx::ParseError::UnknownFormat),
        Err(P::EmptyFile) => Err(tx::ParseError::EmptyFile),
        Err(P::NoMessages(f)) => Err(tx::ParseError::NoMessages(format_out(f))),
        Err(P::TooManyEpisodes(n)) => Err(tx::ParseError::TooManyEpisodes(n)),
    }
}

impl tx::GuestParser for ParserResource {
    fn new(opts: tx::ParseOptions) -> Self {
        ParserResource(std::cell::RefCell::new(transcript::Parser::new(
            transcript::Options {
                format: opts.format.map(format_in),
                include_tools: opts.include_tools,
                skip_invalid: opts.skip_invalid,
                first_line: opts.first_line,
                name: opts.name,
                max_episode_bytes: opts.max_episode_bytes,
                whole: opts.whole,
                max_episodes: opts.max_episodes,
            },
        )))
    }

    fn feed(&self, chunk: Vec<u8>) -> Result<tx::Batch, tx::ParseError> {
        batch_out(self.0.borrow_mut().feed(&chunk))
    }

    fn finish(&self) -> Result<tx::Batch, tx::ParseError> {
        batch_out(self.0.borrow_mut().finish())
    }
}

#[path = "component_memory.rs"]
mod component_memory;

bindings::export!(Component with_types_in self::bindings);
