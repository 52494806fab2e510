//! Sealing text at rest in the SQLite store: per-tenant data keys (table `data_keys`, wrapped
//! by the master key), unwrapped once and kept in memory while the store is open.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use crate::crypto::{self, Place, Secret};
use crate::types::Error;

/// The master key and the data keys unwrapped so far.
pub struct Keyring {
    master: Secret,
    cache: Mutex<BTreeMap<(String, u32), Arc<Secret>>>,
}

/// When a key was made (bookkeeping only).
pub(super) fn now_ms() -> u64 {
    use crate::clock::Clock;
    crate::clock::SystemClock.now_ms()
}

fn db_err(e: rusqlite::Error) -> Error {
    Error::Storage(e.to_string())
}

fn wrong_key(tenant: &str, version: u32) -> Error {
    Error::Storage(format!(
        "the master key does not open tenant '{tenant}''s data key (version {version}): ABRIDGE_MASTER_KEY_FILE or ABRIDGE_MASTER_KEY is not the key this database was written with"
    ))
}

impl Keyring {
    /// A keyring for `master`.
    pub fn new(master: Secret) -> Keyring {
        Keyring {
            master,
            cache: Mutex::new(BTreeMap::new()),
        }
    }

    fn key(&self, c: &Connection, tenant: &str, version: u32) -> Result<Arc<Secret>, Error> {
        if let Some(k) = self.cached(tenant, version) {
            return Ok(k);
        }
        let wrapped: Option<Vec<u8>> = c
            .query_row(
                "SELECT wrapped FROM data_keys WHERE tenant = ?1 AND version = ?2",
                params![tenant, version],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_err)?;
        self.admit(tenant, version, wrapped)
    }

    /// A data key already unwrapped.
    pub(super) fn cached(&self, tenant: &str, version: u32) -> Option<Arc<Secret>> {
        self.cache
            .lock()
            .expect("keyring lock")
            .get(&(tenant.to_string(), version))
            .cloned()
    }

    /// Unwrap a stored data key (`None`: there is no such row) and keep it.
    pub(super) fn admit(
        &self,
        tenant: &str,
        version: u32,
        wrapped: Option<Vec<u8>>,
    ) -> Result<Arc<Secret>, Error> {
        let wrapped = wrapped.ok_or_else(|| {
            Error::Storage(format!(
                "tenant '{tenant}''s data key version {version} is gone (the tenant was deleted): its sealed text cannot be read"
            ))
        })?;
        let k = Arc::new(
            crypto::unwrap(&self.master, tenant, version, &wrapped)
                .map_err(|_| wrong_key(tenant, version))?,
        );
        self.cache
            .lock()
            .expect("keyring lock")
            .insert((tenant.to_string(), version), k.clone());
        Ok(k)
    }

    /// A new random data key for `tenant`, wrapped by the master key (to be stored).
    pub(super) fn new_wrapped(&self, tenant: &str, version: u32) -> Result<Vec<u8>, Error> {
        new_wrapped_under(&self.master, tenant, version)
    }

    /// A stored data key wrapped again under `new`.
    pub(super) fn rewrapped(
        &self,
        new: &Secret,
        tenant: &str,
        version: u32,
        wrapped: &[u8],
    ) -> Result<Vec<u8>, Error> {
        crypto::rewrap(&self.master, new, tenant, version, wrapped)
            .map_err(|_| wrong_key(tenant, version))
    }

    /// Forget every unwrapped key (after a rotation).
    pub(super) fn forget(&self) {
        self.cache.lock().expect("keyring lock").clear();
    }

    /// The tenant's newest data key, made (and stored wrapped) on first use.
    fn current(&self, c: &Connection, tenant: &str) -> Result<(u32, Arc<Secret>), Error> {
        let v: Option<u32> = c
            .query_row(
                "SELECT MAX(version) FROM data_keys WHERE tenant = ?1",
                [tenant],
                |r| r.get(0),
            )
            .map_err(db_err)?;
        if let Some(v) = v {
            return Ok((v, self.key(c, tenant, v)?));
        }
        let wrapped = self.new_wrapped(tenant, 1)?;
        c.execute(
            "INSERT OR IGNORE INTO data_keys (tenant, version, wrapped, created_ms) VALUES (?1, 1, ?2, ?3)",
            params![tenant, wrapped, now_ms() as i64],
        )
        .map_err(db_err)?;
        // Another writer may have made it first: read back what is stored.
        Ok((1, self.key(c, tenant, 1)?))
    }

