//! The SQLite store's side of the keyring: its data keys in the `data_keys` table, and
//! sealing or opening a row's text with them (see [`crate::keyring`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, params};

use crate::crypto::Secret;
use crate::keyring::{Keyring, Revealed, Sealer, Stored, new_wrapped_under, now_ms, open_under};
use crate::sqlite::SqliteDb;
use crate::types::Error;

impl SqliteDb {
    /// The bytes and key version to store `text` under (sealed when a master key is set).
    pub(crate) fn seal(
        &self,
        c: &Connection,
        tenant: &str,
        table: &str,
        row: &str,
        text: &str,
    ) -> Result<(Vec<u8>, u32), Error> {
        self.sealer(c, tenant)?.seal(table, row, text)
    }

    /// `tenant`'s current data key (made on first use) for sealing a batch of rows; plain
    /// without a master key.
    pub(crate) fn sealer(&self, c: &Connection, tenant: &str) -> Result<Sealer, Error> {
        Ok(Sealer::new(
            tenant,
            match &self.sealing.keys {
                Some(k) => Some(k.current(c, tenant)?),
                None => None,
            },
        ))
    }

    /// A row's text back.
    pub(crate) fn reveal(
        &self,
        c: &Connection,
        tenant: &str,
        table: &str,
        row: &str,
        s: Stored,
    ) -> Result<String, Error> {
        match crate::keyring::reveal(self.sealing.keys.as_ref(), table, row, s)? {
            Revealed::Text(t) => Ok(t),
            Revealed::Sealed {
                keys,
                bytes,
                version,
            } => keys.open(c, tenant, table, row, &bytes, version),
        }
    }
}

fn db_err(e: rusqlite::Error) -> Error {
    Error::Storage(e.to_string())
}

impl Keyring {
    pub(crate) fn key(
        &self,
        c: &Connection,
        tenant: &str,
        version: u32,
    ) -> Result<Arc<Secret>, Error> {
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
    /// The tenant's newest data key, made (and stored wrapped) on first use.
    pub(crate) fn current(
        &self,
        c: &Connection,
        tenant: &str,
    ) -> Result<(u32, Arc<Secret>), Error> {
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
