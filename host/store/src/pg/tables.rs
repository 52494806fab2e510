//! The app's tables ([`crate::tables`]) in PostgreSQL: jobs shared by every instance,
//! sources, per-session settings, tokens and the event log.

use async_trait::async_trait;
use tokio_postgres::Row;

use super::{LOCK, P, PgStore, g32, g64, gopt};
use crate::control::Progress;
use crate::jobs::{Beat, Claim, Job, JobState};
use crate::keyring::{Stored, place};
use crate::rules;
use crate::sources::{Mark, SessionMode, Source, WatchedFile};
use crate::tables::{
    EventRow, EventStore, JobScope, JobStore, Liveness, SlotStore, SourceStore, TenantCap,
    TokenRow, TokenStore,
};
use crate::types::{Error, Mode};

const COLS: &str = "id, session, target, state, config, cancel_requested, level, done, total, calls_planned, answers, attempts, error, lease_owner, lease_until_ms, created_ms, started_ms, updated_ms, finished_ms";

fn job_from(r: &Row) -> Job {
    let (tenant, session) = crate::jobs::tenant_and_session(r.get::<_, &str>(1));
    Job {
        id: g64(r, 0),
        tenant,
        session,
        target: g64(r, 2),
        state: JobState::parse(&r.get::<_, String>(3)),
        config: crate::types::config_from_json(
            &serde_json::from_str(&r.get::<_, String>(4)).unwrap_or_default(),
        ),
        cancel_requested: r.get::<_, i64>(5) != 0,
        level: g32(r, 6),
        done: g32(r, 7),
        total: g32(r, 8),
        calls_planned: g32(r, 9),
        answers: g64(r, 10),
        attempts: g32(r, 11),
        error: r.get(12),
        lease_owner: r.get(13),
        lease_until_ms: gopt(r, 14),
        created_ms: g64(r, 15),
        started_ms: gopt(r, 16),
        updated_ms: g64(r, 17),
        finished_ms: gopt(r, 18),
    }
}

/// A `WHERE` fragment selecting the sessions of `scope`, with its parameters numbered from
/// `n`.
fn scope_sql<'a>(scope: JobScope<'a>, n: usize, args: &mut Vec<&'a str>) -> String {
    match scope {
        JobScope::Local => "strpos(session, chr(31)) = 0".into(),
        JobScope::Keys(lo, hi) => {
            args.push(lo);
            args.push(hi);
            format!("session >= ${n} AND session < ${}", n + 1)
        }
    }
}

impl PgStore {
    /// Event rows with their data opened.
    async fn events_opened<C: deadpool_postgres::GenericClient + Sync>(
        &self,
        c: &C,
        rows: &[Row],
    ) -> Result<Vec<EventRow>, Error> {
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let (mut e, data) = event_from(r);
            e.data = self
                .reveal(c, &e.tenant, place::EVENT, &e.id.to_string(), data)
                .await?;
            out.push(e);
        }
        Ok(out)
    }

    async fn jobs_where(&self, filter: &str, params: &[P<'_>]) -> Result<Vec<Job>, Error> {
        Ok(self
            .rows(&format!("SELECT {COLS} FROM jobs WHERE {filter}"), params)
            .await?
            .iter()
            .map(job_from)
            .collect())
    }
}

#[async_trait]
impl JobStore for PgStore {
    async fn job_enqueue(
        &self,
        session: &str,
        target: u64,
        config: &str,
        now_ms: u64,
    ) -> Result<(Job, bool), Error> {
        let key = format!("{session}@{target}");
        // The partial unique index admits one active job per key, whoever inserts; a loser
        // reads the winner's job (or tries again when it finished in between).
        for _ in 0..5 {
            let newest = self
                .row("SELECT MAX(id) FROM jobs", &[])
                .await?
                .and_then(|r| r.get::<_, Option<i64>>(0))
                .map(|n| n as u64);
            let made = self
                .row(
                    &format!(
                        "INSERT INTO jobs (id, session, target, key, state, config, created_ms, updated_ms, tenant) VALUES ($6, $1, $2, $3, 'queued', $4, $5, $5, $7)
                         ON CONFLICT DO NOTHING RETURNING {COLS}"
                    ),
                    &[&session, &(target as i64), &key, &config, &(now_ms as i64), &(crate::rules::new_job_id(now_ms, newest) as i64), &crate::tenant::tenant_column(session)],
                )
                .await?;
            if let Some(r) = made {
                return Ok((job_from(&r), true));
            }
            let active = self
                .jobs_where("key = $1 AND state IN ('queued','running')", &[&key])
                .await?;
            if let Some(j) = active.into_iter().next() {
                return Ok((j, false));
            }
        }
        Err(Error::Conflict(format!(
            "job {key} kept changing under the enqueue; try again"
        )))
    }

