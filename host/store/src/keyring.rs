//! Sealing text at rest: per-tenant data keys (table `data_keys`, wrapped by the master key),
//! unwrapped once and kept in memory while the store is open, and the sealing of one row's
//! text under one of them. Each SQL store reads and writes the `data_keys` rows its own way
//! (`sqlite_keys.rs`, `pg/recall.rs`); the keys and the sealing are the same for both.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::crypto::{self, Place, Secret};
use crate::types::Error;

/// A row's text as stored: its bytes and the version of the data key that sealed them (0:
/// plain, written without a master key).
pub(crate) struct Stored {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// The data key version; 0 when plain.
    pub sealed: u32,
}

/// What reading a stored text back needs (see [`reveal`]).
pub(crate) enum Revealed<'k> {
    /// It was plain: here it is.
    Text(String),
    /// It is sealed: open `bytes` with the tenant's data key `version` from `keys`.
    Sealed {
        /// The store's keyring (PostgreSQL's fetches its data keys through its own pool).
        #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
        keys: &'k Keyring,
        /// The sealed bytes.
        bytes: Vec<u8>,
        /// The data key version.
        version: u32,
    },
}

/// The sealing rule on the way out, the same for every store: plain text comes back as it
/// is (invalid UTF-8 replaced, never refused); sealed text needs the store's keyring, and
/// without a master key it is refused with how to fix that. (On the way in a store seals
/// under the tenant's current data key exactly when it has a keyring.)
pub(crate) fn reveal<'k>(
    keys: Option<&'k Keyring>,
    table: &str,
    row: &str,
    s: Stored,
) -> Result<Revealed<'k>, Error> {
    if s.sealed == 0 {
        return Ok(Revealed::Text(crate::recall::text_in(s.bytes)));
    }
    match keys {
        Some(keys) => Ok(Revealed::Sealed {
            keys,
            bytes: s.bytes,
            version: s.sealed,
        }),
        None => Err(Error::Storage(format!(
            "{table} row '{row}' is encrypted and no master key is set: set ABRIDGE_MASTER_KEY_FILE (or ABRIDGE_MASTER_KEY) to the key it was written with"
        ))),
    }
}

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

pub(super) fn wrong_key(tenant: &str, version: u32) -> Error {
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

/// What every sealed column is called in a row's associated data, and how its rows are named:
/// one list for the SQLite and PostgreSQL stores (and `js/src/sealing.js`, which names them the
/// same), so a value sealed by one store opens in the other. A session's rows are sealed under
/// the data key of the tenant whose view wrote them.
pub(crate) mod place {
    /// Episode text: table `episodes`, row `KEY#ID`.
    pub const EPISODE: &str = "episodes";
    /// An episode's speaker: table `episodes.speaker`, row `KEY#ID`.
    pub const SPEAKER: &str = "episodes.speaker";
    /// The client's item stored with an episode (JSON): table `episodes.item`, row `KEY#ID`.
    pub const ITEM: &str = "episodes.item";
    /// Summary prose: table `summaries`, row `KEY#LEVEL:FIRST` (a row grows in place, so its
    /// last episode is not part of its name; a level and a first episode name one row).
    pub const SUMMARY: &str = "summaries";
    /// A summary's ledger (JSON): table `summaries.ledger`, the summary's row name.
    pub const LEDGER: &str = "summaries.ledger";
    /// A cached partial answer: table `partials`, row its (tenant-scoped) key.
    pub const PARTIAL: &str = "partials";
    /// An event's data (JSON): table `events`, row its id.
    pub const EVENT: &str = "events";
    /// A session's focus text: table `session_focus`, row the session key.
    pub const FOCUS: &str = "session_focus";
    /// A session's display names (JSON `{"title", "project"}`): table `session_labels`, row
    /// the session key.
    pub const LABEL: &str = "session_labels";
    /// A memory's text: table `memories`, row its id.
    pub const MEMORY: &str = "memories";
    /// A cluster summary's text: table `cluster_summaries`, row its id.
    pub const CLUSTER_SUMMARY: &str = "cluster_summaries";

    /// The row name of episode `id` of the session stored as `key`.
    pub fn episode(key: &str, id: u64) -> String {
        format!("{key}#{id}")
    }

    /// The row name of a summary of the session stored as `key`.
    pub fn summary(key: &str, level: u32, first_episode: u64) -> String {
        format!("{key}#{level}:{first_episode}")
    }
}

/// One tenant's current data key, fetched once for a batch of rows (or none: no master key,
/// the text is stored plain).
pub(crate) struct Sealer {
    tenant: String,
    key: Option<(u32, Arc<Secret>)>,
}

impl Sealer {
    /// A sealer for `tenant` with its current data key `key` (version, key), if any.
    pub(crate) fn new(tenant: &str, key: Option<(u32, Arc<Secret>)>) -> Sealer {
        Sealer {
            tenant: tenant.to_string(),
            key,
        }
    }

    /// `text` of row `row` of `table` as stored: its bytes and the key version (0: plain).
    pub(crate) fn seal(&self, table: &str, row: &str, text: &str) -> Result<(Vec<u8>, u32), Error> {
        match &self.key {
            None => Ok((text.as_bytes().to_vec(), 0)),
            Some((v, k)) => Ok((seal_under(k, *v, &self.tenant, table, row, text)?, *v)),
        }
    }
}

/// The lexical embedding key of a tenant whose first data key is `k`: SHA-256 over a label and
/// the key, so the data key itself never leaves the store. `js/src/sealing.js` derives the same.
pub(crate) fn lexical_key_of(k: &Secret) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::new()
        .chain_update(b"abridge lexical embedding key v1\0")
        .chain_update(k.0)
        .finalize()
        .to_vec()
}

