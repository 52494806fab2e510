//! The PostgreSQL store: every store trait on one database that several `abridge serve`
//! instances share (`--db postgres://…`). A connection pool (deadpool) of tokio-postgres
//! clients; versioned migrations run at start under an advisory lock; the rules that must
//! hold across instances are enforced inside transactions:
//!
//! - the summary chain: writers of one session serialize on its `sessions` row
//!   (`SELECT … FOR UPDATE`) before they read the chain and check the write;
//! - clusters, events and data keys: per-tenant transaction-scoped advisory locks before the
//!   next id is read;
//! - jobs: a claim locks the job row with `FOR UPDATE SKIP LOCKED` (a row another instance is
//!   claiming is busy, not waited for) and the session's and tenant's running jobs under
//!   advisory locks, so one session never runs twice and a tenant's cap holds across
//!   instances; one active job per idempotency key is a partial unique index.

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use super::Store;
use crate::keyring::{Stored, place};
use crate::types::{
    CachedAnswer, Calibration, Compaction, Episode, Error, FailureMarker, LedgerEntry, NewEpisode,
    Role, SessionStats, SummaryRow, SummaryWrite,
};
use deadpool_postgres::GenericClient;

mod ann;
mod recall;
mod tables;

/// Schema versions, in order; `abridge_schema.version` records how many have run.
const MIGRATIONS: &[&str] = &[
    include_str!("001-schema.sql"),
    include_str!("002-usage-days.sql"),
    include_str!("003-summaries-session.sql"),
    include_str!("004-sealed-session-text.sql"),
    include_str!("005-session-labels.sql"),
    include_str!("006-scale-indexes.sql"),
    include_str!("007-episode-running-tokens.sql"),
    include_str!("008-episode-running-bytes.sql"),
    include_str!("009-jobs-tenant.sql"),
    include_str!("010-sessions-tenant.sql"),
    include_str!("011-summary-coverage.sql"),
    include_str!("012-session-grams.sql"),
    include_str!("013-episode-terms.sql"),
    include_str!("014-episode-items.sql"),
];

/// Tables of the abridge schema (and the version table): a schema holding any other table
/// belongs to another program and is refused rather than migrated.
const OWN_TABLES: &[&str] = &[
    "abridge_schema",
    "sessions",
    "episodes",
    "summaries",
    "calibration",
    "partials",
    "jobs",
    "sources",
    "failure_markers",
    "watched_files",
    "source_marks",
    "session_modes",
    "session_focus",
    "session_pins",
    "session_labels",
    "session_grams",
    "episode_terms",
    "search_totals",
    "tokens",
    "events",
    "clusters",
    "memories",
    "cluster_summaries",
    "data_keys",
    "usage",
    "usage_days",
    "model_slots",
];

/// The advisory lock every opener takes while it migrates.
const MIGRATION_LOCK: i64 = 0x0061_6272_6964_6765;

/// Parameters of a statement.
pub(super) type P<'a> = &'a (dyn ToSql + Sync);

/// Whether a `--db` value names a PostgreSQL database.
pub fn is_url(db: &str) -> bool {
    super::is_postgres_url(db)
}

/// `db` as shown in messages and logs: a file's path, or a URL without its password.
pub fn shown(db: &std::path::Path) -> String {
    let text = db.to_string_lossy();
    if !is_url(&text) {
        return db.display().to_string();
    }
    match text.parse::<tokio_postgres::Config>() {
        Ok(c) => redacted(&c),
        Err(_) => "an unreadable postgres:// URL".into(),
    }
}

/// A PostgreSQL-backed store (every trait of [`super::AppStore`]).
pub struct PgStore {
    pool: Pool,
    /// The database as named in messages: the URL without its password.
    name: String,
    config: tokio_postgres::Config,
    /// The master key, when memory and summary text is sealed at rest.
    pub(super) keys: Option<super::keyring::Keyring>,
    /// Whether vectors are sealed too (see `with_sealed_vectors`).
    pub(super) seal_vectors: bool,
    /// Whether recall asks pgvector's index (the server has the extension).
    ann: bool,
    /// The vector indexes made so far.
    ann_indexes: ann::Indexes,
}