    async fn job_get(&self, id: u64) -> Result<Option<Job>, Error> {
        Ok(self
            .jobs_where("id = $1", &[&(id as i64)])
            .await?
            .into_iter()
            .next())
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
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        // Another instance claiming the same row holds its lock: skip, it is busy.
        let locked = tx
            .query_opt(
                &format!("SELECT {COLS} FROM jobs WHERE id = $1 FOR UPDATE SKIP LOCKED"),
                &[&(id as i64)],
            )
            .await
            .map_err(|e| self.err(e))?;
        let Some(row) = locked else {
            drop(tx);
            let job = self
                .job_get(id)
                .await?
                .ok_or_else(|| Error::Storage(format!("no job {id}")))?;
            return Ok(if job.state.is_active() {
                Claim::Busy(job)
            } else {
                Claim::Finished(job)
            });
        };
        let job = job_from(&row);
        if let Some(no) = crate::rules::claim_first(&job, live) {
            return Ok(no.answer(job));
        }
        // One running job per session, and the tenant's cap, across instances: the session's
        // and then the tenant's lock (always in that order) make check and claim one step.
        let key = job.key();
        tx.execute(LOCK, &[&format!("job-session:{key}")])
            .await
            .map_err(|e| self.err(e))?;
        let others: Vec<Job> = tx
            .query(
                &format!(
                    "SELECT {COLS} FROM jobs WHERE session = $1 AND id != $2 AND state = 'running'"
                ),
                &[&key, &(id as i64)],
            )
            .await
            .map_err(|e| self.err(e))?
            .iter()
            .map(job_from)
            .collect();
        let mut running = 0;
        if let Some(cap) = cap {
            let lock = match cap.scope {
                JobScope::Local => "job-tenant:".to_string(),
                JobScope::Keys(lo, _) => format!("job-tenant:{lo}"),
            };
            tx.execute(LOCK, &[&lock]).await.map_err(|e| self.err(e))?;
            let mut args: Vec<&str> = Vec::new();
            let filter = scope_sql(cap.scope, 3, &mut args);
            let now = now_ms as i64;
            let me = id as i64;
            let mut params: Vec<P<'_>> = vec![&me, &now];
            for a in &args {
                params.push(a);
            }
            let n: i64 = tx
                .query_one(
                    &format!("SELECT COUNT(*) FROM jobs WHERE state = 'running' AND id != $1 AND lease_until_ms > $2 AND {filter}"),
                    &params,
                )
                .await
                .map_err(|e| self.err(e))?
                .get(0);
            running = n as usize;
        }
        if let Some(no) = crate::rules::claim_rest(&others, live, running, cap) {
            return Ok(no.answer(job));
        }
        let r = tx
            .query_one(
                &format!("UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_owner = $2, lease_until_ms = $3, started_ms = COALESCE(started_ms, $4), updated_ms = $4, error = NULL WHERE id = $1 RETURNING {COLS}"),
                &[&(id as i64), &owner, &(until_ms as i64), &(now_ms as i64)],
            )
            .await
            .map_err(|e| self.err(e))?;
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(Claim::Taken(job_from(&r)))
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
        let r = self
            .row(
                "UPDATE jobs SET lease_until_ms = $3, level = $4, done = $5, total = $6, answers = $7, updated_ms = $8 WHERE id = $1 AND lease_owner = $2 AND state = 'running' RETURNING cancel_requested",
                &[
                    &(id as i64),
                    &owner,
                    &(until_ms as i64),
                    &i64::from(p.level),
                    &i64::from(p.done),
                    &i64::from(p.total),
                    &(answers as i64),
                    &(now_ms as i64),
                ],
            )
            .await?;
        Ok(match r {
            None => Beat::Lost,
            Some(r) if r.get::<_, i64>(0) != 0 => Beat::Cancel,
            Some(_) => Beat::Go,
        })
    }

    async fn job_set_planned(&self, id: u64, calls: u32) -> Result<(), Error> {
        self.exec(
            "UPDATE jobs SET calls_planned = $2 WHERE id = $1",
            &[&(id as i64), &i64::from(calls)],
        )
        .await
        .map(drop)
    }

    async fn job_finish(
        &self,
        id: u64,
        state: JobState,
        error: Option<&str>,
        now_ms: u64,
    ) -> Result<(), Error> {
        self.exec(
            "UPDATE jobs SET state = $2, error = $3, lease_owner = NULL, lease_until_ms = NULL, updated_ms = $4, finished_ms = $4 WHERE id = $1",
            &[&(id as i64), &state.as_str(), &error, &(now_ms as i64)],
        )
        .await
        .map(drop)
    }

    async fn job_cancel(&self, id: u64, now_ms: u64) -> Result<(), Error> {
        self.exec(
            "UPDATE jobs SET state = 'cancelled', error = 'cancelled before it ran', updated_ms = $2, finished_ms = $2 WHERE id = $1 AND state = 'queued'",
            &[&(id as i64), &(now_ms as i64)],
        )
        .await?;
        self.exec(
            "UPDATE jobs SET cancel_requested = 1, updated_ms = $2 WHERE id = $1 AND state = 'running'",
            &[&(id as i64), &(now_ms as i64)],
        )
        .await
        .map(drop)
    }

    async fn job_release(&self, id: u64, owner: &str, now_ms: u64) -> Result<bool, Error> {
        Ok(self
            .exec(
                "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_until_ms = NULL, updated_ms = $3 WHERE id = $1 AND lease_owner = $2 AND state = 'running'",
                &[&(id as i64), &owner, &(now_ms as i64)],
            )
            .await?
            > 0)
    }

