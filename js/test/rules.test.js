// The store rules' golden script (tests/golden/store-rules/steps.json), run on the JS host's
// stores: the Rust stores run the same script (host/store/tests/golden_rules.rs), so where this
// host keeps a rule of its own (the chain and compaction checks, the memory and cluster rules,
// the ranking, the reset), both hosts are proven to decide alike, message for message.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { SqliteStore } from '../src/index.js';
import { GOLDEN } from './helpers.js';

const scope = { user: 'u', project: 'p', environment: 'e', kind: 'fact', key: 'k' };

function run(name, s) {
  const { steps } = JSON.parse(readFileSync(join(GOLDEN, 'store-rules', 'steps.json'), 'utf8'));
  const rows = [];
  const clusters = new Map();
  const fill = (text) => {
    let t = text;
    rows.forEach((id, i) => (t = t.replaceAll(`{row${i}}`, String(id))));
    for (const [m, c] of clusters) t = t.replaceAll(`{cluster:${m}}`, String(c));
    return t;
  };
  const refusal = (expect) => {
    for (const kind of ['conflict', 'invalid-input']) {
      if (expect && typeof expect === 'object' && kind in expect) return { kind, detail: fill(expect[kind]) };
    }
    return undefined;
  };
  const outcome = (f) => {
    try {
      return { ok: f() };
    } catch (e) {
      return { err: { kind: e.kind, detail: e.detail ?? e.message } };
    }
  };
  steps.forEach((step, n) => {
    const at = `${name}, step ${n} (${JSON.stringify(step)})`;
    const { expect, session } = step;
    switch (step.op) {
      case 'append': {
        const eps = Array.from({ length: step.episodes }, (_, i) => ({ role: 'user', content: `message ${i + 1}`, sourceKey: `k${i + 1}`, tokens: 10 }));
        s.appendEpisodes(session, eps);
        break;
      }
      case 'write': {
        const w = {
          replaces: step.replaces === undefined ? undefined : rows[step.replaces],
          firstEpisode: step.first, lastEpisode: step.last, content: 'summary', tokens: 5, promptTokens: 1, outputTokens: 1,
          model: 'm', nowMs: 1, skipped: [], ledger: [], ledgerDropped: 0,
        };
        const got = outcome(() => s.writeSummary(session, w));
        const want = refusal(expect);
        if (want) assert.deepEqual(got.err, want, at);
        else {
          assert.ok(got.ok, `${at}: ${JSON.stringify(got.err)}`);
          if (step.replaces === undefined) rows.push(got.ok.id);
        }
        break;
      }
      case 'compact': {
        const c = { rows: step.rows.map((i) => rows[i]), content: 'earlier', tokens: 3, promptTokens: 1, outputTokens: 1, model: 'm', nowMs: 2, skipped: [], ledger: [], ledgerDropped: 0 };
        const got = outcome(() => s.compactSummaries(session, c));
        const want = refusal(expect);
        if (want) assert.deepEqual(got.err, want, at);
        else {
          assert.ok(got.ok, `${at}: ${JSON.stringify(got.err)}`);
          assert.deepEqual([got.ok.firstEpisode, got.ok.lastEpisode, got.ok.level], [expect.row.first, expect.row.last, expect.row.level], at);
        }
        break;
      }
      case 'items': {
        const eps = step.items.map((item, i) => ({ role: 'user', content: `message ${i + 1}`, sourceKey: `k${i + 1}`, tokens: 10, item: item ?? undefined }));
        s.appendEpisodes(session, eps);
        const got = Object.fromEntries([...s.items(session, step.ask)].map(([id, item]) => [String(id), item]));
        assert.deepEqual(got, expect, at);
        break;
      }
      case 'episodes': {
        const eps = Array.from({ length: step.count }, (_, i) => ({ role: 'user', content: `message ${i + 1}`, sourceKey: `k${i + 1}`, tokens: 10 }));
        s.appendEpisodes(session, eps);
        assert.deepEqual(s.episodes(session, step.ask).map((e) => [Number(e.id), e.content]), expect, at);
        break;
      }
      case 'chain':
        assert.deepEqual(s.summaries(session).map((r) => [r.firstEpisode, r.lastEpisode, r.level ?? 0]), expect, at);
        break;
      case 'put': {
        const cluster = typeof step.cluster === 'number' ? step.cluster : step.cluster_of ? clusters.get(step.cluster_of) : undefined;
        const m = { id: step.id, scope, text: step.text, importance: 0.5, tokens: 4, createdMs: 10, model: step.model ?? 'emb', vector: step.vector, cluster };
        const got = outcome(() => s.recall.putMemory(m));
        const want = refusal(expect);
        if (want) assert.deepEqual(got.err, want, at);
        else {
          assert.ok(got.ok, `${at}: ${JSON.stringify(got.err)}`);
          assert.deepEqual([got.ok.created, got.ok.members], [expect.stored.created, expect.stored.members], at);
          clusters.set(step.id, got.ok.cluster);
        }
        break;
      }
      case 'centroid': {
        const c = s.recall.centroids(scope).find((x) => x.cluster === clusters.get(step.of));
        assert.ok(c, `${at}: no centroid`);
        assert.equal(c.vector.length, expect.length, at);
        [...c.vector].forEach((x, i) => assert.ok(Math.abs(x - expect[i]) < 1e-6, `${at}: ${[...c.vector]}`));
        break;
      }
      case 'search':
        assert.deepEqual(s.recall.search(step.vector, 'emb', {}, step.limit).map((h) => h.id), expect, at);
        break;
      case 'delete':
        assert.equal(s.recall.deleteMemory(step.id) !== undefined, expect === 'ok', at);
        break;
      case 'reset':
        s.resetSession(session);
        break;
      default:
        assert.fail(`${at}: unknown op ${step.op}`);
    }
  });
}

test('golden store rules: the same outcomes as the Rust stores, in SQLite in memory and in a file', async () => {
  run('sqlite in memory', await SqliteStore.open(':memory:'));
  const dir = mkdtempSync(join(tmpdir(), 'abridge-js-'));
  run('sqlite', await SqliteStore.open(join(dir, 'rules.db')));
});

test('the JS cosine equals the guest\'s, bit for bit, on the golden cases', async () => {
  const { cosine } = await import('../src/recall.js');
  const { cases } = JSON.parse(readFileSync(join(GOLDEN, 'cosine', 'cases.json'), 'utf8'));
  assert.ok(cases.length >= 8);
  const bits = (x) => {
    const v = new DataView(new ArrayBuffer(4));
    v.setFloat32(0, x);
    return v.getUint32(0);
  };
  for (const c of cases) {
    assert.equal(bits(cosine(Float32Array.from(c.a), Float32Array.from(c.b))), c.bits, JSON.stringify(c));
  }
});
