//! Encryption at rest: XChaCha20-Poly1305 (RustCrypto) with per-tenant data keys wrapped by a
//! master key.
//!
//! - A sealed value is `1 | nonce (24 bytes) | ciphertext and tag`. The nonce is random (192
//!   bits, so random nonces never realistically repeat under one key).
//! - Its associated data binds it to where it belongs: tenant, table, row and the version of
//!   the data key. A ciphertext copied to another tenant, table or row, or presented as another
//!   key version, does not open.
//! - A tenant's data key is random and is stored only wrapped: sealed under the master key
//!   with associated data naming the tenant and the key's version. Rotating the master key
//!   re-wraps the data keys (the data stays as it is); deleting a tenant's wrapped keys makes
//!   its data unreadable.
//! - Keys are never printed: their `Debug` says `[redacted]`, and they are wiped from memory
//!   when dropped.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};

/// The format byte of a sealed value.
const FORMAT: u8 = 1;
const NONCE: usize = 24;
const TAG: usize = 16;

/// Bytes a sealed value adds to its text (format, nonce, tag): SQLite migration 27 and
/// PostgreSQL 8 count a sealed episode's text bytes with it.
pub const SEALED_OVERHEAD: usize = 1 + NONCE + TAG;

/// Why something could not be sealed or opened, or a key not loaded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CryptoError {
    /// The value does not open with this key and associated data: tampered with, moved to
    /// another row, tenant or table, or sealed under another key.
    #[error("a sealed value does not open: it was altered, moved, or sealed under another key")]
    Unopenable,
    /// Not a sealed value of a known format.
    #[error("not a sealed value (unknown format or too short)")]
    Malformed,
    /// A key that is not 32 bytes written as 64 hexadecimal digits.
    #[error("{0}")]
    BadKey(String),
    /// No random numbers.
    #[error("no random numbers: {0}")]
    Random(String),
}

/// 32 secret bytes, wiped when dropped and never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub(crate) [u8; 32]);

impl Secret {
    /// 32 random bytes.
    pub fn random() -> Result<Secret, CryptoError> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| CryptoError::Random(e.to_string()))?;
        Ok(Secret(b))
    }

    /// The key as 64 hexadecimal digits (to write a new key to a file; never logged).
    pub fn to_hex(&self) -> String {
        crate::text::hex(&self.0)
    }

    /// A key written as 64 hexadecimal digits (surrounding whitespace ignored), as kept in
    /// `ABRIDGE_MASTER_KEY_FILE` or `ABRIDGE_MASTER_KEY`.
    pub fn from_hex(text: &str) -> Result<Secret, CryptoError> {
        let t = text.trim();
        let bad = || {
            CryptoError::BadKey(
                "a key is 32 bytes written as 64 hexadecimal digits; make one with 'openssl rand -hex 32'"
                    .into(),
            )
        };
        if t.len() != 64 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut b = [0u8; 32];
        for (i, pair) in t.as_bytes().chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).map_err(|_| bad())?;
            b[i] = u8::from_str_radix(s, 16).map_err(|_| bad())?;
        }
        Ok(Secret(b))
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(Key::from_slice(&self.0))
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// Where a sealed value belongs: what its associated data binds it to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place<'a> {
    /// The tenant's name.
    pub tenant: &'a str,
    /// The table (`memories`, `summaries`, …).
    pub table: &'a str,
    /// The row's id.
    pub row: &'a str,
    /// The version of the tenant's data key it is sealed under.
    pub key_version: u32,
}

impl Place<'_> {
    /// The associated data: each part length-prefixed, so no two places share it.
    fn aad(&self) -> Vec<u8> {
        let mut out = b"abridge-sealed-v1".to_vec();
        for part in [self.tenant, self.table, self.row] {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(part.as_bytes());
        }
        out.extend_from_slice(&self.key_version.to_be_bytes());
        out
    }
}

fn seal_with(key: &Secret, aad: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, CryptoError> {
    let mut nonce = [0u8; NONCE];
    getrandom::fill(&mut nonce).map_err(|e| CryptoError::Random(e.to_string()))?;
    let body = key
        .cipher()
        .encrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: plaintext,
                aad,
            },
        )
        .map_err(|_| CryptoError::Unopenable)?;
    let mut out = Vec::with_capacity(1 + NONCE + body.len());
    out.push(FORMAT);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&body);
    Ok(out)
}

fn open_with(key: &Secret, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
    if sealed.len() < 1 + NONCE + TAG || sealed[0] != FORMAT {
        return Err(CryptoError::Malformed);
    }
    key.cipher()
        .decrypt(
            XNonce::from_slice(&sealed[1..1 + NONCE]),
            Payload {
                msg: &sealed[1 + NONCE..],
                aad,
            },
        )
        .map_err(|_| CryptoError::Unopenable)
}

/// Seal `plaintext` under a tenant's data key for `place`.
pub fn seal(
    data_key: &Secret,
    place: &Place<'_>,
    plaintext: &[u8],
) -> Result<Vec<u8>, CryptoError> {
    seal_with(data_key, &place.aad(), plaintext)
}

/// Open what [`seal`] made for the same `place`.
pub fn open(data_key: &Secret, place: &Place<'_>, sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
    open_with(data_key, &place.aad(), sealed)
}

