//! Messages and context: appending (posted records, inline, imported), the one due rule and
//! its verdicts, queueing a refresh, the context a model is sent, search and plans.

use super::*;

/// What [`Scoped::append_inline`] did.
#[derive(Debug)]
pub struct InlineAppend {
    /// Episodes stored (the rest were already there).
    pub stored: u32,
    /// Summary rows the refresh wrote or extended (0 when none was due).
    pub passes: u32,
    /// Summary rows written or extended.
    pub written: Vec<crate::types::SummaryRow>,
    /// Why a due refresh failed.
    pub failure: Option<AppError>,
}

/// The smallest context budget (tokens): what holds one message.
pub const MIN_CONTEXT_BUDGET: u32 = 16;

/// What a context read asks for ([`Scoped::context`]), with every front end's defaults
/// written here once: `ContextAsk { query, ..ContextAsk::new(budget) }`.
#[derive(Clone, Copy, Debug)]
pub struct ContextAsk<'a> {
    /// Tokens the context may take (at least [`MIN_CONTEXT_BUDGET`]).
    pub budget: u32,
    /// Recent message pairs kept verbatim.
    pub pairs: u32,
    /// A refresh is due when more than this many messages lie beyond the summary
    /// (`u32::MAX`: only when the session's mode says so).
    pub refresh_after: u32,
    /// Wait up to this long for a due refresh first (`None`: never wait).
    pub wait: Option<Duration>,
    /// What the next call is about (usually the user's newest message): the earlier turns
    /// that best match it are included verbatim.
    pub query: Option<&'a str>,
}

impl ContextAsk<'_> {
    /// The budget when none is given.
    pub const DEFAULT_BUDGET: u32 = 2000;
    /// The recent pairs kept verbatim when none are given.
    pub const DEFAULT_PAIRS: u32 = 4;
    /// The messages beyond the summary a context waits for before a refresh is due.
    pub const DEFAULT_REFRESH_AFTER: u32 = 8;

    /// A context of `budget` tokens with the other defaults.
    pub fn new(budget: u32) -> Self {
        ContextAsk {
            budget,
            pairs: Self::DEFAULT_PAIRS,
            refresh_after: Self::DEFAULT_REFRESH_AFTER,
            wait: None,
            query: None,
        }
    }

    /// Whether the ask can be answered (a front end may check it before it opens anything).
    pub fn check(&self) -> AppResult<()> {
        if self.budget < MIN_CONTEXT_BUDGET {
            return Err(AppError::invalid(format!(
                "budget {} is too small to hold a message; give at least {MIN_CONTEXT_BUDGET} tokens",
                self.budget
            )));
        }
        Ok(())
    }
}

impl Default for ContextAsk<'_> {
    fn default() -> Self {
        ContextAsk::new(Self::DEFAULT_BUDGET)
    }
}

/// Why the due rule ([`Scoped::due`]) is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Messages arrived (posted, ingested, watched or uploaded): the mode's trigger, and the
    /// fold point it names.
    Append,
    /// A user asked for a summary (`summarize`, `backfill`, a refresh, an upgrade): every
    /// episode beyond the chain, and offline rows the model rewrites.
    Asked,
}

impl Scoped {
    /// The last episode the session's summary chain covers (0 without a summary).
    pub(crate) async fn covered(&self, session: &str) -> AppResult<u64> {
        Ok(self
            .store()
            .latest_summary(session)
            .await?
            .map_or(0, |r| r.last_episode))
    }

    /// The one due rule: the episode a refresh of `session` under `cfg` must bring it to, or
    /// `None` when nothing is due, for `reason`. Every decision to queue or run a refresh
    /// asks here; the verdicts are the guest's.
    pub async fn due(
        &self,
        session: &str,
        cfg: &SessionConfig,
        reason: Reason,
    ) -> AppResult<Option<u64>> {
        Ok(self.verdict(session, cfg, reason).await?.0)
    }

    /// [`Scoped::due`]'s answer, and the session's episode count the verdict saw.
    pub(crate) async fn verdict(
        &self,
        session: &str,
        cfg: &SessionConfig,
        reason: Reason,
    ) -> AppResult<(Option<u64>, u64)> {
        let f = match reason {
            Reason::Append => self.engine().freshness(session, cfg).await?,
            Reason::Asked => {
                let stats = self.store().stats(session).await?;
                let last = stats.last_episode;
                if last > self.covered(session).await? {
                    return Ok((Some(last), stats.episodes));
                }
                // Everything is covered: rows the offline summarizer wrote that `cfg`'s model
                // rewrites (the guest's count) are the work.
                let f = self.engine().freshness(session, cfg).await?;
                return Ok(((f.fallback_rows > 0).then_some(last), stats.episodes));
            }
        };
        Ok((
            (f.state == FreshState::Due).then_some(f.fold_upto),
            f.episodes,
        ))
    }