    /// Seal `text` for a row: the bytes to store and the key version (never 0).
    pub fn seal(
        &self,
        c: &Connection,
        tenant: &str,
        table: &str,
        row: &str,
        text: &str,
    ) -> Result<(Vec<u8>, u32), Error> {
        let (v, k) = self.current(c, tenant)?;
        Ok((seal_under(&k, v, tenant, table, row, text)?, v))
    }

    /// Open a sealed row's text.
    pub fn open(
        &self,
        c: &Connection,
        tenant: &str,
        table: &str,
        row: &str,
        sealed: &[u8],
        version: u32,
    ) -> Result<String, Error> {
        let k = self.key(c, tenant, version)?;
        open_under(&k, version, tenant, table, row, sealed)
    }

    /// Re-wrap every data key under `new` (the rows stay as they are) and start a new data key
    /// version per tenant, so text written from now on is sealed under a fresh key; returns
    /// the tenants.
    pub fn rotate(&self, c: &mut Connection, new: &Secret) -> Result<usize, Error> {
        let tx = c.transaction().map_err(db_err)?;
        let rows: Vec<(String, u32, Vec<u8>)> = {
            let mut st = tx
                .prepare("SELECT tenant, version, wrapped FROM data_keys")
                .map_err(db_err)?;
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .map_err(db_err)?
                .collect::<Result<_, _>>()
                .map_err(db_err)?
        };
        let mut newest: BTreeMap<String, u32> = BTreeMap::new();
        for (tenant, version, wrapped) in &rows {
            let re = self.rewrapped(new, tenant, *version, wrapped)?;
            tx.execute(
                "UPDATE data_keys SET wrapped = ?3 WHERE tenant = ?1 AND version = ?2",
                params![tenant, version, re],
            )
            .map_err(db_err)?;
            let e = newest.entry(tenant.clone()).or_default();
            *e = (*e).max(*version);
        }
        for (tenant, v) in &newest {
            let w = new_wrapped_under(new, tenant, v + 1)?;
            tx.execute(
                "INSERT INTO data_keys (tenant, version, wrapped, created_ms) VALUES (?1, ?2, ?3, ?4)",
                params![tenant, v + 1, w, now_ms() as i64],
            )
            .map_err(db_err)?;
        }
        tx.commit().map_err(db_err)?;
        self.forget();
        Ok(newest.len())
    }
}

/// A new random data key wrapped by `master`.
pub(super) fn new_wrapped_under(
    master: &Secret,
    tenant: &str,
    version: u32,
) -> Result<Vec<u8>, Error> {
    let k = Secret::random().map_err(|e| Error::Storage(e.to_string()))?;
    crypto::wrap(master, tenant, version, &k).map_err(|e| Error::Storage(e.to_string()))
}

/// Seal `text` of a row under data key `k` (version `v`).
pub(super) fn seal_under(
    k: &Secret,
    v: u32,
    tenant: &str,
    table: &str,
    row: &str,
    text: &str,
) -> Result<Vec<u8>, Error> {
    let place = Place {
        tenant,
        table,
        row,
        key_version: v,
    };
    crypto::seal(k, &place, text.as_bytes()).map_err(|e| Error::Storage(e.to_string()))
}

/// Open a row's sealed text under data key `k` (version `v`).
pub(super) fn open_under(
    k: &Secret,
    v: u32,
    tenant: &str,
    table: &str,
    row: &str,
    sealed: &[u8],
) -> Result<String, Error> {
    let place = Place {
        tenant,
        table,
        row,
        key_version: v,
    };
    let b = crypto::open(k, &place, sealed).map_err(|e| {
        Error::Storage(format!(
            "{table} row '{row}' of tenant '{tenant}' does not decrypt ({e}); the database was altered"
        ))
    })?;
    String::from_utf8(b).map_err(|_| Error::Storage(format!("{table} row '{row}' is not UTF-8")))
}
