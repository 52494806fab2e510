// Encryption at rest for the JavaScript host, byte for byte the Rust host's (host/store/src/crypto.rs
// and host/store/src/keyring.rs): XChaCha20-Poly1305 (HChaCha20 subkey, then node:crypto's
// ChaCha20-Poly1305), a sealed value `1 | nonce (24) | ciphertext | tag (16)`, associated data
// binding tenant, table, row and key version, and per-tenant data keys in `data_keys` wrapped by
// the master key. A database sealed by either host opens in the other with the same key.
import { createHash, createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';

import { AbridgeError } from './errors.js';

const FORMAT = 1;
const NONCE = 24;
const TAG = 16;

const rotl = (v, n) => ((v << n) | (v >>> (32 - n))) >>> 0;

function quarter(s, a, b, c, d) {
  s[a] = (s[a] + s[b]) >>> 0; s[d] = rotl(s[d] ^ s[a], 16);
  s[c] = (s[c] + s[d]) >>> 0; s[b] = rotl(s[b] ^ s[c], 12);
  s[a] = (s[a] + s[b]) >>> 0; s[d] = rotl(s[d] ^ s[a], 8);
  s[c] = (s[c] + s[d]) >>> 0; s[b] = rotl(s[b] ^ s[c], 7);
}

/** HChaCha20: a 32-byte subkey from a key and the first 16 bytes of an XChaCha nonce. */
export function hchacha20(key, nonce16) {
  const s = new Uint32Array(16);
  s.set([0x61707865, 0x3320646e, 0x79622d32, 0x6b206574]);
  const kv = new DataView(key.buffer, key.byteOffset, 32);
  for (let i = 0; i < 8; i++) s[4 + i] = kv.getUint32(i * 4, true);
  const nv = new DataView(nonce16.buffer, nonce16.byteOffset, 16);
  for (let i = 0; i < 4; i++) s[12 + i] = nv.getUint32(i * 4, true);
  for (let i = 0; i < 10; i++) {
    quarter(s, 0, 4, 8, 12); quarter(s, 1, 5, 9, 13); quarter(s, 2, 6, 10, 14); quarter(s, 3, 7, 11, 15);
    quarter(s, 0, 5, 10, 15); quarter(s, 1, 6, 11, 12); quarter(s, 2, 7, 8, 13); quarter(s, 3, 4, 9, 14);
  }
  const out = Buffer.alloc(32);
  [0, 1, 2, 3, 12, 13, 14, 15].forEach((w, i) => out.writeUInt32LE(s[w], i * 4));
  return out;
}

function inner(nonce) {
  const n = Buffer.alloc(12);
  Buffer.from(nonce.subarray(16, 24)).copy(n, 4);
  return n;
}

function sealWith(key, aad, plaintext) {
  const nonce = randomBytes(NONCE);
  const c = createCipheriv('chacha20-poly1305', hchacha20(key, nonce.subarray(0, 16)), inner(nonce), { authTagLength: TAG });
  c.setAAD(aad, { plaintextLength: plaintext.length });
  const body = Buffer.concat([c.update(plaintext), c.final(), c.getAuthTag()]);
  return Buffer.concat([Buffer.from([FORMAT]), nonce, body]);
}

function openWith(key, aad, sealed) {
  const b = Buffer.from(sealed);
  if (b.length < 1 + NONCE + TAG || b[0] !== FORMAT) throw new Error('not a sealed value');
  const nonce = b.subarray(1, 1 + NONCE);
  const body = b.subarray(1 + NONCE, b.length - TAG);
  const d = createDecipheriv('chacha20-poly1305', hchacha20(key, nonce.subarray(0, 16)), inner(nonce), { authTagLength: TAG });
  d.setAAD(aad, { plaintextLength: body.length });
  d.setAuthTag(b.subarray(b.length - TAG));
  return Buffer.concat([d.update(body), d.final()]);
}

const u32 = (n) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};
const part = (s) => {
  const b = Buffer.from(s, 'utf8');
  return Buffer.concat([u32(b.length), b]);
};

/** The associated data of a sealed value (the Rust host's `Place::aad`). */
export const placeAad = (tenant, table, row, version) =>
  Buffer.concat([Buffer.from('abridge-sealed-v1'), part(tenant), part(table), part(row), u32(version)]);