    /// A session's figures; an unknown session is [`ErrorKind::NotFound`].
    pub(crate) async fn known(&self, session: &str) -> AppResult<crate::types::SessionStats> {
        check_session(session)?;
        let stats = self.store().stats(session).await?;
        if stats.episodes == 0 {
            return Err(AppError::not_found(format!("no session '{session}'")));
        }
        Ok(stats)
    }

    /// The guest's freshness verdict for `session` under `cfg` (no model call).
    pub async fn freshness(&self, session: &str, cfg: &Config) -> AppResult<FreshnessReport> {
        Ok(self.engine().freshness(session, cfg).await?)
    }

    /// What summarizing `session` now under `cfg` would do and cost (no model call, nothing
    /// written): a dry run's answer.
    pub async fn plan(&self, session: &str, cfg: &Config) -> AppResult<types::PlanReport> {
        Ok(self.engine().plan(session, cfg).await?)
    }

    /// Refuse a request of more messages than one request takes (the service's limit; the
    /// parser holds the same bound for what it is given).
    pub fn check_message_count(&self, n: usize) -> AppResult<()> {
        let most = self.app.inner.cfg.limits.messages_per_request;
        if most > 0 && n as u64 > most {
            return Err(AppError::new(
                ErrorKind::TooLarge,
                format!("the body holds {n} messages, more than one request takes ({most})"),
            )
            .hint(format!("post them in requests of at most {most} messages")));
        }
        Ok(())
    }

    /// Append messages as a client posts them (the messages API's records), in one guest
    /// call: each is checked as `abridge ingest` checks a line (one that is wrong fails the
    /// request, nothing stored), a message with an `id` already stored is skipped (re-posting
    /// is idempotent), and the session's verdict comes back with the write. Never calls the
    /// model: when a refresh is due it is queued as a job.
    pub async fn post(&self, session: &str, messages: Vec<MessageIn>) -> AppResult<Appended> {
        check_session(session)?;
        self.check_message_count(messages.len())?;
        let cfg = self.session_config(session).await?;
        // An active job of the session already covers the work: no verdict then.
        let active = self.active_job(session).await?;
        let json = |v: Option<serde_json::Value>| v.map(|v| v.to_string());
        let mut keys = Vec::with_capacity(messages.len());
        let records: Vec<types::PostedMessage> = messages
            .into_iter()
            .map(|m| {
                keys.push(import::unkeyed(&self.app.unique_id()));
                types::PostedMessage {
                    role: m.role,
                    content: m.content,
                    timestamp: json(m.timestamp),
                    id: json(m.id),
                    name: m.name,
                    item: json(m.item),
                }
            })
            .collect();
        let posted = self
            .engine()
            .post(session, &records, &keys, active.is_none().then_some(&*cfg))
            .await?;
        let received = posted.keys.len() as u32;
        let ids = posted.keys.iter().map(|k| import::client_id(k)).collect();
        let (job, episodes) = match (active, posted.verdict) {
            (None, Some(f)) => (self.queue_due(session, &f, &cfg).await?, f.episodes),
            (active, _) => (active, self.store().stats(session).await?.episodes),
        };
        Ok(Appended {
            session: session.to_string(),
            ids,
            received,
            stored: posted.stored,
            duplicates: received - posted.stored,
            episodes,
            job: job.map(|j| self.job_view(&j)),
        })
    }

