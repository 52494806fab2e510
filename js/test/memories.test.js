// Memories and cluster summaries through the JS host: the golden cluster decisions shared with
// the Rust host, a summary naming its sources, deletes that never resurface, and the SQLite
// store's tables.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { SqliteStore, createEngine } from '../src/index.js';
import { GOLDEN } from './helpers.js';

async function decisions(store) {
  const engine = await createEngine({ store });
  const out = {};
  for (const line of readFileSync(join(GOLDEN, 'clusters', 'memories.jsonl'), 'utf8').split('\n')) {
    if (!line.trim()) continue;
    const v = JSON.parse(line);
    const [r] = await engine.remember([{ id: v.id, scope: { user: v.user, project: v.project, environment: v.environment, kind: v.type, key: v.key }, text: v.text, importance: 0.5 }]);
    out[v.id] = { cluster: r.cluster, created: r.created, due: r.due };
  }
  return out;
}

test('golden cluster decisions: the same as the Rust host, in SQLite in memory and in a file', async () => {
  const want = JSON.parse(readFileSync(join(GOLDEN, 'clusters', 'expected.json'), 'utf8'));
  assert.deepEqual(await decisions(await SqliteStore.open(':memory:')), want);
  const dir = mkdtempSync(join(tmpdir(), 'abridge-js-'));
  const store = await SqliteStore.open(join(dir, 'g.db'));
  assert.deepEqual(await decisions(store), want);
  store.close();
});

const EDITOR = ['Alice prefers the dark theme in her editor', 'Alice uses a dark theme with large fonts in the editor', 'Alice wants the editor theme dark at night'];
const scope = { user: 'alice', project: 'web', environment: 'prod', kind: 'preference', key: 'editor' };

test('the smallest memory is {user, text}: related facts without a key cluster and come due together', async () => {
  const engine = await createEngine({ store: await SqliteStore.open(':memory:') });
  const r = await engine.remember(EDITOR.map((text) => ({ user: 'alice', text })));
  assert.equal(new Set(r.map((x) => x.cluster)).size, 1);
  assert.deepEqual(r.map((x) => x.due), [false, false, true]);
  const m = engine.memory(r[0].id);
  assert.equal(m.scope?.key ?? m.key, 'general');
});

test('three facts make one summary with its sources; a delete drops it and its text', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'abridge-js-'));
  const store = await SqliteStore.open(join(dir, 'm.db'));
  const engine = await createEngine({ store });
  const r = await engine.remember(EDITOR.map((text, i) => ({ id: `m${i}`, scope, text })));
  assert.deepEqual(r.map((x) => x.due), [false, false, true]);
  const o = await engine.summarizeCluster(r[2].cluster, { engine: 'extractive' });
  assert.equal(o.action, 'created');
  assert.equal(o.summary.covered, 3);
  assert.deepEqual(engine.summarySources(o.summary), ['m0', 'm1', 'm2']);
  for (const t of EDITOR) assert.ok(o.summary.text.includes(t), o.summary.text);
  const again = await engine.summarizeCluster(r[2].cluster, { engine: 'extractive' });
  assert.equal(again.action, 'unchanged');
  const hits = await engine.recall('dark editor theme', {}, 10);
  const summary = hits.find((h) => h.kind === 'summary');
  assert.deepEqual(summary.sources, ['m0', 'm1', 'm2']);
  const f = await engine.forget('m1');
  assert.equal(f.summaryDeleted, true);
  assert.equal(f.due, false);
  const after = await engine.recall('large fonts', {}, 10);
  assert.ok(after.every((h) => !h.text.includes('large fonts')));
  assert.ok(after.every((h) => h.kind === 'memory'));
  assert.equal(await engine.forget('m1'), undefined);
  assert.equal(engine.memory('m0').text, EDITOR[0]);
  assert.deepEqual(engine.clusters()[0].members, ['m0', 'm2']);
  assert.deepEqual(engine.memories({ user: 'alice', kind: 'preference' }).map((m) => m.id), ['m0', 'm2']);
  assert.deepEqual(engine.memories({ user: 'bob' }), []);
  store.close();
});