    async fn jobs_active(&self) -> Result<Vec<Job>, Error> {
        self.jobs_where("state IN ('queued','running') ORDER BY id", &[])
            .await
    }

    async fn jobs_runnable(&self, per_tenant: u32) -> Result<Vec<Job>, Error> {
        // The tenants with active jobs, one index seek each (a skip scan); each one's oldest
        // queued jobs from the same index; and every running job (a lease may have run
        // out). One statement.
        self.jobs_where(
            "id IN (
                WITH RECURSIVE t(name) AS (
                    SELECT (SELECT tenant FROM jobs WHERE state IN ('queued','running')
                            ORDER BY tenant LIMIT 1)
                    UNION ALL
                    SELECT (SELECT tenant FROM jobs WHERE state IN ('queued','running')
                            AND tenant > t.name ORDER BY tenant LIMIT 1)
                    FROM t WHERE t.name IS NOT NULL
                )
                SELECT q.id FROM t CROSS JOIN LATERAL (
                    SELECT id FROM jobs
                    WHERE tenant = t.name AND state IN ('queued','running') AND state = 'queued'
                    ORDER BY id LIMIT $1
                ) q
                WHERE t.name IS NOT NULL
                UNION ALL
                SELECT id FROM jobs WHERE state = 'running'
            ) ORDER BY id",
            &[&i64::from(per_tenant.max(1))],
        )
        .await
    }

    async fn job_active_for(&self, session: &str) -> Result<Option<Job>, Error> {
        Ok(self
            .jobs_where(
                "session = $1 AND state IN ('queued','running') ORDER BY id DESC LIMIT 1",
                &[&session],
            )
            .await?
            .into_iter()
            .next())
    }

    async fn job_lease_owners(&self, session: &str, now_ms: u64) -> Result<Vec<String>, Error> {
        Ok(self
            .rows(
                "SELECT lease_owner FROM jobs WHERE session = $1 AND state = 'running' AND lease_until_ms > $2 AND lease_owner IS NOT NULL",
                &[&session, &(now_ms as i64)],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn jobs_list(
        &self,
        scope: Option<JobScope<'_>>,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<Job>, Error> {
        let before = before.map_or(i64::MAX, |b| b.min(i64::MAX as u64) as i64);
        let limit = i64::from(limit);
        let mut args: Vec<&str> = Vec::new();
        let filter = match scope {
            None => "TRUE".to_string(),
            Some(s) => scope_sql(s, 3, &mut args),
        };
        let mut params: Vec<P<'_>> = vec![&before, &limit];
        for a in &args {
            params.push(a);
        }
        self.jobs_where(
            &format!("id < $1 AND {filter} ORDER BY id DESC LIMIT $2"),
            &params,
        )
        .await
    }

    async fn job_counts(&self) -> Result<Vec<(String, u64)>, Error> {
        Ok(self
            .rows(
                "SELECT state, COUNT(*) FROM jobs GROUP BY state ORDER BY state",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), g64(r, 1)))
            .collect())
    }

    async fn jobs_queued(&self, scope: JobScope<'_>) -> Result<u64, Error> {
        let mut args: Vec<&str> = Vec::new();
        let filter = scope_sql(scope, 1, &mut args);
        let params: Vec<P<'_>> = args.iter().map(|a| a as P<'_>).collect();
        let rows = self
            .rows(
                &format!(
                    "SELECT COUNT(*) FROM jobs WHERE state IN ('queued','running') AND state = 'queued' AND {filter}"
                ),
                &params,
            )
            .await?;
        Ok(rows.first().map_or(0, |r| g64(r, 0)))
    }

    async fn jobs_prune(
        &self,
        finished_before_ms: u64,
        keep_per_tenant: u32,
    ) -> Result<u64, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        let before = finished_before_ms.min(i64::MAX as u64) as i64;
        let keep = i64::from(keep_per_tenant);
        let mut gone: Vec<i64> = tx
            .query(
                "DELETE FROM jobs WHERE state IN ('succeeded','failed','cancelled') AND finished_ms < $1 RETURNING id",
                &[&before],
            )
            .await
            .map_err(|e| self.err(e))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        // Each tenant's newest `keep` finished jobs stay (the tenant is the key's part before
        // the separator; the local tenant's keys have none).
        gone.extend(
            tx.query(
                "DELETE FROM jobs WHERE id IN (
                   SELECT id FROM (
                     SELECT id, ROW_NUMBER() OVER (
                       PARTITION BY substr(session, 1, strpos(session, chr(31)))
                       ORDER BY id DESC) AS n
                     FROM jobs WHERE state IN ('succeeded','failed','cancelled')) ranked
                   WHERE n > $1)
                 RETURNING id",
                &[&keep],
            )
            .await
            .map_err(|e| self.err(e))?
            .iter()
            .map(|r| r.get::<_, i64>(0)),
        );
        if !gone.is_empty() {
            tx.execute("DELETE FROM events WHERE job = ANY($1)", &[&gone])
                .await
                .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(gone.len() as u64)
    }
}

