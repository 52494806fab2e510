// @abridge/engine: the abridge guest component in JavaScript (jco, JSPI), with hosts for
// the model (Ollama, OpenAI-compatible), the store (memory, node:sqlite), clock and logging.
// Each call runs in a fresh instance of the component, as in the Rust host.
// First: on a Node without JSPI this stops with the fix, before the component's glue loads.
import './node-check.js';

import { readFile } from 'node:fs/promises';

import { AbridgeError, describe, toGuest } from './errors.js';
import { defaultRetry, noModel, ollama, openai, slidingWindow } from './llm.js';
import { SqliteStore, checkChain } from './stores.js';
import { wasiImports } from './wasi.js';

export { AbridgeError, SqliteStore, checkChain, defaultRetry, describe, noModel, ollama, openai };

// The component's glue, loaded after the Node check above (a static import would be linked,
// and fail, before that check could say what to fix); a package not built says so.
let instantiate;
try {
  ({ instantiate } = await import('../dist/guest/abridge.js'));
} catch (e) {
  if (e?.code !== 'ERR_MODULE_NOT_FOUND') throw e;
  throw new Error(`@abridge/engine is not built (${e.message}); run 'npm run build' in js/, or install the packed package, which ships it built`);
}

// The documented defaults (`defaultConfig`, `defaultContextRequest`, `defaultMemoryConfig`)
// are read from the component itself, their one source (`default-config` and
// `default-memory-config`), when this module loads: see the end of this file.

let compiled;

/** The component's core modules, compiled once per process. */
function coreModules() {
  compiled ??= (async () => {
    const dir = new URL('../dist/guest/', import.meta.url);
    const names = ['abridge.core.wasm', 'abridge.core2.wasm', 'abridge.core3.wasm'];
    const modules = new Map();
    for (const name of names) {
      let bytes;
      try {
        bytes = await readFile(new URL(name, dir));
      } catch (e) {
        throw new Error(`@abridge/engine is not built (${e.message}); run 'npm run build' in js/`);
      }
      modules.set(name, await WebAssembly.compile(bytes));
    }
    return modules;
  })();
  return compiled;
}

const big = (n) => (n === undefined || n === null ? undefined : BigInt(n));
/** A message's `item` (the client's own record of it) as the JSON text the store keeps: a
 * string as given, any other value as its JSON. */
const itemText = (item) => (item === undefined || item === null ? undefined : typeof item === 'string' ? item : JSON.stringify(item));
/** Episodes as the guest's `new-episode` records (the guest fills in tokens and terms). */
const newEpisodes = (episodes) =>
  episodes.map((e) => ({ role: e.role, content: e.content, timestampMs: big(e.timestampMs), sourceKey: String(e.sourceKey), tokens: 0, speaker: e.speaker ?? undefined, terms: '', item: itemText(e.item) }));
const num = (b) => (b === undefined || b === null ? undefined : Number(b));
/** A WIT `freshness-report` with numbers. */
const freshToJs = (f) => ({
  ...f,
  episodes: num(f.episodes),
  covered: num(f.covered),
  backlogTokens: num(f.backlogTokens),
  lastActivityMs: num(f.lastActivityMs),
  coveredUntilMs: num(f.coveredUntilMs),
  dueAtMs: num(f.dueAtMs),
  foldUpto: num(f.foldUpto),
});
/** A store's episode as the WIT `episode`. */
const episodeToWit = (e) => {
  if (typeof e.tokensThrough !== 'number' && typeof e.tokensThrough !== 'bigint') {
    throw new AbridgeError('storage', "the store returned an episode without tokensThrough (the sum of tokens of the session's episodes 1..=id); a custom store must keep it as episodes arrive");
  }
  return { ...e, id: big(e.id), timestampMs: big(e.timestampMs), tokensThrough: big(e.tokensThrough) };
};

const rowToJs = (r) => ({
  id: num(r.id),
  firstEpisode: num(r.firstEpisode),
  lastEpisode: num(r.lastEpisode),
  content: r.content,
  tokens: r.tokens,
  promptTokens: r.promptTokens,
  outputTokens: r.outputTokens,
  model: r.model,
  createdMs: num(r.createdMs),
  updatedMs: num(r.updatedMs),
  skipped: r.skipped.map((x) => [num(x.first), num(x.last)]),
  level: r.level,
  compactedInto: num(r.compactedInto),
  ledger: r.ledger.map((e) => ({ text: e.text, kind: e.kind, episode: num(e.episode), count: e.count })),
  ledgerDropped: r.ledgerDropped,
});

const ledgerToWit = (l) => (l ?? []).map((e) => ({ text: e.text, kind: e.kind, episode: big(e.episode), count: e.count }));
const ledgerToJs = (l) => l.map((e) => ({ text: e.text, kind: e.kind, episode: num(e.episode), count: e.count }));

