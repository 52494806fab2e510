//! abridge's storage: every store trait's implementations (SQLite, in a file or in memory, and
//! PostgreSQL),
//! the records they keep (jobs, sources, marks, modes, tokens, events), tenancy, sealing, and
//! the rules every store enforces. The traits the engine's imports need ([`Store`],
//! [`RecallStore`]) are the engine's and re-exported here.
#![deny(missing_docs)]
// Without either SQL store the helpers they share (stored formats, the keyring) go unused.
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

use std::sync::Arc;

use abridge_engine::{clock, control, text, types};

use crate::types::{EpisodeRange, Error, IdentifierKind, LedgerEntry};

pub mod ann;
pub mod crypto;
pub mod jobs;
pub(crate) mod keyring;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod once;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod recall;
pub mod rules;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod search;
pub mod sources;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "sqlite")]
mod sqlite_keys;
#[cfg(feature = "sqlite")]
mod sqlite_recall;
pub mod tables;
pub mod tenant;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod terms;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod writes;

pub use abridge_engine::store::{ClusterRow, RecallStore, Store, Unsettled, UsageDay};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use once::Sql;
#[cfg(feature = "sqlite")]
pub use sqlite::memory_map as sqlite_memory_map;

/// Store calls this process made: transactions and single statements on a database (each
/// opens a connection's turn or a pooled connection). What `/metrics` reports as
/// `abridge_store_calls_total`, and the scale bench divides by requests.
pub fn store_calls() -> u64 {
    STORE_CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) static STORE_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Count one store call ([`store_calls`]).
pub(crate) fn count_call() {
    STORE_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}
#[cfg(feature = "postgres")]
pub use pg::{PgDb, PgStore};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteDb, SqliteStore};
pub use tables::{
    AppStore, EventRow, EventStore, IndexStore, JobStore, Popped, SessionRows, SlotStore,
    SourceStore, TenantCap, TokenRow, TokenStore,
};

/// Skipped ranges as stored: JSON `[[first, last], ...]` (the same in every store).
pub(crate) fn skipped_to_json(ranges: &[EpisodeRange]) -> String {
    serde_json::to_string(&ranges.iter().map(|r| [r.first, r.last]).collect::<Vec<_>>())
        .expect("ranges serialize")
}

/// Stored skipped ranges (see [`skipped_to_json`]); unreadable text reads as empty.
pub(crate) fn skipped_from_json(text: &str) -> Vec<EpisodeRange> {
    serde_json::from_str::<Vec<[u64; 2]>>(text)
        .unwrap_or_default()
        .into_iter()
        .map(|[first, last]| EpisodeRange { first, last })
        .collect()
}

/// The kind an identifier-kind name stands for (`path`, `url`, …).
pub fn kind_of(name: &str) -> IdentifierKind {
    match name {
        "path" => IdentifierKind::Path,
        "url" => IdentifierKind::Url,
        "command" => IdentifierKind::Command,
        "number" => IdentifierKind::Number,
        "version" => IdentifierKind::Version,
        "date" => IdentifierKind::Date,
        "email" => IdentifierKind::Email,
        "ticket" => IdentifierKind::Ticket,
        "request" => IdentifierKind::Request,
        "created" => IdentifierKind::Created,
        "edited" => IdentifierKind::Edited,
        "read" => IdentifierKind::Read,
        "ran" => IdentifierKind::Ran,
        "failed" => IdentifierKind::Failed,
        "todo" => IdentifierKind::Todo,
        "fact" => IdentifierKind::Fact,
        "name" => IdentifierKind::Name,
        _ => IdentifierKind::Code,
    }
}

/// A ledger as stored: JSON `[{"t": text, "k": kind, "e": episode, "c": count}, ...]` (the
/// same in every store and in the JS host).
pub fn ledger_to_json(entries: &[LedgerEntry]) -> String {
    serde_json::to_string(
        &entries
            .iter()
            .map(|e| serde_json::json!({"t": e.text, "k": e.kind.as_str(), "e": e.episode, "c": e.count}))
            .collect::<Vec<_>>(),
    )
    .expect("a ledger serializes")
}

/// A stored ledger (see [`ledger_to_json`]); unreadable text reads as empty.
pub fn ledger_from_json(text: &str) -> Vec<LedgerEntry> {
    serde_json::from_str::<Vec<serde_json::Value>>(text)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| {
            Some(LedgerEntry {
                text: v["t"].as_str()?.to_string(),
                kind: kind_of(v["k"].as_str().unwrap_or("code")),
                episode: v["e"].as_u64().unwrap_or(0),
                count: v["c"].as_u64().unwrap_or(1) as u32,
            })
        })
        .collect()
}