/// A PostgreSQL error as a storage error naming the database (and the fix, where known).
pub(super) fn pg_err(name: &str, e: &tokio_postgres::Error) -> Error {
    let detail = match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            let mut m = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(s) = src {
                m.push_str(&format!(": {s}"));
                src = s.source();
            }
            m
        }
    };
    let remedy = if e.is_closed() || detail.contains("connect") || detail.contains("refused") {
        " — is the server running and reachable? check the host and port in --db/ABRIDGE_DB"
    } else if detail.contains("password") || detail.contains("authentication") {
        " — check the user and password in --db/ABRIDGE_DB"
    } else if detail.contains("does not exist") && detail.contains("database") {
        " — create it first (createdb NAME) or fix the database name in --db/ABRIDGE_DB"
    } else {
        ""
    };
    Error::Storage(format!("database {name}: {detail}{remedy}"))
}

/// The URL without its password, for messages and logs.
fn redacted(c: &tokio_postgres::Config) -> String {
    let host = c
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(s) => s.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = c.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        c.get_user().unwrap_or(""),
        c.get_dbname().unwrap_or("")
    )
}

pub(super) fn g64(r: &Row, i: usize) -> u64 {
    r.get::<_, i64>(i).max(0) as u64
}

pub(super) fn g32(r: &Row, i: usize) -> u32 {
    r.get::<_, i64>(i).clamp(0, u32::MAX as i64) as u32
}

pub(super) fn gopt(r: &Row, i: usize) -> Option<u64> {
    r.get::<_, Option<i64>>(i).map(|x| x.max(0) as u64)
}

/// The key of a transaction-scoped advisory lock on `what` (`hashtextextended`).
pub(super) const LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))";

impl PgStore {
    /// Connect to the database at `url` (a `postgres://` URL), check that it is abridge's (or
    /// empty) and bring its schema up to date.
    pub async fn connect(url: &str) -> Result<PgStore, Error> {
        let config: tokio_postgres::Config = url.parse().map_err(|e| {
            Error::InvalidInput(format!(
                "--db/ABRIDGE_DB is not a PostgreSQL URL ({e}); write postgres://USER:PASSWORD@HOST:PORT/DATABASE"
            ))
        })?;
        let name = redacted(&config);
        let mgr = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(16)
            .build()
            .map_err(|e| Error::Storage(format!("database {name}: {e}")))?;
        let store = PgStore {
            pool,
            name,
            config,
            keys: None,
            seal_vectors: false,
            ann: false,
            ann_indexes: Default::default(),
        };
        let mut store = store;
        store.ann = store.migrate().await?;
        Ok(store)
    }

    /// Seal memory and cluster summary text at rest (see [`super::SqliteStore::with_master_key`]).
    pub fn with_master_key(mut self, master: crate::crypto::Secret) -> Self {
        self.keys = Some(super::keyring::Keyring::new(master));
        self
    }

    /// Seal stored vectors as well (memories', cluster summaries' and cluster sums'): search
    /// then scans and opens them (pgvector's index is not used). Needs a master key.
    pub fn with_sealed_vectors(mut self) -> Self {
        self.seal_vectors = true;
        self
    }

