// Memories, clusters and cluster summaries for the JavaScript host: the same tables and rules
// as the Rust host's RecallStore (host/store/src/sqlite_recall.rs), on node:sqlite. The
// SqliteStore shares its database file (or a database in memory: `SqliteStore.open(':memory:')`).
// Every call is the local tenant's (the JavaScript host has no tenants).
import { AbridgeError } from './errors.js';
import { termsKey, termToken } from './stores.js';

const TENANT = 'local';

/** The vector columns, as named in a sealed vector's associated data (as the Rust stores). */
const VECTOR = 'memories.vector';
const SUMMARY_VECTOR = 'cluster_summaries.vector';
const SUM = 'clusters.sum';
const f32bytes = (v) => new Uint8Array(new Float32Array(v).buffer);
const f32from = (b) => {
  const u = b instanceof Uint8Array ? b : new Uint8Array(b);
  const copy = new Uint8Array(u); // aligned
  return new Float32Array(copy.buffer, 0, copy.byteLength / 4);
};
const text = (b) => (typeof b === 'string' ? b : new TextDecoder().decode(b));

const utf8 = (s) => new TextEncoder().encode(s);

/** A `seq` bound as SQL compares it (a signed 64-bit column), as rules::seq_arg does. */
const I64_MAX = 9223372036854775807n;
const seqArg = (b) => {
  const v = BigInt(b ?? 0);
  return v > I64_MAX ? I64_MAX : v;
};

/** Cosine similarity, summed in double precision (as the Rust host does). */
export function cosine(a, b) {
  if (a.length !== b.length || a.length === 0) return 0;
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    const y = b[i];
    dot += x * y;
    na += x * x;
    nb += y * y;
  }
  if (na === 0 || nb === 0) return 0;
  return Math.fround(dot / (Math.sqrt(na) * Math.sqrt(nb)));
}

const sameScope = (a, b) => a.user === b.user && a.project === b.project && a.environment === b.environment && a.kind === b.kind && a.key === b.key;

function filterSql(f, prefix) {
  let sql = '';
  const args = [];
  for (const col of ['user', 'project', 'environment', 'kind', 'key']) {
    if (f[col] !== undefined && f[col] !== null) {
      args.push(f[col]);
      sql += ` AND ${prefix}${col} = ?`;
    }
  }
  return { sql, args };
}

const memFrom = (r, body) => ({
  id: r.id,
  scope: { user: r.user, project: r.project, environment: r.environment, kind: r.kind, key: r.key },
  text: body,
  importance: r.importance,
  tokens: r.tokens,
  createdMs: r.created_ms,
  cluster: r.cluster,
  seq: r.seq,
  supersedes: r.supersedes ?? undefined,
  supersededBy: r.superseded_by ?? undefined,
  supersededMs: r.superseded_ms ?? 0,
});

const sumFrom = (r, body) => ({
  id: r.id,
  cluster: r.cluster,
  text: body,
  memberHash: r.member_hash,
  coveredSeq: r.covered_seq,
  covered: r.covered,
  importance: r.importance,
  tokens: r.tokens,
  model: r.model,
  calls: r.calls,
  promptTokens: r.prompt_tokens,
  outputTokens: r.output_tokens,
  createdMs: r.created_ms,
  updatedMs: r.updated_ms,
});

/** Keeps the `limit` most similar hits. */
function topK(limit) {
  const hits = [];
  return {
    offer(sim, make) {
      if (limit === 0) return;
      if (hits.length >= limit && sim <= hits[hits.length - 1].similarity) return;
      const h = make(sim);
      let at = hits.findIndex((x) => x.similarity < sim || (x.similarity === sim && x.id > h.id));
      if (at < 0) at = hits.length;
      hits.splice(at, 0, h);
      if (hits.length > limit) hits.pop();
    },
    hits,
  };
}

/** Copy the WAL into the file and truncate it after a delete (the Rust store's `scrub`). */
export function scrub(db) {
  try {
    db.exec('PRAGMA wal_checkpoint(TRUNCATE)');
  } catch {
    // A reader holds the WAL: the next delete, or SQLite's own checkpoints, finish it.
  }
}

