//! The app's tables ([`super::tables`]) in the SQLite database.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::tables::{
    EventRow, EventStore, JobScope, JobStore, Liveness, SourceStore, TenantCap, TokenRow,
    TokenStore,
};
use crate::control::Progress;
use crate::jobs::{Beat, Claim, Job, JobState};
use crate::keyring::{Stored, place};
use crate::rules;
use crate::sources::{Mark, SessionMode, Source, WatchedFile};
use crate::sqlite_keys::stored;
use crate::types::{Error, Mode};

/// A session and its label as stored (`SELECT id, label, sealed`).
fn label_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, Option<Stored>)> {
    let label = match r.get_ref(1)? {
        rusqlite::types::ValueRef::Null => None,
        _ => Some(stored(r, 1, r.get(2)?)?),
    };
    Ok((r.get::<_, String>(0)?, label))
}

/// Sessions added to the search index per write.
const INDEX_BATCH: u32 = 500;

fn db_err(e: rusqlite::Error) -> Error {
    Error::Storage(e.to_string())
}

const COLS: &str = "id, session, target, state, config, cancel_requested, level, done, total, calls_planned, answers, attempts, error, lease_owner, lease_until_ms, created_ms, started_ms, updated_ms, finished_ms";

fn job_from(r: &rusqlite::Row<'_>) -> rusqlite::Result<Job> {
    let opt_u64 = |i: usize| -> rusqlite::Result<Option<u64>> {
        Ok(r.get::<_, Option<i64>>(i)?.map(|x| x as u64))
    };
    let (tenant, session) = crate::jobs::tenant_and_session(&r.get::<_, String>(1)?);
    Ok(Job {
        id: r.get::<_, i64>(0)? as u64,
        tenant,
        session,
        target: r.get::<_, i64>(2)? as u64,
        state: JobState::parse(&r.get::<_, String>(3)?),
        config: crate::types::config_from_json(
            &serde_json::from_str(&r.get::<_, String>(4)?).unwrap_or_default(),
        ),
        cancel_requested: r.get::<_, i64>(5)? != 0,
        level: r.get(6)?,
        done: r.get(7)?,
        total: r.get(8)?,
        calls_planned: r.get(9)?,
        answers: r.get::<_, i64>(10)? as u64,
        attempts: r.get(11)?,
        error: r.get(12)?,
        lease_owner: r.get(13)?,
        lease_until_ms: opt_u64(14)?,
        created_ms: r.get::<_, i64>(15)? as u64,
        started_ms: opt_u64(16)?,
        updated_ms: r.get::<_, i64>(17)? as u64,
        finished_ms: opt_u64(18)?,
    })
}