/// Whether `db` names a PostgreSQL database (`postgres://` or `postgresql://`) rather than a
/// SQLite file.
pub fn is_postgres_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// `db` as shown in messages and logs: a file's path, or a URL without its password.
pub fn shown(db: &std::path::Path) -> String {
    let text = db.to_string_lossy();
    if !is_postgres_url(&text) {
        return db.display().to_string();
    }
    #[cfg(feature = "postgres")]
    return pg::shown(db);
    #[cfg(not(feature = "postgres"))]
    return "a postgres:// URL".into();
}

/// The refusal for a store this build left out.
#[allow(dead_code)]
fn left_out(feature: &str, what: &str) -> Error {
    Error::InvalidInput(format!(
        "{what} needs abridge-store's '{feature}' feature, which this build leaves out; build with it (it is on by default)"
    ))
}

/// Open `db`: a PostgreSQL URL connects (from inside a multi-threaded tokio runtime, as the
/// binary runs), anything else is a SQLite file.
pub fn open_store(
    db: &std::path::Path,
    master: Option<&crate::crypto::Secret>,
    seal_vectors: bool,
) -> Result<Arc<dyn AppStore>, Error> {
    let text = db.to_string_lossy();
    if seal_vectors && master.is_none() {
        return Err(Error::InvalidInput(
            "sealing vectors needs a master key: set ABRIDGE_MASTER_KEY_FILE (make one with 'abridge keys new'), or leave ABRIDGE_SEAL_VECTORS unset".into(),
        ));
    }
    if is_postgres_url(&text) {
        open_postgres(&text, master, seal_vectors)
    } else {
        open_sqlite(db, master, seal_vectors)
    }
}

#[cfg(feature = "postgres")]
fn open_postgres(
    url: &str,
    master: Option<&crate::crypto::Secret>,
    seal_vectors: bool,
) -> Result<Arc<dyn AppStore>, Error> {
    let handle = tokio::runtime::Handle::try_current()
        .ok()
        .filter(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
        .ok_or_else(|| {
            Error::Storage(
                "a PostgreSQL store is opened from inside a multi-threaded tokio runtime".into(),
            )
        })?;
    let url = url.to_string();
    let store = tokio::task::block_in_place(move || handle.block_on(pg::PgStore::connect(&url)))?;
    let store = match master {
        Some(k) => store.with_master_key(k.clone()),
        None => store,
    };
    let store = if seal_vectors {
        store.with_sealed_vectors()
    } else {
        store
    };
    Ok(Arc::new(store))
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(
    _url: &str,
    _master: Option<&crate::crypto::Secret>,
    _seal_vectors: bool,
) -> Result<Arc<dyn AppStore>, Error> {
    Err(left_out("postgres", "a PostgreSQL database"))
}

#[cfg(feature = "sqlite")]
fn open_sqlite(
    db: &std::path::Path,
    master: Option<&crate::crypto::Secret>,
    seal_vectors: bool,
) -> Result<Arc<dyn AppStore>, Error> {
    let mut s = SqliteStore::open(db)?;
    if let Some(k) = master {
        s = s.with_master_key(k.clone());
    }
    if seal_vectors {
        s = s.with_sealed_vectors();
    }
    Ok(Arc::new(s))
}

#[cfg(not(feature = "sqlite"))]
fn open_sqlite(
    _db: &std::path::Path,
    _master: Option<&crate::crypto::Secret>,
    _seal_vectors: bool,
) -> Result<Arc<dyn AppStore>, Error> {
    Err(left_out("sqlite", "a SQLite database file"))
}

/// Rotate the master key of the database `db` (a SQLite file or a PostgreSQL URL) from
/// `current` to `new`. Returns the tenants rotated.
pub async fn rotate_master_key(
    db: &std::path::Path,
    current: crate::crypto::Secret,
    new: &crate::crypto::Secret,
) -> Result<usize, Error> {
    let text = db.to_string_lossy();
    if is_postgres_url(&text) {
        #[cfg(feature = "postgres")]
        return pg::PgStore::connect(&text)
            .await?
            .with_master_key(current)
            .rotate_master_key(new)
            .await;
        #[cfg(not(feature = "postgres"))]
        return Err(left_out("postgres", "a PostgreSQL database"));
    }
    #[cfg(feature = "sqlite")]
    return SqliteStore::open(db)?
        .with_master_key(current)
        .rotate_master_key(new);
    #[cfg(not(feature = "sqlite"))]
    {
        let _ = (current, new);
        Err(left_out("sqlite", "a SQLite database file"))
    }
}
