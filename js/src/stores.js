// The store for the JavaScript host: SQLite (node:sqlite), in a file or in memory. It enforces
// the same rules as the Rust stores: episode ids are 1-based per session, source keys make appends idempotent, and summary rows cover every
// episode exactly once, in order. Store methods are synchronous (node:sqlite is), and take
// and return plain numbers.
import { createHash, createHmac } from 'node:crypto';
import { readFileSync, readdirSync } from 'node:fs';

import { AbridgeError } from './errors.js';
import { RecallTables, scrub } from './recall.js';
import { Keyring, masterKeyFromHex } from './sealing.js';

/** The compaction rule: the rows folded are the oldest rows of the active chain, at least two.
 * Returns the new row's first and last episode and level. */
export function checkCompaction(session, active, c) {
  const conflict = (why) => new AbridgeError('conflict', `summary compaction rule for session '${session}': ${why}`);
  if (c.rows.length < 2) throw conflict('a compaction folds at least two rows');
  const head = active.slice(0, c.rows.length).map((r) => r.id);
  if (head.length !== c.rows.length || head.some((id, i) => id !== c.rows[i])) {
    // Lists as the Rust host writes them (`[1, 2]`): the golden store rules compare messages.
    const list = (ids) => `[${ids.join(', ')}]`;
    throw conflict(`rows ${list(c.rows)} are not the oldest rows of the active chain (${list(head)})`);
  }
  const folded = active.slice(0, c.rows.length);
  return { first: folded[0].firstEpisode, last: folded[folded.length - 1].lastEpisode, level: Math.max(...folded.map((r) => r.level ?? 0)) + 1 };
}

/** A ledger as stored, the same JSON as the Rust host's: [{t, k, e, c}]. */
const ledgerJson = (entries) => JSON.stringify((entries ?? []).map((e) => ({ t: e.text, k: e.kind, e: e.episode, c: e.count })));
const ledgerParse = (text) => {
  try {
    return JSON.parse(text).map((x) => ({ text: x.t, kind: x.k, episode: x.e, count: x.c }));
  } catch {
    return [];
  }
};

/**
 * The chain rule, checked before every summary write (the same rule as the Rust stores'
 * `rules::check_chain`). `target` is `{first, last}` of the active row `w.replaces` names in
 * this session, or undefined: a write is a new row after the latest, an update of the latest
 * that keeps its first episode and does not shrink, or a rewrite of another active row that
 * keeps its range exactly.
 */
export function checkChain(session, episodes, prev, target, w) {
  const conflict = (why) => new AbridgeError('conflict', `summary chain rule for session '${session}': ${why}`);
  if (w.lastEpisode > episodes || w.lastEpisode < w.firstEpisode || w.firstEpisode === 0) {
    throw conflict(`coverage ${w.firstEpisode}-${w.lastEpisode} is outside episodes 1-${episodes}`);
  }
  if (w.replaces === undefined) {
    const expect = prev ? prev.lastEpisode + 1 : 1;
    if (w.firstEpisode !== expect) throw conflict(`a new row must start at episode ${expect}, not ${w.firstEpisode}`);
  } else if (prev && prev.id === w.replaces) {
    if (w.firstEpisode !== prev.firstEpisode || w.lastEpisode < prev.lastEpisode) {
      throw conflict(`an update of row ${w.replaces} must keep its first episode ${prev.firstEpisode} and reach at least ${prev.lastEpisode}`);
    }
  } else if (target) {
    if (w.firstEpisode !== target.first || w.lastEpisode !== target.last) {
      throw conflict(`row ${w.replaces} is not the latest row: a rewrite must keep its range ${target.first}-${target.last}`);
    }
  } else {
    throw conflict(`row ${w.replaces} is not in the session's active chain`);
  }
}

function rowFrom(w, id, createdMs) {
  return {
    id,
    firstEpisode: w.firstEpisode,
    lastEpisode: w.lastEpisode,
    content: w.content,
    tokens: w.tokens,
    promptTokens: w.promptTokens,
    outputTokens: w.outputTokens,
    model: w.model,
    createdMs,
    updatedMs: w.nowMs,
    skipped: w.skipped ?? [],
    level: 0,
    compactedInto: undefined,
    ledger: w.ledger ?? [],
    ledgerDropped: w.ledgerDropped ?? 0,
  };
}