fn jobs_where(
    c: &rusqlite::Connection,
    filter: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<Job>, Error> {
    let mut st = c
        .prepare_cached(&format!("SELECT {COLS} FROM jobs WHERE {filter}"))
        .map_err(db_err)?;
    st.query_map(args, job_from)
        .map_err(db_err)?
        .collect::<Result<_, _>>()
        .map_err(db_err)
}

fn one_job(c: &rusqlite::Connection, id: u64) -> Result<Option<Job>, Error> {
    c.query_row(
        &format!("SELECT {COLS} FROM jobs WHERE id = ?1"),
        [id as i64],
        job_from,
    )
    .optional()
    .map_err(db_err)
}

#[async_trait]
impl JobStore for SqliteStore {
    async fn job_enqueue(
        &self,
        session: &str,
        target: u64,
        config: &str,
        now_ms: u64,
    ) -> Result<(Job, bool), Error> {
        let key = format!("{session}@{target}");
        self.with(|c| {
            let tx = c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(db_err)?;
            let active = jobs_where(&tx, "key = ?1 AND state IN ('queued','running')", [&key])?;
            if let Some(job) = active.into_iter().next() {
                return Ok((job, false));
            }
            let newest: Option<i64> = tx
                .query_row("SELECT MAX(id) FROM jobs", [], |r| r.get(0))
                .map_err(db_err)?;
            let id = loop {
                let id = crate::rules::new_job_id(now_ms, newest.map(|n| n as u64));
                let n = tx
                    .execute(
                        "INSERT OR IGNORE INTO jobs (id, session, target, key, state, config, created_ms, updated_ms, tenant) VALUES (?6, ?1, ?2, ?3, 'queued', ?4, ?5, ?5, ?7)",
                        params![session, target as i64, key, config, now_ms as i64, id as i64, crate::tenant::tenant_column(session)],
                    )
                    .map_err(db_err)?;
                if n == 1 {
                    break id;
                }
            };
            let job = one_job(&tx, id)?.ok_or_else(|| Error::Storage("job vanished".into()))?;
            tx.commit().map_err(db_err)?;
            Ok((job, true))
        })
    }

    async fn job_get(&self, id: u64) -> Result<Option<Job>, Error> {
        self.with(|c| one_job(c, id))
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
        self.with(|c| {
            let tx = c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(db_err)?;
            let job = one_job(&tx, id)?.ok_or_else(|| Error::Storage(format!("no job {id}")))?;
            if let Some(no) = crate::rules::claim_first(&job, live) {
                return Ok(no.answer(job));
            }
            let others = jobs_where(
                &tx,
                "session = ?1 AND id != ?2 AND state = 'running'",
                params![job.key(), id as i64],
            )?;
            let running = match cap {
                // From the index of running jobs: every tenant's queue stays out of it.
                Some(cap) => jobs_where(
                    &tx,
                    "state = 'running' AND id != ?1 AND lease_until_ms > ?2",
                    params![id as i64, now_ms as i64],
                )?
                .iter()
                .filter(|j| crate::rules::counts_against_cap(j, id, now_ms, cap))
                .count(),
                None => 0,
            };
            if let Some(no) = crate::rules::claim_rest(&others, live, running, cap) {
                return Ok(no.answer(job));
            }
            tx.execute(
                "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_owner = ?2, lease_until_ms = ?3, started_ms = COALESCE(started_ms, ?4), updated_ms = ?4, error = NULL WHERE id = ?1",
                params![id as i64, owner, until_ms as i64, now_ms as i64],
            )
            .map_err(db_err)?;
            let job = one_job(&tx, id)?.ok_or_else(|| Error::Storage("job vanished".into()))?;
            tx.commit().map_err(db_err)?;
            Ok(Claim::Taken(job))
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
        self.with(|c| {
            let n = c
                .execute(
                    "UPDATE jobs SET lease_until_ms = ?3, level = ?4, done = ?5, total = ?6, answers = ?7, updated_ms = ?8 WHERE id = ?1 AND lease_owner = ?2 AND state = 'running'",
                    params![id as i64, owner, until_ms as i64, p.level, p.done, p.total, answers as i64, now_ms as i64],
                )
                .map_err(db_err)?;
            if n == 0 {
                return Ok(Beat::Lost);
            }
            let cancel = c
                .query_row(
                    "SELECT cancel_requested FROM jobs WHERE id = ?1",
                    [id as i64],
                    |r| r.get::<_, i64>(0),
                )
                .map_err(db_err)?;
            Ok(if cancel != 0 { Beat::Cancel } else { Beat::Go })
        })
    }

    async fn job_set_planned(&self, id: u64, calls: u32) -> Result<(), Error> {
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET calls_planned = ?2 WHERE id = ?1",
                params![id as i64, calls],
            )
            .map(drop)
            .map_err(db_err)
        })
    }

    async fn job_finish(
        &self,
        id: u64,
        state: JobState,
        error: Option<&str>,
        now_ms: u64,
    ) -> Result<(), Error> {
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = ?2, error = ?3, lease_owner = NULL, lease_until_ms = NULL, updated_ms = ?4, finished_ms = ?4 WHERE id = ?1",
                params![id as i64, state.as_str(), error, now_ms as i64],
            )
            .map(drop)
            .map_err(db_err)
        })
    }

    async fn job_cancel(&self, id: u64, now_ms: u64) -> Result<(), Error> {
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = 'cancelled', error = 'cancelled before it ran', updated_ms = ?2, finished_ms = ?2 WHERE id = ?1 AND state = 'queued'",
                params![id as i64, now_ms as i64],
            )
            .map_err(db_err)?;
            c.execute(
                "UPDATE jobs SET cancel_requested = 1, updated_ms = ?2 WHERE id = ?1 AND state = 'running'",
                params![id as i64, now_ms as i64],
            )
            .map(drop)
            .map_err(db_err)
        })
    }

    async fn job_release(&self, id: u64, owner: &str, now_ms: u64) -> Result<bool, Error> {
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_until_ms = NULL, updated_ms = ?3 WHERE id = ?1 AND lease_owner = ?2 AND state = 'running'",
                params![id as i64, owner, now_ms as i64],
            )
            .map(|n| n > 0)
            .map_err(db_err)
        })
    }

    async fn jobs_active(&self) -> Result<Vec<Job>, Error> {
        self.with(|c| jobs_where(c, "state IN ('queued','running') ORDER BY id", []))
    }

    async fn jobs_runnable(&self, per_tenant: u32) -> Result<Vec<Job>, Error> {
        self.with(|c| {
            // The tenants with active jobs, one index seek each (a skip scan); each one's
            // oldest queued jobs from the same index; and every running job (a lease may
            // have run out). One statement.
            jobs_where(
                c,
                "id IN (
                    WITH RECURSIVE t(name) AS (
                        SELECT (SELECT tenant FROM jobs INDEXED BY jobs_runnable
                                WHERE state IN ('queued','running') ORDER BY tenant LIMIT 1)
                        UNION ALL
                        SELECT (SELECT tenant FROM jobs INDEXED BY jobs_runnable
                                WHERE state IN ('queued','running') AND tenant > t.name
                                ORDER BY tenant LIMIT 1)
                        FROM t WHERE t.name IS NOT NULL
                    )
                    SELECT q.id FROM t, jobs q
                    WHERE t.name IS NOT NULL AND q.id IN (
                        SELECT id FROM jobs INDEXED BY jobs_runnable
                        WHERE tenant = t.name AND state IN ('queued','running')
                            AND state = 'queued'
                        ORDER BY id LIMIT ?1)
                    UNION ALL
                    SELECT id FROM jobs INDEXED BY jobs_running WHERE state = 'running'
                ) ORDER BY id",
                [per_tenant.max(1)],
            )
        })
    }

    async fn job_active_for(&self, session: &str) -> Result<Option<Job>, Error> {
        self.with(|c| {
            Ok(jobs_where(
                c,
                "session = ?1 AND state IN ('queued','running') ORDER BY id DESC LIMIT 1",
                [session],
            )?
            .into_iter()
            .next())
        })
    }

    async fn job_lease_owners(&self, session: &str, now_ms: u64) -> Result<Vec<String>, Error> {
        self.with(|c| {
            let mut st = c
                .prepare(
                    "SELECT lease_owner FROM jobs WHERE session = ?1 AND state = 'running' AND lease_until_ms > ?2 AND lease_owner IS NOT NULL",
                )
                .map_err(db_err)?;
            st.query_map(params![session, now_ms as i64], |r| r.get::<_, String>(0))
                .map_err(db_err)?
                .collect::<Result<_, _>>()
                .map_err(db_err)
        })
    }

    async fn jobs_list(
        &self,
        scope: Option<JobScope<'_>>,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<Job>, Error> {
        let before = before.map_or(i64::MAX, |b| b as i64);
        let limit = i64::from(limit);
        self.with(|c| match scope {
            None => jobs_where(
                c,
                "id < ?1 ORDER BY id DESC LIMIT ?2",
                params![before, limit],
            ),
            Some(JobScope::Local) => jobs_where(
                c,
                "id < ?1 AND instr(session, char(31)) = 0 ORDER BY id DESC LIMIT ?2",
                params![before, limit],
            ),
            Some(JobScope::Keys(lo, hi)) => jobs_where(
                c,
                "id < ?1 AND session >= ?3 AND session < ?4 ORDER BY id DESC LIMIT ?2",
                params![before, limit, lo, hi],
            ),
        })
    }

    async fn jobs_queued(&self, scope: JobScope<'_>) -> Result<u64, Error> {
        self.with(|c| {
            let n: i64 = match scope {
                JobScope::Local => c.query_row(
                    "SELECT COUNT(*) FROM jobs WHERE state IN ('queued','running') AND state = 'queued' AND instr(session, char(31)) = 0",
                    [],
                    |r| r.get(0),
                ),
                JobScope::Keys(lo, hi) => c.query_row(
                    "SELECT COUNT(*) FROM jobs INDEXED BY jobs_active_session WHERE state IN ('queued','running') AND state = 'queued' AND session >= ?1 AND session < ?2",
                    params![lo, hi],
                    |r| r.get(0),
                ),
            }
            .map_err(db_err)?;
            Ok(n as u64)
        })
    }

    async fn jobs_prune(
        &self,
        finished_before_ms: u64,
        keep_per_tenant: u32,
    ) -> Result<u64, Error> {
        self.with(|c| {
            let tx = c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(db_err)?;
            let mut gone: Vec<i64> = Vec::new();
            {
                let mut old = tx
                    .prepare(
                        "DELETE FROM jobs WHERE state IN ('succeeded','failed','cancelled') AND finished_ms < ?1 RETURNING id",
                    )
                    .map_err(db_err)?;
                let ids = old
                    .query_map([finished_before_ms as i64], |r| r.get::<_, i64>(0))
                    .map_err(db_err)?;
                for id in ids {
                    gone.push(id.map_err(db_err)?);
                }
                // Each tenant's newest `keep_per_tenant` finished jobs stay (the tenant is the
                // key's part before the separator; the local tenant's keys have none).
                let mut over = tx
                    .prepare(
                        "DELETE FROM jobs WHERE id IN (
                           SELECT id FROM (
                             SELECT id, ROW_NUMBER() OVER (
                               PARTITION BY substr(session, 1, instr(session, char(31)))
                               ORDER BY id DESC) AS n
                             FROM jobs WHERE state IN ('succeeded','failed','cancelled'))
                           WHERE n > ?1)
                         RETURNING id",
                    )
                    .map_err(db_err)?;
                let ids = over
                    .query_map([i64::from(keep_per_tenant)], |r| r.get::<_, i64>(0))
                    .map_err(db_err)?;
                for id in ids {
                    gone.push(id.map_err(db_err)?);
                }
                let mut events = tx
                    .prepare("DELETE FROM events WHERE job = ?1")
                    .map_err(db_err)?;
                for id in &gone {
                    events.execute([id]).map_err(db_err)?;
                }
            }
            tx.commit().map_err(db_err)?;
            Ok(gone.len() as u64)
        })
    }

    async fn job_counts(&self) -> Result<Vec<(String, u64)>, Error> {
        self.with(|c| {
            let mut st = c
                .prepare("SELECT state, COUNT(*) FROM jobs GROUP BY state ORDER BY state")
                .map_err(db_err)?;
            st.query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })
            .map_err(db_err)?
            .collect::<Result<_, _>>()
            .map_err(db_err)
        })
    }
}