test('bad memories are refused with what to fix', async () => {
  const engine = await createEngine({ store: await SqliteStore.open(':memory:') });
  await assert.rejects(engine.remember([{ id: 'x', scope, text: 't', importance: 3 }]), /from 0 to 1/);
  await assert.rejects(engine.remember([{ id: 'x', scope: { ...scope, key: '' }, text: 't' }]), /key is empty/);
  await assert.rejects(engine.remember([{ id: 'x', scope, text: 't' }], { embedder: 'nomic-embed-text' }), /no embedding backend/);
});

test('sealed at rest with the Rust host\'s scheme: no canary on disk, and the binary reads what JS wrote', async () => {
  const { execFileSync } = await import('node:child_process');
  const { existsSync, readFileSync: read } = await import('node:fs');
  const { ROOT } = await import('./helpers.js');
  const CANARY = 'canary-js-5e1d-wombat';
  const key = 'a1'.repeat(32);
  const dir = mkdtempSync(join(tmpdir(), 'abridge-js-'));
  const path = join(dir, 's.db');
  const store = await SqliteStore.open(path, { masterKey: key });
  const engine = await createEngine({ store });
  const facts = EDITOR.map((t, i) => ({ id: `s${i}`, scope, text: `${t}, ${CANARY} ${i}` }));
  const r = await engine.remember(facts);
  const o = await engine.summarizeCluster(r[2].cluster, { engine: 'extractive' });
  assert.ok(o.summary.text.includes(CANARY));
  assert.ok(engine.memory('s0').text.includes(CANARY));
  store.close();
  const onDisk = [path, `${path}-wal`].filter(existsSync).map((p) => read(p).toString('latin1')).join('');
  assert.ok(!onDisk.includes(CANARY) && !onDisk.includes('wombat'), 'the canary is on disk in the clear');
  // Another key, or none, does not read it.
  const wrong = await SqliteStore.open(path, { masterKey: 'b2'.repeat(32) });
  assert.throws(() => wrong.recall.getMemory('s0'), /not the key this database was written with/);
  wrong.close();
  const none = await SqliteStore.open(path);
  assert.throws(() => none.recall.getMemory('s0'), /encrypted and no master key/);
  none.close();
  // The Rust binary opens what JS sealed (the same cipher, associated data and key wrapping).
  const bin = join(ROOT, 'target', 'debug', 'abridge');
  if (!existsSync(bin)) execFileSync('cargo', ['build', '-q', '-p', 'abridge'], { cwd: ROOT, stdio: 'inherit' });
  const out = execFileSync(bin, ['memory', 'show', 's1'], { env: { ...process.env, ABRIDGE_DB: path, ABRIDGE_MASTER_KEY: key }, encoding: 'utf8' });
  assert.ok(out.includes(`${CANARY} 1`), out);
  // And the other way: what the binary seals, JS opens.
  execFileSync(bin, ['memory', 'add', 'Bob sealed this from Rust', '--user', 'bob', '--type', 'fact', '--key', 'k', '--id', 'r1'], {
    env: { ...process.env, ABRIDGE_DB: path, ABRIDGE_MASTER_KEY: key, ABRIDGE_BACKEND: 'extractive' },
    stdio: 'ignore',
  });
  const back = await SqliteStore.open(path, { masterKey: key });
  assert.equal(back.recall.getMemory('r1').text, 'Bob sealed this from Rust');
  // Both hosts key the lexical embedding the same way (from the same data key): what the
  // binary embedded, JS recalls; the vectors are in the keyed space.
  const e2 = await createEngine({ store: back });
  const hits = await e2.recall('Bob sealed this from Rust', { user: 'bob' }, 3);
  assert.ok(hits.some((h) => h.text === 'Bob sealed this from Rust'), JSON.stringify(hits));
  // A fact the binary stored is superseded by its change written here: both hosts key a fact
  // the same way (a keyed hash: no fact in the clear).
  execFileSync(bin, ['memory', 'add', 'Bob lives in Porto', '--user', 'bob', '--type', 'fact', '--key', 'k', '--id', 'r2'], {
    env: { ...process.env, ABRIDGE_DB: path, ABRIDGE_MASTER_KEY: key, ABRIDGE_BACKEND: 'extractive' },
    stdio: 'ignore',
  });
  const [moved] = await e2.remember([{ id: 'j2', scope: { user: 'bob', project: '', environment: '', kind: 'fact', key: 'k' }, text: 'Bob moved to Lyon' }]);
  assert.equal(moved.supersedes, 'r2');
  assert.equal(back.recall.getMemory('r2').supersededBy, 'j2');
  back.close();
  const { DatabaseSync } = await import('node:sqlite');
  const raw = new DatabaseSync(path);
  const models = raw.prepare('SELECT DISTINCT model FROM memories').all().map((r) => r.model);
  const factKeys = raw.prepare("SELECT fact_key FROM memories WHERE fact_key <> ''").all().map((r) => r.fact_key);
  raw.close();
  assert.deepEqual(models, ['abridge-lexical-v1+keyed']);
  assert.equal(factKeys.length, 2);
  for (const k of factKeys) assert.match(k, /^[a-z]{13}$/);
  assert.equal(factKeys[0], factKeys[1]);
});

