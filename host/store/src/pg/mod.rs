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

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use crate::types::Error;
use deadpool_postgres::GenericClient;

mod ann;
mod recall;
mod tables;

/// Schema versions, the numbered `.sql` files of this folder in order (listed by `build.rs`);
/// `abridge_schema.version` records how many have run.
const MIGRATIONS: &[&str] = include!(concat!(env!("OUT_DIR"), "/pg_migrations.rs"));

/// The tables only PostgreSQL keeps (see [`crate::rules::refuse_foreign`]): the version table
/// and the model slots.
const OWN_TABLES: &[&str] = &["abridge_schema", "model_slots"];

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

/// The PostgreSQL store (every trait of [`super::AppStore`], written once over its
/// transactions, [`crate::once`]).
pub type PgStore = crate::once::Sql<PgDb>;

impl PgStore {
    /// Connect to the database at `url` (see [`PgDb::connect`]).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        PgDb::connect(url).await.map(crate::once::Sql::new)
    }
}

/// A PostgreSQL database: its pool, keys and index state (what [`PgStore`] runs on).
pub struct PgDb {
    pool: Pool,
    /// The database as named in messages: the URL without its password.
    name: String,
    config: tokio_postgres::Config,
    /// The master key and whether vectors are sealed too (see [`crate::Sql::with_master_key`]).
    pub(crate) sealing: super::keyring::Sealing,
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

/// The key of a transaction-scoped advisory lock on `what` (`hashtextextended`).
pub(super) const LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))";

impl PgDb {
    /// Connect to the database at `url` (a `postgres://` URL), check that it is abridge's (or
    /// empty) and bring its schema up to date.
    pub async fn connect(url: &str) -> Result<PgDb, Error> {
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
        let store = PgDb {
            pool,
            name,
            config,
            sealing: crate::keyring::Sealing::default(),
            ann: false,
            ann_indexes: Default::default(),
        };
        let mut store = store;
        store.ann = store.migrate().await?;
        Ok(store)
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
        crate::count_call();
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
        crate::rules::refuse_foreign(&tables, OWN_TABLES).map_err(|(shown, more)| {
            Error::Storage(format!(
                "{} is not an abridge database (its schema holds other tables: {shown}{more}); abridge leaves it untouched — create a database of its own (createdb abridge) and point --db/ABRIDGE_DB at it",
                self.name
            ))
        })?;
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

    /// Empty every table (tests: one server, a fresh store per test).
    pub async fn truncate_all(&self) -> Result<(), Error> {
        let c = self.client().await?;
        let list: Vec<&str> = crate::rules::TABLES
            .iter()
            .chain(OWN_TABLES)
            .copied()
            .filter(|t| *t != "abridge_schema")
            .collect();
        c.batch_execute(&format!("TRUNCATE {} RESTART IDENTITY", list.join(", ")))
            .await
            .map_err(|e| self.err(e))
    }
}