#[async_trait]
impl SourceStore for SqliteStore {
    async fn source(&self, path: &str) -> Result<Option<Source>, Error> {
        self.with(|c| {
            c.query_row(
                "SELECT path, size, mtime_ms, sha256, status, sessions, episodes, detail FROM sources WHERE path = ?1",
                [path],
                |r| {
                    Ok(Source {
                        path: r.get(0)?,
                        size: r.get::<_, i64>(1)? as u64,
                        mtime_ms: r.get::<_, i64>(2)? as u64,
                        sha256: r.get(3)?,
                        status: r.get(4)?,
                        sessions: serde_json::from_str(&r.get::<_, String>(5)?)
                            .unwrap_or_default(),
                        episodes: r.get::<_, i64>(6)? as u64,
                        detail: r.get(7)?,
                    })
                },
            )
            .optional()
            .map_err(db_err)
        })
    }

    async fn put_source(&self, s: &Source, now_ms: u64) -> Result<(), Error> {
        self.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO sources (path, size, mtime_ms, sha256, status, sessions, episodes, detail, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    s.path,
                    s.size as i64,
                    s.mtime_ms as i64,
                    s.sha256,
                    s.status,
                    serde_json::to_string(&s.sessions).expect("strings serialize"),
                    s.episodes as i64,
                    s.detail,
                    now_ms as i64
                ],
            )
            .map(drop)
            .map_err(db_err)
        })
    }

    async fn watched_files(&self) -> Result<Vec<WatchedFile>, Error> {
        self.with(|c| {
            let mut st = c
                .prepare(
                    "SELECT path, session, format, offset, lines FROM watched_files ORDER BY path",
                )
                .map_err(db_err)?;
            st.query_map([], |r| {
                Ok(WatchedFile {
                    path: r.get(0)?,
                    session: r.get(1)?,
                    format: r.get(2)?,
                    offset: r.get::<_, i64>(3)? as u64,
                    lines: r.get::<_, Option<i64>>(4)?.map(|n| n as u64),
                })
            })
            .map_err(db_err)?
            .collect::<Result<_, _>>()
            .map_err(db_err)
        })
    }

    async fn put_watched(&self, f: &WatchedFile, now_ms: u64) -> Result<(), Error> {
        self.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO watched_files (path, session, format, offset, lines, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![f.path, f.session, f.format, f.offset as i64, f.lines.map(|n| n as i64), now_ms as i64],
            )
            .map(drop)
            .map_err(db_err)
        })
    }

    async fn record_mark(
        &self,
        session: &str,
        path: &str,
        last_episode: u64,
        bytes: u64,
    ) -> Result<(), Error> {
        self.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO source_marks (session, path, last_episode, bytes) VALUES (?1, ?2, ?3, ?4)",
                params![session, path, last_episode as i64, bytes as i64],
            )
            .map(drop)
            .map_err(db_err)
        })
    }

    async fn mark_covering(&self, session: &str, last_episode: u64) -> Result<Option<Mark>, Error> {
        self.with(|c| {
            c.query_row(
                "SELECT path, last_episode, bytes FROM source_marks WHERE session = ?1 AND last_episode <= ?2 ORDER BY last_episode DESC, bytes DESC LIMIT 1",
                params![session, last_episode as i64],
                |r| {
                    Ok(Mark {
                        path: r.get(0)?,
                        last_episode: r.get::<_, i64>(1)? as u64,
                        bytes: r.get::<_, i64>(2)? as u64,
                    })
                },
            )
            .optional()
            .map_err(db_err)
        })
    }

    async fn session_mode(&self, session: &str) -> Result<Option<SessionMode>, Error> {
        self.with(|c| {
            c.query_row(
                "SELECT mode, quiescence_secs FROM session_modes WHERE session = ?1",
                [session],
                |r| {
                    Ok(SessionMode {
                        mode: Mode::parse(&r.get::<_, String>(0)?).unwrap_or(Mode::Eager),
                        quiescence_secs: r.get::<_, Option<i64>>(1)?.map(|x| x as u32),
                    })
                },
            )
            .optional()
            .map_err(db_err)
        })
    }

    async fn set_session_mode(&self, session: &str, m: Option<&SessionMode>) -> Result<(), Error> {
        self.with(|c| {
            match m {
                None => c.execute("DELETE FROM session_modes WHERE session = ?1", [session]),
                Some(m) => c.execute(
                    "INSERT OR REPLACE INTO session_modes (session, mode, quiescence_secs) VALUES (?1, ?2, ?3)",
                    params![
                        session,
                        m.mode.as_str(),
                        m.quiescence_secs
                    ],
                ),
            }
            .map(drop)
            .map_err(db_err)
        })
    }

    async fn session_focus(&self, session: &str) -> Result<Option<String>, Error> {
        self.session_text(crate::tables::SessionText::FOCUS, session)
    }

    async fn set_session_focus(&self, session: &str, focus: Option<&str>) -> Result<(), Error> {
        self.set_session_text(crate::tables::SessionText::FOCUS, session, focus)
    }

    async fn session_label(&self, session: &str) -> Result<Option<String>, Error> {
        self.session_text(crate::tables::SessionText::LABEL, session)
    }

    async fn set_session_label(&self, session: &str, label: Option<&str>) -> Result<(), Error> {
        self.set_session_text(crate::tables::SessionText::LABEL, session, label)
    }

    async fn sessions_count(&self, tenant: &str) -> Result<u64, Error> {
        self.with(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM sessions INDEXED BY sessions_tenant_change WHERE tenant = ?1",
                [tenant],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(db_err)
        })
    }

    async fn sessions_page(
        &self,
        tenant: &str,
        offset: u64,
        limit: u32,
    ) -> Result<Vec<String>, Error> {
        self.with(|c| {
            let mut st = c
                .prepare_cached(
                    "SELECT id FROM sessions INDEXED BY sessions_tenant_change WHERE tenant = ?1 ORDER BY changed_seq DESC, id LIMIT ?2 OFFSET ?3",
                )
                .map_err(db_err)?;
            st.query_map(params![tenant, limit, offset as i64], |r| r.get(0))
                .map_err(db_err)?
                .collect::<Result<Vec<String>, _>>()
                .map_err(db_err)
        })
    }

    async fn sessions_prefixed(
        &self,
        tenant: &str,
        prefix: &str,
        limit: u32,
    ) -> Result<(Vec<String>, u64), Error> {
        // The key range [prefix, bound) of the primary key (`+tenant`: the tenant's index,
        // which would read every session of the tenant, is not the one to use).
        let bound = crate::rules::prefix_bound(prefix);
        let bound = bound.as_deref().unwrap_or("\u{10FFFF}\u{10FFFF}");
        self.with(|c| {
            let total: i64 = c
                .query_row(
                    "SELECT COUNT(*) FROM sessions WHERE id >= ?1 AND id < ?2 AND +tenant = ?3",
                    params![prefix, bound, tenant],
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            let mut st = c
                .prepare_cached(
                    "SELECT id FROM sessions WHERE id >= ?1 AND id < ?2 AND +tenant = ?3 ORDER BY id LIMIT ?4",
                )
                .map_err(db_err)?;
            let ids = st
                .query_map(params![prefix, bound, tenant, limit], |r| r.get(0))
                .map_err(db_err)?
                .collect::<Result<Vec<String>, _>>()
                .map_err(db_err)?;
            Ok((ids, total as u64))
        })
    }

    async fn sessions_labelled(
        &self,
        tenant: &str,
        q: &str,
    ) -> Result<Vec<(String, Option<String>)>, Error> {
        let t = crate::tables::SessionText::LABEL;
        let (key, query) = crate::tables::search_grams(self, tenant, q).await?;
        self.with(|c| {
            self.index_sessions(c, tenant, &key)?;
            let mut args: Vec<rusqlite::types::Value> = vec![tenant.to_string().into()];
            let sql = if query.is_empty() {
                "SELECT s.id, l.label, l.sealed FROM sessions s INDEXED BY sessions_tenant_change LEFT JOIN session_labels l ON l.session = s.id WHERE s.tenant = ?1 ORDER BY s.changed_seq DESC, s.id".to_string()
            } else {
                // The rarest trigrams first (counted only as far as telling them apart needs):
                // the first gives the candidates, the others must be held by each.
                let mut counted = Vec::with_capacity(query.len());
                for &g in &query {
                    let n: i64 = c
                        .prepare_cached("SELECT COUNT(*) FROM (SELECT 1 FROM session_grams WHERE tenant = ?1 AND gram = ?2 LIMIT ?3)")
                        .map_err(db_err)?
                        .query_row(params![tenant, g, rules::GRAM_COUNT_CAP], |r| r.get(0))
                        .map_err(db_err)?;
                    counted.push((n, g));
                }
                let Some(grams) = rules::rarest_grams(counted) else {
                    return Ok(Vec::new());
                };
                let mut sql = String::from("SELECT s.id, l.label, l.sealed FROM session_grams g0 JOIN sessions s ON s.id = g0.session LEFT JOIN session_labels l ON l.session = s.id WHERE g0.tenant = ?1 AND g0.gram = ?2");
                for (k, g) in grams.into_iter().enumerate() {
                    args.push(g.into());
                    if k > 0 {
                        sql.push_str(&format!(" AND EXISTS (SELECT 1 FROM session_grams g WHERE g.tenant = ?1 AND g.gram = ?{} AND g.session = g0.session)", k + 2));
                    }
                }
                sql.push_str(" ORDER BY s.changed_seq DESC, s.id");
                sql
            };
            let mut st = c.prepare_cached(&sql).map_err(db_err)?;
            let rows = st
                .query_map(rusqlite::params_from_iter(args), label_row)
                .map_err(db_err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db_err)?;
            rows.into_iter()
                .map(|(id, label)| {
                    let label = label
                        .map(|f| self.reveal(c, &place::tenant_of(&id), t.place, &id, f))
                        .transpose()?;
                    Ok((id, label))
                })
                .collect()
        })
    }

    async fn pins(&self, session: &str) -> Result<Vec<u64>, Error> {
        self.with(|c| {
            let mut st = c
                .prepare_cached(
                    "SELECT episode FROM session_pins WHERE session = ?1 ORDER BY episode",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map([session], |r| r.get::<_, i64>(0).map(|x| x as u64))
                .map_err(db_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db_err)
        })
    }

    async fn set_pin(&self, session: &str, episode: u64, pinned: bool) -> Result<bool, Error> {
        self.with(|c| {
            let n = if pinned {
                c.execute(
                    "INSERT OR IGNORE INTO session_pins (session, episode) VALUES (?1, ?2)",
                    params![session, episode as i64],
                )
            } else {
                c.execute(
                    "DELETE FROM session_pins WHERE session = ?1 AND episode = ?2",
                    params![session, episode as i64],
                )
            }
            .map_err(db_err)?;
            Ok(n > 0)
        })
    }
}

fn token_from(r: &rusqlite::Row<'_>) -> rusqlite::Result<TokenRow> {
    Ok(TokenRow {
        id: r.get::<_, i64>(0)? as u64,
        tenant: r.get(1)?,
        prefix: r.get(2)?,
        read_only: r.get::<_, i64>(3)? != 0,
        label: r.get(4)?,
        created_ms: r.get::<_, i64>(5)? as u64,
        revoked_ms: r.get::<_, Option<i64>>(6)?.map(|x| x as u64),
    })
}

const TOKEN_COLS: &str = "id, tenant, prefix, read_only, label, created_ms, revoked_ms";

#[async_trait]
impl TokenStore for SqliteStore {
    async fn insert_token(
        &self,
        tenant: &str,
        hash: &str,
        prefix: &str,
        read_only: bool,
        label: Option<&str>,
        now_ms: u64,
    ) -> Result<u64, Error> {
        self.with(|c| {
            c.execute(
                "INSERT INTO tokens (tenant, hash, prefix, read_only, label, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![tenant, hash, prefix, read_only as i64, label, now_ms as i64],
            )
            .map_err(db_err)?;
            Ok(c.last_insert_rowid() as u64)
        })
    }

    async fn tokens(&self) -> Result<Vec<TokenRow>, Error> {
        self.with(|c| {
            let mut st = c
                .prepare(&format!("SELECT {TOKEN_COLS} FROM tokens ORDER BY id"))
                .map_err(db_err)?;
            st.query_map([], token_from)
                .map_err(db_err)?
                .collect::<Result<_, _>>()
                .map_err(db_err)
        })
    }

    async fn revoke_token(&self, id: u64, now_ms: u64) -> Result<bool, Error> {
        self.with(|c| {
            c.execute(
                "UPDATE tokens SET revoked_ms = ?2 WHERE id = ?1 AND revoked_ms IS NULL",
                params![id as i64, now_ms as i64],
            )
            .map(|n| n > 0)
            .map_err(db_err)
        })
    }

    async fn any_live_token(&self) -> Result<bool, Error> {
        self.with(|c| {
            c.query_row(
                "SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_ms IS NULL)",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n != 0)
            .map_err(db_err)
        })
    }

    async fn live_token(&self, hash: &str) -> Result<Option<TokenRow>, Error> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {TOKEN_COLS} FROM tokens WHERE hash = ?1 AND revoked_ms IS NULL"),
                [hash],
                token_from,
            )
            .optional()
            .map_err(db_err)
        })
    }
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn append_events(
        &self,
        tenant: &str,
        floor: u64,
        rows: &[EventRow],
        keep: usize,
    ) -> Result<u64, Error> {
        self.with(|c| {
            let tx = c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(db_err)?;
            let newest: i64 = tx
                .query_row(
                    "SELECT COALESCE(MAX(id), 0) FROM events WHERE tenant = ?1",
                    [tenant],
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            let first = (newest as u64).max(floor) + 1;
            {
                let mut st = tx
                    .prepare_cached(
                        "INSERT INTO events (tenant, id, kind, at_ms, session_key, job, data, sealed) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    )
                    .map_err(db_err)?;
                for (i, e) in rows.iter().enumerate() {
                    let id = first + i as u64;
                    let (data, sealed) =
                        self.seal_value(&tx, tenant, place::EVENT, &id.to_string(), &e.data)?;
                    st.execute(params![
                        tenant,
                        id as i64,
                        e.kind,
                        e.at_ms as i64,
                        e.session_key,
                        e.job.map(|j| j as i64),
                        data,
                        sealed
                    ])
                    .map_err(db_err)?;
                }
            }
            let last = first + rows.len() as u64;
            tx.execute(
                "DELETE FROM events WHERE tenant = ?1 AND id < ?2",
                params![tenant, last.saturating_sub(keep as u64) as i64],
            )
            .map_err(db_err)?;
            tx.commit().map_err(db_err)?;
            Ok(first)
        })
    }

    async fn events_after(
        &self,
        tenant: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<EventRow>, Error> {
        self.with(|c| {
            let mut st = c
                .prepare_cached(
                    "SELECT tenant, id, kind, at_ms, session_key, job, data, sealed FROM events WHERE tenant = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
                )
                .map_err(db_err)?;
            let raws = st
                .query_map(
                    params![tenant, after as i64, limit.min(i64::MAX as usize) as i64],
                    event_from,
                )
                .map_err(db_err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db_err)?;
            self.events_opened(c, raws)
        })
    }

    async fn event_heads(&self) -> Result<Vec<(String, u64)>, Error> {
        self.with(|c| {
            let mut st = c
                .prepare("SELECT tenant, MAX(id) FROM events GROUP BY tenant ORDER BY tenant")
                .map_err(db_err)?;
            st.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))
                .map_err(db_err)?
                .collect::<Result<_, _>>()
                .map_err(db_err)
        })
    }

    async fn recent_events(&self, keep: usize) -> Result<Vec<EventRow>, Error> {
        self.with(|c| {
            let mut st = c
                .prepare(
                    "SELECT e.tenant, e.id, e.kind, e.at_ms, e.session_key, e.job, e.data, e.sealed FROM events e
                     WHERE e.id > (SELECT MAX(id) FROM events WHERE tenant = e.tenant) - ?1
                     ORDER BY e.tenant, e.id",
                )
                .map_err(db_err)?;
            let raws = st
                .query_map([keep as i64], event_from)
                .map_err(db_err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db_err)?;
            self.events_opened(c, raws)
        })
    }
}

