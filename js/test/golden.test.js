// The golden vectors in tests/golden, run through the JS host: prompts and stripped outputs
// byte for byte, and whole summary chains (with the model requests) against the test server.
// The Rust tests run the same files; bless them from Rust (ABRIDGE_BLESS=1 cargo test --workspace golden).
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { MemoryStore, createEngine, ollama } from '../src/index.js';
import { GOLDEN, startServer } from './helpers.js';

const cases = (kind) => readdirSync(join(GOLDEN, kind)).map((d) => join(GOLDEN, kind, d)).filter((p) => statSync(p).isDirectory()).sort();
const read = (p) => readFileSync(p, 'utf8');

let server;
before(async () => {
  server = await startServer();
});
after(() => server.close());

test('golden prompts: chat messages and ChatML, byte for byte', async () => {
  const engine = await createEngine({ store: new MemoryStore() });
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
  const engine = await createEngine({ store: new MemoryStore() });
  for (const dir of cases('strip')) {
    assert.equal(await engine.stripTemplateTokens(read(join(dir, 'input.txt'))), read(join(dir, 'expected.txt')), dir);
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
      store: new MemoryStore(),
      llm: ollama({ url: server.url, timeoutMs: 30_000 }),
      clock: () => (now += 1000) - 1000,
    });
    const config = Object.fromEntries(Object.entries(input.config).map(([k, v]) => [camel(k), v]));
    const episodes = input.episodes.map((e, i) => ({ role: e.role, content: e.content, sourceKey: String(i) }));
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
  }
});
