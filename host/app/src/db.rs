//! The database as a front end names it: a SQLite file or a PostgreSQL URL. Front ends open,
//! show and re-key it through here, never through the store crate.

use std::path::Path;
use std::sync::Arc;

use abridge_store::AppStore;

use crate::crypto::Secret;
use crate::types::Error;

/// Whether `db` names a PostgreSQL database (a `postgres://` or `postgresql://` URL).
pub fn is_url(db: &str) -> bool {
    abridge_store::is_postgres_url(db)
}

/// `db` as shown in messages: a PostgreSQL URL without its password, a path as it is.
pub fn shown(db: &Path) -> String {
    abridge_store::shown(db)
}

/// Whether SQLite files opened from now on in this process are read through a memory map (see
/// [`abridge_store::sqlite_memory_map`]): on for a long-lived server, off for a one-shot
/// command.
pub fn memory_map(on: bool) {
    abridge_store::sqlite_memory_map(on);
}

/// Open `db` (see [`abridge_store::open_store`]).
pub(crate) fn open(db: &Path, master: Option<&Secret>) -> Result<Arc<dyn AppStore>, Error> {
    abridge_store::open_store(db, master, false)
}

/// Rotate the master key of `db` from `current` to `new`; returns the tenants rotated.
pub async fn rotate_master_key(db: &Path, current: Secret, new: &Secret) -> Result<usize, Error> {
    abridge_store::rotate_master_key(db, current, new).await
}

/// A SQLite store in memory, gone with the process: for an engine that only parses or plans
/// (a dry run stores a transcript's episodes to plan them) and keeps nothing; an engine's
/// store or an app's.
pub(crate) fn in_memory() -> Result<Arc<abridge_store::SqliteStore>, Error> {
    Ok(Arc::new(abridge_store::SqliteStore::in_memory()?))
}

/// The imported-file records of `db` when it exists (a PostgreSQL URL always does), for a dry
/// run that must not create a database.
pub(crate) fn sources_if_present(
    db: &Path,
) -> Result<Option<Arc<dyn abridge_store::SourceStore>>, Error> {
    if db.exists() || is_url(&db.to_string_lossy()) {
        let store: Arc<dyn abridge_store::SourceStore> = open(db, None)?;
        Ok(Some(store))
    } else {
        Ok(None)
    }
}