/// An event row as read, its data still as stored.
fn event_from(r: &rusqlite::Row<'_>) -> rusqlite::Result<(EventRow, Stored)> {
    Ok((
        EventRow {
            tenant: r.get(0)?,
            id: r.get::<_, i64>(1)? as u64,
            kind: r.get(2)?,
            at_ms: r.get::<_, i64>(3)? as u64,
            session_key: r.get(4)?,
            job: r.get::<_, Option<i64>>(5)?.map(|j| j as u64),
            data: String::new(),
        },
        stored(r, 6, r.get(7)?)?,
    ))
}

impl SqliteStore {
    /// Event rows with their data opened.
    fn events_opened(
        &self,
        c: &rusqlite::Connection,
        raws: Vec<(EventRow, Stored)>,
    ) -> Result<Vec<EventRow>, Error> {
        raws.into_iter()
            .map(|(mut e, data)| {
                e.data = self.reveal(c, &e.tenant, place::EVENT, &e.id.to_string(), data)?;
                Ok(e)
            })
            .collect()
    }
}

/// One process: its own semaphores bound model requests (the defaults grant every slot).
impl super::tables::SlotStore for SqliteStore {}

impl SqliteStore {
    fn session_text(
        &self,
        t: crate::tables::SessionText,
        session: &str,
    ) -> Result<Option<String>, Error> {
        self.with(|c| {
            let raw = c
                .query_row(
                    &format!(
                        "SELECT {}, sealed FROM {} WHERE session = ?1",
                        t.column, t.table
                    ),
                    [session],
                    |r| stored(r, 0, r.get(1)?),
                )
                .optional()
                .map_err(db_err)?;
            raw.map(|f| self.reveal(c, &place::tenant_of(session), t.place, session, f))
                .transpose()
        })
    }