const rowToWit = (r) => ({
  ...r,
  id: big(r.id),
  firstEpisode: big(r.firstEpisode),
  lastEpisode: big(r.lastEpisode),
  createdMs: big(r.createdMs),
  updatedMs: big(r.updatedMs),
  skipped: (r.skipped ?? []).map(([first, last]) => ({ first: big(first), last: big(last) })),
  level: r.level ?? 0,
  compactedInto: big(r.compactedInto),
  ledger: ledgerToWit(r.ledger),
  ledgerDropped: r.ledgerDropped ?? 0,
});

const outcomeToJs = (o) => ({ triggered: o.triggered, passes: o.passes, written: o.written.map(rowToJs), unsummarized: num(o.unsummarized) });

/** The month (`YYYY-MM`, UTC) of a time and when the next one starts. */
function monthOf(ms) {
  const d = new Date(ms);
  const y = d.getUTCFullYear();
  const m = d.getUTCMonth();
  const month = `${y}-${String(m + 1).padStart(2, '0')}`;
  return { month, day: `${month}-${String(d.getUTCDate()).padStart(2, '0')}`, resetsAtMs: Date.UTC(y, m + 1, 1) };
}

/** Run at most `n` of the given tasks at once. */
function slots(n) {
  let free = n;
  const waiting = [];
  return async (task) => {
    if (free === 0) await new Promise((resolve) => waiting.push(resolve));
    else free--;
    try {
      return await task();
    } finally {
      const next = waiting.shift();
      if (next) next();
      else free++;
    }
  };
}

const memToWit = (m) => (m ? { ...m, createdMs: big(m.createdMs), cluster: big(m.cluster), seq: big(m.seq), supersedes: m.supersedes ?? undefined, supersededBy: m.supersededBy ?? undefined, supersededMs: big(m.supersededMs ?? 0) } : undefined);
const memToJs = (m) => ({ ...m, createdMs: num(m.createdMs), cluster: num(m.cluster), seq: num(m.seq), supersededMs: num(m.supersededMs) });
const sumToWit = (s) => (s ? { ...s, id: big(s.id), cluster: big(s.cluster), coveredSeq: big(s.coveredSeq), createdMs: big(s.createdMs), updatedMs: big(s.updatedMs) } : undefined);
const sumToJs = (s) => (s ? { ...s, id: num(s.id), cluster: num(s.cluster), coveredSeq: num(s.coveredSeq), createdMs: num(s.createdMs), updatedMs: num(s.updatedMs) } : undefined);

/** Store calls: engine errors go to the guest as WIT errors, anything else is a storage error. */
function storeCall(f) {
  try {
    return f();
  } catch (e) {
    throw toGuest(e instanceof AbridgeError ? e : new AbridgeError('storage', e?.message ?? String(e)));
  }
}

/** The message for a transcript parse error (the same words as the Rust host's). */

/** Run an export call; turn WIT errors into AbridgeError and traps into a described Error. */
async function exportCall(f) {
  try {
    return await f();
  } catch (e) {
    const p = e?.payload;
    if (p && typeof p.tag === 'string') throw new AbridgeError(p.tag, p.val);
    if (e instanceof WebAssembly.RuntimeError) {
      throw new Error(`the engine trapped (a bug in the guest); the store is unchanged by this call: ${e.message}`, { cause: e });
    }
    throw e;
  }
}

/** The engine: the same API as the Rust `Abridge`, with plain numbers and Promises. */
export class Engine {
  #llm;
  #store;
  #clock;
  /** Model calls served and not yet written to the usage table: [promptTokens, outputTokens]. */
  #pendingUsage = [];
  #log;
  #batch;
  #modules;
  #progress;
  #onPlan;

  #embedder;
  #limits;
  #clusterSlots;

  constructor({ llm, store, clock, log, onProgress, onPlan, batchConcurrency, modules, embedder, limits }) {
    this.#embedder = embedder;
    this.#limits = { clusterJobs: 3, ...limits };
    this.#clusterSlots = slots(Math.max(1, this.#limits.clusterJobs));
    this.#llm = llm;
    this.#store = store;
    this.#clock = clock;
    this.#log = log;
    this.#progress = onProgress;
    this.#onPlan = onPlan;
    this.#batch = batchConcurrency;
    this.#modules = modules;
  }

  /** The backend's name (`ollama`, `openai`, `none`). */
  get llmName() {
    return this.#llm.name;
  }

  /** The store. */
  get store() {
    return this.#store;
  }