    /// Append episodes and, when a refresh is due, run it here and now: one user's process
    /// (the command line's ingest), where the caller waits. The refresh is the session's job,
    /// run here through the job service like every refresh (a job of the session that a live
    /// worker already runs covers the work). A refresh that fails is reported in the result,
    /// not as an error: the episodes are stored and the previous summary is kept. (The
    /// service's [`Scoped::append`] queues the job instead; whether one is due is the guest's
    /// verdict either way.)
    pub async fn append_inline(
        &self,
        session: &str,
        episodes: &[NewEpisode],
        cfg: &SessionConfig,
    ) -> AppResult<InlineAppend> {
        check_session(session)?;
        let stored = self.engine().append(session, episodes).await?;
        let mut out = InlineAppend {
            stored,
            passes: 0,
            written: Vec::new(),
            failure: None,
        };
        if self
            .app
            .inner
            .jobs
            .session_busy(&*self.tables, session)
            .await?
        {
            return Ok(out);
        }
        let Some(target) = self.due(session, cfg, Reason::Append).await? else {
            return Ok(out);
        };
        let before = self.store().summaries(session).await?;
        match self.run_or_join(session, target, cfg).await {
            Ok(_) => {
                // What the job wrote: the rows that are new or reach further than before.
                out.written = self
                    .store()
                    .summaries(session)
                    .await?
                    .into_iter()
                    .filter(|r| {
                        !before.iter().any(|b| {
                            b.id == r.id && b.last_episode == r.last_episode && b.level == r.level
                        })
                    })
                    .collect();
                out.passes = out.written.len() as u32;
            }
            Err(e) if e.kind == ErrorKind::InvalidInput => return Err(e),
            Err(e) => out.failure = Some(e),
        }
        Ok(out)
    }

    /// Append episodes and queue a refresh when one is due.
    pub async fn append(
        &self,
        session: &str,
        episodes: Vec<NewEpisode>,
        ids: Vec<String>,
    ) -> AppResult<Appended> {
        check_session(session)?;
        let received = episodes.len() as u32;
        let stored = self.engine().append(session, &episodes).await?;
        let cfg = self.session_config(session).await?;
        let (job, episodes) = self.queue_if_due(session, &cfg).await?;
        Ok(Appended {
            session: session.to_string(),
            ids,
            received,
            stored,
            duplicates: received - stored,
            episodes,
            job: job.map(|j| self.job_view(&j)),
        })
    }

    /// Queue a refresh of `session` when its freshness says one is due. An active job of the
    /// session already covers the work. Returns the job (queued now, or already active) and
    /// the session's episode count.
    pub(crate) async fn queue_if_due(
        &self,
        session: &str,
        cfg: &SessionConfig,
    ) -> AppResult<(Option<Job>, u64)> {
        // An active job already covers the work: skip the verdict (a guest call) then.
        if let Some(j) = self.active_job(session).await? {
            return Ok((Some(j), self.store().stats(session).await?.episodes));
        }
        let f = self.engine().freshness(session, cfg).await?;
        Ok((self.queue_due(session, &f, cfg).await?, f.episodes))
    }

    /// Queue the refresh a guest's verdict names when it is due, unless the caller may only
    /// read (a read-only caller never causes model spend).
    pub(crate) async fn queue_due(
        &self,
        session: &str,
        f: &FreshnessReport,
        cfg: &SessionConfig,
    ) -> AppResult<Option<Job>> {
        if f.state == FreshState::Due && !self.read_only {
            Ok(Some(self.enqueue(session, f.fold_upto, cfg).await?))
        } else {
            Ok(None)
        }
    }

    /// The session's queued or running job, if any (it covers what the session holds).
    pub(crate) async fn active_job(&self, session: &str) -> AppResult<Option<Job>> {
        Ok(self
            .app
            .inner
            .jobs
            .active_for(&*self.tables, session)
            .await?)
    }

    pub(crate) async fn enqueue(
        &self,
        session: &str,
        target: u64,
        cfg: &SessionConfig,
    ) -> AppResult<Job> {
        let jobs = &self.app.inner.jobs;
        let (queued, mine) = jobs.queued_of(&*self.tables, session).await?;
        // Repeated refreshes of one session coalesce: its queued job, once it runs, is the
        // refresh (what is due after it queues the next).
        if let Some(j) = mine {
            return Ok(j);
        }
        let limit = self.app.inner.cfg.limits.queued_per_tenant;
        if limit > 0 && queued >= limit {
            return Err(AppError::new(
                ErrorKind::RateLimited {
                    retry_after_secs: 30,
                },
                format!(
                    "this tenant already has {queued} refreshes queued (the limit is {limit}); the messages are stored and the refresh is asked for again by the next write or context read"
                ),
            )
            .hint("wait for the queue to drain (GET /v1/jobs), then retry; send large imports in smaller parts"));
        }
        let (job, created) = self
            .app
            .inner
            .jobs
            .enqueue(&*self.tables, session, target, cfg)
            .await?;
        if created {
            self.publish(What::queued(target), Some(session), Some(job.id));
            self.app.inner.wake.notify_one();
        }
        Ok(job)
    }