export class RecallTables {
  #db;
  #tx;
  #keys;

  /**
   * Over `db` (node:sqlite); `migration` is the schema to apply to a private database;
   * `keyring` seals text at rest (see sealing.js), or `undefined` for plaintext rows.
   */
  #sealVectors = false;

  constructor(db, tx, migration, keyring, { sealVectors = false } = {}) {
    this.#db = db;
    this.#tx = tx;
    this.#keys = keyring;
    this.#sealVectors = Boolean(sealVectors && keyring);
    if (migration) db.exec(migration);
  }

  /** The secret keying this store's lexical embedding, when it seals (see sealing.js). */
  lexicalKey() {
    return this.#keys ? this.#keys.lexicalKey(TENANT) : undefined;
  }

  /** A vector as stored in `table`'s row `row`: sealed with `sealVectors`, plain otherwise. */
  #vin(table, row, v) {
    const b = f32bytes(v);
    return this.#sealVectors ? this.#keys.sealVector(TENANT, table, String(row), b) : b;
  }

  /** A stored vector back: a sealed one's length is 1 more than a multiple of 4. */
  #vout(table, row, b) {
    if (b.length % 4 !== 1) return f32from(b);
    if (!this.#keys) {
      throw new AbridgeError('storage', `${table} row '${row}' is encrypted and no master key is set: open the store with the key it was written with (SqliteStore.open(path, { masterKey }))`);
    }
    return f32from(this.#keys.openVector(TENANT, table, String(row), b));
  }

  /** Bytes and key version to store `body` in a row. */
  #seal(table, row, body) {
    return this.#keys ? this.#keys.seal(TENANT, table, String(row), body) : [utf8(body), 0];
  }

  /** A row's text back. */
  #open(table, row, r) {
    if (!r.sealed) return text(r.text);
    if (!this.#keys) {
      throw new AbridgeError('storage', `${table} row '${row}' is encrypted and no master key is set: open the store with the key it was written with (SqliteStore.open(path, { masterKey }))`);
    }
    return this.#keys.open(TENANT, table, String(row), r.text, r.sealed);
  }

  #mem(r) {
    return memFrom(r, this.#open('memories', r.id, r));
  }

  #sum(r) {
    return sumFrom(r, this.#open('cluster_summaries', r.id, r));
  }

  #all(sql, ...args) {
    return this.#db.prepare(sql).all(...args);
  }

  #get(sql, ...args) {
    return this.#db.prepare(sql).get(...args);
  }

  #run(sql, ...args) {
    return this.#db.prepare(sql).run(...args);
  }

  #bump(cluster) {
    this.#run('UPDATE clusters SET version = version + 1, changed_seq = (SELECT COALESCE(MAX(changed_seq), 0) + 1 FROM clusters) WHERE tenant = ? AND id = ?', TENANT, cluster);
  }

  centroids(s) {
    return this.#all('SELECT id, model, sum, members FROM clusters WHERE tenant = ? AND user = ? AND project = ? AND environment = ? AND kind = ? AND key = ? AND members > 0 ORDER BY id', TENANT, s.user, s.project, s.environment, s.kind, s.key).map((r) => {
      const sum = this.#vout(SUM, r.id, r.sum);
      const n = Math.max(r.members, 1);
      return { cluster: r.id, model: r.model, vector: Float32Array.from(sum, (x) => x / n), members: r.members };
    });
  }

  putMemory(m) {
    return this.#tx(() => {
      const e = this.#get('SELECT * FROM memories WHERE tenant = ? AND id = ?', TENANT, m.id);
      if (e) {
        const old = this.#mem(e);
        if (!sameScope(old.scope, m.scope) || old.text !== m.text) {
          throw new AbridgeError('invalid-input', `memory '${m.id}' already exists with another scope or text; give a new id to store a different fact`);
        }
        const c = this.#get('SELECT members FROM clusters WHERE tenant = ? AND id = ?', TENANT, old.cluster);
        return { cluster: old.cluster, created: false, members: c.members };
      }
      const s = m.scope;
      let cluster;
      let sum;
      if (m.cluster !== undefined) {
        const c = this.#get('SELECT * FROM clusters WHERE tenant = ? AND id = ?', TENANT, m.cluster);
        if (!c || c.model !== m.model || !sameScope(c, s)) {
          throw new AbridgeError('conflict', `cluster ${m.cluster} changed under the write (it is gone or holds other vectors); write again`);
        }
        cluster = m.cluster;
        sum = Float32Array.from(this.#vout(SUM, cluster, c.sum));
      } else {
        cluster = this.#get('SELECT COALESCE(MAX(id), 0) + 1 AS id FROM clusters WHERE tenant = ?', TENANT).id;
        sum = new Float32Array(m.vector.length);
        this.#run('INSERT INTO clusters (tenant, id, user, project, environment, kind, key, model, sum) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)', TENANT, cluster, s.user, s.project, s.environment, s.kind, s.key, m.model, this.#vin(SUM, cluster, sum));
      }
      if (sum.length !== m.vector.length) {
        throw new AbridgeError('invalid-input', `a vector of ${m.vector.length} values does not match cluster ${cluster}'s ${sum.length}`);
      }
      for (let i = 0; i < sum.length; i++) sum[i] += m.vector[i];
      const seq = this.#get('SELECT COALESCE(MAX(seq), 0) + 1 AS seq FROM memories WHERE tenant = ?', TENANT).seq;
      const [body, sealed] = this.#seal('memories', m.id, m.text);
      const factKey = this.#factToken(m.factKey);
      // The memory it supersedes: the one named, if still current, else the newest current
      // one of its scope with its fact key (as the Rust store's writes::superseded).
      const [cond, arg] = m.replaces != null ? ['id', m.replaces] : ['fact_key', factKey];
      const old = m.replaces != null || factKey !== ''
        ? this.#get(`SELECT id, cluster FROM memories WHERE tenant = ? AND ${cond} = ? AND user = ? AND project = ? AND environment = ? AND kind = ? AND key = ? AND id <> ? AND superseded_by IS NULL ORDER BY seq DESC LIMIT 1`, TENANT, arg, s.user, s.project, s.environment, s.kind, s.key, m.id)
        : undefined;
      this.#run('INSERT INTO memories (tenant, id, user, project, environment, kind, key, text, sealed, importance, tokens, created_ms, cluster, model, vector, seq, fact_key, supersedes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)', TENANT, m.id, s.user, s.project, s.environment, s.kind, s.key, body, sealed, m.importance, m.tokens, m.createdMs, cluster, m.model, this.#vin(VECTOR, m.id, m.vector), seq, factKey, old?.id ?? null);
      if (old) {
        this.#run('UPDATE memories SET superseded_by = ?, superseded_ms = ? WHERE tenant = ? AND id = ?', m.id, m.createdMs, TENANT, old.id);
        if (old.cluster !== cluster) this.#bump(old.cluster);
      }
      this.#run('UPDATE clusters SET sum = ?, members = members + 1 WHERE tenant = ? AND id = ?', this.#vin(SUM, cluster, sum), TENANT, cluster);
      this.#bump(cluster);
      const members = this.#get('SELECT members FROM clusters WHERE tenant = ? AND id = ?', TENANT, cluster).members;
      return { cluster, created: true, members, superseded: old?.id };
    });
  }

  getMemory(id) {
    const r = this.#get('SELECT * FROM memories WHERE tenant = ? AND id = ?', TENANT, id);
    return r ? this.#mem(r) : undefined;
  }

  /** A fact key as the store keeps it: a keyed hash under the tenant's full-text key (the
   * Rust store's `fact_token`), '' for none. */
  #factToken(factKey) {
    if (!factKey) return '';
    this.#factKey ??= termsKey(TENANT, this.#keys ? this.#keys.lexicalKey(TENANT) : undefined);
    return termToken(this.#factKey, `\0fact\0${factKey}`);
  }

  #factKey;

  /** The newest current (not superseded) memory of `scope` with `factKey`, if any. */
  currentMemory(scope, factKey) {
    if (!factKey) return undefined;
    const r = this.#get('SELECT * FROM memories WHERE tenant = ? AND fact_key = ? AND user = ? AND project = ? AND environment = ? AND kind = ? AND key = ? AND superseded_by IS NULL ORDER BY seq DESC LIMIT 1', TENANT, this.#factToken(factKey), scope.user, scope.project, scope.environment, scope.kind, scope.key);
    return r ? this.#mem(r) : undefined;
  }

  members(cluster) {
    return this.#all('SELECT * FROM memories WHERE tenant = ? AND cluster = ? ORDER BY seq', TENANT, cluster).map((r) => this.#mem(r));
  }

  /** A cluster's members with `seq > after` (oldest first), its member count and membership
   * version, in one snapshot; `after` is a BigInt (the guest's u64). */
  membersAfter(cluster, after) {
    return this.#tx(() => {
      const c = this.#get('SELECT version, members FROM clusters WHERE tenant = ? AND id = ?', TENANT, cluster);
      if (!c) return { version: 0, count: 0, members: [] };
      const rows = this.#all('SELECT * FROM memories WHERE tenant = ? AND cluster = ? AND seq > ? ORDER BY seq', TENANT, cluster, seqArg(after));
      return { version: c.version, count: c.members, members: rows.map((r) => this.#mem(r)) };
    });
  }

  /** A cluster's members by rank: importance (highest first), then oldest, then id. */
  topMembers(cluster, offset, limit) {
    return this.#all('SELECT * FROM memories WHERE tenant = ? AND cluster = ? ORDER BY importance DESC, created_ms, id LIMIT ? OFFSET ?', TENANT, cluster, limit, offset).map((r) => this.#mem(r));
  }

  /** The ids of a cluster's members with `seq <= upto` (a BigInt), oldest first. */
  memberIds(cluster, upto) {
    return this.#all('SELECT id FROM memories WHERE tenant = ? AND cluster = ? AND seq <= ? ORDER BY seq', TENANT, cluster, seqArg(upto)).map((r) => r.id);
  }

  deleteMemory(id) {
    const out = this.#tx(() => {
      const r = this.#get('SELECT * FROM memories WHERE tenant = ? AND id = ?', TENANT, id);
      if (!r) return undefined;
      this.#run('DELETE FROM memories WHERE tenant = ? AND id = ?', TENANT, id);
      // What it superseded is current again, and nothing names it any more.
      const restored = this.#all('SELECT DISTINCT cluster FROM memories WHERE tenant = ? AND superseded_by = ?', TENANT, id).map((x) => x.cluster);
      this.#run('UPDATE memories SET superseded_by = NULL, superseded_ms = 0 WHERE tenant = ? AND superseded_by = ?', TENANT, id);
      this.#run('UPDATE memories SET supersedes = NULL WHERE tenant = ? AND supersedes = ?', TENANT, id);
      for (const c of restored) if (c !== r.cluster) this.#bump(c);
      this.#markDelete();
      const c = this.#get('SELECT model, sum, members FROM clusters WHERE tenant = ? AND id = ?', TENANT, r.cluster);
      const sum = Float32Array.from(this.#vout(SUM, r.cluster, c.sum));
      const left = Math.max(c.members - 1, 0);
      if (left === 0) sum.fill(0);
      else if (c.model === r.model) {
        const v = this.#vout(VECTOR, r.id, r.vector);
        for (let i = 0; i < sum.length; i++) sum[i] -= v[i];
      }
      this.#run('UPDATE clusters SET sum = ?, members = ? WHERE tenant = ? AND id = ?', this.#vin(SUM, r.cluster, sum), left, TENANT, r.cluster);
      this.#bump(r.cluster);
      // The memory is given back; one whose text no longer opens is deleted all the same.
      try {
        return this.#mem(r);
      } catch {
        return memFrom(r, '');
      }
    });
    // Deleted means gone: the WAL's old page images leave the disk too (see stores.js).
    scrub(this.#db);
    return out;
  }

  setVectors(cluster, model, vectors) {
    this.#tx(() => {
      const dim = vectors.length ? vectors[0][1].length : 0;
      const sum = new Float32Array(dim);
      for (const [id, v] of vectors) {
        const n = this.#run('UPDATE memories SET model = ?, vector = ? WHERE tenant = ? AND id = ? AND cluster = ?', model, this.#vin(VECTOR, id, v), TENANT, id, cluster).changes;
        if (n === 1) for (let i = 0; i < dim; i++) sum[i] += v[i];
      }
      this.#run('UPDATE clusters SET model = ?, sum = ? WHERE tenant = ? AND id = ?', model, this.#vin(SUM, cluster, sum), TENANT, cluster);
      this.#bump(cluster);
      this.#markDelete();
    });
  }

  /** Count a deletion or re-embedding: a Rust process's vector index of this file rebuilds
   * when the count moves under it (host/store/src/ann.rs). */
  #markDelete() {
    this.#run('INSERT INTO memory_marks (tenant, deletes) VALUES (?, 1) ON CONFLICT (tenant) DO UPDATE SET deletes = deletes + 1', TENANT);
  }

  summary(cluster) {
    const r = this.#get('SELECT * FROM cluster_summaries WHERE tenant = ? AND cluster = ?', TENANT, cluster);
    return r ? this.#sum(r) : undefined;
  }

  writeSummary(w) {
    return this.#tx(() => {
      const cur = this.#get('SELECT id, member_hash FROM cluster_summaries WHERE tenant = ? AND cluster = ?', TENANT, w.cluster);
      // The same rule as the Rust stores (rules::summary_write_allowed): the summary it
      // replaces, and the membership version its members were read at.
      if ((cur ? cur.member_hash : undefined) !== (w.expect ?? undefined)) return false;
      const c = this.#get('SELECT version FROM clusters WHERE tenant = ? AND id = ?', TENANT, w.cluster);
      if (!c || BigInt(c.version) !== BigInt(w.version)) return false;
      const coveredSeq = seqArg(w.coveredSeq);
      if (cur) {
        const [body, sealed] = this.#seal('cluster_summaries', cur.id, w.text);
        this.#run('UPDATE cluster_summaries SET text = ?, sealed = ?, member_hash = ?, covered_seq = ?, covered = ?, importance = ?, tokens = ?, model = ?, calls = ?, prompt_tokens = ?, output_tokens = ?, vector_model = ?, vector = ?, updated_ms = ? WHERE tenant = ? AND id = ?', body, sealed, w.memberHash, coveredSeq, w.covered, w.importance, w.tokens, w.model, w.calls, w.promptTokens, w.outputTokens, w.vectorModel, this.#vin(SUMMARY_VECTOR, cur.id, w.vector), w.nowMs, TENANT, cur.id);
      } else {
        const id = this.#get('SELECT COALESCE(MAX(id), 0) + 1 AS id FROM cluster_summaries WHERE tenant = ?', TENANT).id;
        const [body, sealed] = this.#seal('cluster_summaries', id, w.text);
        this.#run('INSERT INTO cluster_summaries (tenant, id, cluster, text, sealed, member_hash, covered_seq, covered, importance, tokens, model, calls, prompt_tokens, output_tokens, vector_model, vector, created_ms, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)', TENANT, id, w.cluster, body, sealed, w.memberHash, coveredSeq, w.covered, w.importance, w.tokens, w.model, w.calls, w.promptTokens, w.outputTokens, w.vectorModel, this.#vin(SUMMARY_VECTOR, id, w.vector), w.nowMs, w.nowMs);
      }
      return true;
    });
  }

  deleteSummary(cluster) {
    this.#run('DELETE FROM cluster_summaries WHERE tenant = ? AND cluster = ?', TENANT, cluster);
  }

  setClusterNote(cluster, note) {
    this.#run('UPDATE clusters SET note = ? WHERE tenant = ? AND id = ?', note ?? null, TENANT, cluster);
  }

  search(query, model, filter, limit) {
    const f = filterSql(filter, '');
    const mems = topK(limit);
    for (const r of this.#all(`SELECT id, vector, importance, cluster, text, sealed, superseded_by, superseded_ms FROM memories WHERE tenant = ?${f.sql} AND model = ?`, TENANT, ...f.args, model)) {
      mems.offer(cosine(query, this.#vout(VECTOR, r.id, r.vector)), (similarity) => ({ kind: 'memory', id: r.id, text: this.#open('memories', r.id, r), similarity, importance: r.importance, cluster: r.cluster, coveredSeq: 0, covered: 0, supersededBy: r.superseded_by ?? undefined, supersededMs: r.superseded_ms ?? 0 }));
    }
    const g = filterSql(filter, 'c.');
    const sums = topK(limit);
    for (const r of this.#all(`SELECT s.id, s.vector, s.importance, s.cluster, s.text, s.covered_seq, s.covered, s.sealed FROM cluster_summaries s JOIN clusters c ON c.tenant = s.tenant AND c.id = s.cluster WHERE s.tenant = ?${g.sql} AND s.vector_model = ?`, TENANT, ...g.args, model)) {
      sums.offer(cosine(query, this.#vout(SUMMARY_VECTOR, r.id, r.vector)), (similarity) => ({ kind: 'summary', id: String(r.id), text: this.#open('cluster_summaries', r.id, r), similarity, importance: r.importance, cluster: r.cluster, coveredSeq: r.covered_seq, covered: r.covered }));
    }
    return [...mems.hits, ...sums.hits];
  }

  /** Memories under a filter (every field given must match), oldest first. */
  list(filter = {}, offset = 0, limit = 100) {
    const f = filterSql(filter, '');
    return this.#all(`SELECT * FROM memories WHERE tenant = ?${f.sql} ORDER BY seq LIMIT ? OFFSET ?`, TENANT, ...f.args, limit, offset).map((r) => this.#mem(r));
  }

  /** Add model usage to a day (`YYYY-MM-DD`, UTC) and so to its month (as the Rust host does). */
  addUsage(day, calls, promptTokens, outputTokens) {
    this.#tx(() => {
      this.#run('INSERT INTO usage (tenant, month, calls, prompt_tokens, output_tokens) VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, month) DO UPDATE SET calls = calls + excluded.calls, prompt_tokens = prompt_tokens + excluded.prompt_tokens, output_tokens = output_tokens + excluded.output_tokens', TENANT, day.slice(0, 7), calls, promptTokens, outputTokens);
      this.#run('INSERT INTO usage_days (tenant, day, calls, prompt_tokens, output_tokens) VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, day) DO UPDATE SET calls = calls + excluded.calls, prompt_tokens = prompt_tokens + excluded.prompt_tokens, output_tokens = output_tokens + excluded.output_tokens', TENANT, day, calls, promptTokens, outputTokens);
    });
  }

  /** A month's usage per day (days with usage, oldest first). */
  usageDays(month) {
    return this.#all("SELECT day, calls, prompt_tokens, output_tokens FROM usage_days WHERE tenant = ? AND day LIKE ? || '-%' ORDER BY day", TENANT, month).map((r) => ({ day: r.day, calls: r.calls, promptTokens: r.prompt_tokens, outputTokens: r.output_tokens }));
  }

  /** A month's usage. */
  usage(month) {
    const r = this.#get('SELECT calls, prompt_tokens, output_tokens FROM usage WHERE tenant = ? AND month = ?', TENANT, month);
    return { calls: r?.calls ?? 0, promptTokens: r?.prompt_tokens ?? 0, outputTokens: r?.output_tokens ?? 0 };
  }

  /** Clusters with their member ids, oldest first. */
  clusters() {
    return this.#all('SELECT c.id, c.user, c.project, c.environment, c.kind, c.key, c.note, s.id AS summary FROM clusters c LEFT JOIN cluster_summaries s ON s.tenant = c.tenant AND s.cluster = c.id WHERE c.tenant = ? AND c.members > 0 ORDER BY c.id', TENANT).map((c) => ({
      id: c.id,
      scope: { user: c.user, project: c.project, environment: c.environment, kind: c.kind, key: c.key },
      members: this.members(c.id).map((m) => m.id),
      summary: c.summary ?? undefined,
      note: c.note ?? undefined,
    }));
  }
}