#[async_trait]
impl SourceStore for PgStore {
    async fn source(&self, path: &str) -> Result<Option<Source>, Error> {
        Ok(self
            .row(
                "SELECT path, size, mtime_ms, sha256, status, sessions, episodes, detail FROM sources WHERE path = $1",
                &[&path],
            )
            .await?
            .map(|r| Source {
                path: r.get(0),
                size: g64(&r, 1),
                mtime_ms: g64(&r, 2),
                sha256: r.get(3),
                status: r.get(4),
                sessions: serde_json::from_str(&r.get::<_, String>(5)).unwrap_or_default(),
                episodes: g64(&r, 6),
                detail: r.get(7),
            }))
    }

    async fn put_source(&self, s: &Source, now_ms: u64) -> Result<(), Error> {
        self.exec(
            "INSERT INTO sources (path, size, mtime_ms, sha256, status, sessions, episodes, detail, updated_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (path) DO UPDATE SET size = excluded.size, mtime_ms = excluded.mtime_ms, sha256 = excluded.sha256, status = excluded.status, sessions = excluded.sessions, episodes = excluded.episodes, detail = excluded.detail, updated_ms = excluded.updated_ms",
            &[
                &s.path,
                &(s.size as i64),
                &(s.mtime_ms as i64),
                &s.sha256,
                &s.status,
                &serde_json::to_string(&s.sessions).expect("strings serialize"),
                &(s.episodes as i64),
                &s.detail,
                &(now_ms as i64),
            ],
        )
        .await
        .map(drop)
    }

    async fn watched_files(&self) -> Result<Vec<WatchedFile>, Error> {
        Ok(self
            .rows(
                "SELECT path, session, format, \"offset\", lines FROM watched_files ORDER BY path",
                &[],
            )
            .await?
            .iter()
            .map(|r| WatchedFile {
                path: r.get(0),
                session: r.get(1),
                format: r.get(2),
                offset: g64(r, 3),
                lines: gopt(r, 4),
            })
            .collect())
    }

    async fn put_watched(&self, f: &WatchedFile, now_ms: u64) -> Result<(), Error> {
        self.exec(
            "INSERT INTO watched_files (path, session, format, \"offset\", lines, updated_ms) VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (path) DO UPDATE SET session = excluded.session, format = excluded.format, \"offset\" = excluded.\"offset\", lines = excluded.lines, updated_ms = excluded.updated_ms",
            &[
                &f.path,
                &f.session,
                &f.format,
                &(f.offset as i64),
                &f.lines.map(|n| n as i64),
                &(now_ms as i64),
            ],
        )
        .await
        .map(drop)
    }

    async fn record_mark(
        &self,
        session: &str,
        path: &str,
        last_episode: u64,
        bytes: u64,
    ) -> Result<(), Error> {
        self.exec(
            "INSERT INTO source_marks (session, path, last_episode, bytes) VALUES ($1, $2, $3, $4)
             ON CONFLICT (session, path, last_episode) DO UPDATE SET bytes = excluded.bytes",
            &[&session, &path, &(last_episode as i64), &(bytes as i64)],
        )
        .await
        .map(drop)
    }

    async fn mark_covering(&self, session: &str, last_episode: u64) -> Result<Option<Mark>, Error> {
        Ok(self
            .row(
                "SELECT path, last_episode, bytes FROM source_marks WHERE session = $1 AND last_episode <= $2 ORDER BY last_episode DESC, bytes DESC LIMIT 1",
                &[&session, &(last_episode.min(i64::MAX as u64) as i64)],
            )
            .await?
            .map(|r| Mark {
                path: r.get(0),
                last_episode: g64(&r, 1),
                bytes: g64(&r, 2),
            }))
    }

    async fn session_mode(&self, session: &str) -> Result<Option<SessionMode>, Error> {
        Ok(self
            .row(
                "SELECT mode, quiescence_secs FROM session_modes WHERE session = $1",
                &[&session],
            )
            .await?
            .map(|r| SessionMode {
                mode: Mode::parse(&r.get::<_, String>(0)).unwrap_or(Mode::Eager),
                quiescence_secs: gopt(&r, 1).map(|x| x as u32),
            }))
    }

    async fn set_session_mode(&self, session: &str, m: Option<&SessionMode>) -> Result<(), Error> {
        match m {
            None => {
                self.exec(
                    "DELETE FROM session_modes WHERE session = $1",
                    &[&session],
                )
                .await?
            }
            Some(m) => {
                self.exec(
                    "INSERT INTO session_modes (session, mode, quiescence_secs) VALUES ($1, $2, $3)
                     ON CONFLICT (session) DO UPDATE SET mode = excluded.mode, quiescence_secs = excluded.quiescence_secs",
                    &[
                        &session,
                        &m.mode.as_str(),
                        &m.quiescence_secs.map(i64::from),
                    ],
                )
                .await?
            }
        };
        Ok(())
    }

    async fn sessions_count(&self, tenant: &str) -> Result<u64, Error> {
        Ok(self
            .row(
                "SELECT COUNT(*) FROM sessions WHERE tenant = $1",
                &[&tenant],
            )
            .await?
            .map_or(0, |r| r.get::<_, i64>(0)) as u64)
    }