const wrapAad = (tenant, version) => Buffer.concat([Buffer.from('abridge-data-key-v1'), part(tenant), u32(version)]);

/** A master key from 64 hexadecimal digits. */
export function masterKeyFromHex(text) {
  const t = String(text).trim();
  if (!/^[0-9a-fA-F]{64}$/.test(t)) {
    throw new AbridgeError('invalid-input', "a key is 32 bytes written as 64 hexadecimal digits; make one with 'openssl rand -hex 32' or 'abridge keys new'");
  }
  return Buffer.from(t, 'hex');
}

/** Per-tenant data keys in a database's `data_keys` table, wrapped by the master key. */
export class Keyring {
  #db;
  #master;
  #cache = new Map();

  constructor(db, master) {
    this.#db = db;
    this.#master = master;
  }

  #key(tenant, version) {
    const k = `${tenant}\u001f${version}`;
    if (this.#cache.has(k)) return this.#cache.get(k);
    const row = this.#db.prepare('SELECT wrapped FROM data_keys WHERE tenant = ? AND version = ?').get(tenant, version);
    if (!row) throw new AbridgeError('storage', `tenant '${tenant}''s data key version ${version} is gone (the tenant was deleted): its sealed text cannot be read`);
    let key;
    try {
      key = openWith(this.#master, wrapAad(tenant, version), row.wrapped);
    } catch {
      throw new AbridgeError('storage', `the master key does not open tenant '${tenant}''s data key (version ${version}): it is not the key this database was written with`);
    }
    this.#cache.set(k, key);
    return key;
  }

  #current(tenant) {
    const r = this.#db.prepare('SELECT MAX(version) AS v FROM data_keys WHERE tenant = ?').get(tenant);
    if (r && r.v !== null) return [r.v, this.#key(tenant, r.v)];
    const key = randomBytes(32);
    this.#db.prepare('INSERT OR IGNORE INTO data_keys (tenant, version, wrapped, created_ms) VALUES (?, 1, ?, ?)').run(tenant, sealWith(this.#master, wrapAad(tenant, 1), key), Date.now());
    return [1, this.#key(tenant, 1)];
  }

  /** The key of the tenant's lexical embedding: SHA-256 over a label and its first data key
   * (the Rust store's `keyring::lexical_key_of`), so it outlives master key rotations. */
  lexicalKey(tenant) {
    const r = this.#db.prepare('SELECT MIN(version) AS v FROM data_keys WHERE tenant = ?').get(tenant);
    const key = r && r.v !== null ? this.#key(tenant, r.v) : this.#current(tenant)[1];
    return new Uint8Array(createHash('sha256').update(Buffer.from('abridge lexical embedding key v1\0')).update(key).digest());
  }

  /** A vector's `f32` bytes sealed for a row: the key version (4 bytes, little-endian), then
   * the sealed bytes (the Rust store's `VectorKeys::seal`). */
  sealVector(tenant, table, row, bytes) {
    const [v, key] = this.#current(tenant);
    const head = Buffer.alloc(4);
    head.writeUInt32LE(v, 0);
    return Buffer.concat([head, sealWith(key, placeAad(tenant, table, row, v), Buffer.from(bytes))]);
  }

  /** The `f32` bytes of a sealed vector. */
  openVector(tenant, table, row, sealed) {
    const b = Buffer.from(sealed);
    const v = b.readUInt32LE(0);
    const key = this.#key(tenant, v);
    try {
      return openWith(key, placeAad(tenant, table, row, v), b.subarray(4));
    } catch {
      throw new AbridgeError('storage', `${table} row '${row}' of tenant '${tenant}' does not decrypt; the database was altered`);
    }
  }

  /** `[bytes, version]` to store `text` in a row. */
  seal(tenant, table, row, text) {
    const [v, key] = this.#current(tenant);
    return [sealWith(key, placeAad(tenant, table, row, v), Buffer.from(text, 'utf8')), v];
  }

  /** A sealed row's text. */
  open(tenant, table, row, sealed, version) {
    const key = this.#key(tenant, version);
    try {
      return openWith(key, placeAad(tenant, table, row, version), sealed).toString('utf8');
    } catch {
      throw new AbridgeError('storage', `${table} row '${row}' of tenant '${tenant}' does not decrypt; the database was altered`);
    }
  }
}