/// A tenant's data keys for its vectors in one call, fetched before the rows are read (so a
/// row's vector opens where it is read): sealing with the newest, opening with any. With
/// vector sealing off (or no master key), vectors are stored and read as plain `f32` bytes.
///
/// A sealed vector is the key version (4 bytes, little-endian) then the sealed `f32` bytes
/// (format byte, nonce, ciphertext, tag): its length is 1 more than a multiple of 4, so it
/// is told from a plain vector (a multiple of 4) by its length alone.
#[derive(Clone)]
pub(crate) struct VectorKeys {
    tenant: String,
    /// Seal with this (version, key); `None`: store plain.
    seal_with: Option<(u32, Arc<Secret>)>,
    /// Every data key of the tenant, to open.
    open_with: BTreeMap<u32, Arc<Secret>>,
}

impl VectorKeys {
    /// Keys for `tenant`: `all` its data keys, sealing with the newest when `seal` holds.
    pub(crate) fn new(tenant: &str, all: BTreeMap<u32, Arc<Secret>>, seal: bool) -> VectorKeys {
        let newest = all.iter().next_back().map(|(v, k)| (*v, k.clone()));
        VectorKeys {
            tenant: tenant.to_string(),
            seal_with: if seal { newest } else { None },
            open_with: all,
        }
    }

    /// No keys: plain vectors only.
    pub(crate) fn plain(tenant: &str) -> VectorKeys {
        VectorKeys::new(tenant, BTreeMap::new(), false)
    }

    /// `v` as stored in `table` (`memories.vector`, …) for `row`: plain, or the data key's
    /// version and the sealed bytes.
    pub(crate) fn seal(&self, table: &str, row: &str, v: &[f32]) -> Result<Vec<u8>, Error> {
        let (sealed, version) = self.seal_bytes(table, row, crate::recall::vector_bytes(v))?;
        if version == 0 {
            return Ok(sealed);
        }
        let mut out = version.to_le_bytes().to_vec();
        out.extend(sealed);
        Ok(out)
    }

    /// `bytes` as stored in `table` for `row`: sealed with the newest data key when vectors
    /// are sealed, with that key's version (0: plain).
    pub(crate) fn seal_bytes(
        &self,
        table: &str,
        row: &str,
        bytes: Vec<u8>,
    ) -> Result<(Vec<u8>, u32), Error> {
        let Some((version, k)) = &self.seal_with else {
            return Ok((bytes, 0));
        };
        let place = Place {
            tenant: &self.tenant,
            table,
            row,
            key_version: *version,
        };
        let sealed = crypto::seal(k, &place, &bytes).map_err(|e| Error::Storage(e.to_string()))?;
        Ok((sealed, *version))
    }

    /// Bytes [`seal_bytes`](Self::seal_bytes) stored, back (`version` 0: plain).
    pub(crate) fn open_bytes(
        &self,
        table: &str,
        row: &str,
        version: u32,
        bytes: &[u8],
    ) -> Result<Vec<u8>, Error> {
        if version == 0 {
            return Ok(bytes.to_vec());
        }
        let k = self.open_with.get(&version).ok_or_else(|| {
            Error::Storage(format!(
                "{table} row '{row}' is encrypted and its key (version {version}) is not at hand: set ABRIDGE_MASTER_KEY_FILE (or ABRIDGE_MASTER_KEY) to the key it was written with"
            ))
        })?;
        let place = Place {
            tenant: &self.tenant,
            table,
            row,
            key_version: version,
        };
        crypto::open(k, &place, bytes).map_err(|e| {
            Error::Storage(format!(
                "{table} row '{row}' of tenant '{}' does not decrypt ({e}); the database was altered",
                self.tenant
            ))
        })
    }

    /// A stored vector back, sealed or plain.
    pub(crate) fn open(&self, table: &str, row: &str, b: &[u8]) -> Result<Vec<f32>, Error> {
        if b.len() % 4 != 1 || b.len() < 5 {
            return Ok(crate::recall::vector_from(b));
        }
        let version = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let plain = self.open_bytes(table, row, version, &b[4..])?;
        Ok(crate::recall::vector_from(&plain))
    }
}

/// What a database seals at rest: text under per-tenant data keys wrapped by the master key
/// (none: nothing is sealed), and vectors too when `vectors` is set.
#[derive(Default)]
pub(crate) struct Sealing {
    /// The master key's keyring.
    pub keys: Option<Keyring>,
    /// Whether vectors are sealed too.
    pub vectors: bool,
}
