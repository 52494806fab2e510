//! The app's tables ([`super::tables`]) in memory, with the same rules as the SQLite ones.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::MemoryStore;
use super::tables::{
    EventRow, EventStore, JobScope, JobStore, Liveness, SourceStore, TenantCap, TokenRow,
    TokenStore, in_scope,
};
use crate::control::Progress;
use crate::jobs::{Beat, Claim, Job, JobState};
use crate::rules;
use crate::sources::{Mark, SessionMode, Source, WatchedFile};
use crate::types::Error;

/// The app's tables of a [`MemoryStore`].
#[derive(Default)]
pub(super) struct Tables {
    jobs: BTreeMap<u64, Job>,
    sources: BTreeMap<String, Source>,
    watched: BTreeMap<String, WatchedFile>,
    /// (session, path, last episode) → bytes.
    marks: BTreeMap<(String, String, u64), u64>,
    modes: BTreeMap<String, SessionMode>,
    focus: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    pins: BTreeMap<String, std::collections::BTreeSet<u64>>,
    /// Token rows with their hashes.
    tokens: Vec<(TokenRow, String)>,
    /// Each tenant's newest events, oldest first.
    events: BTreeMap<String, std::collections::VecDeque<EventRow>>,
}

impl Tables {
    /// Forget the app's rows of a session, walking the one reset cascade
    /// ([`crate::rules::RESET_CASCADE`]); the session's own rows (episodes, summaries, its
    /// failure marker) are the [`MemoryStore`]'s.
    pub(super) fn reset_session(&mut self, session: &str) {
        use crate::rules::ResetStep;
        for step in crate::rules::RESET_CASCADE {
            match *step {
                ResetStep::Rows { table, .. } => match table {
                    "source_marks" => self.marks.retain(|(s, _, _), _| s != session),
                    "watched_files" => self
                        .watched
                        .retain(|_, f| f.session.as_deref() != Some(session)),
                    "session_modes" => drop(self.modes.remove(session)),
                    "session_focus" => drop(self.focus.remove(session)),
                    "session_labels" => drop(self.labels.remove(session)),
                    "session_pins" => drop(self.pins.remove(session)),
                    "events" => {
                        for log in self.events.values_mut() {
                            log.retain(|e| e.session_key.as_deref() != Some(session));
                        }
                    }
                    // Kept by the MemoryStore itself (see its reset_session).
                    "summaries" | "episodes" | "failure_markers" | "sessions" => {}
                    // This store keeps no search index (its searches read every session).
                    "session_grams" => {}
                    other => unreachable!(
                        "the reset cascade names table {other}, which the in-memory store does not keep"
                    ),
                },
                ResetStep::SourcesNaming => self
                    .sources
                    .retain(|_, s| !s.sessions.iter().any(|x| x == session)),
                ResetStep::JobsNotRunning => self
                    .jobs
                    .retain(|_, j| j.session != session || j.state == JobState::Running),
                ResetStep::CancelRunningJob => {
                    for j in self.jobs.values_mut().filter(|j| j.session == session) {
                        j.cancel_requested = true;
                    }
                }
            }
        }
    }
}

impl Tables {
    /// Walk the pop cascade ([`crate::rules::POP_CASCADE`]) for episode `episode`.
    pub(super) fn pop_side(&mut self, session: &str, episode: u64) {
        use crate::rules::PopStep;
        for step in crate::rules::POP_CASCADE {
            match *step {
                PopStep::Pin => {
                    if let Some(set) = self.pins.get_mut(session) {
                        set.remove(&episode);
                    }
                }
                PopStep::SummaryEvents => {
                    for log in self.events.values_mut() {
                        log.retain(|e| {
                            e.session_key.as_deref() != Some(session) || e.kind != "summary.written"
                        });
                    }
                }
                PopStep::CancelRunningJob => {
                    for j in self
                        .jobs
                        .values_mut()
                        .filter(|j| j.session == session && j.state == JobState::Running)
                    {
                        j.cancel_requested = true;
                    }
                }
            }
        }
    }
}

impl MemoryStore {
    fn tables<T>(&self, f: impl FnOnce(&mut Tables) -> T) -> T {
        f(&mut self
            .tables
            .lock()
            .expect("the store's lock is poisoned by an earlier panic"))
    }
}

fn no_job(id: u64) -> Error {
    Error::Storage(format!("no job {id}"))
}