    /// The database as named in messages (no password).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn err(&self, e: tokio_postgres::Error) -> Error {
        pg_err(&self.name, &e)
    }

    /// A pooled connection.
    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object, Error> {
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => self.err(e),
            other => Error::Storage(format!(
                "database {}: no connection ({other}) — is the server running and reachable? check --db/ABRIDGE_DB",
                self.name
            )),
        })
    }

    /// Bring the schema up to date, and turn pgvector on when the server has it; whether it
    /// is on.
    async fn migrate(&self) -> Result<bool, Error> {
        let mut c = self.client().await?;
        // Several instances may start at once: one migrates, the others wait and find the
        // work done.
        c.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(|e| self.err(e))?;
        let r = match self.migrate_locked(&mut c).await {
            Ok(()) => self.enable_ann().await,
            Err(e) => Err(e),
        };
        let _ = c
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await;
        r
    }

    async fn migrate_locked(&self, c: &mut deadpool_postgres::Object) -> Result<(), Error> {
        let tables: Vec<String> = c
            .query(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()",
                &[],
            )
            .await
            .map_err(|e| self.err(e))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let foreign: Vec<&String> = tables
            .iter()
            .filter(|t| !OWN_TABLES.contains(&t.as_str()))
            .collect();
        if !foreign.is_empty() {
            let shown: Vec<&str> = foreign.iter().take(5).map(|t| t.as_str()).collect();
            return Err(Error::Storage(format!(
                "{} is not an abridge database (its schema holds other tables: {}{}); abridge leaves it untouched — create a database of its own (createdb abridge) and point --db/ABRIDGE_DB at it",
                self.name,
                shown.join(", "),
                if foreign.len() > 5 { ", …" } else { "" }
            )));
        }
        c.batch_execute("CREATE TABLE IF NOT EXISTS abridge_schema (version BIGINT NOT NULL)")
            .await
            .map_err(|e| self.err(e))?;
        loop {
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            let version = tx
                .query_opt("SELECT version FROM abridge_schema", &[])
                .await
                .map_err(|e| self.err(e))?
                .map_or(0, |r| r.get::<_, i64>(0)) as usize;
            if version > MIGRATIONS.len() {
                return Err(Error::Storage(format!(
                    "{} was written by a newer abridge (schema {version}, this build knows {}); upgrade abridge",
                    self.name,
                    MIGRATIONS.len()
                )));
            }
            let Some(sql) = MIGRATIONS.get(version) else {
                return Ok(());
            };
            tx.batch_execute(sql).await.map_err(|e| self.err(e))?;
            tx.execute("DELETE FROM abridge_schema", &[])
                .await
                .map_err(|e| self.err(e))?;
            tx.execute(
                "INSERT INTO abridge_schema (version) VALUES ($1)",
                &[&((version + 1) as i64)],
            )
            .await
            .map_err(|e| self.err(e))?;
            tx.commit().await.map_err(|e| self.err(e))?;
        }
    }

    /// Run `sql` with `params` (helpers for single statements).
    pub(super) async fn exec(&self, sql: &str, params: &[P<'_>]) -> Result<u64, Error> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql).await.map_err(|e| self.err(e))?;
        c.execute(&st, params).await.map_err(|e| self.err(e))
    }

    pub(super) async fn rows(&self, sql: &str, params: &[P<'_>]) -> Result<Vec<Row>, Error> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql).await.map_err(|e| self.err(e))?;
        c.query(&st, params).await.map_err(|e| self.err(e))
    }

    pub(super) async fn row(&self, sql: &str, params: &[P<'_>]) -> Result<Option<Row>, Error> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql).await.map_err(|e| self.err(e))?;
        c.query_opt(&st, params).await.map_err(|e| self.err(e))
    }

    /// Empty every table (tests: one server, a fresh store per test).
    pub async fn truncate_all(&self) -> Result<(), Error> {
        let c = self.client().await?;
        let list: Vec<&str> = OWN_TABLES
            .iter()
            .copied()
            .filter(|t| *t != "abridge_schema")
            .collect();
        c.batch_execute(&format!("TRUNCATE {} RESTART IDENTITY", list.join(", ")))
            .await
            .map_err(|e| self.err(e))
    }
}

const ROW_COLS: &str = "id, first_episode, last_episode, content, tokens, prompt_tokens, output_tokens, model, created_ms, updated_ms, skipped, level, compacted_into, ledger, ledger_dropped, sealed";

/// A summary row as read: its prose and ledger still as stored (see [`PgStore::opened`]).
struct RawRow {
    row: SummaryRow,
    content: Vec<u8>,
    ledger: Vec<u8>,
    sealed: u32,
}

fn row_from(r: &Row) -> RawRow {
    RawRow {
        row: SummaryRow {
            id: g64(r, 0),
            first_episode: g64(r, 1),
            last_episode: g64(r, 2),
            content: String::new(),
            tokens: g32(r, 4),
            prompt_tokens: g32(r, 5),
            output_tokens: g32(r, 6),
            model: r.get(7),
            created_ms: g64(r, 8),
            updated_ms: g64(r, 9),
            skipped: super::skipped_from_json(&r.get::<_, String>(10)),
            level: g32(r, 11),
            compacted_into: gopt(r, 12),
            ledger: Vec::new(),
            ledger_dropped: g32(r, 14),
        },
        content: r.get(3),
        ledger: r.get(13),
        sealed: g32(r, 15),
    }
}

fn role_from(s: &str) -> Role {
    Role::parse(s).unwrap_or(Role::User)
}

type Tx<'a> = deadpool_postgres::Transaction<'a>;

impl PgStore {
    /// A summary row with its prose and ledger opened.
    async fn opened<C: GenericClient + Sync>(
        &self,
        c: &C,
        session: &str,
        raw: RawRow,
    ) -> Result<SummaryRow, Error> {
        let tenant = place::tenant_of(session);
        let name = place::summary(session, raw.row.level, raw.row.first_episode);
        let mut row = raw.row;
        let stored = |bytes| Stored {
            bytes,
            sealed: raw.sealed,
        };
        row.content = self
            .reveal(c, &tenant, place::SUMMARY, &name, stored(raw.content))
            .await?;
        let ledger = self
            .reveal(c, &tenant, place::LEDGER, &name, stored(raw.ledger))
            .await?;
        row.ledger = super::ledger_from_json(&ledger);
        Ok(row)
    }

    /// Summary rows read by `sql` (one parameter: the session), opened.
    /// Episodes with `id > after`, ascending, at most `limit`, revealed.
    /// The items stored with episodes `ids` of `session`, opened (those stored without one
    /// are absent).
    async fn read_items<C: GenericClient + Sync>(
        &self,
        c: &C,
        session: &str,
        ids: &[u64],
    ) -> Result<std::collections::BTreeMap<u64, String>, Error> {
        let wanted: Vec<i64> = ids.iter().map(|&i| i.min(i64::MAX as u64) as i64).collect();
        let rows = c
            .query(
                "SELECT id, item, sealed FROM episodes WHERE session = $1 AND id = ANY($2) AND item IS NOT NULL",
                &[&session, &wanted],
            )
            .await
            .map_err(|e| self.err(e))?;
        let tenant = place::tenant_of(session);
        let mut out = std::collections::BTreeMap::new();
        for r in &rows {
            let id = g64(r, 0);
            let raw = Stored {
                bytes: r.get(1),
                sealed: g32(r, 2),
            };
            let name = place::episode(session, id);
            out.insert(id, self.reveal(c, &tenant, place::ITEM, &name, raw).await?);
        }
        Ok(out)
    }

    async fn read_episodes<C: GenericClient + Sync>(
        &self,
        c: &C,
        session: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Episode>, Error> {
        let rows = c
            .query(
                "SELECT id, role, content, timestamp_ms, tokens, speaker, sealed, tokens_through FROM episodes
                 WHERE session = $1 AND id > $2 ORDER BY id LIMIT $3",
                &[
                    &session,
                    &(after.min(i64::MAX as u64) as i64),
                    &i64::from(limit),
                ],
            )
            .await
            .map_err(|e| self.err(e))?;
        let tenant = place::tenant_of(session);
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let id = g64(r, 0);
            let sealed = g32(r, 6);
            let name = place::episode(session, id);
            let content = Stored {
                bytes: r.get(2),
                sealed,
            };
            let speaker = match r.get::<_, Option<Vec<u8>>>(5) {
                Some(bytes) => Some(
                    self.reveal(c, &tenant, place::SPEAKER, &name, Stored { bytes, sealed })
                        .await?,
                ),
                None => None,
            };
            out.push(Episode {
                id,
                role: role_from(&r.get::<_, String>(1)),
                content: self
                    .reveal(c, &tenant, place::EPISODE, &name, content)
                    .await?,
                timestamp_ms: r.get(3),
                tokens: g32(r, 4),
                speaker,
                tokens_through: g64(r, 7),
            });
        }
        Ok(out)
    }

    async fn summary_rows<C: GenericClient + Sync>(
        &self,
        c: &C,
        session: &str,
        sql: &str,
    ) -> Result<Vec<SummaryRow>, Error> {
        let rows = c.query(sql, &[&session]).await.map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push(self.opened(c, session, row_from(r)).await?);
        }
        Ok(out)
    }

    async fn active_chain(&self, c: &Tx<'_>, session: &str) -> Result<Vec<SummaryRow>, Error> {
        self.summary_rows(
            c,
            session,
            &format!("SELECT {ROW_COLS} FROM summaries WHERE session = $1 AND compacted_into IS NULL ORDER BY first_episode"),
        )
        .await
    }

    async fn latest_in<C: GenericClient + Sync>(
        &self,
        c: &C,
        session: &str,
    ) -> Result<Option<SummaryRow>, Error> {
        Ok(self
            .summary_rows(
                c,
                session,
                &format!("SELECT {ROW_COLS} FROM summaries WHERE session = $1 AND compacted_into IS NULL ORDER BY last_episode DESC, id DESC LIMIT 1"),
            )
            .await?
            .pop())
    }

    /// A summary's prose and ledger as stored, and their key version.
    async fn sealed_summary(
        &self,
        c: &Tx<'_>,
        session: &str,
        (level, first): (u32, u64),
        content: &str,
        ledger: &[LedgerEntry],
    ) -> Result<(Vec<u8>, Vec<u8>, i64), Error> {
        let sealer = self.sealer(c, &place::tenant_of(session)).await?;
        let name = place::summary(session, level, first);
        let (content, v) = sealer.seal(place::SUMMARY, &name, content)?;
        let (ledger, _) = sealer.seal(place::LEDGER, &name, &super::ledger_to_json(ledger))?;
        Ok((content, ledger, i64::from(v)))
    }

    /// Lock the session's row for the rest of the transaction (writers of one session, on
    /// any instance, take turns); its episode count, or `None` when there is no session.
    async fn lock_session(&self, c: &Tx<'_>, session: &str) -> Result<Option<u64>, Error> {
        Ok(c.query_opt(
            "SELECT episodes FROM sessions WHERE id = $1 FOR UPDATE",
            &[&session],
        )
        .await
        .map_err(|e| self.err(e))?
        .map(|r| g64(&r, 0)))
    }

    async fn summary_by(&self, c: &Tx<'_>, session: &str, id: i64) -> Result<SummaryRow, Error> {
        let r = c
            .query_one(
                &format!("SELECT {ROW_COLS} FROM summaries WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(|e| self.err(e))?;
        self.opened(c, session, row_from(&r)).await
    }
}

#[async_trait]
impl Store for PgStore {
    async fn append_episodes(
        &self,
        session: &str,
        episodes: Vec<NewEpisode>,
    ) -> Result<u32, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        tx.execute(
            "INSERT INTO sessions (id, tenant, indexed) VALUES ($1, $2, 1) ON CONFLICT (id) DO NOTHING",
            &[&session, &crate::tenant::tenant_column(session)],
        )
        .await
        .map_err(|e| self.err(e))?;
        let mut next = self.lock_session(&tx, session).await?.unwrap_or(0) as i64 + 1;
        // The running token total the new episodes continue (the session row is locked).
        let mut through: i64 = tx
            .query_one(
                "SELECT total_tokens FROM sessions WHERE id = $1",
                &[&session],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        // And the running byte total.
        let mut bytes: i64 = tx
            .query_one(
                "SELECT COALESCE((SELECT bytes_through FROM episodes WHERE session = $1 ORDER BY id DESC LIMIT 1), 0)",
                &[&session],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        let ins = tx
            .prepare_cached(
                "INSERT INTO episodes (session, id, role, content, timestamp_ms, source_key, tokens, speaker, sealed, tokens_through, bytes_through, item)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT DO NOTHING",
            )
            .await
            .map_err(|e| self.err(e))?;
        let sealer = self.sealer(&tx, &place::tenant_of(session)).await?;
        let (mut added, mut tokens) = (0u32, 0i64);
        let mut docs: Vec<(u64, String)> = Vec::new();
        for e in &episodes {
            let name = place::episode(session, next as u64);
            let (content, sealed) = sealer.seal(place::EPISODE, &name, &e.content)?;
            let speaker = match &e.speaker {
                Some(sp) => Some(sealer.seal(place::SPEAKER, &name, sp)?.0),
                None => None,
            };
            let item = match &e.item {
                Some(it) => Some(sealer.seal(place::ITEM, &name, it)?.0),
                None => None,
            };
            let n = tx
                .execute(
                    &ins,
                    &[
                        &session,
                        &next,
                        &e.role.as_str(),
                        &content,
                        &e.timestamp_ms,
                        &e.source_key,
                        &i64::from(e.tokens),
                        &speaker,
                        &i64::from(sealed),
                        &(through + i64::from(e.tokens)),
                        &(bytes + e.content.len() as i64),
                        &item,
                    ],
                )
                .await
                .map_err(|e| self.err(e))?;
            if n == 1 {
                if !e.terms.trim().is_empty() {
                    docs.push((next as u64, e.terms.clone()));
                }
                next += 1;
                added += 1;
                tokens += i64::from(e.tokens);
                through += i64::from(e.tokens);
                bytes += e.content.len() as i64;
            }
        }
        if !docs.is_empty() {
            self.index_terms_in(&tx, session, &docs, true).await?;
        }
        if added > 0 {
            tx.execute(
                "UPDATE sessions SET episodes = episodes + $2, total_tokens = total_tokens + $3, changed_seq = nextval('sessions_changed') WHERE id = $1",
                &[&session, &i64::from(added), &tokens],
            )
            .await
            .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(added)
    }

    async fn bytes_through(
        &self,
        session: &str,
        id: u64,
    ) -> Result<Option<(u64, Option<i64>)>, Error> {
        let r = self
            .row(
                "SELECT bytes_through, timestamp_ms FROM episodes WHERE session = $1 AND id = $2",
                &[&session, &(id as i64)],
            )
            .await?;
        Ok(r.map(|r| (g64(&r, 0), r.get::<_, Option<i64>>(1))))
    }

    async fn stats(&self, session: &str) -> Result<SessionStats, Error> {
        let r = self
            .row(
                "SELECT episodes, total_tokens FROM sessions WHERE id = $1",
                &[&session],
            )
            .await?;
        let (episodes, total_tokens) = r.map_or((0, 0), |r| (g64(&r, 0), g64(&r, 1)));
        Ok(SessionStats {
            episodes,
            total_tokens,
            last_episode: episodes,
        })
    }

    async fn episodes_after(
        &self,
        session: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Episode>, Error> {
        let c = self.client().await?;
        self.read_episodes(&c, session, after, limit).await
    }

    async fn latest_summary(&self, session: &str) -> Result<Option<SummaryRow>, Error> {
        let c = self.client().await?;
        self.latest_in(&c, session).await
    }

    async fn summaries(&self, session: &str) -> Result<Vec<SummaryRow>, Error> {
        let c = self.client().await?;
        self.summary_rows(
            &c,
            session,
            &format!("SELECT {ROW_COLS} FROM summaries WHERE session = $1 AND compacted_into IS NULL ORDER BY first_episode"),
        )
        .await
    }

    async fn summary_history(&self, session: &str) -> Result<Vec<SummaryRow>, Error> {
        let c = self.client().await?;
        self.summary_rows(
            &c,
            session,
            &format!("SELECT {ROW_COLS} FROM summaries WHERE session = $1 ORDER BY first_episode, level DESC, id"),
        )
        .await
    }

    async fn write_summary(&self, session: &str, w: SummaryWrite) -> Result<SummaryRow, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        // The session's row lock makes the check and the write one step for every writer.
        let episodes = self
            .lock_session(&tx, session)
            .await?
            .ok_or_else(|| Error::InvalidInput(format!("no session '{session}' in the store")))?;
        let prev = self.latest_in(&tx, session).await?;
        let target = match w.replaces {
            Some(id) => tx
                .query_opt(
                    "SELECT first_episode, last_episode, level FROM summaries WHERE id = $1 AND session = $2 AND compacted_into IS NULL",
                    &[&(id as i64), &session],
                )
                .await
                .map_err(|e| self.err(e))?
                .map(|r| {
                    (
                        r.get::<_, i64>(0) as u64,
                        r.get::<_, i64>(1) as u64,
                        r.get::<_, i64>(2) as u32,
                    )
                }),
            None => None,
        };
        crate::rules::check_chain(
            session,
            episodes,
            prev.as_ref(),
            target.map(|(a, b, _)| (a, b)),
            &w,
        )?;
        // A new row is keyed by its session, an update by the row it replaces; the values
        // are the same (an update keeps its first episode: the chain check said so).
        let replaces = w.replaces.map(|id| id as i64);
        let (first, last, now) = (
            w.first_episode as i64,
            w.last_episode as i64,
            w.now_ms as i64,
        );
        // The row keeps its level and first episode (the chain check said so): its name.
        let level = target.map_or(0, |(_, _, level)| level);
        let (content, ledger, sealed) = self
            .sealed_summary(
                &tx,
                session,
                (level, w.first_episode),
                &w.content,
                &w.ledger,
            )
            .await?;
        let skipped = super::skipped_to_json(&w.skipped);
        let counts = [w.tokens, w.prompt_tokens, w.output_tokens, w.ledger_dropped].map(i64::from);
        let key: P<'_> = match &replaces {
            None => &session,
            Some(id) => id,
        };
        let sql = match replaces {
            None => "INSERT INTO summaries (session, first_episode, last_episode, content, tokens, prompt_tokens, output_tokens, model, created_ms, updated_ms, skipped, ledger, ledger_dropped, sealed)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, $11, $12, $13) RETURNING id",
            Some(_) => "UPDATE summaries SET first_episode = $2, last_episode = $3, content = $4, tokens = $5, prompt_tokens = $6, output_tokens = $7, model = $8, updated_ms = $9, skipped = $10, ledger = $11, ledger_dropped = $12, sealed = $13 WHERE id = $1 RETURNING id",
        };
        let id: i64 = tx
            .query_one(
                sql,
                &[
                    key, &first, &last, &content, &counts[0], &counts[1], &counts[2], &w.model,
                    &now, &skipped, &ledger, &counts[3], &sealed,
                ],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        let row = self.summary_by(&tx, session, id).await?;
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(row)
    }

    async fn compact_summaries(&self, session: &str, cp: Compaction) -> Result<SummaryRow, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        self.lock_session(&tx, session).await?;
        let active = self.active_chain(&tx, session).await?;
        let (first, last, level) = crate::rules::check_compaction(session, &active, &cp)?;
        let (content, ledger, sealed) = self
            .sealed_summary(&tx, session, (level, first), &cp.content, &cp.ledger)
            .await?;
        let id: i64 = tx
            .query_one(
                "INSERT INTO summaries (session, first_episode, last_episode, content, tokens, prompt_tokens, output_tokens, model, created_ms, updated_ms, skipped, level, ledger, ledger_dropped, sealed)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, $11, $12, $13, $14) RETURNING id",
                &[
                    &session,
                    &(first as i64),
                    &(last as i64),
                    &content,
                    &i64::from(cp.tokens),
                    &i64::from(cp.prompt_tokens),
                    &i64::from(cp.output_tokens),
                    &cp.model,
                    &(cp.now_ms as i64),
                    &super::skipped_to_json(&cp.skipped),
                    &i64::from(level),
                    &ledger,
                    &i64::from(cp.ledger_dropped),
                    &sealed,
                ],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        for r in &cp.rows {
            tx.execute(
                "UPDATE summaries SET compacted_into = $2 WHERE id = $1 AND session = $3",
                &[&(*r as i64), &id, &session],
            )
            .await
            .map_err(|e| self.err(e))?;
        }
        let row = self.summary_by(&tx, session, id).await?;
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(row)
    }

    async fn sessions(&self) -> Result<Vec<String>, Error> {
        Ok(self
            .rows("SELECT id FROM sessions ORDER BY changed_seq DESC, id", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn failure(&self, session: &str) -> Result<Option<FailureMarker>, Error> {
        Ok(self
            .row(
                "SELECT failures, last_error, retry_after_ms, failed_ms FROM failure_markers WHERE session = $1",
                &[&session],
            )
            .await?
            .map(|r| FailureMarker {
                failures: g32(&r, 0),
                last_error: r.get(1),
                retry_after_ms: g64(&r, 2),
                failed_ms: g64(&r, 3),
            }))
    }

    async fn set_failure(&self, session: &str, marker: Option<FailureMarker>) -> Result<(), Error> {
        match marker {
            None => {
                self.exec(
                    "DELETE FROM failure_markers WHERE session = $1",
                    &[&session],
                )
                .await?
            }
            Some(m) => {
                self.exec(
                    "INSERT INTO failure_markers (session, failures, last_error, retry_after_ms, failed_ms) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (session) DO UPDATE SET failures = excluded.failures, last_error = excluded.last_error, retry_after_ms = excluded.retry_after_ms, failed_ms = excluded.failed_ms",
                    &[
                        &session,
                        &i64::from(m.failures),
                        &m.last_error,
                        &(m.retry_after_ms as i64),
                        &(m.failed_ms as i64),
                    ],
                )
                .await?
            }
        };
        Ok(())
    }

    async fn reset_session(&self, session: &str) -> Result<(), Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        // The session's writers are waited for (and wait) on its row.
        self.lock_session(&tx, session).await?;
        for step in crate::rules::RESET_CASCADE {
            let sql = crate::rules::reset_sql(*step, crate::rules::Dialect::Postgres);
            tx.execute(&sql, &[&session])
                .await
                .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))
    }

    async fn pop_episode(&self, session: &str) -> Result<Option<crate::Popped>, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        // The session's writers are waited for (and wait) on its row.
        let last = self.lock_session(&tx, session).await?.unwrap_or(0);
        if last == 0 {
            return Ok(None);
        }
        let episode = self
            .read_episodes(&tx, session, last - 1, 1)
            .await?
            .pop()
            .ok_or_else(|| {
                Error::Storage(format!(
                    "session '{session}' counts {last} episodes but episode {last} is not stored"
                ))
            })?;
        let item = self.read_items(&tx, session, &[last]).await?.remove(&last);
        let history = self
            .summary_rows(
                &tx,
                session,
                &format!("SELECT {ROW_COLS} FROM summaries WHERE session = $1"),
            )
            .await?;
        let plan = crate::rules::pop_plan(&history, last);
        let ids = |v: &[u64]| v.iter().map(|x| *x as i64).collect::<Vec<i64>>();
        tx.execute(
            "DELETE FROM summaries WHERE session = $1 AND id = ANY($2)",
            &[&session, &ids(&plan.drop)],
        )
        .await
        .map_err(|e| self.err(e))?;
        tx.execute(
            "UPDATE summaries SET compacted_into = NULL WHERE session = $1 AND id = ANY($2)",
            &[&session, &ids(&plan.reopen)],
        )
        .await
        .map_err(|e| self.err(e))?;
        let last_arg = last as i64;
        tx.execute(
            "DELETE FROM episodes WHERE session = $1 AND id = $2",
            &[&session, &last_arg],
        )
        .await
        .map_err(|e| self.err(e))?;
        tx.execute(
            "UPDATE sessions SET episodes = episodes - 1, total_tokens = total_tokens - $2, changed_seq = nextval('sessions_changed') WHERE id = $1",
            &[&session, &i64::from(episode.tokens)],
        )
        .await
        .map_err(|e| self.err(e))?;
        for step in crate::rules::POP_CASCADE {
            let (sql, binds) = crate::rules::pop_sql(*step, crate::rules::Dialect::Postgres);
            if binds {
                tx.execute(&sql, &[&session, &last_arg]).await
            } else {
                tx.execute(&sql, &[&session]).await
            }
            .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(Some(crate::Popped {
            episode,
            item,
            dropped: plan.drop,
            reopened: plan.reopen,
        }))
    }

    async fn items(
        &self,
        session: &str,
        ids: &[u64],
    ) -> Result<std::collections::BTreeMap<u64, String>, Error> {
        let c = self.client().await?;
        self.read_items(&c, session, ids).await
    }

    async fn partial(&self, key: &str) -> Result<Option<CachedAnswer>, Error> {
        let c = self.client().await?;
        let Some(r) = c
            .query_opt(
                "SELECT text, prompt_tokens, output_tokens, sealed FROM partials WHERE key = $1",
                &[&key],
            )
            .await
            .map_err(|e| self.err(e))?
        else {
            return Ok(None);
        };
        let text = Stored {
            bytes: r.get(0),
            sealed: g32(&r, 3),
        };
        Ok(Some(CachedAnswer {
            text: self
                .reveal(&c, &place::tenant_of(key), place::PARTIAL, key, text)
                .await?,
            prompt_tokens: g32(&r, 1),
            output_tokens: g32(&r, 2),
        }))
    }

    async fn put_partial(&self, key: &str, a: &CachedAnswer) -> Result<(), Error> {
        let c = self.client().await?;
        let (text, sealed) =
            self.sealer(&c, &place::tenant_of(key))
                .await?
                .seal(place::PARTIAL, key, &a.text)?;
        c.execute(
            "INSERT INTO partials (key, text, prompt_tokens, output_tokens, sealed) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (key) DO UPDATE SET text = excluded.text, prompt_tokens = excluded.prompt_tokens, output_tokens = excluded.output_tokens, sealed = excluded.sealed",
            &[
                &key,
                &text,
                &i64::from(a.prompt_tokens),
                &i64::from(a.output_tokens),
                &i64::from(sealed),
            ],
        )
        .await
        .map(drop)
        .map_err(|e| self.err(e))
    }

    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, Error> {
        Ok(self
            .row(
                "SELECT estimated, reported FROM calibration WHERE model = $1",
                &[&model],
            )
            .await?
            .map(|r| Calibration {
                estimated: g64(&r, 0),
                reported: g64(&r, 1),
            }))
    }

    async fn search_episodes(
        &self,
        tenant: Option<&str>,
        session: Option<&str>,
        terms: &[String],
        limit: u32,
    ) -> Result<crate::types::TermMatches, Error> {
        let column = crate::terms::scope_column(tenant, session);
        let c = self.client().await?;
        self.search_terms_in(&c, &column, session, terms, limit)
            .await
    }

    async fn record_calibration(
        &self,
        model: &str,
        estimated: u32,
        reported: u32,
    ) -> Result<(), Error> {
        self.exec(
            "INSERT INTO calibration (model, estimated, reported) VALUES ($1, $2, $3)
             ON CONFLICT (model) DO UPDATE SET estimated = calibration.estimated + excluded.estimated, reported = calibration.reported + excluded.reported",
            &[&model, &i64::from(estimated), &i64::from(reported)],
        )
        .await
        .map(drop)
    }
}