/** A model that restates the facts it is shown after a pause, counting calls in flight. */
function restating(delayMs = 0) {
  const m = { name: 'restating', calls: 0, inFlight: 0, most: 0 };
  m.generate = async (req) => {
    m.calls++;
    m.inFlight++;
    m.most = Math.max(m.most, m.inFlight);
    await new Promise((r) => setTimeout(r, delayMs));
    m.inFlight--;
    const text = req.prompt.tag === 'chat' ? req.prompt.val.map((x) => x.content).join('\n') : req.prompt.val;
    const facts = text.split('\n').filter((l) => l.startsWith('- ')).map((l) => `${l.slice(2).replace(/\.$/, '')}.`);
    return { text: facts.join(' '), finishReason: 'stop', promptTokens: 100, outputTokens: 40 };
  };
  return m;
}

test('guards: at most limits.clusterJobs at once, and the monthly ceiling refuses summaries while recall answers', async () => {
  let now = Date.UTC(2026, 0, 15);
  const llm = restating(50);
  const engine = await createEngine({ store: await SqliteStore.open(':memory:'), llm, clock: () => now, limits: { clusterJobs: 1, ceiling: { tokens: 250 } } });
  const clusters = [];
  for (const key of ['a', 'b']) {
    const r = await engine.remember(EDITOR.map((text, i) => ({ id: `${key}${i}`, scope: { ...scope, key }, text })));
    clusters.push(r[2].cluster);
  }
  const outs = await Promise.all(clusters.map((c) => engine.summarizeCluster(c)));
  assert.deepEqual(outs.map((o) => o.action), ['created', 'created']);
  assert.equal(llm.most, 1, 'one cluster summary at a time');
  const u = engine.usage();
  assert.deepEqual([u.month, u.calls, u.promptTokens, u.outputTokens, u.exhausted], ['2026-01', 2, 200, 80, true]);
  // Per day too, in the same table the Rust host's console charts.
  assert.deepEqual(u.days.map((d) => [d.day.slice(0, 7), d.calls, d.promptTokens + d.outputTokens]), [['2026-01', 2, 280]]);
  const r = await engine.remember(EDITOR.map((text, i) => ({ id: `c${i}`, scope: { ...scope, key: 'c' }, text })));
  await assert.rejects(engine.summarizeCluster(r[2].cluster), (e) => e.kind === 'quota-exhausted' && e.spent === 280 && e.limit === 250 && e.resetsAtMs === Date.UTC(2026, 1, 1));
  assert.equal(llm.calls, 2);
  const hits = await engine.recall('dark editor theme', {}, 20);
  assert.equal(hits.length, 9);
  assert.ok(hits.every((h) => h.kind === 'memory'));
  now = Date.UTC(2026, 1, 1);
  assert.equal((await engine.summarizeCluster(r[2].cluster)).action, 'created');
});

test('usage counts every call the model served: a session summary the gate discarded as well as a cluster summary', async () => {
  const llm = restating(0);
  const engine = await createEngine({ store: await SqliteStore.open(':memory:'), llm, clock: () => Date.UTC(2026, 0, 15) });
  const episodes = Array.from({ length: 12 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: `fact ${i}: the deploy of service ${i} moves to friday`, sourceKey: `k${i}` }));
  await engine.append('chat', episodes);
  // This model restates "- " lines only: a session prompt gets an empty answer, which the
  // quality gate discards — the call was still served, and counts.
  await assert.rejects(engine.summarizeNow('chat', {}), /rejected/);
  const sessionCalls = llm.calls;
  assert.ok(sessionCalls >= 1);
  let u = engine.usage();
  assert.deepEqual([u.calls, u.promptTokens, u.outputTokens], [sessionCalls, 100 * sessionCalls, 40 * sessionCalls]);
  const r = await engine.remember(EDITOR.map((text, i) => ({ id: `a${i}`, scope: { ...scope, key: 'a' }, text })));
  await engine.summarizeCluster(r[2].cluster);
  u = engine.usage();
  assert.equal(u.calls, llm.calls);
  assert.ok(u.calls > sessionCalls);
});