#[async_trait]
impl JobStore for MemoryStore {
    async fn job_enqueue(
        &self,
        session: &str,
        target: u64,
        config: &str,
        now_ms: u64,
    ) -> Result<(Job, bool), Error> {
        self.tables(|t| {
            if let Some(j) = t
                .jobs
                .values()
                .find(|j| j.session == session && j.target == target && j.state.is_active())
            {
                return Ok((j.clone(), false));
            }
            let id = crate::rules::new_job_id(now_ms, t.jobs.keys().next_back().copied());
            let job = Job {
                id,
                session: session.to_string(),
                target,
                state: JobState::Queued,
                config: crate::types::config_from_json(
                    &serde_json::from_str(config).unwrap_or_default(),
                ),
                cancel_requested: false,
                level: 0,
                done: 0,
                total: 0,
                calls_planned: 0,
                answers: 0,
                attempts: 0,
                error: None,
                lease_owner: None,
                lease_until_ms: None,
                created_ms: now_ms,
                started_ms: None,
                updated_ms: now_ms,
                finished_ms: None,
            };
            t.jobs.insert(job.id, job.clone());
            Ok((job, true))
        })
    }

    async fn job_get(&self, id: u64) -> Result<Option<Job>, Error> {
        Ok(self.tables(|t| t.jobs.get(&id).cloned()))
    }

    async fn job_claim(
        &self,
        id: u64,
        owner: &str,
        now_ms: u64,
        until_ms: u64,
        live: Liveness<'_>,
        cap: Option<TenantCap<'_>>,
    ) -> Result<Claim, Error> {
        self.tables(|t| {
            let job = t.jobs.get(&id).cloned().ok_or_else(|| no_job(id))?;
            if let Some(no) = rules::claim_first(&job, live) {
                return Ok(no.answer(job));
            }
            let others: Vec<Job> = t
                .jobs
                .values()
                .filter(|o| o.session == job.session && o.id != id && o.state == JobState::Running)
                .cloned()
                .collect();
            let running = cap.map_or(0, |cap| {
                t.jobs
                    .values()
                    .filter(|o| rules::counts_against_cap(o, id, now_ms, cap))
                    .count()
            });
            if let Some(no) = rules::claim_rest(&others, live, running, cap) {
                return Ok(no.answer(job));
            }
            let j = t.jobs.get_mut(&id).ok_or_else(|| no_job(id))?;
            rules::claimed(j, owner, now_ms, until_ms);
            Ok(Claim::Taken(j.clone()))
        })
    }

    async fn job_heartbeat(
        &self,
        id: u64,
        owner: &str,
        until_ms: u64,
        p: Progress,
        answers: u64,
        now_ms: u64,
    ) -> Result<Beat, Error> {
        Ok(self.tables(|t| match t.jobs.get_mut(&id) {
            Some(j) if j.state == JobState::Running && j.lease_owner.as_deref() == Some(owner) => {
                j.lease_until_ms = Some(until_ms);
                (j.level, j.done, j.total, j.answers) = (p.level, p.done, p.total, answers);
                j.updated_ms = now_ms;
                if j.cancel_requested {
                    Beat::Cancel
                } else {
                    Beat::Go
                }
            }
            _ => Beat::Lost,
        }))
    }

    async fn job_set_planned(&self, id: u64, calls: u32) -> Result<(), Error> {
        self.tables(|t| {
            if let Some(j) = t.jobs.get_mut(&id) {
                j.calls_planned = calls;
            }
        });
        Ok(())
    }

    async fn job_finish(
        &self,
        id: u64,
        state: JobState,
        error: Option<&str>,
        now_ms: u64,
    ) -> Result<(), Error> {
        self.tables(|t| {
            if let Some(j) = t.jobs.get_mut(&id) {
                j.state = state;
                j.error = error.map(str::to_string);
                j.lease_owner = None;
                j.lease_until_ms = None;
                j.updated_ms = now_ms;
                j.finished_ms = Some(now_ms);
            }
        });
        Ok(())
    }

    async fn job_cancel(&self, id: u64, now_ms: u64) -> Result<(), Error> {
        self.tables(|t| {
            if let Some(j) = t.jobs.get_mut(&id) {
                match j.state {
                    JobState::Queued => {
                        j.state = JobState::Cancelled;
                        j.error = Some("cancelled before it ran".into());
                        j.updated_ms = now_ms;
                        j.finished_ms = Some(now_ms);
                    }
                    JobState::Running => {
                        j.cancel_requested = true;
                        j.updated_ms = now_ms;
                    }
                    _ => {}
                }
            }
        });
        Ok(())
    }

