//! A tenant's sessions: reading them (a session, the list, messages, summaries and their
//! coverage), their settings (focus, pins, mode), expansion, resets, pops and source marks.

use super::*;

impl Scoped {
    /// The engine configuration for a session: the global one with the session's own mode
    /// and focus.
    pub async fn session_config(&self, session: &str) -> AppResult<SessionConfig> {
        self.for_session(session, &self.app.inner.cfg.config).await
    }

    /// `base` (a front end's configuration: its backend, model, budgets) with the session's own
    /// mode and focus: the only configuration a verdict or a job takes, so which session
    /// settings a fold honours is not a front end's choice (`abridge refresh` folds with the
    /// session's focus as `POST …/refresh` does).
    pub async fn for_session(&self, session: &str, base: &Config) -> AppResult<SessionConfig> {
        let own = self.tables.session_mode(session).await?;
        let mut cfg = crate::sources::with_mode(base, own.as_ref());
        if let Some(focus) = self.tables.session_focus(session).await? {
            cfg.focus = focus;
        }
        Ok(SessionConfig(cfg))
    }

    /// Set (`Some`) or clear (`None`) a session's focus instructions (added to every fold
    /// prompt); the session's focus now, if any.
    pub async fn set_focus(&self, session: &str, focus: Option<&str>) -> AppResult<Option<String>> {
        self.known(session).await?;
        let focus = focus.map(str::trim).filter(|f| !f.is_empty());
        if let Some(f) = focus
            && f.chars().count() > MAX_FOCUS_CHARS
        {
            return Err(AppError::invalid(format!(
                "the focus is {} characters; keep it under {MAX_FOCUS_CHARS} (it goes into every fold prompt)",
                f.chars().count()
            )));
        }
        self.tables.set_session_focus(session, focus).await?;
        Ok(self.tables.session_focus(session).await?)
    }

    /// The session's focus instructions, if any.
    pub async fn focus(&self, session: &str) -> AppResult<Option<String>> {
        self.known(session).await?;
        Ok(self.tables.session_focus(session).await?)
    }

    /// Pin (`true`) or unpin an episode: a pinned episode is in every context verbatim
    /// (within the budget), whatever its age. Returns the session's pins.
    pub async fn pin(&self, session: &str, episode: u64, pinned: bool) -> AppResult<Vec<u64>> {
        let stats = self.known(session).await?;
        if pinned && (episode == 0 || episode > stats.last_episode) {
            return Err(AppError::not_found(format!(
                "session '{session}' has episodes 1-{}; there is no episode {episode} to pin",
                stats.last_episode
            )));
        }
        self.tables.set_pin(session, episode, pinned).await?;
        Ok(self.tables.pins(session).await?)
    }

    /// The session's pinned episodes.
    pub async fn pins(&self, session: &str) -> AppResult<Vec<u64>> {
        self.known(session).await?;
        Ok(self.tables.pins(session).await?)
    }

    /// Every summary row of a session, compacted ones included.
    pub async fn summary_history(&self, session: &str) -> AppResult<Vec<SummaryView>> {
        self.known(session).await?;
        Ok(self
            .engine()
            .history(session)
            .await?
            .iter()
            .map(SummaryView::from)
            .collect())
    }