    async fn sessions_page(
        &self,
        tenant: &str,
        offset: u64,
        limit: u32,
    ) -> Result<Vec<String>, Error> {
        Ok(self
            .rows(
                "SELECT id FROM sessions WHERE tenant = $1 ORDER BY changed_seq DESC, id LIMIT $2 OFFSET $3",
                &[&tenant, &i64::from(limit), &(offset as i64)],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn sessions_prefixed(
        &self,
        tenant: &str,
        prefix: &str,
        limit: u32,
    ) -> Result<(Vec<String>, u64), Error> {
        // LIKE with the prefix escaped, on an index of the ids by pattern (byte order).
        let pattern = format!(
            "{}%",
            prefix
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_")
        );
        let total: i64 = self
            .row(
                "SELECT COUNT(*) FROM sessions WHERE tenant = $1 AND id LIKE $2",
                &[&tenant, &pattern],
            )
            .await?
            .map_or(0, |r| r.get(0));
        let ids = self
            .rows(
                "SELECT id FROM sessions WHERE tenant = $1 AND id LIKE $2 ORDER BY id COLLATE \"C\" LIMIT $3",
                &[&tenant, &pattern, &i64::from(limit)],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        Ok((ids, total as u64))
    }

    async fn sessions_labelled(
        &self,
        tenant: &str,
        q: &str,
    ) -> Result<Vec<(String, Option<String>)>, Error> {
        let (key, query) = crate::tables::search_grams(self, tenant, q).await?;
        self.index_sessions(tenant, &key).await?;
        let c = self.client().await?;
        let rows = if query.is_empty() {
            c.query(
                "SELECT s.id, l.label, l.sealed FROM sessions s LEFT JOIN session_labels l ON l.session = s.id WHERE s.tenant = $1 ORDER BY s.changed_seq DESC, s.id",
                &[&tenant],
            )
            .await
            .map_err(|e| self.err(e))?
        } else {
            // The rarest trigrams first (counted only as far as telling them apart needs):
            // the first gives the candidates, the others must be held by each.
            let mut counted = Vec::with_capacity(query.len());
            for g in &query {
                let n: i64 = c
                    .query_one(
                        "SELECT COUNT(*) FROM (SELECT 1 FROM session_grams WHERE tenant = $1 AND gram = $2 LIMIT $3) x",
                        &[&tenant, g, &i64::from(rules::GRAM_COUNT_CAP)],
                    )
                    .await
                    .map_err(|e| self.err(e))?
                    .get(0);
                counted.push((n, *g));
            }
            let Some(grams) = rules::rarest_grams(counted) else {
                return Ok(Vec::new());
            };
            c.query(
                "SELECT s.id, l.label, l.sealed FROM session_grams g0 JOIN sessions s ON s.id = g0.session LEFT JOIN session_labels l ON l.session = s.id WHERE g0.tenant = $1 AND g0.gram = $2 AND NOT EXISTS (SELECT 1 FROM unnest($3::bigint[]) w(gram) WHERE NOT EXISTS (SELECT 1 FROM session_grams g WHERE g.tenant = $1 AND g.gram = w.gram AND g.session = g0.session)) ORDER BY s.changed_seq DESC, s.id",
                &[&tenant, &grams[0], &grams[1..].to_vec()],
            )
            .await
            .map_err(|e| self.err(e))?
        };
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push(self.label_row(&c, r).await?);
        }
        Ok(out)
    }

    async fn session_focus(&self, session: &str) -> Result<Option<String>, Error> {
        self.session_text(crate::tables::SessionText::FOCUS, session)
            .await
    }

    async fn set_session_focus(&self, session: &str, focus: Option<&str>) -> Result<(), Error> {
        self.set_session_text(crate::tables::SessionText::FOCUS, session, focus)
            .await
    }

    async fn session_label(&self, session: &str) -> Result<Option<String>, Error> {
        self.session_text(crate::tables::SessionText::LABEL, session)
            .await
    }

    async fn set_session_label(&self, session: &str, label: Option<&str>) -> Result<(), Error> {
        self.set_session_text(crate::tables::SessionText::LABEL, session, label)
            .await
    }

    async fn pins(&self, session: &str) -> Result<Vec<u64>, Error> {
        Ok(self
            .rows(
                "SELECT episode FROM session_pins WHERE session = $1 ORDER BY episode",
                &[&session],
            )
            .await?
            .iter()
            .map(|r| g64(r, 0))
            .collect())
    }

    async fn set_pin(&self, session: &str, episode: u64, pinned: bool) -> Result<bool, Error> {
        let n = if pinned {
            self.exec(
                "INSERT INTO session_pins (session, episode) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&session, &(episode as i64)],
            )
            .await?
        } else {
            self.exec(
                "DELETE FROM session_pins WHERE session = $1 AND episode = $2",
                &[&session, &(episode as i64)],
            )
            .await?
        };
        Ok(n > 0)
    }
}

const TOKEN_COLS: &str = "id, tenant, prefix, read_only, label, created_ms, revoked_ms";

fn token_from(r: &Row) -> TokenRow {
    TokenRow {
        id: g64(r, 0),
        tenant: r.get(1),
        prefix: r.get(2),
        read_only: r.get::<_, i64>(3) != 0,
        label: r.get(4),
        created_ms: g64(r, 5),
        revoked_ms: gopt(r, 6),
    }
}

#[async_trait]
impl TokenStore for PgStore {
    async fn insert_token(
        &self,
        tenant: &str,
        hash: &str,
        prefix: &str,
        read_only: bool,
        label: Option<&str>,
        now_ms: u64,
    ) -> Result<u64, Error> {
        let r = self
            .row(
                "INSERT INTO tokens (tenant, hash, prefix, read_only, label, created_ms) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                &[&tenant, &hash, &prefix, &i64::from(read_only), &label, &(now_ms as i64)],
            )
            .await?
            .ok_or_else(|| Error::Storage("the token row vanished".into()))?;
        Ok(g64(&r, 0))
    }

    async fn tokens(&self) -> Result<Vec<TokenRow>, Error> {
        Ok(self
            .rows(&format!("SELECT {TOKEN_COLS} FROM tokens ORDER BY id"), &[])
            .await?
            .iter()
            .map(token_from)
            .collect())
    }

    async fn revoke_token(&self, id: u64, now_ms: u64) -> Result<bool, Error> {
        Ok(self
            .exec(
                "UPDATE tokens SET revoked_ms = $2 WHERE id = $1 AND revoked_ms IS NULL",
                &[&(id as i64), &(now_ms as i64)],
            )
            .await?
            > 0)
    }

    async fn any_live_token(&self) -> Result<bool, Error> {
        Ok(self
            .row(
                "SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_ms IS NULL)",
                &[],
            )
            .await?
            .is_some_and(|r| r.get::<_, bool>(0)))
    }

    async fn live_token(&self, hash: &str) -> Result<Option<TokenRow>, Error> {
        Ok(self
            .row(
                &format!("SELECT {TOKEN_COLS} FROM tokens WHERE hash = $1 AND revoked_ms IS NULL"),
                &[&hash],
            )
            .await?
            .as_ref()
            .map(token_from))
    }
}

/// An event row as read, its data still as stored.
fn event_from(r: &Row) -> (EventRow, Stored) {
    (
        EventRow {
            tenant: r.get(0),
            id: g64(r, 1),
            kind: r.get(2),
            at_ms: g64(r, 3),
            session_key: r.get(4),
            job: gopt(r, 5),
            data: String::new(),
        },
        Stored {
            bytes: r.get(6),
            sealed: g32(r, 7),
        },
    )
}

/// The channel event writers notify (the payload is the tenant).
pub(super) const EVENTS_CHANNEL: &str = "abridge_events";

#[async_trait]
impl EventStore for PgStore {
    async fn append_events(
        &self,
        tenant: &str,
        floor: u64,
        rows: &[EventRow],
        keep: usize,
    ) -> Result<u64, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        // Writers of one tenant take turns until they commit, so its ids are dense and
        // become visible in order (what readers on other instances rely on).
        tx.execute(LOCK, &[&format!("events:{tenant}")])
            .await
            .map_err(|e| self.err(e))?;
        let newest: i64 = tx
            .query_one(
                "SELECT COALESCE(MAX(id), 0) FROM events WHERE tenant = $1",
                &[&tenant],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        let first = (newest.max(0) as u64).max(floor) + 1;
        let ins = tx
            .prepare_cached(
                "INSERT INTO events (tenant, id, kind, at_ms, session_key, job, data, sealed) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .await
            .map_err(|e| self.err(e))?;
        let sealer = self.sealer(&tx, tenant).await?;
        for (i, e) in rows.iter().enumerate() {
            let id = first + i as u64;
            let (data, sealed) = sealer.seal(place::EVENT, &id.to_string(), &e.data)?;
            tx.execute(
                &ins,
                &[
                    &tenant,
                    &(id as i64),
                    &e.kind,
                    &(e.at_ms as i64),
                    &e.session_key,
                    &e.job.map(|j| j as i64),
                    &data,
                    &i64::from(sealed),
                ],
            )
            .await
            .map_err(|e| self.err(e))?;
        }
        let last = first + rows.len() as u64;
        tx.execute(
            "DELETE FROM events WHERE tenant = $1 AND id < $2",
            &[&tenant, &(last.saturating_sub(keep as u64) as i64)],
        )
        .await
        .map_err(|e| self.err(e))?;
        // Delivered to listeners at commit.
        tx.execute("SELECT pg_notify($1, $2)", &[&EVENTS_CHANNEL, &tenant])
            .await
            .map_err(|e| self.err(e))?;
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(first)
    }

    async fn recent_events(&self, keep: usize) -> Result<Vec<EventRow>, Error> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT e.tenant, e.id, e.kind, e.at_ms, e.session_key, e.job, e.data, e.sealed FROM events e
                 WHERE e.id > (SELECT MAX(id) FROM events WHERE tenant = e.tenant) - $1
                 ORDER BY e.tenant, e.id",
                &[&(keep as i64)],
            )
            .await
            .map_err(|e| self.err(e))?;
        self.events_opened(&c, &rows).await
    }

    async fn events_after(
        &self,
        tenant: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<EventRow>, Error> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT tenant, id, kind, at_ms, session_key, job, data, sealed FROM events WHERE tenant = $1 AND id > $2 ORDER BY id LIMIT $3",
                &[
                    &tenant,
                    &(after.min(i64::MAX as u64) as i64),
                    &(limit.min(i64::MAX as usize) as i64),
                ],
            )
            .await
            .map_err(|e| self.err(e))?;
        self.events_opened(&c, &rows).await
    }

    async fn event_heads(&self) -> Result<Vec<(String, u64)>, Error> {
        Ok(self
            .rows(
                "SELECT tenant, MAX(id) FROM events GROUP BY tenant ORDER BY tenant",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), g64(r, 1)))
            .collect())
    }

    fn events_shared(&self) -> bool {
        true
    }

    async fn event_signal(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        Some(self.listen(EVENTS_CHANNEL))
    }
}