    async fn job_release(&self, id: u64, owner: &str, now_ms: u64) -> Result<bool, Error> {
        Ok(self.tables(|t| match t.jobs.get_mut(&id) {
            Some(j) if j.state == JobState::Running && j.lease_owner.as_deref() == Some(owner) => {
                j.state = JobState::Queued;
                j.lease_owner = None;
                j.lease_until_ms = None;
                j.updated_ms = now_ms;
                true
            }
            _ => false,
        }))
    }

    async fn jobs_active(&self) -> Result<Vec<Job>, Error> {
        Ok(self.tables(|t| {
            t.jobs
                .values()
                .filter(|j| j.state.is_active())
                .cloned()
                .collect()
        }))
    }

    async fn jobs_runnable(&self, per_tenant: u32) -> Result<Vec<Job>, Error> {
        // In memory: one pass over the jobs (a test and embedding store).
        Ok(self.tables(|t| {
            let mut taken: BTreeMap<&str, u32> = BTreeMap::new();
            t.jobs
                .values()
                .filter(|j| match j.state {
                    JobState::Running => true,
                    JobState::Queued => {
                        let n = taken
                            .entry(crate::tenant::tenant_column(&j.session))
                            .or_default();
                        *n += 1;
                        *n <= per_tenant.max(1)
                    }
                    _ => false,
                })
                .cloned()
                .collect()
        }))
    }

    async fn job_active_for(&self, session: &str) -> Result<Option<Job>, Error> {
        Ok(self.tables(|t| {
            t.jobs
                .values()
                .rev()
                .find(|j| j.session == session && j.state.is_active())
                .cloned()
        }))
    }

    async fn job_lease_owners(&self, session: &str, now_ms: u64) -> Result<Vec<String>, Error> {
        Ok(self.tables(|t| {
            t.jobs
                .values()
                .filter(|j| {
                    j.session == session
                        && j.state == JobState::Running
                        && j.lease_until_ms.is_some_and(|u| u > now_ms)
                })
                .filter_map(|j| j.lease_owner.clone())
                .collect()
        }))
    }

    async fn jobs_list(
        &self,
        scope: Option<JobScope<'_>>,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<Job>, Error> {
        let before = before.unwrap_or(u64::MAX);
        Ok(self.tables(|t| {
            t.jobs
                .range(..before)
                .rev()
                .map(|(_, j)| j)
                .filter(|j| match scope {
                    None => true,
                    Some(JobScope::Local) => !j.session.contains('\u{1f}'),
                    Some(JobScope::Keys(lo, hi)) => {
                        j.session.as_str() >= lo && j.session.as_str() < hi
                    }
                })
                .take(limit as usize)
                .cloned()
                .collect()
        }))
    }

    async fn job_counts(&self) -> Result<Vec<(String, u64)>, Error> {
        Ok(self.tables(|t| {
            let mut by: BTreeMap<String, u64> = BTreeMap::new();
            for j in t.jobs.values() {
                *by.entry(j.state.as_str().to_string()).or_default() += 1;
            }
            by.into_iter().collect()
        }))
    }

    async fn jobs_queued(&self, scope: JobScope<'_>) -> Result<u64, Error> {
        Ok(self.tables(|t| {
            t.jobs
                .values()
                .filter(|j| j.state == JobState::Queued && in_scope(scope, &j.session))
                .count() as u64
        }))
    }

    async fn jobs_prune(
        &self,
        finished_before_ms: u64,
        keep_per_tenant: u32,
    ) -> Result<u64, Error> {
        Ok(self.tables(|t| {
            let mut kept: BTreeMap<&str, u32> = BTreeMap::new();
            let mut gone = std::collections::BTreeSet::new();
            for (id, j) in t.jobs.iter().rev() {
                if j.state.is_active() {
                    continue;
                }
                if j.finished_ms.is_some_and(|f| f < finished_before_ms) {
                    gone.insert(*id);
                    continue;
                }
                let tenant = j.session.split_once('\u{1f}').map_or("", |(t, _)| t);
                let n = kept.entry(tenant).or_default();
                *n += 1;
                if *n > keep_per_tenant {
                    gone.insert(*id);
                }
            }
            t.jobs.retain(|id, _| !gone.contains(id));
            for log in t.events.values_mut() {
                log.retain(|e| e.job.is_none_or(|j| !gone.contains(&j)));
            }
            gone.len() as u64
        }))
    }
}