    /// Provenance: summary row `row` and exactly the episodes it covers (a page of `limit`
    /// after `after`), or with `identifier` the episode that ledger entry came from. An
    /// unknown row is [`ErrorKind::NotFound`].
    pub async fn expand(
        &self,
        session: &str,
        row: u64,
        identifier: Option<&str>,
        after: u64,
        limit: u32,
    ) -> AppResult<views::ExpansionView> {
        self.known(session).await?;
        match self
            .engine()
            .expand(session, row, identifier, after, limit)
            .await
        {
            Ok(x) => Ok(views::ExpansionView::from(&x)),
            Err(crate::runtime::CallError::Engine(crate::types::Error::InvalidInput(m))) => {
                Err(AppError::not_found(m))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The session's facts as they stand (current value, what it replaced, how it ended, and
    /// the episode of each), the facts changed most recently first.
    pub async fn facts(&self, session: &str) -> AppResult<Vec<views::FactView>> {
        self.known(session).await?;
        Ok(self
            .engine()
            .facts(session)
            .await?
            .iter()
            .map(views::FactView::from)
            .collect())
    }

    /// Remember that `session` held `last_episode` episodes after importing the first `bytes`
    /// bytes of the file `source`, so a summary can say how far into its file it reaches.
    pub async fn mark_source(
        &self,
        session: &str,
        source: &str,
        last_episode: u64,
        bytes: u64,
    ) -> AppResult<()> {
        Ok(self
            .tables
            .record_mark(session, source, last_episode, bytes)
            .await?)
    }

    /// How far into its file a summary ending at `last_episode` reaches (when the session
    /// came from one).
    pub async fn source_mark(
        &self,
        session: &str,
        last_episode: u64,
    ) -> AppResult<Option<crate::sources::Mark>> {
        Ok(self.tables.mark_covering(session, last_episode).await?)
    }

    /// Whether a live worker (here or in another process) is running a job of `session`.
    pub async fn session_busy(&self, session: &str) -> AppResult<bool> {
        Ok(self
            .app
            .inner
            .jobs
            .session_busy(&*self.tables, session)
            .await?)
    }

    /// A session's standing.
    pub async fn session(&self, session: &str) -> AppResult<SessionView> {
        let stats = self.known(session).await?;
        self.view(session, stats).await
    }

    /// The view of a session whose figures were just read.
    pub(crate) async fn view(
        &self,
        session: &str,
        stats: crate::types::SessionStats,
    ) -> AppResult<SessionView> {
        let own = self.tables.session_mode(session).await?;
        let cfg = crate::sources::with_mode(&self.app.inner.cfg.config, own.as_ref());
        let f = self.engine().freshness(session, &cfg).await?;
        let active = self.active_job(session).await?;
        // The whole history as a model call would carry it (each message's framing counted,
        // as a context's `full_tokens` counts it): one size on every page.
        let history = stats.total_tokens + abridge_engine::MESSAGE_COST * stats.episodes;
        let chain: u64 = self
            .store()
            .summaries(session)
            .await?
            .iter()
            .map(|r| u64::from(r.tokens))
            .sum();
        let mut v = SessionView::new(
            session,
            &f,
            (cfg.mode, own.is_some()),
            active.map(|j| j.id),
            (history, chain),
        );
        (v.title, v.project) = self.label(session).await?;
        Ok(v)
    }

    /// Sessions, most recently changed first, `limit` from `offset`; and the total. With
    /// `search`, only sessions whose id, title or project folder contains it (ignoring case).
    /// Only this tenant's part of the store is read: a page from its index; a search from its
    /// trigram index (the sessions holding the query's rarest trigrams), each candidate checked
    /// against its id and opened names.
    pub async fn sessions(
        &self,
        offset: usize,
        limit: usize,
        search: Option<&str>,
    ) -> AppResult<(Vec<SessionView>, usize)> {
        let limit32 = u32::try_from(limit).unwrap_or(u32::MAX);
        let (page, total) = match search.map(str::trim).filter(|q| !q.is_empty()) {
            None => {
                let page = self.tables.sessions_page(offset as u64, limit32).await?;
                let total = self.tables.sessions_count().await?;
                (page, usize::try_from(total).unwrap_or(usize::MAX))
            }
            Some(q) => {
                let q = q.to_lowercase();
                // The candidates come from the store's trigram index; each is checked here.
                let hits: Vec<String> = self
                    .tables
                    .sessions_labelled(&q)
                    .await?
                    .into_iter()
                    .filter(|(s, json)| {
                        let (title, project) = naming::parse_label(json.as_deref());
                        [Some(s.as_str()), title.as_deref(), project.as_deref()]
                            .into_iter()
                            .flatten()
                            .any(|x| x.to_lowercase().contains(&q))
                    })
                    .map(|(s, _)| s)
                    .collect();
                let total = hits.len();
                (hits.into_iter().skip(offset).take(limit).collect(), total)
            }
        };
        let mut out = Vec::with_capacity(page.len());
        for s in &page {
            let stats = self.store().stats(s).await?;
            out.push(self.view(s, stats).await?);
        }
        Ok((out, total))
    }

    /// A page of the session's messages (`limit` after episode `after`), each with the active
    /// summary row that covers it.
    pub async fn messages(&self, session: &str, after: u64, limit: u32) -> AppResult<MessagesView> {
        let stats = self.known(session).await?;
        let rows = self.store().summaries(session).await?;
        let page = self
            .store()
            .episodes_after(session, after, limit.clamp(1, 1000))
            .await?;
        let next_after = page
            .last()
            .map(|e| e.id)
            .filter(|&last| last < stats.last_episode);
        let ids: Vec<u64> = page.iter().map(|e| e.id).collect();
        let mut items = self.tables.items(session, &ids).await?;
        let messages = page
            .into_iter()
            .map(|e| {
                // The chain is in episode order: the candidate is the last row starting at or
                // before the message.
                let covered_by = rows[..rows.partition_point(|r| r.first_episode <= e.id)]
                    .last()
                    .filter(|r| e.id <= r.last_episode)
                    .map(|r| r.id);
                let item = items.remove(&e.id).map(views::item_value);
                MessageView {
                    item,
                    ..MessageView::of(e, covered_by)
                }
            })
            .collect();
        Ok(MessagesView {
            session: session.to_string(),
            messages,
            total: stats.episodes,
            next_after,
        })
    }

    /// What each row covers of the transcript: its last exchange's time, the bytes and the
    /// number of its messages (from the running byte totals the store keeps per episode).
    pub async fn with_coverage(
        &self,
        session: &str,
        mut rows: Vec<SummaryView>,
    ) -> AppResult<Vec<SummaryView>> {
        // Two reads per row: the running byte totals at its ends (and its last episode's
        // time), whatever the length of the session.
        let top = self.store().stats(session).await?.last_episode;
        for r in &mut rows {
            let (first, last) = (
                r.first_episode.clamp(1, top.max(1)),
                r.last_episode.min(top),
            );
            let source = self
                .source_mark(session, r.last_episode)
                .await?
                .map(|m| SourceMarkView {
                    path: m.path,
                    bytes: m.bytes,
                });
            let ends = if last >= first && top > 0 {
                let end = self.store().bytes_through(session, last).await?;
                let start = match first {
                    1 => Some((0, None)),
                    _ => self.store().bytes_through(session, first - 1).await?,
                };
                start.zip(end)
            } else {
                None
            };
            r.coverage = Some(if let Some(((before, _), (through, at))) = ends {
                CoverageView {
                    last_exchange_ms: at,
                    transcript_bytes: through.saturating_sub(before),
                    messages: last - first + 1,
                    source,
                }
            } else {
                CoverageView {
                    last_exchange_ms: None,
                    transcript_bytes: 0,
                    messages: 0,
                    source,
                }
            });
        }
        Ok(rows)
    }

    /// Every session id of this tenant, most recently changed first (from its own part of
    /// the store).
    pub async fn session_ids(&self) -> AppResult<Vec<String>> {
        Ok(self.tables.sessions_page(0, u32::MAX).await?)
    }

    /// The session's newest summary row, if any: what a command prints as the summary, read
    /// alone (a long session's chain holds thousands of rows).
    pub async fn latest_summary(&self, session: &str) -> AppResult<Option<SummaryView>> {
        self.known(session).await?;
        Ok(self
            .store()
            .latest_summary(session)
            .await?
            .as_ref()
            .map(SummaryView::from))
    }

    /// A session's summary chain, oldest first.
    pub async fn summaries(&self, session: &str) -> AppResult<Vec<SummaryView>> {
        self.known(session).await?;
        Ok(self
            .store()
            .summaries(session)
            .await?
            .iter()
            .map(SummaryView::from)
            .collect())
    }

    /// Set (or with `None` clear) a session's own refresh mode; returns the mode in force.
    pub async fn set_mode(
        &self,
        session: &str,
        mode: Option<SessionMode>,
    ) -> AppResult<SessionView> {
        let stats = self.known(session).await?;
        self.tables.set_session_mode(session, mode.as_ref()).await?;
        self.view(session, stats).await
    }

    /// Delete a session and everything kept for it (episodes, summaries, failure marker, jobs,
    /// mode, the files it was imported from); returns how many episodes it had.
    pub async fn reset(&self, session: &str) -> AppResult<u64> {
        let stats = self.known(session).await?;
        self.reset_quietly(session).await?;
        self.publish(What::SessionReset {}, Some(session), None);
        Ok(stats.episodes)
    }

    pub(crate) async fn reset_quietly(&self, session: &str) -> AppResult<()> {
        // Its events first: those still queued are written, then dropped with the rest.
        self.app
            .inner
            .events
            .forget_session(&self.tenant, session, None)
            .await;
        self.engine().reset(session).await?;
        Ok(())
    }

    /// Remove the session's newest message (an undo: an agent framework's `pop`). In one
    /// store transaction the message goes with every summary row that covered it, and the rows
    /// an earlier compaction had folded into those come back; the chain rule holds after. A
    /// refresh then folds again what the deleted rows covered besides the message, when the
    /// session's mode would have kept it folded. Removing a session's only message removes the
    /// session. Its id is free again: the next message takes it.
    pub async fn pop(&self, session: &str) -> AppResult<RemovedView> {
        self.known(session).await?;
        self.writing("remove messages")?;
        let before = self.covered(session).await?;
        // Summary events still queued are written before the store deletes them.
        self.app
            .inner
            .events
            .forget_session(&self.tenant, session, Some("summary.written"))
            .await;
        let popped = self
            .tables
            .pop_episode(session)
            .await?
            .ok_or_else(|| AppError::not_found(format!("no session '{session}'")))?;
        let e = popped.episode;
        let left = self.store().stats(session).await?.episodes;
        let job = if left == 0 {
            self.reset_quietly(session).await?;
            None
        } else if !popped.dropped.is_empty() {
            // What the dropped rows covered, without the message.
            let target = before.min(e.id - 1);
            let cfg = self.session_config(session).await?;
            if target > self.covered(session).await? {
                Some(self.job_view(&self.enqueue(session, target, &cfg).await?))
            } else {
                None
            }
        } else {
            None
        };
        self.publish(
            What::MessageRemoved {
                message: e.id,
                dropped: popped.dropped.clone(),
            },
            Some(session),
            None,
        );
        Ok(RemovedView {
            session: session.to_string(),
            message: MessageView {
                item: popped.item.clone().map(views::item_value),
                ..MessageView::of(e, None)
            },
            dropped_rows: popped.dropped,
            reopened_rows: popped.reopened,
            episodes: left,
            job,
        })
    }
}