test('session text is sealed too: episodes, speakers, summaries, ledgers and partial answers, readable by the other host', async () => {
  const { execFileSync } = await import('node:child_process');
  const { existsSync, readFileSync: read } = await import('node:fs');
  const { ROOT } = await import('./helpers.js');
  const CANARY = 'canary-session-9c2b-quokka';
  const key = 'c3'.repeat(32);
  const dir = mkdtempSync(join(tmpdir(), 'abridge-js-'));
  const path = join(dir, 's.db');
  const store = await SqliteStore.open(path, { masterKey: key });
  const engine = await createEngine({ store });
  const eps = [0, 1, 2, 3].map((i) => ({ role: i % 2 ? 'assistant' : 'user', content: `Step ${i}: ${CANARY} lives in /srv/${CANARY}/app.toml`, sourceKey: `k${i}`, speaker: `${CANARY} speaker` }));
  assert.equal(await engine.append('s', eps), 4);
  await engine.summarizeNow('s', { engine: 'extractive' });
  store.putPartial('p', { text: `${CANARY} partial`, promptTokens: 1, outputTokens: 1 });
  const chain = await engine.chain('s');
  assert.ok(chain[0].content.includes(CANARY));
  assert.ok(chain[0].ledger.some((e) => e.text.includes(CANARY)));
  assert.equal(store.episodesAfter('s', 0, 10)[0].speaker, `${CANARY} speaker`);
  assert.equal(store.partial('p').text, `${CANARY} partial`);
  store.close();
  const onDisk = [path, `${path}-wal`].filter(existsSync).map((p) => read(p).toString('latin1')).join('');
  assert.ok(!onDisk.includes(CANARY) && !onDisk.includes('quokka'), 'session text is on disk in the clear');
  const none = await SqliteStore.open(path);
  assert.throws(() => none.episodesAfter('s', 0, 10), /encrypted and no master key/);
  none.close();
  // The Rust binary reads what JS sealed, and JS reads what the binary seals.
  const bin = join(ROOT, 'target', 'debug', 'abridge');
  if (!existsSync(bin)) execFileSync('cargo', ['build', '-q', '-p', 'abridge'], { cwd: ROOT, stdio: 'inherit' });
  const env = { ...process.env, ABRIDGE_DB: path, ABRIDGE_MASTER_KEY: key, ABRIDGE_BACKEND: 'extractive' };
  const out = execFileSync(bin, ['context', 's'], { env, encoding: 'utf8' });
  assert.ok(out.includes(CANARY), out);
  const lines = ['Rust wrote this sealed line one.', 'Rust wrote this sealed line two.'].map((content, i) => JSON.stringify({ role: i ? 'assistant' : 'user', content })).join('\n');
  execFileSync(bin, ['ingest', '--session', 'r'], { env, input: `${lines}\n`, stdio: ['pipe', 'ignore', 'ignore'] });
  const back = await SqliteStore.open(path, { masterKey: key });
  assert.equal(back.episodesAfter('r', 0, 10)[1].content, 'Rust wrote this sealed line two.');
  back.close();
});

test('deleted means gone: a reset session and a deleted memory leave neither the file nor its WAL', async () => {
  const { existsSync, readFileSync: read } = await import('node:fs');
  const dir = mkdtempSync(join(tmpdir(), 'abridge-js-'));
  const path = join(dir, 'd.db');
  const store = await SqliteStore.open(path);
  const engine = await createEngine({ store });
  const GONE = 'canary-gone-2e8f';
  await engine.append('gone', [0, 1, 2].map((i) => ({ role: 'user', content: `${GONE} message ${i}`, sourceKey: `k${i}` })));
  await engine.append('kept', [{ role: 'user', content: 'canary-kept-message', sourceKey: 'k' }]);
  await engine.remember([{ id: 'm1', scope, text: `${GONE} memory` }]);
  const disk = () => [path, `${path}-wal`].filter(existsSync).map((p) => read(p).toString('latin1')).join('');
  assert.ok(disk().includes(GONE), 'the canary was never written');
  await engine.reset('gone');
  await engine.forget('m1');
  assert.ok(!disk().includes(GONE), 'deleted text is still on disk');
  assert.ok(disk().includes('canary-kept-message'));
  store.close();
});