/** The schema migrations, shared with the Rust host: host/store/src/migrations/*.sql, copied
 * into dist/migrations by `npm run build`. Read on first use. */
let migrations;
function loadMigrations() {
  if (!migrations) {
    const dir = new URL('../dist/migrations/', import.meta.url);
    let names;
    try {
      names = readdirSync(dir).filter((n) => n.endsWith('.sql')).sort();
    } catch (e) {
      throw new Error(`@abridge/engine is not built (${e.message}); run 'npm run build' in js/`);
    }
    migrations = names.map((n) => readFileSync(new URL(n, dir), 'utf8'));
  }
  return migrations;
}

/** Tables of the abridge schema (the same list as the Rust store's). */
const OWN_TABLES = ['sessions', 'episodes', 'summaries', 'calibration', 'partials', 'jobs', 'sources', 'failure_markers', 'watched_files', 'source_marks', 'session_modes', 'tokens', 'events', 'clusters', 'memories', 'cluster_summaries', 'data_keys', 'usage', 'usage_days', 'memory_marks', 'session_focus', 'session_pins', 'session_labels', 'session_grams', 'ann_graphs', 'episode_terms', 'episode_fts', 'episode_fts_data', 'episode_fts_idx', 'episode_fts_config', 'episode_fts_content', 'episode_fts_docsize', 'episode_vocab', 'search_totals'];

const ROW_COLS = 'id, first_episode AS firstEpisode, last_episode AS lastEpisode, content, tokens, prompt_tokens AS promptTokens, output_tokens AS outputTokens, model, created_ms AS createdMs, updated_ms AS updatedMs, skipped, level, compacted_into AS compactedInto, ledger, ledger_dropped AS ledgerDropped, sealed';

// How sealed columns and their rows are named in the associated data: the Rust store's
// `keyring::place`, so a value sealed by either host opens in the other.
const PLACE = { episode: 'episodes', speaker: 'episodes.speaker', item: 'episodes.item', summary: 'summaries', ledger: 'summaries.ledger', partial: 'partials' };
const episodeRow = (key, id) => `${key}#${id}`;
const summaryRow = (key, level, first) => `${key}#${level}:${first}`;
const rowOut = (r) => (r ? { ...r, skipped: JSON.parse(r.skipped), compactedInto: r.compactedInto ?? undefined, ledger: ledgerParse(r.ledger) } : undefined);
/** This store keeps the local tenant's sessions (the Rust store's whole view): their rows are
 * sealed under the local tenant's data key, and their `tenant` column is ''. */
const LOCAL = 'local';
const LOCAL_COLUMN = '';

/** Episodes holding a term are counted up to this many (the Rust store's `terms::DF_CAP`). */
const DF_CAP = 10000;

/** The key of a tenant's full-text terms (the Rust store's `terms::terms_key`). */
export function termsKey(tenant, lexical) {
  return createHash('sha256')
    .update(Buffer.from('abridge episode terms v1\0'))
    .update(lexical ? Buffer.from(lexical) : Buffer.alloc(0))
    .update(Buffer.from('\0'))
    .update(Buffer.from(tenant, 'utf8'))
    .digest();
}

/** One term as the index keeps it: the first 8 bytes of HMAC-SHA-256, as 13 letters a–z (the
 * Rust store's `terms::token`). */
export function termToken(key, term) {
  const d = createHmac('sha256', key).update(Buffer.from(term, 'utf8')).digest();
  let v = d.readBigUInt64LE(0);
  const out = new Array(13);
  for (let i = 12; i >= 0; i--) {
    out[i] = String.fromCharCode(97 + Number(v % 26n));
    v /= 26n;
  }
  return out.join('');
}

const sessionToken = (key, session) => termToken(key, `\0session\0${session}`);

/** A SQLite file through Node's built-in node:sqlite (no native addon). */
export class SqliteStore {
  #db;
  #st;

  #keyring;