#[async_trait]
impl SourceStore for MemoryStore {
    async fn source(&self, path: &str) -> Result<Option<Source>, Error> {
        Ok(self.tables(|t| t.sources.get(path).cloned()))
    }

    async fn put_source(&self, s: &Source, _now_ms: u64) -> Result<(), Error> {
        self.tables(|t| t.sources.insert(s.path.clone(), s.clone()));
        Ok(())
    }

    async fn watched_files(&self) -> Result<Vec<WatchedFile>, Error> {
        Ok(self.tables(|t| t.watched.values().cloned().collect()))
    }

    async fn put_watched(&self, f: &WatchedFile, _now_ms: u64) -> Result<(), Error> {
        self.tables(|t| t.watched.insert(f.path.clone(), f.clone()));
        Ok(())
    }

    async fn record_mark(
        &self,
        session: &str,
        path: &str,
        last_episode: u64,
        bytes: u64,
    ) -> Result<(), Error> {
        self.tables(|t| {
            t.marks
                .insert((session.to_string(), path.to_string(), last_episode), bytes)
        });
        Ok(())
    }

    async fn mark_covering(&self, session: &str, last_episode: u64) -> Result<Option<Mark>, Error> {
        Ok(self.tables(|t| {
            t.marks
                .iter()
                .filter(|((s, _, e), _)| s == session && *e <= last_episode)
                .max_by_key(|((_, _, e), b)| (*e, **b))
                .map(|((_, p, e), b)| Mark {
                    path: p.clone(),
                    last_episode: *e,
                    bytes: *b,
                })
        }))
    }

    async fn session_mode(&self, session: &str) -> Result<Option<SessionMode>, Error> {
        Ok(self.tables(|t| t.modes.get(session).cloned()))
    }

    async fn set_session_mode(&self, session: &str, m: Option<&SessionMode>) -> Result<(), Error> {
        self.tables(|t| match m {
            None => t.modes.remove(session),
            Some(m) => t.modes.insert(session.to_string(), m.clone()),
        });
        Ok(())
    }

    async fn session_focus(&self, session: &str) -> Result<Option<String>, Error> {
        Ok(self.tables(|t| t.focus.get(session).cloned()))
    }

    async fn sessions_count(&self, tenant: &str) -> Result<u64, Error> {
        Ok(self.sessions_of(tenant).await?.len() as u64)
    }

    async fn sessions_page(
        &self,
        tenant: &str,
        offset: u64,
        limit: u32,
    ) -> Result<Vec<String>, Error> {
        Ok(self
            .sessions_of(tenant)
            .await?
            .into_iter()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .take(limit as usize)
            .collect())
    }

    async fn sessions_prefixed(
        &self,
        tenant: &str,
        prefix: &str,
        limit: u32,
    ) -> Result<(Vec<String>, u64), Error> {
        let mut all = self.sessions_of(tenant).await?;
        all.retain(|k| k.starts_with(prefix));
        all.sort();
        let total = all.len() as u64;
        all.truncate(limit as usize);
        Ok((all, total))
    }

    /// Every session of the tenant (this store keeps no index: its callers check each).
    async fn sessions_labelled(
        &self,
        tenant: &str,
        _q: &str,
    ) -> Result<Vec<(String, Option<String>)>, Error> {
        let all = self.sessions_of(tenant).await?;
        Ok(self.tables(|t| {
            all.into_iter()
                .map(|k| {
                    let label = t.labels.get(&k).cloned();
                    (k, label)
                })
                .collect()
        }))
    }

    async fn session_label(&self, session: &str) -> Result<Option<String>, Error> {
        Ok(self.tables(|t| t.labels.get(session).cloned()))
    }

    async fn set_session_label(&self, session: &str, label: Option<&str>) -> Result<(), Error> {
        self.tables(|t| match label {
            None => t.labels.remove(session),
            Some(l) => t.labels.insert(session.to_string(), l.to_string()),
        });
        Ok(())
    }

    async fn set_session_focus(&self, session: &str, focus: Option<&str>) -> Result<(), Error> {
        self.tables(|t| match focus {
            None => t.focus.remove(session),
            Some(f) => t.focus.insert(session.to_string(), f.to_string()),
        });
        Ok(())
    }

