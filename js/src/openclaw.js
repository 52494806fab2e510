// abridge as an OpenClaw context engine (the `contextEngine` slot; `openclaw` on npm). The
// plugin folder `js/openclaw/` registers what this file builds. The engine runs the same
// component as every other host, in process, over a SQLite file; no server is needed.
//
// Lifecycle, as OpenClaw drives it:
// - `commitTurn` (and `ingest`) store each message of a turn in the abridge session of the
//   OpenClaw session, idempotently (a turn's advancement key names its messages);
// - `afterTurn` lets a fold that is due run in the background, never blocking the turn;
// - `assemble` answers abridge's context at the budget OpenClaw gives, the newest user message
//   as its query: once abridge has folded the session, the summary (stable until the next
//   fold, so a provider's prompt cache keeps it) goes into the system prompt addition, the
//   turns abridge keeps verbatim are OpenClaw's own messages, and what changes every turn (the
//   earlier turns that answer the question) rides last; before any fold, the history as it is;
// - `compact` (on `/compact` and on overflow; abridge owns compaction) folds now.
//
// With `serveUrl` (and `token`) it uses an `abridge serve` instead of the component in process:
// the same calls over HTTP, the server's workers folding in the background.

import { createHash } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';

import { createEngine, noModel, ollama, SqliteStore } from './index.js';

export const ENGINE_ID = 'abridge';

/** A context request's `refreshAfter` that leaves every fold to the caller. */
const NEVER = 4294967295;

/** How long `compact` over an `abridge serve` waits for the fold it asked for. */
const COMPACT_WAIT_MS = 10 * 60_000;

/** A short, stable digest of `text` (for names and keys, not for security). */
function digest(text) {
  return createHash('sha256').update(text).digest('hex').slice(0, 24);
}

/** The abridge session of an OpenClaw session id. */
export function sessionOf(sessionId) {
  const s = String(sessionId ?? '').trim();
  if (/^[A-Za-z0-9][A-Za-z0-9._:-]{0,120}$/.test(s)) return `openclaw-${s}`;
  return `openclaw-${digest(s)}`;
}

/** An ingested message's key: when, who and what it said (a message given twice is stored once). */
const ingestKey = (m) => `ingest:${m.timestamp ?? ''}:${m.role}:${digest(textOf(m))}`;

/** A message's text: a string, or its text parts. */
export function textOf(m) {
  const c = m?.content;
  if (typeof c === 'string') return c;
  if (Array.isArray(c)) return c.filter((p) => p && p.type === 'text' && typeof p.text === 'string').map((p) => p.text).join('\n');
  return '';
}

/** abridge's role for an OpenClaw message (none for what is not part of the dialogue). */
function roleOf(m) {
  switch (m?.role) {
    case 'user':
      return 'user';
    case 'assistant':
      return 'assistant';
    case 'toolResult':
      return 'tool';
    default:
      return null;
  }
}

/** The messages abridge stores of `messages`: those with a role and some text. */
function stored(messages) {
  return (messages ?? []).filter((m) => roleOf(m) && textOf(m).trim());
}

function episodes(messages, keyOf) {
  return stored(messages).map((m, i) => ({
    role: roleOf(m),
    content: textOf(m),
    sourceKey: keyOf(m, i),
    timestampMs: typeof m.timestamp === 'number' && Number.isFinite(m.timestamp) ? m.timestamp : undefined,
  }));
}

/** Open the engine over its SQLite file, saying what to fix when Node or the file is unusable. */
export async function openEngine(config = {}, ctx = {}) {
  const major = Number(process.versions.node.split('.')[0]);
  if (major < 24) {
    throw new Error(
      `abridge's context engine needs Node 24 or later (the component uses JSPI); this OpenClaw runs on Node ${process.versions.node}: run it with Node 24`,
    );
  }
  const dbPath = config.dbPath || join(ctx.agentDir || ctx.workspaceDir || join(homedir(), '.openclaw'), 'abridge', 'abridge.db');
  try {
    mkdirSync(dirname(dbPath), { recursive: true });
  } catch (e) {
    throw new Error(`abridge cannot make the folder of its database ${dbPath} (${e.message}): set plugins.entries.abridge.config.dbPath to a file in a writable folder`);
  }
  let store;
  try {
    store = await SqliteStore.open(dbPath);
  } catch (e) {
    throw new Error(`abridge cannot open its database ${dbPath} (${e.message}): set plugins.entries.abridge.config.dbPath to a writable SQLite file abridge made, or a new one`);
  }
  const llm = config.modelUrl ? ollama({ url: config.modelUrl }) : noModel;
  return { engine: await createEngine({ store, llm }), store, dbPath };
}