    /// Queue a refresh now, whatever the session's mode or backoff. `None` when every episode
    /// is already covered.
    pub async fn refresh(&self, session: &str) -> AppResult<Option<JobView>> {
        self.known(session).await?;
        let cfg = self.session_config(session).await?;
        let Some(target) = self.due(session, &cfg, Reason::Asked).await? else {
            return Ok(None);
        };
        let job = self.enqueue(session, target, &cfg).await?;
        Ok(Some(self.job_view(&job)))
    }

    /// The context for the next model call, from what is summarized now. Never waits for the
    /// model unless `ask.wait` is given: a refresh that is due is queued and reported. With
    /// `wait`, a due refresh is queued and waited for (up to that long) first.
    ///
    /// With a `query` (usually the user's newest message), the earlier turns that best match it
    /// are included verbatim beside the summary, within their share of the budget.
    pub async fn context(&self, session: &str, ask: ContextAsk<'_>) -> AppResult<ContextView> {
        ask.check()?;
        let ContextAsk {
            budget,
            pairs,
            refresh_after,
            wait,
            query,
        } = ask;
        let stats = self.known(session).await?;
        let cfg = self.session_config(session).await?;
        // An active job of the session already covers the work: no verdict then.
        let mut job = self.active_job(session).await?;
        let pins = self.tables.pins(session).await?;
        let mut req = ContextRequest {
            budget,
            pairs,
            // The hot path never summarizes inline: refreshes run as jobs.
            refresh_after: u32::MAX,
            pins,
            query: query.map(str::to_string),
            // The guest's verdict comes with the window, from the same call.
            verdict_after: job.is_none().then_some(refresh_after),
        };
        let mut w = self.engine().context(session, req.clone(), &cfg).await?;
        let episodes = w.verdict.as_ref().map_or(stats.episodes, |f| f.episodes);
        if let Some(f) = &w.verdict {
            job = self.queue_due(session, f, &cfg).await?;
        }
        let mut waited = false;
        if let (Some(limit), Some(j)) = (wait, &job) {
            // Asked to wait for the refresh: the context is read again once it is done.
            waited = true;
            if let Some(done) = self.wait_job(j.id, limit).await? {
                job = Some(done);
            }
            req.verdict_after = None;
            w = self.engine().context(session, req, &cfg).await?;
        }
        let pending = job.as_ref().is_some_and(|j| j.state.is_active());
        // Left out and no refresh on the way (more than the caller allows, or what the engine
        // says is due): it waits for idle mode's quiet window or a failing model's backoff.
        let due = !pending && (w.refresh_due || w.behind);
        let job = job.map(|j| self.job_view(&j));
        let mut view = ContextView::new(session, &w, job, (pending, due), waited, episodes);
        // The items clients stored with the messages shown, handed back as given.
        let mut items = self.tables.items(session, &w.shown).await?;
        for m in &mut view.messages {
            if let Some(text) = m.episode.and_then(|id| items.remove(&id)) {
                m.item = Some(views::item_value(text));
            }
        }
        Ok(view)
    }

    /// Full-text search of the tenant's messages (of one session, with `session`): the
    /// `limit` best (at most 100) after the first `offset`, ranked by BM25. A query's
    /// punctuation and operators are words or nothing; a query of no searchable word finds
    /// nothing.
    pub async fn search(
        &self,
        query: &str,
        session: Option<&str>,
        offset: u32,
        limit: u32,
    ) -> AppResult<SearchView> {
        if let Some(s) = session {
            self.known(s).await?;
        }
        if offset > SEARCH_MAX_OFFSET {
            return Err(AppError::invalid(format!(
                "offset {offset} is beyond the deepest page ({SEARCH_MAX_OFFSET}); add words to the query to narrow it"
            )));
        }
        if !(1..=SEARCH_MAX_LIMIT).contains(&limit) {
            return Err(AppError::invalid(format!(
                "limit {limit} is out of range; give 1 to {SEARCH_MAX_LIMIT}"
            )));
        }
        let page = self.engine().search(session, query, offset, limit).await?;
        Ok(SearchView {
            query: query.to_string(),
            session: session.map(str::to_string),
            hits: page.hits.iter().map(SearchHitView::new).collect(),
            next_offset: page.more.then_some(offset + limit),
            complete: !self.app.indexing(),
        })
    }
}