    async fn pins(&self, session: &str) -> Result<Vec<u64>, Error> {
        Ok(self.tables(|t| {
            t.pins
                .get(session)
                .map_or_else(Vec::new, |p| p.iter().copied().collect())
        }))
    }

    async fn set_pin(&self, session: &str, episode: u64, pinned: bool) -> Result<bool, Error> {
        Ok(self.tables(|t| {
            let set = t.pins.entry(session.to_string()).or_default();
            if pinned {
                set.insert(episode)
            } else {
                set.remove(&episode)
            }
        }))
    }
}

#[async_trait]
impl TokenStore for MemoryStore {
    async fn insert_token(
        &self,
        tenant: &str,
        hash: &str,
        prefix: &str,
        read_only: bool,
        label: Option<&str>,
        now_ms: u64,
    ) -> Result<u64, Error> {
        Ok(self.tables(|t| {
            let id = t.tokens.len() as u64 + 1;
            t.tokens.push((
                TokenRow {
                    id,
                    tenant: tenant.to_string(),
                    prefix: prefix.to_string(),
                    read_only,
                    label: label.map(str::to_string),
                    created_ms: now_ms,
                    revoked_ms: None,
                },
                hash.to_string(),
            ));
            id
        }))
    }

    async fn tokens(&self) -> Result<Vec<TokenRow>, Error> {
        Ok(self.tables(|t| t.tokens.iter().map(|(r, _)| r.clone()).collect()))
    }

    async fn revoke_token(&self, id: u64, now_ms: u64) -> Result<bool, Error> {
        Ok(self.tables(|t| {
            match t
                .tokens
                .iter_mut()
                .find(|(r, _)| r.id == id && r.revoked_ms.is_none())
            {
                Some((r, _)) => {
                    r.revoked_ms = Some(now_ms);
                    true
                }
                None => false,
            }
        }))
    }

    async fn any_live_token(&self) -> Result<bool, Error> {
        Ok(self.tables(|t| t.tokens.iter().any(|(r, _)| r.revoked_ms.is_none())))
    }

    async fn live_token(&self, hash: &str) -> Result<Option<TokenRow>, Error> {
        Ok(self.tables(|t| {
            t.tokens
                .iter()
                .find(|(r, h)| h == hash && r.revoked_ms.is_none())
                .map(|(r, _)| r.clone())
        }))
    }
}

#[async_trait]
impl EventStore for MemoryStore {
    async fn append_events(
        &self,
        tenant: &str,
        floor: u64,
        rows: &[EventRow],
        keep: usize,
    ) -> Result<u64, Error> {
        Ok(self.tables(|t| {
            let log = t.events.entry(tenant.to_string()).or_default();
            let first = log.back().map_or(0, |e| e.id).max(floor) + 1;
            for (i, e) in rows.iter().enumerate() {
                log.push_back(EventRow {
                    tenant: tenant.to_string(),
                    id: first + i as u64,
                    ..e.clone()
                });
            }
            let newest = log.back().map_or(0, |e| e.id);
            log.retain(|e| e.id + keep as u64 > newest);
            first
        }))
    }

    async fn events_after(
        &self,
        tenant: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<EventRow>, Error> {
        Ok(self.tables(|t| {
            t.events
                .get(tenant)
                .map(|log| {
                    log.iter()
                        .filter(|e| e.id > after)
                        .take(limit)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default()
        }))
    }

    async fn event_heads(&self) -> Result<Vec<(String, u64)>, Error> {
        Ok(self.tables(|t| {
            t.events
                .iter()
                .filter_map(|(k, log)| Some((k.clone(), log.back()?.id)))
                .collect()
        }))
    }

    async fn recent_events(&self, keep: usize) -> Result<Vec<EventRow>, Error> {
        Ok(self.tables(|t| {
            t.events
                .values()
                .flat_map(|log| {
                    let newest = log.back().map_or(0, |e| e.id);
                    log.iter().filter(move |e| e.id + keep as u64 > newest)
                })
                .cloned()
                .collect()
        }))
    }
}

/// One process: its own semaphores bound model requests (the defaults grant every slot).
impl super::tables::SlotStore for MemoryStore {}

impl MemoryStore {
    /// One tenant's session keys (`tenant`: its column value), most recently changed first.
    async fn sessions_of(&self, tenant: &str) -> Result<Vec<String>, Error> {
        let mut all = abridge_engine::Store::sessions(self).await?;
        all.retain(|k| crate::tenant::tenant_column(k) == tenant);
        Ok(all)
    }
}