/** An `abridge serve` as the engine's backend: the calls the engine makes, over HTTP. */
export function serveBackend(serveUrl, token) {
  const base = String(serveUrl).replace(/\/+$/, '');
  const call = async (method, path, body) => {
    let r;
    try {
      r = await fetch(`${base}${path}`, {
        method,
        headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw new Error(`abridge serve at ${base} is not reachable (${e.cause?.message ?? e.message}): start it, or fix plugins.entries.abridge.config.serveUrl`);
    }
    const v = await r.json().catch(() => ({}));
    if (!r.ok) {
      const err = new Error(`abridge serve at ${base}: ${v?.error?.message ?? r.statusText} (HTTP ${r.status})${v?.error?.hint ? ` — ${v.error.hint}` : ''}`);
      err.status = r.status;
      throw err;
    }
    return v;
  };
  const at = (session) => `/v1/sessions/${encodeURIComponent(session)}`;
  return {
    async append(session, eps) {
      if (!eps.length) return 0;
      const v = await call('POST', `${at(session)}/messages`, {
        messages: eps.map((e) => ({ role: e.role, content: e.content, id: e.sourceKey, ...(e.timestampMs ? { timestamp: e.timestampMs } : {}) })),
      });
      return v.stored;
    },
    async context(session, { budget, query }) {
      const q = new URLSearchParams({ budget: String(budget), refresh_after: String(NEVER) });
      if (query) q.set('query', query);
      try {
        const v = await call('GET', `${at(session)}/context?${q}`);
        return { messages: v.messages, covered: v.covered, note: v.note ?? undefined, tokens: v.tokens, fullTokens: v.full_tokens };
      } catch (e) {
        if (e.status === 404) return { messages: [], covered: 0, tokens: 0, fullTokens: 0 };
        throw e;
      }
    },
    // The server queues a due fold itself when messages arrive.
    foldLater() {},
    async compact(session) {
      let v;
      try {
        v = await call('POST', `${at(session)}/refresh`, {});
      } catch (e) {
        if (e.status === 404) return { folded: false, summary: '' };
        throw e;
      }
      const job = v.id ?? v.job?.id;
      if (job != null) {
        // Until the fold ends (a model may take minutes), and no longer than COMPACT_WAIT_MS.
        const until = Date.now() + COMPACT_WAIT_MS;
        for (;;) {
          const j = await call('GET', `/v1/jobs/${job}`);
          if (['succeeded', 'failed', 'cancelled'].includes(j.state)) {
            if (j.state !== 'succeeded') throw new Error(`abridge serve's fold of ${session} ${j.state}${j.error ? `: ${j.error}` : ''}`);
            break;
          }
          if (Date.now() >= until) {
            throw new Error(
              `abridge serve's fold of ${session} (job ${job}) has not ended after ${COMPACT_WAIT_MS / 60000} minutes; it goes on there (GET ${base}/v1/jobs/${job}), and the next turn uses it once it ends`,
            );
          }
          await new Promise((r) => setTimeout(r, 200));
        }
      }
      const rows = (await call('GET', `${at(session)}/summaries`)).summaries ?? [];
      return { folded: job != null, summary: rows.map((r) => r.content ?? r.text ?? '').join('\n\n'), tokensAfter: rows.reduce((n, r) => n + (r.tokens ?? 0), 0) };
    },
    async close() {},
  };
}

/** The component in process as the engine's backend (`foldConfig`: abridge's config). */
export function localBackend({ engine, store }, foldConfig, log = true) {
  const folds = new Map();
  const covered = (chain) => chain.reduce((m, r) => Math.max(m, r.lastEpisode), 0);
  return {
    append: (session, eps) => (eps.length ? engine.append(session, eps) : 0),
    // (The engine folds in the background itself: the context never calls the model.)
    context: (session, { budget, query }) => engine.context(session, { budget, query, refreshAfter: NEVER }, foldConfig),
    /** A due fold of `session`, in the background (one at a time per session). */
    foldLater(session) {
      if (folds.has(session)) return;
      const p = engine
        .refresh(session, foldConfig)
        .catch((e) => {
          if (log) console.error(`abridge: the fold of ${session} failed (${e.message}); the previous summary is kept`);
        })
        .finally(() => folds.delete(session));
      folds.set(session, p);
    },
    async compact(session, force) {
      await folds.get(session);
      const was = covered(await engine.chain(session));
      // `force` (`/compact`): fold everything now; else only what is due.
      if (force === false) await engine.refresh(session, foldConfig);
      else await engine.summarizeNow(session, foldConfig);
      const chain = await engine.chain(session);
      return {
        folded: covered(chain) > was,
        summary: chain.map((r) => r.content).join('\n\n'),
        tokensAfter: chain.reduce((n, r) => n + r.tokens, 0),
      };
    },
    async close() {
      await Promise.allSettled([...folds.values()]);
      store.close?.();
    },
  };
}

/** The context engine OpenClaw's factory returns (`config`: the plugin's config entry). */
export function createContextEngine(config = {}, ctx = {}) {
  // abridge's own settings (`config.abridge`: any field of its config, such as `mode` or
  // `windowMessages`), and the model it folds with; without a model server, the extractive
  // summarizer.
  const foldConfig = {
    ...(config.modelUrl ? {} : { engine: 'extractive' }),
    ...(config.model ? { model: config.model } : {}),
    ...(config.abridge ?? {}),
  };
  let opened;
  const open = () =>
    (opened ??= config.serveUrl
      ? Promise.resolve(serveBackend(config.serveUrl, config.token))
      : openEngine(config, ctx).then((e) => localBackend(e, foldConfig, config.log !== false)));

  return {
    info: {
      id: ENGINE_ID,
      name: 'abridge',
      version: '0.1.0',
      ownsCompaction: true,
      turnMaintenanceMode: 'background',
      transcriptSemantics: {
        currentTurnFence: 'before-current-turn-entry-v1',
        turnAdvancementIdempotency: 'atomic-idempotent-v1',
      },
    },

    async ingest({ sessionId, message }) {
      const b = await open();
      const added = await b.append(sessionOf(sessionId), episodes([message], ingestKey));
      return { ingested: added > 0 };
    },

    async ingestBatch({ sessionId, messages }) {
      const b = await open();
      return { ingestedCount: await b.append(sessionOf(sessionId), episodes(messages, ingestKey)) };
    },

    async commitTurn({ advancementKey, sessionId, messages }) {
      const b = await open();
      const session = sessionOf(sessionId);
      const eps = episodes(messages, (_, i) => `${advancementKey}#${i}`);
      const added = await b.append(session, eps);
      b.foldLater(session);
      return { status: eps.length && added === 0 ? 'duplicate' : 'committed' };
    },

    async afterTurn({ sessionId }) {
      (await open()).foldLater(sessionOf(sessionId));
    },

    async assemble({ sessionId, messages, tokenBudget, prompt }) {
      const b = await open();
      const session = sessionOf(sessionId);
      const given = messages ?? [];
      const budget = Math.max(256, Math.floor(tokenBudget || config.budget || 8000));
      const newestUser = [...given].reverse().find((m) => m.role === 'user');
      const query = (typeof prompt === 'string' && prompt.trim()) || (newestUser && textOf(newestUser).trim()) || undefined;
      const c = await b.context(session, { budget, query });
      if (!c.covered) {
        // Nothing folded yet: the history as OpenClaw holds it.
        return { messages: given, estimatedTokens: c.fullTokens };
      }
      const system = c.messages.filter((m) => m.role === 'system').map((m) => m.content.trim()).join('\n\n');
      // The turns abridge shows verbatim are the newest it stores: OpenClaw's own messages
      // for them (their every field kept), from the first of them on.
      const kept = c.messages.filter((m) => m.role !== 'system').length;
      const dialogue = given.map((m, i) => [m, i]).filter(([m]) => roleOf(m) && textOf(m).trim());
      const from = kept === 0 ? given.length : dialogue[Math.max(0, dialogue.length - kept)]?.[1] ?? 0;
      const out = given.slice(from);
      if (c.note) {
        // What changes every turn goes last, after everything that stays.
        const at = given.length ? given[given.length - 1].timestamp : undefined;
        out.push({ role: 'user', content: [{ type: 'text', text: c.note }], timestamp: typeof at === 'number' ? at : 0 });
      }
      // Fenced, so the model (and a reader of the prompt) tells abridge's part from the rest
      // of OpenClaw's system prompt.
      const addition = system ? `<abridge-context>\n${system}\n</abridge-context>` : undefined;
      return { messages: out, estimatedTokens: c.tokens, systemPromptAddition: addition };
    },

    async compact({ sessionId, force, tokenBudget, runtimeContext }) {
      const b = await open();
      const session = sessionOf(sessionId);
      // Before a turn OpenClaw asks for a fold when its own transcript has outgrown the
      // window (`preflight_required`). The model receives what `assemble` gives, so a fold is
      // due only when that does not fit: abridge's context once it has folded, else the
      // history as it is.
      if (runtimeContext?.forceReason === 'preflight_required' && tokenBudget > 0) {
        const c = await b.context(session, { budget: Math.floor(tokenBudget) });
        const sent = c.covered ? c.tokens : c.fullTokens;
        if (sent <= tokenBudget) {
          return { ok: true, compacted: false, reason: `already under target: what abridge assembles is ${sent} of ${Math.floor(tokenBudget)} tokens` };
        }
      }
      const before = await b.context(session, { budget: 1 << 20 });
      const r = await b.compact(session, force);
      if (!r.folded) {
        // Said as OpenClaw reads a no-op (not a failure that stops the turn).
        const reason = !r.summary
          ? 'nothing to compact yet: abridge holds no messages of this session'
          : force === false
            ? 'below threshold: no fold is due'
            : "already compacted: abridge's summary covers every message it holds";
        return { ok: true, compacted: false, reason };
      }
      return {
        ok: true,
        compacted: true,
        result: { summary: r.summary, tokensBefore: before.fullTokens, tokensAfter: r.tokensAfter },
      };
    },

    async dispose() {
      if (opened) await (await opened).close();
    },
  };
}
