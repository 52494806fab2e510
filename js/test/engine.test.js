// Behaviour of the JS host: trigger and strategy through the model, stores, errors, sandbox.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { AbridgeError, SqliteStore, createEngine, ollama, openai } from '../src/index.js';
import { wasiImports } from '../src/wasi.js';
import { ROOT, assertCovers, closedPortUrl, startServer } from './helpers.js';

let server;
before(async () => {
  server = await startServer();
});
after(() => server.close());

// Short backoff in tests; the policy's shape is the same as in production.
const fast = { attempts: 3, baseMs: 5, maxMs: 20 };
const turn = (i, text) => ({ role: i % 2 ? 'assistant' : 'user', content: text, sourceKey: `k${i}` });
const long = 'The deployment pipeline builds the container image, runs the unit and integration tests, scans the image for known vulnerabilities, signs it, and pushes it to the staging registry, where it waits for a manual promotion to production.';

test('the trigger waits for enough episodes, then summarizes and updates through Ollama', async () => {
  await server.reset();
  const engine = await createEngine({ store: await SqliteStore.open(':memory:'), llm: ollama({ url: server.url, retry: fast }) });
  // The eager trigger (the default is window mode).
  const eager = { mode: 'eager' };
  for (let i = 0; i < 4; i++) {
    await engine.append('s', [turn(i, `${long} Step ${i}.`)]);
    const out = await engine.afterEpisodeWritten('s', eager);
    assert.equal(out.triggered, false);
  }
  assert.equal((await server.generations()).length, 0);
  await engine.append('s', [turn(4, 'And the rollback plan?')]);
  const out = await engine.afterEpisodeWritten('s', eager);
  assert.equal(out.passes, 1);
  assert.deepEqual([out.written[0].firstEpisode, out.written[0].lastEpisode], [1, 5]);
  const gen = (await server.generations())[0];
  assert.equal(gen.path, '/api/chat');
  assert.equal(gen.body.truncate, false);
  assert.equal(gen.body.options.num_ctx, 4096);
  for (let i = 5; i < 10; i++) await engine.append('s', [turn(i, `Rollback step ${i}: redeploy the previous tag.`)]);
  await engine.afterEpisodeWritten('s', eager);
  const chain = await engine.chain('s');
  assert.equal(chain.length, 1);
  assertCovers(assert, chain, 10);
  assert.match(chain[0].content, /continues an earlier summary/);
});

test('appends are idempotent by source key, in both stores', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'abridge-js-'));
  for (const store of [await SqliteStore.open(':memory:'), await SqliteStore.open(join(dir, 'a.db'))]) {
    const engine = await createEngine({ store });
    const eps = [turn(0, 'first message here'), turn(1, 'second message here')];
    assert.equal(await engine.append('s', eps), 2);
    assert.equal(await engine.append('s', eps), 0);
    assert.deepEqual(store.stats('s').episodes, 2);
  }
});