test('vectors sealed when asked: none on disk in clear, recall works, the binary reads them', async () => {
  const { execFileSync } = await import('node:child_process');
  const { existsSync, readFileSync: read } = await import('node:fs');
  const { ROOT } = await import('./helpers.js');
  const key = 'd4'.repeat(32);
  const dir = mkdtempSync(join(tmpdir(), 'abridge-js-'));
  const path = join(dir, 'v.db');
  const store = await SqliteStore.open(path, { masterKey: key, sealVectors: true });
  const engine = await createEngine({ store });
  await engine.remember(EDITOR.map((t, i) => ({ id: `v${i}`, scope, text: t })));
  const hits = await engine.recall(EDITOR[0], { user: scope.user }, 3);
  assert.ok(hits.some((h) => h.text === EDITOR[0]), JSON.stringify(hits));
  store.close();
  const { DatabaseSync } = await import('node:sqlite');
  const raw = new DatabaseSync(path);
  const lens = raw.prepare('SELECT length(vector) AS n FROM memories UNION ALL SELECT length(sum) FROM clusters').all().map((r) => r.n);
  raw.close();
  assert.ok(lens.length > 0 && lens.every((n) => n % 4 === 1), JSON.stringify(lens));
  // Without the key the vectors are refused (unkeyed recall looks in another space and finds
  // nothing); the binary, with the key, recalls what JS sealed.
  const none = await SqliteStore.open(path);
  assert.throws(() => none.recall.centroids(scope), /encrypted and no master key/);
  none.close();
  const bin = join(ROOT, 'target', 'debug', 'abridge');
  if (!existsSync(bin)) execFileSync('cargo', ['build', '-q', '-p', 'abridge'], { cwd: ROOT, stdio: 'inherit' });
  const out = execFileSync(bin, ['recall', EDITOR[0], '--user', scope.user, '--json'], { env: { ...process.env, ABRIDGE_DB: path, ABRIDGE_MASTER_KEY: key }, encoding: 'utf8' });
  assert.ok(out.includes('v0'), out);
  void read;
});

test('facts that change: the later memory supersedes the earlier, recall puts it first and marks the old one', async () => {
  const engine = await createEngine({ store: await SqliteStore.open(':memory:') });
  const [porto] = await engine.remember([{ id: 'porto', user: 'alice', text: 'I live in Porto, by the river Douro' }]);
  assert.equal(porto.supersedes, undefined);
  const [lyon] = await engine.remember([{ id: 'lyon', user: 'alice', text: 'Alice moved to Lyon' }]);
  assert.equal(lyon.supersedes, 'porto');
  assert.equal(lyon.cluster, porto.cluster);
  const old = engine.memory('porto');
  assert.equal(old.supersededBy, 'lyon');
  assert.ok(old.supersededMs > 0);
  assert.equal(engine.memory('lyon').supersedes, 'porto');
  const hits = await engine.recall('Porto river Douro', { user: 'alice' }, 5);
  assert.deepEqual(hits.slice(0, 2).map((h) => h.id), ['lyon', 'porto'], JSON.stringify(hits));
  assert.equal(hits[1].supersededBy, 'lyon');
  assert.equal(hits[0].supersededBy, undefined);
  // Named explicitly, and refused when it names nothing.
  const [named] = await engine.remember([{ id: 'tea', user: 'alice', text: 'Alice drinks tea now', replaces: 'lyon' }]);
  assert.equal(named.supersedes, 'lyon');
  await assert.rejects(engine.remember([{ id: 'x', user: 'alice', text: 't', replaces: 'nope' }]), /does not exist/);
  // Deleting the successor makes the earlier memory current again.
  await engine.forget('tea');
  assert.equal(engine.memory('lyon').supersededBy, undefined);
});