  #imports() {
    const llm = this.#llm;
    const store = this.#store;
    const epToJs = (e) => ({ role: e.role, content: e.content, timestampMs: num(e.timestampMs), sourceKey: e.sourceKey, tokens: e.tokens, speaker: e.speaker, terms: e.terms, item: e.item });
    const statsToWit = (s) => ({ episodes: big(s.episodes), totalTokens: big(s.totalTokens), lastEpisode: big(s.lastEpisode) });
    const writeToJs = (w) => ({
      ...w,
      replaces: num(w.replaces),
      firstEpisode: num(w.firstEpisode),
      lastEpisode: num(w.lastEpisode),
      nowMs: num(w.nowMs),
      skipped: w.skipped.map((x) => [num(x.first), num(x.last)]),
      ledger: ledgerToJs(w.ledger),
    });
    // A complete answer to a request with a cache key is cached the moment it arrives, so an
    // interrupted map-reduce loses no finished answer (see the WIT `llm.request.cache-key`).
    // Every call the model serves counts in the month's usage as it returns (session and
    // cluster summaries, retries, answers a gate then discards); one that never reached it
    // (unreachable) does not — as the Rust host counts.
    // Written, dated, at the engine's next clock reading (the guest reads the clock as it
    // writes what the calls produced; `usage()` reads it too), so counting adds no reading.
    const count = (promptTokens, outputTokens) => this.#pendingUsage.push([promptTokens ?? 0, outputTokens ?? 0]);
    const cached = async ({ cacheKey, ...req }) => {
      let resp;
      try {
        resp = await llm.generate(req);
      } catch (e) {
        if (e?.kind !== 'unreachable') count(0, 0);
        throw e;
      }
      count(resp.promptTokens, resp.outputTokens);
      if (cacheKey !== undefined && resp.finishReason === 'stop') {
        try {
          store.putPartial(cacheKey, { text: resp.text, promptTokens: resp.promptTokens ?? 0, outputTokens: resp.outputTokens ?? 0 });
        } catch (e) {
          this.#log('warn', `caching a partial summary failed: ${e.message}`);
        }
      }
      return resp;
    };
    return {
      'abridge:engine/types': {},
      'abridge:engine/clock': {
        nowMs: () => {
          const now = Math.floor(this.#clock());
          this.#flushUsage(now);
          return BigInt(now);
        },
      },
      'abridge:engine/log': {
        write: (level, message) => this.#log(level, message),
        progress: (level, done, total) => this.#progress({ level, done, total }),
        planned: (report) => this.#onPlan(planToJs(report)),
      },
      'abridge:engine/llm': {
        generate: async (req) => {
          try {
            return await cached(req);
          } catch (e) {
            throw toGuest(e);
          }
        },
        generateBatch: (reqs) => slidingWindow(reqs, this.#batch, cached),
      },
      'abridge:engine/store': {
        appendEpisodes: (s, eps) => storeCall(() => store.appendEpisodes(s, eps.map(epToJs))),
        stats: (s) => statsToWit(storeCall(() => store.stats(s))),
        episodesAfter: (s, after, limit) => storeCall(() => store.episodesAfter(s, num(after), limit)).map(episodeToWit),
        // A custom store without `episodes` is read an episode at a time.
        episodes: (s, ids) =>
          storeCall(() =>
            typeof store.episodes === 'function'
              ? store.episodes(s, Array.from(ids, num))
              : Array.from(ids, num).flatMap((id) => store.episodesAfter(s, id - 1, 1).filter((e) => Number(e.id) === id)),
          ).map(episodeToWit),
        latestSummary: (s) => {
          const r = storeCall(() => store.latestSummary(s));
          return r ? rowToWit(r) : undefined;
        },
        summaries: (s) => storeCall(() => store.summaries(s)).map(rowToWit),
        writeSummary: (s, w) => rowToWit(storeCall(() => store.writeSummary(s, writeToJs(w)))),
        summaryHistory: (s) => storeCall(() => store.summaryHistory(s)).map(rowToWit),
        compactSummaries: (s, c) =>
          rowToWit(
            storeCall(() =>
              store.compactSummaries(s, {
                ...c,
                rows: Array.from(c.rows, num),
                nowMs: num(c.nowMs),
                skipped: c.skipped.map((x) => [num(x.first), num(x.last)]),
                ledger: ledgerToJs(c.ledger),
              }),
            ),
          ),
        partial: (key) => storeCall(() => store.partial(key)) ?? undefined,
        failure: (s) => {
          const m = storeCall(() => store.failure(s));
          return m ? { failures: m.failures, lastError: m.lastError, retryAfterMs: big(m.retryAfterMs), failedMs: big(m.failedMs) } : undefined;
        },
        setFailure: (s, m) =>
          storeCall(() => store.setFailure(s, m ? { failures: m.failures, lastError: m.lastError, retryAfterMs: num(m.retryAfterMs), failedMs: num(m.failedMs) } : undefined)),
        resetSession: (s) => storeCall(() => store.resetSession(s)),
        searchEpisodes: (s, terms, limit) => {
          if (typeof store.searchEpisodes !== 'function') {
            throw toGuest(new AbridgeError('storage', 'this store keeps no full-text index: a custom store implements searchEpisodes(session, terms, limit) to search (see SqliteStore)'));
          }
          const m = storeCall(() => store.searchEpisodes(s ?? undefined, terms, limit));
          return {
            docs: big(m.docs),
            length: big(m.length),
            df: BigUint64Array.from(m.df.map((d) => BigInt(d))),
            matches: m.matches.map((x) => ({ session: x.session, episode: big(x.episode), length: x.length, counts: Uint32Array.from(x.counts) })),
          };
        },
        calibration: (model) => {
          const c = storeCall(() => store.calibration(model));
          return c ? { estimated: big(c.estimated), reported: big(c.reported) } : undefined;
        },
        recordCalibration: (model, estimated, reported) => storeCall(() => store.recordCalibration(model, estimated, reported)),
      },
      'abridge:engine/memory-store': {
        embed: async (texts) => {
          if (!this.#embedder) {
            throw toGuest(new AbridgeError('invalid-input', 'no embedding backend is configured; use the offline embedder (abridge-lexical-v1) or pass embedder'));
          }
          try {
            const e = await this.#embedder.embed(texts);
            return { model: e.model, dim: e.dim, vectors: e.vectors.map((v) => Float32Array.from(v)), tokens: e.tokens ?? 0 };
          } catch (e) {
            throw toGuest(e instanceof AbridgeError ? e : new AbridgeError('server', e?.message ?? String(e)));
          }
        },
        centroids: (scope) => storeCall(() => store.recall.centroids(scope)).map((c) => ({ ...c, cluster: big(c.cluster) })),
        putMemory: (m) => {
          const r = storeCall(() => store.recall.putMemory({ ...m, createdMs: num(m.createdMs), cluster: num(m.cluster) }));
          return { ...r, cluster: big(r.cluster), superseded: r.superseded ?? undefined };
        },
        currentMemory: (scope, factKey) => memToWit(storeCall(() => store.recall.currentMemory(scope, factKey))),
        getMemory: (id) => memToWit(storeCall(() => store.recall.getMemory(id))),
        membersAfter: (cluster, after) => {
          const s = storeCall(() => store.recall.membersAfter(num(cluster), after));
          return { version: big(s.version), count: s.count, members: s.members.map(memToWit) };
        },
        topMembers: (cluster, offset, limit) => storeCall(() => store.recall.topMembers(num(cluster), offset, limit)).map(memToWit),
        memberIds: (cluster, upto) => storeCall(() => store.recall.memberIds(num(cluster), upto)),
        deleteMemory: (id) => memToWit(storeCall(() => store.recall.deleteMemory(id))),
        setVectors: (cluster, model, vectors) => storeCall(() => store.recall.setVectors(num(cluster), model, vectors)),
        summary: (cluster) => sumToWit(storeCall(() => store.recall.summary(num(cluster)))),
        writeSummary: (w) => storeCall(() => store.recall.writeSummary({ ...w, cluster: num(w.cluster), nowMs: num(w.nowMs) })),
        deleteSummary: (cluster) => storeCall(() => store.recall.deleteSummary(num(cluster))),
        setClusterNote: (cluster, note) => storeCall(() => store.recall.setClusterNote(num(cluster), note)),
        search: (query, model, filter, limit) =>
          storeCall(() => store.recall.search(query, model, filter, limit)).map((h) => ({ ...h, cluster: big(h.cluster), coveredSeq: big(h.coveredSeq), supersededBy: h.supersededBy ?? undefined, supersededMs: big(h.supersededMs ?? 0) })),
      },
      ...wasiImports,
    };
  }

  async #guest() {
    return instantiate((name) => this.#modules.get(name), this.#imports());
  }

  /**
   * Store memories `{user, text}` (and optionally `type`, `key`, `project`, `environment`,
   * `importance`, `id`; or the scope as `scope: {user, project, environment, kind, key}`),
   * each in its cluster; clusters that are due come back `due` (summarize them with
   * `summarizeCluster`). Memories without an id get one.
   */
  /** The memory settings of a call: the defaults, the caller's, and with a sealing store the
   * key of the lexical embedding (the Rust host derives the same one from the same data key). */
  #memoryConfig(memoryConfig) {
    const lexicalKey = this.#store.recall?.lexicalKey?.();
    return { ...defaultMemoryConfig, ...(lexicalKey ? { lexicalKey } : {}), ...memoryConfig };
  }