    /// Add the tenant's sessions not yet in the search index (new, or renamed since), with
    /// the trigrams of their ids and opened names, [`INDEX_BATCH`] to a write (writers wait
    /// for one batch, never for a whole backlog). The steady state costs one lookup in a
    /// partial index of the pending ones.
    fn index_sessions(
        &self,
        c: &mut rusqlite::Connection,
        tenant: &str,
        key: &[u8],
    ) -> Result<(), Error> {
        let any_pending = |c: &rusqlite::Connection| -> Result<bool, Error> {
            c.prepare_cached("SELECT 1 FROM sessions INDEXED BY sessions_ungrammed WHERE tenant = ?1 AND grams = 0 LIMIT 1")
                .map_err(db_err)?
                .exists([tenant])
                .map_err(db_err)
        };
        while any_pending(c)? {
            let tx = c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(db_err)?;
            // Read under the write lock: a rename meanwhile is indexed as it now stands.
            let batch = tx
                .prepare_cached("SELECT s.id, l.label, l.sealed FROM sessions s INDEXED BY sessions_ungrammed LEFT JOIN session_labels l ON l.session = s.id WHERE s.tenant = ?1 AND s.grams = 0 LIMIT ?2")
                .map_err(db_err)?
                .query_map(params![tenant, INDEX_BATCH], label_row)
                .map_err(db_err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db_err)?;
            self.index_batch(&tx, tenant, key, batch)?;
            tx.commit().map_err(db_err)?;
        }
        Ok(())
    }

