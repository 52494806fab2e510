// The golden vectors in tests/golden, run through the JS host: prompts and stripped outputs
// byte for byte, and whole summary chains (with the model requests) against the test server.
// The Rust tests run the same files; bless them from Rust (ABRIDGE_BLESS=1 cargo test --workspace golden).
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { SqliteStore, createEngine, ollama } from '../src/index.js';
import { GOLDEN, startServer } from './helpers.js';

const cases = (kind) => readdirSync(join(GOLDEN, kind)).map((d) => join(GOLDEN, kind, d)).filter((p) => statSync(p).isDirectory()).sort();
const read = (p) => readFileSync(p, 'utf8');

let server;
before(async () => {
  server = await startServer();
});
after(() => server.close());

test('golden prompts: chat messages and ChatML, byte for byte', async () => {
  const engine = await createEngine({ store: await SqliteStore.open(':memory:') });
  for (const dir of cases('prompts')) {
    const input = JSON.parse(read(join(dir, 'input.json')));
    // Reduce prompts have no text export of their own; the chain goldens below compare them
    // byte for byte as model requests.
    if (input.partials) continue;
    const built = await engine.buildPrompt(input.conversation, input.previous_summary ?? undefined);
    // serde_json writes keys in sorted order: content, then role.
    const messages = JSON.stringify(built.messages.map((m) => ({ content: m.content, role: m.role })), null, 2) + '\n';
    assert.equal(messages, read(join(dir, 'messages.json')), dir);
    assert.equal(built.chatml, read(join(dir, 'chatml.txt')), dir);
  }
});

test('golden stripping, byte for byte', async () => {
  const engine = await createEngine({ store: await SqliteStore.open(':memory:') });
  for (const dir of cases('strip')) {
    assert.equal(await engine.stripTemplateTokens(read(join(dir, 'input.txt'))), read(join(dir, 'expected.txt')), dir);
  }
});

test('golden transcripts: the same episodes as the Rust host, whole and in 7-byte chunks', async () => {
  const engine = await createEngine({ store: await SqliteStore.open(':memory:') });
  const dirs = cases('transcripts');
  assert.ok(dirs.length >= 15, 'golden transcripts missing');
  for (const dir of dirs) {
    const input = readdirSync(dir).find((f) => f.startsWith('input.'));
    const bytes = new Uint8Array(readFileSync(join(dir, input)));
    let o = {};
    try {
      o = JSON.parse(read(join(dir, 'options.json')));
    } catch {}
    const options = {
      name: input,
      includeTools: o.include_tools ?? false,
      skipInvalid: o.skip_invalid ?? false,
      firstLine: o.first_line ?? 0,
      maxEpisodeBytes: o.max_episode_bytes ?? 0,
    };
    const run = async (source) => {
      try {
        const p = await engine.parseTranscript(source, options);
        return {
          format: p.format,
          conversations: p.conversations.map((c) => ({
            index: c.index,
            id: c.id ?? null,
            title: c.title ?? null,
            episodes: c.episodes.map((e) => ({ role: e.role, content: e.content, timestamp_ms: e.timestampMs ?? null, source_key: e.sourceKey, speaker: e.speaker ?? null })),
          })),
          warnings: p.warnings,
        };
      } catch (e) {
        if (!e.kind) throw e;
        const out = { error: e.kind };
        if (e.kind === 'invalid-utf8') Object.assign(out, { line: e.line, offset: e.offset });
        if (e.kind === 'malformed') Object.assign(out, { line: e.line, message: e.reason });
        if (e.kind === 'no-messages') out.format = e.format;
        return out;
      }
    };
    const chunks = [];
    for (let at = 0; at < bytes.length; at += 7) chunks.push(bytes.subarray(at, at + 7));
    const whole = await run(bytes);
    assert.deepEqual(await run(chunks), whole, `${dir}: 7-byte chunks`);
    assert.deepEqual(whole, JSON.parse(read(join(dir, 'expected.json'))), dir);
  }
});

const camel = (k) => k.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
const snakeRow = (r) => ({
  id: r.id, first_episode: r.firstEpisode, last_episode: r.lastEpisode, content: r.content, tokens: r.tokens,
  prompt_tokens: r.promptTokens, output_tokens: r.outputTokens, model: r.model, created_ms: r.createdMs, updated_ms: r.updatedMs,
  skipped: r.skipped,
});

test('golden chains: the same summary chain and model requests as the Rust host', async () => {
  for (const dir of cases('chains')) {
    const input = JSON.parse(read(join(dir, 'input.json')));
    const want = JSON.parse(read(join(dir, 'expected.json')));
    await server.reset();
    let now = 1_767_225_600_000;
    const engine = await createEngine({
      store: await SqliteStore.open(':memory:'),
      llm: ollama({ url: server.url, timeoutMs: 30_000 }),
      clock: () => (now += 1000) - 1000,
    });
    const config = Object.fromEntries(Object.entries(input.config).map(([k, v]) => [camel(k), v]));
    const episodes = input.episodes.map((e, i) => ({ role: e.role, content: e.content, sourceKey: String(i), timestampMs: e.timestamp_ms, speaker: e.speaker }));
    if (input.mode === 'ingest') {
      for (const e of episodes) {
        await engine.append('golden', [e]);
        await engine.afterEpisodeWritten('golden', config);
      }
    } else {
      await engine.append('golden', episodes);
      await engine.summarizeNow('golden', config);
    }
    const chain = (await engine.chain('golden')).map(snakeRow);
    // Batches reach the server concurrently: compare in the canonical order the Rust test
    // uses (sorted by the serialized request; serde_json and this both sort object keys).
    const canon = (v) => (Array.isArray(v) ? v.map(canon) : v && typeof v === 'object' ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, canon(v[k])])) : v);
    const requests = (await server.generations()).map((r) => canon({ path: r.path, body: r.body }));
    requests.sort((a, b) => (JSON.stringify(a) < JSON.stringify(b) ? -1 : JSON.stringify(a) > JSON.stringify(b) ? 1 : 0));
    assert.deepEqual(chain, want.chain, `${dir}: chain`);
    assert.deepEqual(requests, want.requests, `${dir}: model requests`);
    for (const [i, at] of (input.contexts ?? []).entries()) {
      // A budget, or {budget, query}: a context with a query.
      const { budget, query } = typeof at === 'number' ? { budget: at } : at;
      const c = await engine.context('golden', { budget, pairs: 2, refreshAfter: 4294967295, query }, config);
      const got = {
        budget: c.budget,
        tokens: c.tokens,
        parts: c.parts,
        omitted_ranges: c.omittedRanges,
        messages: c.messages.map((m) => ({ role: m.role, content: m.content })),
        stable: c.stable,
      };
      assert.deepEqual(got, want.contexts[i], `${dir}: context at ${budget}`);
    }
  }
});

test('golden ledger: the same identifiers as the Rust host', async () => {
  const engine = await createEngine({ store: await SqliteStore.open(':memory:') });
  const expected = JSON.parse(read(join(GOLDEN, 'ledger', 'expected.json')));
  assert.ok(expected.length >= 10);
  for (const c of expected) {
    assert.deepEqual(await engine.identifiers(c.text), c.identifiers, c.text);
  }
});