  /**
   * Open (creating if needed) `path`; `:memory:` for a private in-memory database. With
   * `masterKey` (64 hex digits, the same key as the Rust host's ABRIDGE_MASTER_KEY_FILE), every
   * column that holds user text (episodes, summaries and their ledgers, cached partial answers,
   * memories, cluster summaries) is sealed at rest.
   */
  static async open(path, { masterKey, sealVectors } = {}) {
    const { DatabaseSync } = await import('node:sqlite');
    return new SqliteStore(new DatabaseSync(path), path, masterKey, { sealVectors });
  }

  #sealVectors;

  constructor(db, name = 'database', masterKey = undefined, { sealVectors = false } = {}) {
    this.#sealVectors = sealVectors;
    this.#db = db;
    if (masterKey !== undefined) this.#keyring = new Keyring(db, masterKeyFromHex(masterKey));
    try {
      db.exec('PRAGMA busy_timeout = 10000');
      // SQLite waits out another connection's lock except where waiting could deadlock
      // (two new openers both switching the file to WAL): each step is safe to repeat, so
      // opening tries again, with a short pause, for as long as the busy timeout.
      const deadline = Date.now() + 10000;
      let pause = 5 + (process.pid % 11);
      for (;;) {
        try {
          this.#prepare(db);
          break;
        } catch (e) {
          if (!/locked|busy/i.test(e.message) || Date.now() >= deadline) throw e;
          Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, pause);
          pause = Math.min(pause * 2, 200);
        }
      }
    } catch (e) {
      try {
        db.close();
      } catch {
        // Already closed or never opened: nothing to release.
      }
      throw new AbridgeError('storage', `${name} is not a usable abridge database (${e.message}); use another file`);
    }
    const p = (sql) => db.prepare(sql);
    this.#st = {
      // A session new to the index is indexed as its episodes arrive.
      ensure: p('INSERT OR IGNORE INTO sessions (id, tenant, indexed) VALUES (?, ?, 1)'),
      // The full-text index (the Rust store's `terms` module: the same statements).
      termsInsert: p('INSERT INTO episode_terms (session, episode, tenant, terms, length) SELECT ?1, ?2, ?3, ?4, ?5 WHERE EXISTS (SELECT 1 FROM episodes WHERE session = ?1 AND id = ?2) AND NOT EXISTS (SELECT 1 FROM episode_terms WHERE session = ?1 AND episode = ?2)'),
      termsAppend: p('INSERT INTO episode_terms (session, episode, tenant, terms, length) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (session, episode) DO NOTHING'),
      termsTotals: p('INSERT INTO search_totals (tenant, docs, length) VALUES (?1, ?2, ?3) ON CONFLICT (tenant) DO UPDATE SET docs = search_totals.docs + excluded.docs, length = search_totals.length + excluded.length'),
      totals: p('SELECT docs, length FROM search_totals WHERE tenant = ?'),
      vocab: p('SELECT doc FROM episode_vocab WHERE term = ?'),
      postings: p('SELECT t.doc AS doc, t.session AS session, t.episode AS episode, t.terms AS terms FROM episode_fts JOIN episode_terms t ON t.doc = episode_fts.rowid WHERE episode_fts MATCH ?1 AND t.tenant = ?2 ORDER BY episode_fts.rowid DESC LIMIT ?3'),
      unindexed: p('SELECT COUNT(*) AS sessions, COALESCE(SUM(episodes), 0) AS episodes FROM sessions WHERE indexed = 0'),
      nextUnindexed: p('SELECT id FROM sessions WHERE indexed = 0 ORDER BY id LIMIT 1'),
      markIndexed: p('UPDATE sessions SET indexed = 1 WHERE id = ?'),
      next: p('SELECT episodes + 1 AS next, (SELECT COALESCE(MAX(changed_seq), 0) + 1 FROM sessions) AS seq, total_tokens AS through FROM sessions WHERE id = ?'),
      insert: p('INSERT OR IGNORE INTO episodes (session, id, role, content, timestamp_ms, source_key, tokens, speaker, sealed, tokens_through, bytes_through, item) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)'),
      items: p('SELECT id, item, sealed FROM episodes WHERE session = ? AND id BETWEEN ? AND ? AND item IS NOT NULL'),
      lastBytes: p('SELECT COALESCE((SELECT bytes_through FROM episodes WHERE session = ? ORDER BY id DESC LIMIT 1), 0) AS bytes'),
      bump: p('UPDATE sessions SET episodes = episodes + ?, total_tokens = total_tokens + ?, changed_seq = ? WHERE id = ?'),
      stats: p('SELECT episodes, total_tokens AS totalTokens FROM sessions WHERE id = ?'),
      after: p('SELECT id, role, content, timestamp_ms AS timestampMs, tokens, speaker, sealed, tokens_through AS tokensThrough FROM episodes WHERE session = ? AND id > ? ORDER BY id LIMIT ?'),
      range: p('SELECT id, role, content, timestamp_ms AS timestampMs, tokens, speaker, sealed, tokens_through AS tokensThrough FROM episodes WHERE session = ? AND id BETWEEN ? AND ? ORDER BY id'),
      latest: p(`SELECT ${ROW_COLS} FROM summaries WHERE session = ? AND compacted_into IS NULL ORDER BY last_episode DESC, id DESC LIMIT 1`),
      all: p(`SELECT ${ROW_COLS} FROM summaries WHERE session = ? AND compacted_into IS NULL ORDER BY first_episode`),
      history: p(`SELECT ${ROW_COLS} FROM summaries WHERE session = ? ORDER BY first_episode, level DESC, id`),
      compactAdd: p(`INSERT INTO summaries (session, first_episode, last_episode, content, tokens, prompt_tokens, output_tokens, model, created_ms, updated_ms, skipped, level, ledger, ledger_dropped, sealed)
              VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
      compacted: p('UPDATE summaries SET compacted_into = ? WHERE id = ? AND session = ?'),
      row: p(`SELECT ${ROW_COLS} FROM summaries WHERE id = ?`),
      add: p(`INSERT INTO summaries (session, first_episode, last_episode, content, tokens, prompt_tokens, output_tokens, model, created_ms, updated_ms, skipped, ledger, ledger_dropped, sealed)
              VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
      update: p('UPDATE summaries SET last_episode = ?, content = ?, tokens = ?, prompt_tokens = ?, output_tokens = ?, model = ?, updated_ms = ?, skipped = ?, ledger = ?, ledger_dropped = ?, sealed = ? WHERE id = ?'),
      placeOf: p('SELECT level, first_episode AS first FROM summaries WHERE id = ?'),
      spanOf: p('SELECT first_episode AS first, last_episode AS last FROM summaries WHERE id = ? AND session = ? AND compacted_into IS NULL'),
      sessions: p('SELECT id FROM sessions ORDER BY changed_seq DESC, id'),
      calibration: p('SELECT estimated, reported FROM calibration WHERE model = ?'),
      partial: p('SELECT text, prompt_tokens AS promptTokens, output_tokens AS outputTokens, sealed FROM partials WHERE key = ?'),
      putPartial: p('INSERT OR REPLACE INTO partials (key, text, prompt_tokens, output_tokens, sealed) VALUES (?, ?, ?, ?, ?)'),
      failure: p('SELECT failures, last_error AS lastError, retry_after_ms AS retryAfterMs, failed_ms AS failedMs FROM failure_markers WHERE session = ?'),
      setFailure: p('INSERT OR REPLACE INTO failure_markers (session, failures, last_error, retry_after_ms, failed_ms) VALUES (?, ?, ?, ?, ?)'),
      clearFailure: p('DELETE FROM failure_markers WHERE session = ?'),
      // Everything kept for the session, as the Rust host's reset clears it (shared tables).
      reset: [
        'UPDATE search_totals SET docs = search_totals.docs - t.n, length = search_totals.length - t.total FROM (SELECT tenant, COUNT(*) AS n, SUM(length) AS total FROM episode_terms WHERE session = ?1 GROUP BY tenant) AS t WHERE search_totals.tenant = t.tenant',
        'DELETE FROM episode_terms WHERE session = ?',
        'DELETE FROM summaries WHERE session = ?',
        'DELETE FROM episodes WHERE session = ?',
        'DELETE FROM failure_markers WHERE session = ?',
        'DELETE FROM source_marks WHERE session = ?',
        'DELETE FROM sources WHERE EXISTS (SELECT 1 FROM json_each(sources.sessions) WHERE value = ?)',
        'DELETE FROM watched_files WHERE session = ?',
        'DELETE FROM session_modes WHERE session = ?',
        'DELETE FROM session_focus WHERE session = ?',
        'DELETE FROM session_labels WHERE session = ?',
        'DELETE FROM session_grams WHERE session = ?',
        'DELETE FROM session_pins WHERE session = ?',
        'DELETE FROM events WHERE session_key = ?',
        "DELETE FROM jobs WHERE session = ? AND state != 'running'",
        "UPDATE jobs SET cancel_requested = 1 WHERE session = ? AND state = 'running'",
        'DELETE FROM sessions WHERE id = ?',
      ].map(p),
      calibrate: p(`INSERT INTO calibration (model, estimated, reported) VALUES (?, ?, ?)
                    ON CONFLICT(model) DO UPDATE SET estimated = estimated + excluded.estimated, reported = reported + excluded.reported`),
    };
  }

  /** Switch to WAL and run the migrations the file lacks, each in a write transaction taken
   * before the version is read, so a second opener waits and then finds the work done. */
  #prepare(db) {
    // Look before touching anything: another program's database is neither migrated nor
    // switched to WAL.
    const foreign = db
      .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
      .all()
      .map((r) => r.name)
      .filter((n) => !OWN_TABLES.includes(n));
    if (foreign.length > 0) {
      throw new Error(`it holds other tables: ${foreign.slice(0, 5).join(', ')}${foreign.length > 5 ? ', …' : ''}; abridge leaves it untouched`);
    }
    db.exec('PRAGMA journal_mode = WAL');
    db.exec('PRAGMA synchronous = NORMAL');
    db.exec('PRAGMA foreign_keys = ON');
    // Deleted means gone: freed content is overwritten, and the WAL is emptied after deletes.
    db.exec('PRAGMA secure_delete = ON');
    const all = loadMigrations();
    for (;;) {
      const done = this.#tx(() => {
        const version = db.prepare('PRAGMA user_version').get().user_version;
        if (version > all.length) {
          throw new Error(`schema ${version} is newer than this build knows (${all.length}); upgrade abridge`);
        }
        if (version === all.length) return true;
        db.exec(all[version]);
        db.exec(`PRAGMA user_version = ${version + 1}`);
        return false;
      });
      if (done) return;
    }
  }

  #tx(f) {
    this.#db.exec('BEGIN IMMEDIATE');
    try {
      const r = f();
      this.#db.exec('COMMIT');
      return r;
    } catch (e) {
      this.#db.exec('ROLLBACK');
      throw e;
    }
  }

  /** `[value, version]` to store `text` in row `row` of `table`: the text itself without a
   * master key, sealed bytes with one (the Rust store's rule). */
  #seal(table, row, text) {
    return this.#keyring ? this.#keyring.seal(LOCAL, table, row, text) : [text, 0];
  }

  /** A stored value's text back (`sealed`: its key version, 0 when plain). */
  #open(table, row, value, sealed) {
    if (!sealed) return typeof value === 'string' ? value : new TextDecoder().decode(value);
    if (!this.#keyring) {
      throw new AbridgeError('storage', `${table} row '${row}' is encrypted and no master key is set: open the store with the key it was written with (SqliteStore.open(path, { masterKey }))`);
    }
    return this.#keyring.open(LOCAL, table, row, value, Number(sealed));
  }

  /** A summary row as stored, opened. */
  #row(session, r) {
    if (!r) return undefined;
    const name = summaryRow(session, r.level, r.firstEpisode);
    const { sealed, ...row } = r;
    return rowOut({ ...row, content: this.#open(PLACE.summary, name, r.content, sealed), ledger: this.#open(PLACE.ledger, name, r.ledger, sealed) });
  }

  /** A summary's content and ledger as stored, and their key version. */
  #sealSummary(session, level, first, content, ledger) {
    const name = summaryRow(session, level, first);
    const [c, v] = this.#seal(PLACE.summary, name, content);
    const [l] = this.#seal(PLACE.ledger, name, ledgerJson(ledger));
    return [c, l, v];
  }

  #wrap(f) {
    try {
      return f();
    } catch (e) {
      if (e instanceof AbridgeError) throw e;
      throw new AbridgeError('storage', e.message);
    }
  }

  appendEpisodes(session, episodes) {
    return this.#wrap(() => this.#tx(() => {
      const s = this.#st;
      s.ensure.run(session, LOCAL_COLUMN);
      let { next, seq, through } = s.next.get(session);
      const docs = [];
      // The running byte total the Rust host's coverage figures subtract (migration 27).
      let { bytes } = s.lastBytes.get(session);
      let added = 0;
      let tokens = 0;
      for (const e of episodes) {
        const name = episodeRow(session, next);
        const [content, sealed] = this.#seal(PLACE.episode, name, e.content);
        const speaker = e.speaker == null ? null : this.#seal(PLACE.speaker, name, e.speaker)[0];
        // The client's own record of the message (the WIT's `new-episode.item`), kept beside it.
        const item = e.item == null ? null : this.#seal(PLACE.item, name, e.item)[0];
        const upto = bytes + Buffer.byteLength(e.content, 'utf8');
        const r = s.insert.run(session, next, e.role, content, e.timestampMs ?? null, e.sourceKey, e.tokens, speaker, sealed, through + e.tokens, upto, item);
        if (r.changes === 1) {
          if (e.terms && e.terms.trim()) docs.push([next, e.terms]);
          next++;
          added++;
          tokens += e.tokens;
          through += e.tokens;
          bytes = upto;
        }
      }
      if (docs.length) this.#index(session, docs, true);
      if (added) s.bump.run(added, tokens, seq, session);
      return added;
    }));
  }

  #termsKeys = new Map();

  /** The full-text key of the tenant whose sessions' `tenant` column is `column`. */
  #termsKey(column) {
    const name = column || 'local';
    if (!this.#termsKeys.has(name)) {
      this.#termsKeys.set(name, termsKey(name, this.#keyring ? this.#keyring.lexicalKey(name) : undefined));
    }
    return this.#termsKeys.get(name);
  }

  /** Index episodes `[[id, terms]]` of `session` in the open transaction, skipping those
   * indexed already (and, unless `fresh`: written just now, those no longer stored); add
   * them to the tenant's totals. */
  #index(session, docs, fresh = false) {
    const s = this.#st;
    const insert = fresh ? s.termsAppend : s.termsInsert;
    const tenant = LOCAL_COLUMN;
    const key = this.#termsKey(tenant);
    let added = 0;
    let length = 0;
    for (const [id, terms] of docs) {
      const words = terms.split(/\s+/).filter((t) => t);
      if (!words.length) continue;
      const text = [sessionToken(key, session), ...words.map((t) => termToken(key, t))].join(' ');
      if (insert.run(session, id, tenant, text, words.length).changes === 1) {
        added++;
        length += words.length;
      }
    }
    if (added) s.termsTotals.run(tenant, added, length);
    return added;
  }

  /**
   * The full-text index's episodes holding any of `terms` (the guest's index terms), in
   * `session` or in every session of the tenant (`tenant`: its name, or the local one), at
   * most `limit`: `{docs, length, df, matches: [{session, episode, length, counts}]}` (the
   * WIT `store.search-episodes`, answered as the Rust stores answer it).
   */
  searchEpisodes(session, terms, limit, tenant = undefined) {
    return this.#wrap(() => {
      const s = this.#st;
      const column = session !== undefined ? LOCAL_COLUMN : tenant && tenant !== LOCAL ? tenant : LOCAL_COLUMN;
      const key = this.#termsKey(column);
      const hashes = terms.map((t) => termToken(key, t));
      const totals = s.totals.get(column);
      const df = hashes.map((h) => Math.min(Number(s.vocab.get(h)?.doc ?? 0), DF_CAP));
      const order = hashes.map((_, i) => i).filter((i) => df[i] > 0);
      order.sort((a, b) => df[a] - df[b] || a - b);
      const scope = session !== undefined ? sessionToken(key, session) : undefined;
      const found = [];
      const seen = new Set();
      for (const i of order) {
        if (found.length >= limit) break;
        const match = scope ? `"${scope}" AND "${hashes[i]}"` : `"${hashes[i]}"`;
        for (const r of s.postings.all(match, column, limit)) {
          if (found.length < limit && !seen.has(r.doc)) {
            seen.add(r.doc);
            found.push(r);
          }
        }
      }
      const matches = found.map((r) => {
        const tokens = r.terms.split(' ').slice(1);
        return { session: r.session, episode: Number(r.episode), length: tokens.length, counts: hashes.map((h) => tokens.filter((t) => t === h).length) };
      });
      return { docs: Number(totals?.docs ?? 0), length: Number(totals?.length ?? 0), df, matches };
    });
  }

  /** Sessions stored before the full-text index existed: `{sessions, episodes}` not indexed. */
  unindexed() {
    return this.#wrap(() => {
      const r = this.#st.unindexed.get();
      return { sessions: Number(r.sessions), episodes: Number(r.episodes) };
    });
  }

  /** The next session not yet indexed, if any. */
  nextUnindexed() {
    return this.#wrap(() => this.#st.nextUnindexed.get()?.id);
  }

  /** Index episodes `[[id, terms]]` of `session` in one transaction; with `done`, the session
   * is indexed from then on. Returns those added. */
  indexEpisodes(session, docs, done) {
    return this.#wrap(() =>
      this.#tx(() => {
        const added = this.#index(session, docs);
        if (done) this.#st.markIndexed.run(session);
        return added;
      }),
    );
  }

  stats(session) {
    return this.#wrap(() => {
      const r = this.#st.stats.get(session);
      return r ? { episodes: r.episodes, totalTokens: r.totalTokens, lastEpisode: r.episodes } : { episodes: 0, totalTokens: 0, lastEpisode: 0 };
    });
  }

  /**
   * The items stored with episodes `ids` of `session` (a `Map` from id to the item's JSON
   * text, opened), those stored without one absent: what the Rust store's `items` answers.
   * One range query per run of consecutive ids.
   */
  items(session, ids) {
    return this.#wrap(() => {
      const sorted = [...new Set(ids.map(Number))].sort((a, b) => a - b);
      const out = new Map();
      for (let i = 0; i < sorted.length; ) {
        let j = i;
        while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
        for (const r of this.#st.items.all(session, sorted[i], sorted[j])) {
          out.set(r.id, this.#open(PLACE.item, episodeRow(session, r.id), r.item, r.sealed));
        }
        i = j + 1;
      }
      return out;
    });
  }

  episodesAfter(session, after, limit) {
    return this.#wrap(() => this.#st.after.all(session, after, limit).map((r) => this.#episode(session, r)));
  }

  /**
   * The episodes `ids` of `session`, ascending (an id it does not hold is left out): what the
   * Rust store's `episodes` answers. One range query per run of consecutive ids.
   */
  episodes(session, ids) {
    return this.#wrap(() => {
      const sorted = [...new Set(ids.map(Number))].sort((a, b) => a - b);
      const out = [];
      for (let i = 0; i < sorted.length; ) {
        let j = i;
        while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
        for (const r of this.#st.range.all(session, sorted[i], sorted[j])) out.push(this.#episode(session, r));
        i = j + 1;
      }
      return out;
    });
  }

  #episode(session, { sealed, ...e }) {
    const name = episodeRow(session, e.id);
    return {
      ...e,
      content: this.#open(PLACE.episode, name, e.content, sealed),
      timestampMs: e.timestampMs ?? undefined,
      speaker: e.speaker == null ? undefined : this.#open(PLACE.speaker, name, e.speaker, sealed),
    };
  }

  latestSummary(session) {
    return this.#wrap(() => {
      return this.#row(session, this.#st.latest.get(session));
    });
  }

  summaries(session) {
    return this.#wrap(() => this.#st.all.all(session).map((r) => this.#row(session, r)));
  }

  writeSummary(session, w) {
    return this.#wrap(() => this.#tx(() => {
      const s = this.#st;
      const stats = s.stats.get(session);
      if (!stats) throw new AbridgeError('invalid-input', `no session '${session}' in the store`);
      const prev = this.#row(session, s.latest.get(session));
      const span = w.replaces === undefined ? undefined : s.spanOf.get(w.replaces, session);
      checkChain(session, stats.episodes, prev, span ? { first: span.first, last: span.last } : undefined, w);
      let id;
      if (w.replaces === undefined) {
        const [content, ledger, sealed] = this.#sealSummary(session, 0, w.firstEpisode, w.content, w.ledger);
        id = Number(s.add.run(session, w.firstEpisode, w.lastEpisode, content, w.tokens, w.promptTokens, w.outputTokens, w.model, w.nowMs, w.nowMs, JSON.stringify(w.skipped ?? []), ledger, w.ledgerDropped ?? 0, sealed).lastInsertRowid);
      } else {
        id = w.replaces;
        // The row keeps its level and first episode: its name stays the same.
        const at = s.placeOf.get(id);
        const [content, ledger, sealed] = this.#sealSummary(session, at.level, at.first, w.content, w.ledger);
        s.update.run(w.lastEpisode, content, w.tokens, w.promptTokens, w.outputTokens, w.model, w.nowMs, JSON.stringify(w.skipped ?? []), ledger, w.ledgerDropped ?? 0, sealed, id);
      }
      return this.#row(session, s.row.get(id));
    }));
  }

  summaryHistory(session) {
    return this.#wrap(() => this.#st.history.all(session).map((r) => this.#row(session, r)));
  }

  compactSummaries(session, c) {
    return this.#wrap(() => this.#tx(() => {
      const s = this.#st;
      const active = s.all.all(session).map((r) => this.#row(session, r));
      const { first, last, level } = checkCompaction(session, active, c);
      const [content, ledger, sealed] = this.#sealSummary(session, level, first, c.content, c.ledger);
      const id = Number(s.compactAdd.run(session, first, last, content, c.tokens, c.promptTokens, c.outputTokens, c.model, c.nowMs, c.nowMs, JSON.stringify(c.skipped ?? []), level, ledger, c.ledgerDropped ?? 0, sealed).lastInsertRowid);
      for (const r of c.rows) s.compacted.run(id, r, session);
      return this.#row(session, s.row.get(id));
    }));
  }

  sessions() {
    return this.#wrap(() => this.#st.sessions.all().map((r) => r.id));
  }

  #recall;

  /** Memories, clusters and cluster summaries, in this database's own tables. */
  get recall() {
    this.#recall ??= new RecallTables(this.#db, (f) => this.#tx(f), undefined, this.#keyring, { sealVectors: this.#sealVectors });
    return this.#recall;
  }

  failure(session) {
    return this.#wrap(() => {
      const r = this.#st.failure.get(session);
      return r ? { failures: r.failures, lastError: r.lastError, retryAfterMs: r.retryAfterMs, failedMs: r.failedMs } : undefined;
    });
  }

  setFailure(session, m) {
    this.#wrap(() => {
      if (m) this.#st.setFailure.run(session, m.failures, m.lastError, m.retryAfterMs, m.failedMs);
      else this.#st.clearFailure.run(session);
    });
  }

  resetSession(session) {
    this.#wrap(() => this.#tx(() => this.#st.reset.forEach((st) => st.run(session))));
    scrub(this.#db);
  }

  partial(key) {
    return this.#wrap(() => {
      const r = this.#st.partial.get(key);
      return r ? { text: this.#open(PLACE.partial, key, r.text, r.sealed), promptTokens: Number(r.promptTokens), outputTokens: Number(r.outputTokens) } : undefined;
    });
  }

  putPartial(key, answer) {
    this.#wrap(() => {
      const [text, sealed] = this.#seal(PLACE.partial, key, answer.text);
      this.#st.putPartial.run(key, text, answer.promptTokens ?? 0, answer.outputTokens ?? 0, sealed);
    });
  }

  calibration(model) {
    return this.#wrap(() => {
      const r = this.#st.calibration.get(model);
      return r ? { estimated: r.estimated, reported: r.reported } : undefined;
    });
  }

  recordCalibration(model, estimated, reported) {
    this.#wrap(() => this.#st.calibrate.run(model, estimated, reported));
  }

  close() {
    this.#db.close();
  }
}