test('an imported transcript keeps no invented times; an appended message its arrival', async () => {
  const store = await SqliteStore.open(':memory:');
  const engine = await createEngine({ store });
  assert.equal(await engine.appendImported('imported', [turn(0, 'yesterday I moved to Lyon')]), 1);
  assert.equal(await engine.append('live', [turn(0, 'yesterday I moved to Lyon')]), 1);
  const [imported] = store.episodesAfter('imported', 0, 10);
  const [live] = store.episodesAfter('live', 0, 10);
  assert.equal(imported.timestampMs ?? null, null);
  assert.equal(typeof live.timestampMs, 'number');
  // Nothing in the context dates the imported message.
  const w = await engine.context('imported', { budget: 200 });
  assert.doesNotMatch(w.messages.map((m) => m.content).join('\n'), /\(= |20\d\d/);
});

test('node:sqlite data survives a new engine and the chain rule is enforced', async () => {
  const path = join(mkdtempSync(join(tmpdir(), 'abridge-js-')), 'chain.db');
  let store = await SqliteStore.open(path);
  let engine = await createEngine({ store });
  await engine.append('s', Array.from({ length: 6 }, (_, i) => turn(i, `${long} (${i})`)));
  await engine.summarizeNow('s', { engine: 'extractive' });
  store.close();
  store = await SqliteStore.open(path);
  engine = await createEngine({ store });
  const chain = await engine.chain('s');
  assertCovers(assert, chain, 6);
  assert.throws(
    () => store.writeSummary('s', { firstEpisode: 3, lastEpisode: 6, content: 'x', tokens: 1, promptTokens: 0, outputTokens: 0, model: 'm', nowMs: 0 }),
    (e) => e instanceof AbridgeError && e.kind === 'conflict' && /must start at episode 7/.test(e.message),
  );
});

test('many openers of a new database file at once all succeed', async () => {
  // Openers racing to switch a new file to WAL can be refused by SQLite without its busy
  // wait; opening tries again instead of failing, and each migration runs once.
  const { Worker } = await import('node:worker_threads');
  const storesUrl = new URL('../src/stores.js', import.meta.url).href;
  const code = `
    const { workerData, parentPort } = require('node:worker_threads');
    const gate = new Int32Array(workerData.gate);
    Atomics.add(gate, 0, 1);
    while (Atomics.load(gate, 0) < workerData.n) Atomics.wait(gate, 0, Atomics.load(gate, 0), 5);
    import(workerData.url)
      .then(({ SqliteStore }) => SqliteStore.open(workerData.path))
      .then((s) => { s.close(); parentPort.postMessage('ok'); },
            (e) => parentPort.postMessage(e.message));`;
  for (let round = 0; round < 5; round++) {
    const path = join(mkdtempSync(join(tmpdir(), 'abridge-js-')), 'race.db');
    const n = 8;
    const gate = new SharedArrayBuffer(4);
    const results = await Promise.all(Array.from({ length: n }, () => new Promise((resolve, reject) => {
      const w = new Worker(code, { eval: true, workerData: { gate, n, path, url: storesUrl } });
      w.once('message', (m) => { resolve(m); w.terminate(); });
      w.once('error', reject);
    })));
    assert.deepEqual(results, Array(n).fill('ok'), `round ${round}`);
    const store = await SqliteStore.open(path);
    store.close();
  }
});

test("another program's database is refused and left untouched", async () => {
  const path = join(mkdtempSync(join(tmpdir(), 'abridge-js-')), 'contacts.db');
  const { DatabaseSync } = await import('node:sqlite');
  const other = new DatabaseSync(path);
  other.exec("CREATE TABLE contacts (name TEXT); INSERT INTO contacts VALUES ('ada')");
  other.close();
  const before = readFileSync(path);
  await assert.rejects(
    SqliteStore.open(path),
    (e) => e instanceof AbridgeError && e.kind === 'storage' && /other tables: contacts/.test(e.message),
  );
  assert.deepEqual(readFileSync(path), before);
});

test('model failures are AbridgeErrors and leave the chain unchanged', async () => {
  await server.reset();
  const store = await SqliteStore.open(':memory:');
  const engine = await createEngine({ store, llm: ollama({ url: server.url, retry: fast }) });
  await engine.append('s', Array.from({ length: 6 }, (_, i) => turn(i, long)));
  await engine.summarizeNow('s');
  const before = await engine.chain('s');
  await engine.append('s', [turn(6, 'one more question about the registry')]);
  const cases = [
    [{ kind: 'status', code: 500, message: 'CUDA error' }, 'server', /HTTP 500.*after 3 attempts/],
    [{ kind: 'garbage' }, 'server', /not JSON/],
    [{ kind: 'reply', text: '<|im_end|>' }, 'rejected-output', /no text/],
    [{ kind: 'reply', text: 'The user asked about', done_reason: 'length' }, 'rejected-output', /output limit/],
  ];
  for (const [fault, kind, re] of cases) {
    // Transient faults are retried (3 attempts), so they must persist to fail the call.
    await server.faults(fault.kind === 'reply' ? [fault] : [fault, fault, fault]);
    await assert.rejects(engine.summarizeNow('s'), (e) => e instanceof AbridgeError && e.kind === kind && re.test(e.message));
    assert.deepEqual(await engine.chain('s'), before);
  }
  const down = await createEngine({ store, llm: ollama({ url: await closedPortUrl(), retry: fast }) });
  await assert.rejects(down.summarizeNow('s'), (e) => e.kind === 'unreachable' && /ollama serve/.test(e.message));
  const missing = await createEngine({ store, llm: ollama({ url: server.url, retry: fast }) });
  await assert.rejects(missing.summarizeNow('s', { model: 'mistral:7b' }), (e) => e.kind === 'model-not-found' && /ollama pull mistral:7b/.test(e.message));
  const out = await engine.summarizeNow('s');
  assert.equal(out.unsummarized, 0);
});

test('raw ChatML through /api/generate and the OpenAI-compatible backend', async () => {
  await server.reset();
  const engine = await createEngine({ store: await SqliteStore.open(':memory:'), llm: ollama({ url: server.url, retry: fast }) });
  await engine.append('s', Array.from({ length: 6 }, (_, i) => turn(i, long)));
  await engine.summarizeNow('s', { rendering: 'chatml' });
  const gen = (await server.generations())[0];
  assert.equal(gen.path, '/api/generate');
  assert.equal(gen.body.raw, true);
  assert.deepEqual(gen.body.options.stop, ['<|im_end|>', '<|im_start|>']);

  const oa = await createEngine({ store: await SqliteStore.open(':memory:'), llm: openai({ baseUrl: `${server.url}/v1`, apiKey: 'sk-test' }) });
  await oa.append('s', Array.from({ length: 6 }, (_, i) => turn(i, long)));
  const out = await oa.summarizeNow('s', { model: 'llama3.2:1b' });
  assert.equal(out.written[0].model, 'llama3.2:1b');
  assert.equal((await server.generations()).at(-1).path, '/v1/chat/completions');
});

test('the guest sees no environment, arguments or working directory, and cannot exit', () => {
  process.env.ABRIDGE_SANDBOX_CANARY = 'leaked';
  const env = wasiImports['wasi:cli/environment'];
  assert.deepEqual(env.getEnvironment(), []);
  assert.deepEqual(env.getArguments(), []);
  assert.equal(env.initialCwd(), undefined);
  assert.throws(() => wasiImports['wasi:cli/exit'].exit({ tag: 'ok' }), /tried to exit/);
});

test('createEngine without a store keeps its rows in a SQLite database in memory', async () => {
  const a = await createEngine({});
  const b = await createEngine({});
  assert.equal(await a.append('s', [turn(0, 'kept here'), turn(1, 'and here')]), 2);
  assert.equal((await a.freshness('s')).episodes, 2);
  assert.equal((await b.freshness('s')).episodes, 0, 'each engine has a database of its own');
});

test('transient faults are retried with backoff; a missing model is not', async () => {
  await server.reset();
  const engine = await createEngine({ store: await SqliteStore.open(':memory:'), llm: ollama({ url: server.url, retry: fast }) });
  await engine.append('s', Array.from({ length: 6 }, (_, i) => turn(i, long)));
  await server.faults([{ kind: 'status', code: 503, message: 'busy' }, { kind: 'disconnect' }]);
  const out = await engine.summarizeNow('s');
  assert.equal(out.passes, 1);
  const gens = await server.generations();
  assert.equal(gens.length, 3);
  assert.ok(gens[2].at_ms > gens[0].at_ms, 'attempts are spaced');
  await server.faults([{ kind: 'status', code: 404, message: "model 'x' not found" }]);
  await engine.append('s', [turn(7, 'one more')]);
  await assert.rejects(engine.summarizeNow('s'), (e) => e.kind === 'model-not-found');
  assert.equal((await server.generations()).length, 4);
});

/** The 12-turn chat fixture as episodes, with one-attempt retries and a small context that
 * makes it three map chunks. */
function chatFixture() {
  const chat = readFileSync(join(ROOT, 'tests', 'fixtures', 'chat.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l, i) => ({ ...JSON.parse(l), sourceKey: String(i) }));
  return { chat, once: { attempts: 1, baseMs: 1, maxMs: 1 }, small: { contextLength: 520, maxOutputTokens: 120 } };
}

test('a failed map chunk is skipped and recorded; too many fail the call', async () => {
  const { chat, once, small } = chatFixture();
  await server.reset();
  const store = await SqliteStore.open(':memory:');
  const engine = await createEngine({ store, llm: ollama({ url: server.url, retry: once }) });
  await engine.append('s', chat.map(({ role, content, sourceKey }) => ({ role, content, sourceKey })));
  await server.faults([{ kind: 'status', code: 500, message: 'boom' }, { kind: 'status', code: 500, message: 'boom' }]);
  await assert.rejects(engine.summarizeNow('s', small), (e) => e.kind === 'server' && /2 of 3 chunks failed, over the 50% limit/.test(e.message));
  assert.deepEqual(await engine.chain('s'), []);
  await server.faults([{ kind: 'status', code: 500, message: 'boom' }]);
  const out = await engine.summarizeNow('s', small);
  assert.deepEqual([out.written[0].firstEpisode, out.written[0].lastEpisode], [1, 12]);
  assert.equal(out.written[0].skipped.length, 1);
});

test('answers are cached as they arrive and progress is reported per stage', async () => {
  const { chat, once, small } = chatFixture();
  await server.reset();
  const store = await SqliteStore.open(':memory:');
  const progress = [];
  const plans = [];
  const engine = await createEngine({ store, llm: ollama({ url: server.url, retry: once }), onProgress: (p) => progress.push(p), onPlan: (p) => plans.push(p) });
  await engine.append('s', chat.map(({ role, content, sourceKey }) => ({ role, content, sourceKey })));
  // Two of three map chunks fail: nothing is written, but the good answer was cached.
  await server.faults([{ kind: 'status', code: 500, message: 'boom' }, { kind: 'status', code: 500, message: 'boom' }]);
  await assert.rejects(engine.summarizeNow('s', small));
  const asked = (await server.generations()).length;
  assert.equal(asked, 3);
  // The rerun asks only for the two failed chunks, then merges.
  // The call planned once, before its first model call, as plan() would.
  assert.equal(plans.length, 1);
  assert.equal(plans[0].path, 'map-reduce');
  assert.equal(plans[0].chunks, 3);
  progress.length = 0;
  plans.length = 0;
  const planned = await engine.plan('s', small);
  await engine.summarizeNow('s', small);
  assert.deepEqual(plans, [planned]);
  const again = (await server.generations()).slice(asked);
  const maps = again.filter((r) => r.body.messages[0].content.startsWith('You write summaries'));
  assert.equal(maps.length, 2);
  assert.deepEqual(progress[0], { level: 0, done: 1, total: 3 });
  assert.deepEqual(progress.filter((p) => p.level === 0).at(-1), { level: 0, done: 3, total: 3 });
  assert.ok(progress.some((p) => p.level === 1));
});

test('a database written by the JS host is read by the Rust runner (shared schema)', async (t) => {
  const { existsSync } = await import('node:fs');
  const { execFileSync } = await import('node:child_process');
  const { ROOT } = await import('./helpers.js');
  const bin = join(ROOT, 'target', 'debug', 'abridge');
  if (!existsSync(bin)) {
    // CI builds it first and sets ABRIDGE_REQUIRE_BINARY: there this test cannot pass by skipping.
    assert.ok(!process.env.ABRIDGE_REQUIRE_BINARY, `ABRIDGE_REQUIRE_BINARY is set but ${bin} is not built (run cargo test first)`);
    t.skip(`SKIPPED: ${bin} not built (cargo test builds it)`);
    return;
  }
  const path = join(mkdtempSync(join(tmpdir(), 'abridge-js-')), 'shared.db');
  const store = await SqliteStore.open(path);
  const engine = await createEngine({ store });
  await engine.append('shared', Array.from({ length: 6 }, (_, i) => turn(i, `${long} (${i})`)));
  await engine.summarizeNow('shared', { engine: 'extractive' });
  const jsChain = await engine.chain('shared');
  store.close();
  const out = JSON.parse(execFileSync(bin, ['summaries', 'shared', '--json', '--db', path], { encoding: 'utf8', env: { HOME: tmpdir() } }));
  assert.equal(out.episodes, 6);
  assert.equal(out.summaries[0].content, jsChain[0].content);
  assert.deepEqual([out.summaries[0].first_episode, out.summaries[0].last_episode], [1, 6]);
});

test('idle mode by the clock, failure markers with backoff, context within budget, reset', async () => {
  await server.reset();
  const dir = mkdtempSync(join(tmpdir(), 'abridge-fresh-'));
  const store = await SqliteStore.open(join(dir, 'a.db'));
  let now = Date.UTC(2026, 0, 1, 10);
  const hour = 3_600_000;
  const once = { attempts: 1, baseMs: 1, maxMs: 1 };
  const engine = await createEngine({ store, clock: () => now, llm: ollama({ url: server.url, retry: once }) });
  const idle = { mode: 'idle' };
  await engine.append('s', Array.from({ length: 12 }, (_, i) => ({ ...turn(i, `${long} (${i})`), timestampMs: now })));
  let f = await engine.freshness('s', idle);
  assert.equal(f.state, 'waiting', f.reason);
  assert.equal(f.dueAtMs, now + hour);
  assert.equal((await engine.refresh('s', idle)).triggered, false);
  assert.equal((await server.generations()).length, 0);
  now += hour;
  // The model fails: the marker records it, nothing is written, and the next try waits.
  await server.faults([{ kind: 'status', code: 503, message: 'down' }]);
  await assert.rejects(engine.refresh('s', idle), (e) => e.kind === 'server');
  assert.deepEqual(await engine.chain('s'), []);
  f = await engine.freshness('s', idle);
  assert.equal(f.state, 'backing-off', f.reason);
  assert.equal(f.failures, 1);
  assert.equal(store.failure('s').failures, 1);
  now += 60_000;
  const out = await engine.refresh('s', idle);
  assert.equal(out.passes, 1);
  assert.equal(store.failure('s'), undefined);
  assert.equal((await engine.freshness('s', idle)).state, 'fresh');
  // Context: a system message with the summary, then recent turns, within the budget.
  const w = await engine.context('s', { budget: 300, pairs: 2 });
  assert.ok(w.tokens <= 300);
  assert.equal(w.messages[0].role, 'system');
  assert.ok(w.messages[0].content.startsWith('[abridge] Summary'));
  assert.ok(w.fullTokens > w.tokens);
  // The messages after it name their episodes: the newest, in order.
  assert.equal(w.shown.length, w.messages.length - 1);
  assert.equal(w.shown.at(-1), store.stats('s').episodes);
  assert.ok(w.shown.every((id, i) => i === 0 || id > w.shown[i - 1]));
  // Feeding that system message back in is refused as abridge's own output.
  assert.equal(await engine.append('s', [{ role: 'system', content: w.messages[0].content, sourceKey: 'echo' }]), 0);
  await engine.reset('s');
  assert.deepEqual(await engine.chain('s'), []);
  assert.equal(store.stats('s').episodes, 0);
  store.close();
});

test('search: every message, hostile queries as words, the same hits as the Rust host, older messages indexed', async (t) => {
  const path = join(mkdtempSync(join(tmpdir(), 'abridge-js-')), 'search.db');
  const store = await SqliteStore.open(path);
  const engine = await createEngine({ store });
  const said = Array.from({ length: 30 }, (_, i) => turn(i, `Turn ${i}: the weather and the garden, nothing more.`));
  said[4] = turn(4, 'The launch code for the Zephyr project is 7741.');
  await engine.append('chat', said);
  await engine.append('other', [turn(0, 'Zephyr plans for the other chat.')]);
  const r = await engine.search('zephyr launch');
  assert.deepEqual(r.hits.map((h) => [h.session, h.episode]), [['chat', 5], ['other', 1]]);
  assert.match(r.hits[0].excerpt, /\*\*launch\*\*.*\*\*Zephyr\*\*/);
  // One session; paged.
  assert.deepEqual((await engine.search('zephyr', { session: 'other' })).hits.map((h) => h.episode), [1]);
  const page = await engine.search('garden', { limit: 2 });
  assert.equal(page.hits.length, 2);
  assert.equal(page.more, true);
  // Quotes, operators, column filters and wildcards are words.
  for (const q of ['"zephyr launch"', 'NEAR(zephyr launch, 2)', 'zephyr*', '-zephyr', 'content:zephyr', "zephyr'; DROP TABLE episodes; --", 'zephyr '.repeat(3000)]) {
    assert.ok((await engine.search(q)).hits.some((h) => h.session === 'chat' && h.episode === 5), q.slice(0, 40));
  }
  assert.deepEqual((await engine.search('"" () *')).hits, []);
  // A context with a query carries the matching turn, numbered and dated.
  const c = await engine.context('chat', { budget: 200, pairs: 2, refreshAfter: 4294967295, query: 'What is the Zephyr launch code?' }, { engine: 'extractive' });
  assert.ok(c.found >= 1 && c.parts.found > 0, JSON.stringify(c.parts));
  // They change every call, so they ride on the newest message, after the stable prefix.
  assert.match(c.note, /Earlier turns that match the question[\s\S]*#5 .*7741/);
  assert.ok(c.messages.at(-1).content.startsWith(c.note));
  assert.ok(c.stable.messages < c.messages.length, JSON.stringify(c.stable));
  // Messages stored before the index existed are indexed on the next search, in batches.
  const { DatabaseSync } = await import('node:sqlite');
  store.close();
  const raw = new DatabaseSync(path);
  raw.exec('DELETE FROM episode_terms; DELETE FROM search_totals; UPDATE sessions SET indexed = 0');
  raw.close();
  const again = await SqliteStore.open(path);
  const engine2 = await createEngine({ store: again });
  assert.deepEqual(again.unindexed(), { sessions: 2, episodes: 31 });
  const seen = [];
  assert.equal(await engine2.indexPending((p) => seen.push(p)), 31);
  assert.deepEqual(seen.at(-1), { done: 31, total: 31 });
  const js = await engine2.search('zephyr launch');
  assert.deepEqual(js.hits.map((h) => [h.session, h.episode]), [['chat', 5], ['other', 1]]);
  again.close();
  // The Rust host reads the same index and ranks alike.
  const { existsSync } = await import('node:fs');
  const { execFileSync } = await import('node:child_process');
  const bin = join(ROOT, 'target', 'debug', 'abridge');
  if (!existsSync(bin)) {
    assert.ok(!process.env.ABRIDGE_REQUIRE_BINARY, `ABRIDGE_REQUIRE_BINARY is set but ${bin} is not built (run cargo test first)`);
    t.skip(`SKIPPED: ${bin} not built (cargo test builds it)`);
    return;
  }
  const out = JSON.parse(execFileSync(bin, ['search', 'zephyr launch', '--json', '--db', path], { encoding: 'utf8', env: { HOME: tmpdir() } }));
  assert.deepEqual(out.hits.map((h) => [h.session, h.episode, h.excerpt]), js.hits.map((h) => [h.session, h.episode, h.excerpt]));
  assert.deepEqual(out.hits.map((h) => Math.round(h.score * 1000) / 1000), js.hits.map((h) => Math.round(h.score * 1000) / 1000));
});

test('facts: what holds now, what it replaced and where it was said, the same as the Rust host reads them', async () => {
  const engine = await createEngine({ store: await SqliteStore.open(':memory:') });
  const said = ['I live in Porto, close to the river.', 'I drive a blue Skoda to work every day.', 'Big news: we moved to Lyon last weekend!', 'I sold the blue Skoda, I take the bus now.'];
  const day = 86_400_000;
  const t0 = Date.UTC(2025, 2, 1, 10);
  const episodes = said.flatMap((text, i) => [
    { role: 'user', speaker: 'Robin', content: text, sourceKey: `u${i}`, timestampMs: t0 + i * 2 * day },
    { role: 'assistant', content: 'Thanks for telling me.', sourceKey: `a${i}`, timestampMs: t0 + i * 2 * day + 60_000 },
  ]);
  await engine.append('robin', episodes);
  await engine.summarizeNow('robin', { engine: 'extractive' });
  const facts = await engine.facts('robin');
  const lives = facts.find((f) => f.key === 'lives in');
  assert.equal(lives.current, 'Lyon');
  assert.deepEqual(lives.values.map((v) => [v.value, v.episode]), [['Porto', 1], ['Lyon', 5]]);
  assert.equal(lives.line, 'Robin lives in: Lyon (since 5 Mar 2025; before: Porto)');
  const car = facts.find((f) => f.key === 'car');
  assert.equal(car.current, undefined);
  assert.equal(car.ended.episode, 7);
  assert.equal(facts[0].key, 'car', 'the newest change first');
  // (A context's facts block is in the golden chain facts-change, run by both hosts.)
});