    fn index_batch(
        &self,
        tx: &rusqlite::Connection,
        tenant: &str,
        key: &[u8],
        batch: Vec<(String, Option<Stored>)>,
    ) -> Result<(), Error> {
        let t = crate::tables::SessionText::LABEL;
        for (id, label) in batch {
            let label = label
                .map(|f| self.reveal(tx, &place::tenant_of(&id), t.place, &id, f))
                .transpose()?;
            let texts = rules::searchable(&id, label.as_deref());
            for g in rules::gram_hashes(key, texts.iter().map(String::as_str)) {
                tx.prepare_cached(
                    "INSERT OR IGNORE INTO session_grams (tenant, gram, session) VALUES (?1, ?2, ?3)",
                )
                .map_err(db_err)?
                .execute(params![tenant, g, id])
                .map_err(db_err)?;
            }
            tx.execute("UPDATE sessions SET grams = 1 WHERE id = ?1", [&id])
                .map_err(db_err)?;
        }
        Ok(())
    }

    fn set_session_text(
        &self,
        t: crate::tables::SessionText,
        session: &str,
        text: Option<&str>,
    ) -> Result<(), Error> {
        self.with(|c| {
            if t.table == crate::tables::SessionText::LABEL.table {
                // Renamed: out of the search index until the next search adds it again.
                let tx = c.transaction().map_err(db_err)?;
                tx.execute("DELETE FROM session_grams WHERE session = ?1", [session])
                    .map_err(db_err)?;
                tx.execute("UPDATE sessions SET grams = 0 WHERE id = ?1", [session])
                    .map_err(db_err)?;
                self.write_session_text(&tx, t, session, text)?;
                return tx.commit().map_err(db_err);
            }
            self.write_session_text(c, t, session, text)
        })
    }