fn wrap_aad(tenant: &str, version: u32) -> Vec<u8> {
    let mut out = b"abridge-data-key-v1".to_vec();
    out.extend_from_slice(&(tenant.len() as u32).to_be_bytes());
    out.extend_from_slice(tenant.as_bytes());
    out.extend_from_slice(&version.to_be_bytes());
    out
}

/// A tenant's data key sealed under the master key (what is stored).
pub fn wrap(
    master: &Secret,
    tenant: &str,
    version: u32,
    data_key: &Secret,
) -> Result<Vec<u8>, CryptoError> {
    seal_with(master, &wrap_aad(tenant, version), &data_key.0)
}

/// The data key inside what [`wrap`] made, for the same tenant and version.
pub fn unwrap(
    master: &Secret,
    tenant: &str,
    version: u32,
    wrapped: &[u8],
) -> Result<Secret, CryptoError> {
    let bytes = open_with(master, &wrap_aad(tenant, version), wrapped)?;
    let key: [u8; 32] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| CryptoError::Malformed)?;
    Ok(Secret(key))
}

/// Rotate the master key for one wrapped data key: unwrap with the old, wrap with the new.
/// The data sealed under the data key is untouched.
pub fn rewrap(
    old: &Secret,
    new: &Secret,
    tenant: &str,
    version: u32,
    wrapped: &[u8],
) -> Result<Vec<u8>, CryptoError> {
    let key = unwrap(old, tenant, version, wrapped)?;
    wrap(new, tenant, version, &key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place<'a>(tenant: &'a str, row: &'a str) -> Place<'a> {
        Place {
            tenant,
            table: "memories",
            row,
            key_version: 1,
        }
    }

    #[test]
    fn sealed_values_open_only_where_they_belong() {
        let key = Secret::random().unwrap();
        let here = place("acme", "m1");
        let sealed = seal(&key, &here, b"Alice prefers the dark theme").unwrap();
        assert!(
            !sealed.windows(5).any(|w| w == b"Alice"),
            "no plaintext in the sealed value"
        );
        assert_eq!(
            open(&key, &here, &sealed).unwrap(),
            b"Alice prefers the dark theme"
        );
        // Moved to another tenant, row, table or key version: it does not open.
        for other in [
            place("globex", "m1"),
            place("acme", "m2"),
            Place {
                table: "summaries",
                ..here
            },
            Place {
                key_version: 2,
                ..here
            },
        ] {
            assert_eq!(open(&key, &other, &sealed), Err(CryptoError::Unopenable));
        }
        // Another key, or one flipped bit anywhere.
        let other_key = Secret::random().unwrap();
        assert_eq!(
            open(&other_key, &here, &sealed),
            Err(CryptoError::Unopenable)
        );
        for i in 1..sealed.len() {
            let mut t = sealed.clone();
            t[i] ^= 0x01;
            assert_eq!(
                open(&key, &here, &t),
                Err(CryptoError::Unopenable),
                "bit at {i}"
            );
        }
        assert_eq!(
            open(&key, &here, &sealed[..20]),
            Err(CryptoError::Malformed)
        );
        // A sealed value is its text plus a fixed overhead (the migrations rely on it).
        assert_eq!(
            seal(&key, &here, b"twelve bytes").unwrap().len(),
            12 + SEALED_OVERHEAD
        );
        assert_eq!(SEALED_OVERHEAD, 41);
        // The same text sealed twice differs (random nonces).
        assert_ne!(
            seal(&key, &here, b"x").unwrap(),
            seal(&key, &here, b"x").unwrap()
        );
    }

    #[test]
    fn data_keys_are_wrapped_per_tenant_and_rotation_rewraps_them() {
        let master = Secret::random().unwrap();
        let data = Secret::random().unwrap();
        let wrapped = wrap(&master, "acme", 1, &data).unwrap();
        assert_eq!(unwrap(&master, "acme", 1, &wrapped).unwrap(), data);
        assert!(unwrap(&master, "globex", 1, &wrapped).is_err());
        assert!(unwrap(&master, "acme", 2, &wrapped).is_err());
        let sealed = seal(&data, &place("acme", "m1"), b"fact").unwrap();
        let new_master = Secret::random().unwrap();
        let rewrapped = rewrap(&master, &new_master, "acme", 1, &wrapped).unwrap();
        assert!(unwrap(&master, "acme", 1, &rewrapped).is_err());
        let again = unwrap(&new_master, "acme", 1, &rewrapped).unwrap();
        assert_eq!(
            open(&again, &place("acme", "m1"), &sealed).unwrap(),
            b"fact"
        );
    }

    #[test]
    fn keys_parse_from_hex_and_are_never_printed() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
        let k = Secret::from_hex(&format!("  {hex}\n")).unwrap();
        assert_eq!(k.0[1], 0x11);
        assert_eq!(format!("{k:?}"), "Secret([redacted])");
        let signed = format!("+f{}", &hex[2..]);
        for bad in [
            "",
            "00",
            &hex[..63],
            &format!("{}zz", &hex[..62]),
            &"é".repeat(32),
            &signed,
        ] {
            assert!(
                matches!(Secret::from_hex(bad), Err(CryptoError::BadKey(_))),
                "{bad}"
            );
        }
    }
}