impl PgStore {
    /// Payloads of notifications on `channel`, from a connection of its own that is opened
    /// again (after a pause) whenever it is lost; ends when the receiver is dropped.
    pub fn listen(&self, channel: &'static str) -> tokio::sync::mpsc::UnboundedReceiver<String> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let config = self.config.clone();
        tokio::spawn(async move {
            while !tx.is_closed() {
                if let Ok((client, mut conn)) = config.connect(tokio_postgres::NoTls).await {
                    let (ntx, mut nrx) = tokio::sync::mpsc::unbounded_channel();
                    let pump = tokio::spawn(async move {
                        let mut stream = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
                        use futures::StreamExt;
                        while let Some(Ok(m)) = stream.next().await {
                            if let tokio_postgres::AsyncMessage::Notification(n) = m
                                && ntx.send(n.payload().to_string()).is_err()
                            {
                                break;
                            }
                        }
                    });
                    if client
                        .batch_execute(&format!("LISTEN {channel}"))
                        .await
                        .is_ok()
                    {
                        // A reconnect may have missed notifications: say "look" once.
                        let _ = tx.send(String::new());
                        while let Some(p) = nrx.recv().await {
                            if tx.send(p).is_err() {
                                break;
                            }
                        }
                    }
                    pump.abort();
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
        rx
    }
}

#[async_trait]
impl SlotStore for PgStore {
    fn slots_shared(&self) -> bool {
        true
    }

    async fn slot_take(
        &self,
        pool: &str,
        owner: &str,
        max: usize,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<Option<u64>, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        // Takers of one pool take turns, so the count and the insert are one step.
        tx.execute(LOCK, &[&format!("slots:{pool}")])
            .await
            .map_err(|e| self.err(e))?;
        let now = now_ms as i64;
        tx.execute(
            "DELETE FROM model_slots WHERE tenant = $1 AND until_ms <= $2",
            &[&pool, &now],
        )
        .await
        .map_err(|e| self.err(e))?;
        let held: i64 = tx
            .query_one(
                "SELECT COUNT(*) FROM model_slots WHERE tenant = $1",
                &[&pool],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        if held as usize >= max {
            return Ok(None);
        }
        let id: i64 = tx
            .query_one(
                "INSERT INTO model_slots (tenant, owner, until_ms) VALUES ($1, $2, $3) RETURNING id",
                &[&pool, &owner, &(until_ms as i64)],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(Some(id as u64))
    }

    async fn slot_release(&self, id: u64) -> Result<(), Error> {
        self.exec("DELETE FROM model_slots WHERE id = $1", &[&(id as i64)])
            .await
            .map(drop)
    }

    async fn slot_renew(&self, owner: &str, until_ms: u64) -> Result<(), Error> {
        self.exec(
            "UPDATE model_slots SET until_ms = $2 WHERE owner = $1",
            &[&owner, &(until_ms as i64)],
        )
        .await
        .map(drop)
    }
}

impl PgStore {
    async fn session_text(
        &self,
        t: crate::tables::SessionText,
        session: &str,
    ) -> Result<Option<String>, Error> {
        let c = self.client().await?;
        let Some(r) = c
            .query_opt(
                &format!(
                    "SELECT {}, sealed FROM {} WHERE session = $1",
                    t.column, t.table
                ),
                &[&session],
            )
            .await
            .map_err(|e| self.err(e))?
        else {
            return Ok(None);
        };
        let text = Stored {
            bytes: r.get(0),
            sealed: g32(&r, 1),
        };
        self.reveal(&c, &place::tenant_of(session), t.place, session, text)
            .await
            .map(Some)
    }

    /// A session and its opened label from a row of `SELECT id, label, sealed`.
    async fn label_row<C: deadpool_postgres::GenericClient + Sync>(
        &self,
        c: &C,
        r: &Row,
    ) -> Result<(String, Option<String>), Error> {
        let t = crate::tables::SessionText::LABEL;
        let id: String = r.get(0);
        let label = match r.get::<_, Option<Vec<u8>>>(1) {
            None => None,
            Some(bytes) => {
                let text = Stored {
                    bytes,
                    sealed: g32(r, 2),
                };
                Some(
                    self.reveal(c, &place::tenant_of(&id), t.place, &id, text)
                        .await?,
                )
            }
        };
        Ok((id, label))
    }

    /// Add the tenant's sessions not yet in the search index (new, or renamed since), with
    /// the trigrams of their ids and opened names, 500 to a transaction. The rows are locked
    /// (in id order) while they are read and indexed, so a rename (written first, then the
    /// index reset) is never lost and two searches never index one session at once.
    async fn index_sessions(&self, tenant: &str, key: &[u8]) -> Result<(), Error> {
        let mut c = self.client().await?;
        loop {
            let pending = c
                .query_opt(
                    "SELECT 1 FROM sessions WHERE tenant = $1 AND grams = 0 LIMIT 1",
                    &[&tenant],
                )
                .await
                .map_err(|e| self.err(e))?;
            if pending.is_none() {
                return Ok(());
            }
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            let rows = tx
                .query(
                    "SELECT s.id, l.label, l.sealed FROM sessions s LEFT JOIN session_labels l ON l.session = s.id WHERE s.tenant = $1 AND s.grams = 0 ORDER BY s.id LIMIT 500 FOR UPDATE OF s",
                    &[&tenant],
                )
                .await
                .map_err(|e| self.err(e))?;
            if rows.is_empty() {
                // Another search added them meanwhile (a locked row is read again once its
                // lock is released, and skipped when it no longer matches).
                return Ok(());
            }
            self.index_batch(&tx, tenant, key, &rows).await?;
            tx.commit().await.map_err(|e| self.err(e))?;
        }
    }

    async fn index_batch(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        tenant: &str,
        key: &[u8],
        rows: &[Row],
    ) -> Result<(), Error> {
        for r in rows {
            let (id, label) = self.label_row(tx, r).await?;
            let texts = rules::searchable(&id, label.as_deref());
            let grams: Vec<i64> = rules::gram_hashes(key, texts.iter().map(String::as_str))
                .into_iter()
                .collect();
            tx.execute(
                "INSERT INTO session_grams (tenant, gram, session) SELECT $1, g, $3 FROM unnest($2::bigint[]) g ON CONFLICT DO NOTHING",
                &[&tenant, &grams, &id],
            )
            .await
            .map_err(|e| self.err(e))?;
            tx.execute("UPDATE sessions SET grams = 1 WHERE id = $1", &[&id])
                .await
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    async fn set_session_text(
        &self,
        t: crate::tables::SessionText,
        session: &str,
        text: Option<&str>,
    ) -> Result<(), Error> {
        let label = t.table == crate::tables::SessionText::LABEL.table;
        self.write_session_text(t, session, text).await?;
        if label {
            // Renamed: out of the search index until the next search adds it again (after the
            // write: a search that read the old name is undone here).
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            tx.execute("UPDATE sessions SET grams = 0 WHERE id = $1", &[&session])
                .await
                .map_err(|e| self.err(e))?;
            tx.execute("DELETE FROM session_grams WHERE session = $1", &[&session])
                .await
                .map_err(|e| self.err(e))?;
            tx.commit().await.map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    async fn write_session_text(
        &self,
        t: crate::tables::SessionText,
        session: &str,
        text: Option<&str>,
    ) -> Result<(), Error> {
        match text {
            None => {
                self.exec(
                    &format!("DELETE FROM {} WHERE session = $1", t.table),
                    &[&session],
                )
                .await?
            }
            Some(v) => {
                let c = self.client().await?;
                let (v, sealed) = self
                    .sealer(&c, &place::tenant_of(session))
                    .await?
                    .seal(t.place, session, v)?;
                c.execute(
                    &format!(
                        "INSERT INTO {table} (session, {col}, sealed) VALUES ($1, $2, $3)
                         ON CONFLICT (session) DO UPDATE SET {col} = excluded.{col}, sealed = excluded.sealed",
                        table = t.table,
                        col = t.column
                    ),
                    &[&session, &v, &i64::from(sealed)],
                )
                .await
                .map_err(|e| self.err(e))?
            }
        };
        Ok(())
    }
}

#[async_trait]
impl crate::tables::IndexStore for PgStore {
    async fn unindexed(&self) -> Result<(u64, u64), Error> {
        let r = self
            .rows(
                "SELECT COUNT(*), COALESCE(SUM(episodes), 0)::BIGINT FROM sessions WHERE indexed = 0",
                &[],
            )
            .await?;
        Ok(r.first().map_or((0, 0), |r| (g64(r, 0), g64(r, 1))))
    }

    async fn next_unindexed(&self) -> Result<Option<String>, Error> {
        let r = self
            .rows(
                "SELECT id FROM sessions WHERE indexed = 0 ORDER BY id LIMIT 1",
                &[],
            )
            .await?;
        Ok(r.first().map(|r| r.get(0)))
    }

    async fn index_episodes(
        &self,
        session: &str,
        docs: &[(u64, String)],
        done: bool,
    ) -> Result<u32, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        let added = self.index_terms_in(&tx, session, docs, false).await?;
        if done {
            tx.execute("UPDATE sessions SET indexed = 1 WHERE id = $1", &[&session])
                .await
                .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(added)
    }
}