  async remember(items, memoryConfig = {}) {
    const list = items.map((m, i) => {
      // `{user, text}` is a memory, as in every front end: the scope may also be given flat,
      // with `type` (default `fact`) and `key` (default `general`).
      const s = m.scope ?? m;
      return {
      id: m.id ?? `m${Date.now()}-${process.pid}-${i}-${Math.random().toString(16).slice(2, 10)}`,
      scope: { user: s.user, project: s.project ?? '', environment: s.environment ?? '', kind: s.kind ?? s.type ?? 'fact', key: s.key ?? 'general' },
      text: m.text,
      // Without one the guest gives its default.
      importance: m.importance ?? undefined,
      // The memory it replaces; without it the fact found in the text decides.
      replaces: m.replaces ?? undefined,
      };
    });
    const g = await this.#guest();
    const r = await exportCall(() => g.memories.remember(list, this.#memoryConfig(memoryConfig)));
    return r.map((x) => ({ ...x, cluster: num(x.cluster) }));
  }

  /**
   * Bring a cluster's summary to its member set (`action`: created, refreshed, unchanged, …).
   * At most `limits.clusterJobs` run at once; over the monthly ceiling it throws an
   * AbridgeError of kind `quota-exhausted` (with `spent`, `limit`, `resetsAtMs`).
   */
  async summarizeCluster(cluster, config = {}, memoryConfig = {}) {
    const refusal = this.#overCeiling();
    if (refusal) throw refusal;
    return this.#clusterSlots(async () => {
      const g = await this.#guest();
      const o = await exportCall(() => g.memories.summarizeCluster(BigInt(cluster), { ...defaultConfig, ...config }, this.#memoryConfig(memoryConfig)));
      return { ...o, summary: sumToJs(o.summary) };
    });
  }

  /** Write the model calls counted since the last clock reading, dated by `now`. */
  #flushUsage(now) {
    if (!this.#pendingUsage.length) return;
    const calls = this.#pendingUsage.length;
    const [p, o] = this.#pendingUsage.reduce(([a, b], [x, y]) => [a + x, b + y], [0, 0]);
    this.#pendingUsage = [];
    try {
      this.#store.recall?.addUsage(monthOf(now).day, calls, p, o);
    } catch (e) {
      this.#log('warn', `recording model usage failed: ${e.message}`);
    }
  }

  /** This month's model usage (every call the model served), against `limits.ceiling`. */
  usage() {
    const now = this.#clock();
    this.#flushUsage(now);
    const { month, resetsAtMs } = monthOf(now);
    const u = this.#store.recall.usage(month);
    const c = this.#limits.ceiling;
    const costOf = (p, o) => (c ? (p * (c.priceInput ?? 0) + o * (c.priceOutput ?? 0)) / 1e6 : 0);
    const cost = costOf(u.promptTokens, u.outputTokens);
    const tokens = u.promptTokens + u.outputTokens;
    const exhausted = !!c && ((c.tokens !== undefined && tokens >= c.tokens) || (c.cost !== undefined && cost >= c.cost));
    const days = this.#store.recall.usageDays(month).map((d) => ({ ...d, cost: costOf(d.promptTokens, d.outputTokens) }));
    return { month, ...u, cost, limitTokens: c?.tokens, limitCost: c?.cost, exhausted, resetsAtMs, days };
  }

  #overCeiling() {
    const u = this.usage();
    if (!u.exhausted) return undefined;
    const byTokens = u.limitTokens !== undefined && u.promptTokens + u.outputTokens >= u.limitTokens;
    const [spent, limit, unit] = byTokens ? [u.promptTokens + u.outputTokens, u.limitTokens, 'tokens'] : [u.cost, u.limitCost, 'money'];
    const e = new AbridgeError('quota-exhausted', `the monthly budget for summaries is used (${Math.floor(spent)} of ${limit} ${unit} in ${u.month}); clusters are not summarized and recall returns memories until it resets`);
    Object.assign(e, { spent: Math.floor(spent), limit, resetsAtMs: u.resetsAtMs });
    return e;
  }

  /** Delete a memory (a summary that covered it goes at once); `undefined` for an unknown id. */
  async forget(id, memoryConfig = {}) {
    const g = await this.#guest();
    const f = await exportCall(() => g.memories.forget(id, this.#memoryConfig(memoryConfig)));
    return f ? { ...f, cluster: num(f.cluster) } : undefined;
  }

  /** The `k` best memories and cluster summaries for `query` under `filter`. */
  async recall(query, filter = {}, k = 5, memoryConfig = {}) {
    const g = await this.#guest();
    // Over the ceiling, recall falls back to the raw memories.
    const summaries = !this.usage().exhausted;
    const r = await exportCall(() => g.memories.recall(query, { ...filter, exact: !!filter.exact }, k, summaries, this.#memoryConfig(memoryConfig)));
    return r.map((x) => ({ ...x, cluster: num(x.cluster), supersededMs: num(x.supersededMs) }));
  }

  /** A memory by id. */
  memory(id) {
    const m = this.#store.recall.getMemory(id);
    return m ? memToJs(memToWit(m)) : undefined;
  }

  /** Memories under a filter `{user?, project?, environment?, kind?, key?}`, oldest first. */
  memories(filter = {}, { offset = 0, limit = 100 } = {}) {
    return this.#store.recall.list(filter, offset, limit).map((m) => memToJs(memToWit(m)));
  }

  /** The ids of the memories a cluster summary covers, oldest first (it keeps two numbers,
   * `coveredSeq` and `covered`, rather than the list). */
  summarySources(summary) {
    return this.#store.recall.memberIds(summary.cluster, BigInt(summary.coveredSeq));
  }

  /** Clusters with their member ids and summary id. */
  clusters() {
    return this.#store.recall.clusters();
  }

  /** The offline embedder's vectors. */
  async embedLexical(texts) {
    const g = await this.#guest();
    return g.memories.embedLexical(texts).map((v) => Array.from(v));
  }

  /** Create a fresh instance without calling it: what every call pays first (for benchmarks). */
  async instantiateOnly() {
    await this.#guest();
  }

  /**
   * Append episodes `{role, content, timestampMs?, sourceKey}`; the guest estimates their
   * tokens. Returns how many were new (known source keys are skipped).
   */
  async append(session, episodes) {
    const g = await this.#guest();
    return exportCall(() => g.summarizer.append(session, newEpisodes(episodes)));
  }

  /**
   * `append` for an imported transcript (what `parseTranscript` returns): an episode without
   * a timestamp stays undated, since the import's clock is not when it was said.
   */
  async appendImported(session, episodes) {
    const g = await this.#guest();
    return exportCall(() => g.summarizer.appendImported(session, newEpisodes(episodes)));
  }

  /** Run the trigger after an episode write; summarize until caught up if it holds. */
  async afterEpisodeWritten(session, config = {}) {
    const g = await this.#guest();
    return outcomeToJs(await exportCall(() => g.summarizer.afterEpisodeWritten(session, { ...defaultConfig, ...config })));
  }

  /** Summarize now, ignoring the trigger, until every episode is covered. */
  async summarizeNow(session, config = {}) {
    const g = await this.#guest();
    return outcomeToJs(await exportCall(() => g.summarizer.summarizeNow(session, { ...defaultConfig, ...config })));
  }

    /** What summarizeNow would do, without calling the model or writing (see the WIT plan-report). */
  async plan(session, config = {}) {
    const g = await this.#guest();
    const p = await exportCall(() => g.summarizer.plan(session, { ...defaultConfig, ...config }));
    return planToJs(p);
  }

  /** The summary chain, oldest first. */
  async chain(session) {
    const g = await this.#guest();
    return (await exportCall(() => g.summarizer.chain(session))).map(rowToJs);
  }

  /** The session's freshness under `config` (mode, backoff), from the clock; no model call. */
  async freshness(session, config = {}) {
    const g = await this.#guest();
    return freshToJs(await exportCall(() => g.summarizer.freshness(session, { ...defaultConfig, ...config })));
  }

  /** Refresh the session if it is due under `config.mode`; a failure keeps the summary and backs off. */
  async refresh(session, config = {}) {
    const g = await this.#guest();
    return outcomeToJs(await exportCall(() => g.summarizer.refresh(session, { ...defaultConfig, ...config })));
  }

  /** The summary plus the last `pairs` message pairs, within `budget` tokens (see the WIT `context`). */
  async context(session, request = {}, config = {}) {
    const g = await this.#guest();
    const req = { ...defaultContextRequest, ...request };
    req.pins = (req.pins ?? []).map((p) => BigInt(p));
    req.query = req.query == null || req.query === '' ? undefined : String(req.query);
    req.verdictAfter = req.verdictAfter ?? undefined;
    if (req.query !== undefined) await this.indexPending();
    const c = await exportCall(() => g.summarizer.context(session, req, { ...defaultConfig, ...config }));
    return {
      ...c,
      fullTokens: num(c.fullTokens),
      covered: num(c.covered),
      omitted: num(c.omitted),
      coveredFrom: num(c.coveredFrom),
      omittedRanges: c.omittedRanges.map((r) => [num(r.first), num(r.last)]),
      shown: Array.from(c.shown, num),
      stable: { messages: c.stable.messages, chars: num(c.stable.chars) },
      note: c.note ?? undefined,
      verdict: c.verdict ? freshToJs(c.verdict) : undefined,
    };
  }

  /**
   * Full-text search of every message the store holds (of one session with `session`): the
   * `limit` best (1 to 100) after the first `offset`, ranked by BM25 — the same guest and the
   * same index as the Rust host, so the same hits. Returns `{hits: [{session, episode, role,
   * speaker, timestampMs, score, excerpt}], more}`; each excerpt marks the matching words
   * between `**`. Messages stored before the index existed are indexed first.
   */
  async search(query, { session, offset = 0, limit = 20 } = {}) {
    const g = await this.#guest();
    await this.indexPending();
    const page = await exportCall(() => g.summarizer.search(session ?? undefined, String(query), offset, limit));
    return {
      hits: page.hits.map((h) => ({
        session: h.session,
        episode: num(h.episode.id),
        role: h.episode.role,
        speaker: h.episode.speaker,
        timestampMs: num(h.episode.timestampMs),
        content: h.episode.content,
        score: h.score,
        excerpt: h.excerpt,
      })),
      more: page.more,
    };
  }

  /**
   * Index, in batches of 500, the messages stored before the full-text index existed (a
   * database from an older version); `onProgress({done, total})` follows each batch. Returns
   * the messages indexed (0 at once when none wait).
   */
  async indexPending(onProgress = () => {}) {
    const store = this.#store;
    if (typeof store.unindexed !== 'function') return 0;
    const { episodes: total } = store.unindexed();
    if (!total) return 0;
    const g = await this.#guest();
    let done = 0;
    for (let session = store.nextUnindexed(); session !== undefined; session = store.nextUnindexed()) {
      let after = 0;
      for (;;) {
        const page = store.episodesAfter(session, after, 500);
        const last = page.length < 500;
        const terms = await exportCall(() => g.text.indexTerms(page.map((e) => [e.speaker ?? undefined, e.content])));
        store.indexEpisodes(session, page.map((e, i) => [e.id, terms[i]]), last);
        after = page.length ? page[page.length - 1].id : after;
        done += page.length;
        onProgress({ done: Math.min(done, total), total });
        if (last) break;
      }
    }
    return done;
  }

  /** Every summary row of the session, rows compacted into "earlier" rows included. */
  async history(session) {
    const g = await this.#guest();
    return (await exportCall(() => g.summarizer.history(session))).map(rowToJs);
  }

  /**
   * Provenance: summary row `row` and exactly the episodes it covers (`{after, limit}` page
   * them), or with `identifier` the episode that ledger entry was last seen in. Returns
   * `{row, episodes, compacted, nextAfter}`.
   */
  async expand(session, row, { identifier, after = 0, limit = 1000 } = {}) {
    const g = await this.#guest();
    const x = await exportCall(() => g.summarizer.expand(session, BigInt(row), identifier ?? undefined, BigInt(after), limit));
    return {
      row: rowToJs(x.row),
      episodes: x.episodes.map((e) => ({ id: num(e.id), role: e.role, content: e.content, timestampMs: num(e.timestampMs), tokens: e.tokens, speaker: e.speaker })),
      compacted: x.compacted.map(rowToJs),
      nextAfter: num(x.nextAfter),
    };
  }

  /**
   * The session's facts as they stand (where its people live, work, their number, manager,
   * partner, pet, car, a regular day), the facts changed most recently first:
   * `[{who, key, current, values: [{value, fromMs, episode}], ended: {atMs, episode, sentence} | undefined, line}]`.
   */
  async facts(session) {
    const g = await this.#guest();
    return (await exportCall(() => g.summarizer.facts(session))).map((f) => ({
      who: f.who,
      key: f.key,
      current: f.ended ? undefined : f.values[f.values.length - 1]?.value,
      values: f.values.map((v) => ({ value: v.value, fromMs: num(v.fromMs), episode: num(v.episode) })),
      ended: f.ended ? { atMs: num(f.ended.atMs), episode: num(f.ended.episode), sentence: f.ended.sentence } : undefined,
      line: f.line,
    }));
  }

  /** The identifiers the facts ledger takes from a text: `[{text, kind}]`, in order. */
  async identifiers(text) {
    const g = await this.#guest();
    return (await exportCall(() => g.text.identifiers(text))).map((e) => ({ text: e.text, kind: e.kind }));
  }

  /** Delete the session's episodes, summaries and failure marker. */
  async reset(session) {
    const g = await this.#guest();
    return exportCall(() => g.summarizer.reset(session));
  }

  /**
   * Parse a transcript inside the sandbox (the same parser as the Rust host, byte for byte).
   * `source`: a Uint8Array, a string, or an (async) iterable of Uint8Array chunks such as
   * `fs.createReadStream(path)`. Options: `format` (`jsonl`, `openai`, `claude-code`,
   * `chatgpt`; default: detect), `includeTools`, `skipInvalid`, `firstLine`, `name`,
   * `maxEpisodeBytes`, `maxEpisodes` (most messages the input may hold; 0: no limit). Returns `{format, conversations: [{index, id, title, episodes}],
   * warnings}`; episodes are `{role, content, timestampMs, sourceKey}`, ready for `appendImported`.
   * A bad file throws an AbridgeError whose `kind` is the WIT parse-error case.
   */
  async parseTranscript(source, options = {}) {
    const g = await this.#guest();
    const opts = {
      format: options.format ?? undefined,
      includeTools: Boolean(options.includeTools),
      skipInvalid: Boolean(options.skipInvalid),
      firstLine: options.firstLine ?? 0,
      name: options.name ?? 'transcript',
      maxEpisodeBytes: options.maxEpisodeBytes ?? 0,
      whole: true,
      maxEpisodes: BigInt(options.maxEpisodes ?? 0),
    };
    const conversations = [];
    const warnings = [];
    let format;
    // Whole mode: the guest hands over each conversation complete, once, in file order.
    const take = (b) => {
      format = b.format ?? format;
      warnings.push(...b.warnings);
      for (const c of b.conversations) {
        const episodes = c.episodes.map((e) => ({ role: e.role, content: e.content, timestampMs: num(e.timestampMs), sourceKey: e.sourceKey, speaker: e.speaker, item: e.item }));
        conversations.push({ index: c.index, id: c.id, title: c.title, episodes });
      }
    };
    const parseCall = (f) => {
      try {
        return f();
      } catch (e) {
        const p = e?.payload;
        if (p && typeof p.tag === 'string') {
          const val = Array.isArray(p.val) ? p.val.map((x) => (typeof x === 'bigint' ? Number(x) : x)) : p.val;
          // The wording is the guest's, the same as the Rust host's.
          const err = new AbridgeError(p.tag, g.transcripts.describeError(opts.name, p, 'format:'));
          // The structured parts, as the WIT parse-error carries them.
          if (p.tag === 'invalid-utf8') [err.line, err.offset] = val;
          if (p.tag === 'malformed') [err.line, err.reason] = val;
          if (p.tag === 'no-messages') err.format = val;
          if (p.tag === 'too-many-episodes') err.limit = Number(p.val);
          throw err;
        }
        if (e instanceof WebAssembly.RuntimeError) {
          throw new Error(`${opts.name}: the transcript parser stopped (${e.message}); nothing was stored`, { cause: e });
        }
        throw e;
      }
    };
    const parser = parseCall(() => new g.transcripts.Parser(opts));
    const chunks =
      typeof source === 'string' ? [new TextEncoder().encode(source)] : source instanceof Uint8Array ? [source] : source;
    const FEED = 1 << 20;
    for await (const chunk of chunks) {
      const bytes = chunk instanceof Uint8Array ? chunk : new Uint8Array(chunk);
      for (let at = 0; at < bytes.length; at += FEED) {
        take(parseCall(() => parser.feed(bytes.subarray(at, at + FEED))));
      }
    }
    take(parseCall(() => parser.finish()));
    return { format, conversations, warnings };
  }

  /** The component's documented defaults: `{config, context, memory}` (see the WIT
   * `default-config` and `default-memory-config`). */
  async defaults() {
    const g = await this.#guest();
    const [config, context] = await exportCall(() => g.summarizer.defaultConfig());
    const memory = await exportCall(() => g.memories.defaultMemoryConfig());
    // f32 fields arrive as the nearest double (0.2 as 0.20000000298023224): give them back
    // as the shortest decimal that is the same f32, as they are written in the WIT docs.
    const short = (o) =>
      Object.fromEntries(
        Object.entries(o).map(([k, v]) => {
          if (typeof v !== 'number' || Number.isInteger(v)) return [k, v];
          for (let p = 1; p <= 9; p++) {
            const d = Number(v.toPrecision(p));
            if (Math.fround(d) === Math.fround(v)) return [k, d];
          }
          return [k, v];
        }),
      );
    return { config: short(config), context: { ...context, pins: [...context.pins].map(Number) }, memory: short(memory) };
  }

  /** The guest's token estimate. */
  async estimateTokens(text) {
    const g = await this.#guest();
    return exportCall(() => g.text.estimateTokens(text));
  }

  /** The summarization prompt in both renderings: `{messages, chatml}`. */
  async buildPrompt(conversation, previousSummary) {
    const g = await this.#guest();
    return exportCall(() => g.text.buildPrompt(conversation, previousSummary ?? undefined));
  }

  /** Clean raw model output. */
  async stripTemplateTokens(text) {
    const g = await this.#guest();
    return exportCall(() => g.text.stripTemplateTokens(text));
  }
}

/**
 * Create an engine. `store` defaults to a SQLite database in memory, gone with the process
 * (`await SqliteStore.open(path)` keeps one in a file, the same schema as the Rust host's);
 * `llm` defaults to no model (extractive engine only).
 */
/** A plan report with plain numbers. */
function planToJs(p) {
  return { ...p, episodes: num(p.episodes), backlogTokens: num(p.backlogTokens), inputTokens: num(p.inputTokens), outputTokens: num(p.outputTokens) };
}

export async function createEngine({ llm = noModel, store, clock = () => Date.now(), log = () => {}, onProgress = () => {}, onPlan = () => {}, batchConcurrency = 6, embedder, limits } = {}) {
  store ??= await SqliteStore.open(':memory:');
  const modules = await coreModules();
  return new Engine({ llm, store, clock, log, onProgress, onPlan, batchConcurrency, modules, embedder, limits });
}

// The defaults, from the component (see the top of this file): an engine with no model asks
// the exports once, while this module loads (they need no store: an empty one is never read).
const read = await (await createEngine({ store: {} })).defaults();

/** The documented engine defaults, as the component exports them (`default-config`). */
export const defaultConfig = Object.freeze(read.config);

/** The documented context request defaults, as the component exports them. */
export const defaultContextRequest = Object.freeze(read.context);

/** The documented memory defaults, as the component exports them (`default-memory-config`). */
export const defaultMemoryConfig = Object.freeze(read.memory);