    fn write_session_text(
        &self,
        c: &rusqlite::Connection,
        t: crate::tables::SessionText,
        session: &str,
        text: Option<&str>,
    ) -> Result<(), Error> {
        match text {
            None => c.execute(
                &format!("DELETE FROM {} WHERE session = ?1", t.table),
                [session],
            ),
            Some(v) => {
                let (v, sealed) =
                    self.seal_value(c, &place::tenant_of(session), t.place, session, v)?;
                c.execute(
                    &format!(
                        "INSERT OR REPLACE INTO {} (session, {}, sealed) VALUES (?1, ?2, ?3)",
                        t.table, t.column
                    ),
                    params![session, v, sealed],
                )
            }
        }
        .map(drop)
        .map_err(db_err)
    }
}

#[async_trait]
impl super::tables::IndexStore for SqliteStore {
    async fn unindexed(&self) -> Result<(u64, u64), Error> {
        self.with(|c| {
            c.query_row(
                "SELECT COUNT(*), COALESCE(SUM(episodes), 0) FROM sessions WHERE indexed = 0",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
            .map_err(db_err)
        })
    }

    async fn next_unindexed(&self) -> Result<Option<String>, Error> {
        self.with(|c| {
            c.query_row(
                "SELECT id FROM sessions WHERE indexed = 0 ORDER BY id LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_err)
        })
    }

    async fn index_episodes(
        &self,
        session: &str,
        docs: &[(u64, String)],
        done: bool,
    ) -> Result<u32, Error> {
        self.with(|conn| {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(db_err)?;
            let added = self.index_terms_on(&tx, session, docs, false)?;
            if done {
                tx.execute("UPDATE sessions SET indexed = 1 WHERE id = ?1", [session])
                    .map_err(db_err)?;
            }
            tx.commit().map_err(db_err)?;
            Ok(added)
        })
    }
}
