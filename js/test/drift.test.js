// Summaries that do not drift, through the JS host: the ledger, the second level (compacted
// rows kept and expandable), pins and window mode, in both stores.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { SqliteStore, createEngine } from '../src/index.js';

const stores = async () => [['sqlite in memory', await SqliteStore.open(':memory:')]];

const turn = (i) => [
  { role: 'user', content: `Turn ${i}: look at src/mod${i}.rs for ticket #${1000 + i} before v2.${i}.0 ships.`, sourceKey: `u${i}` },
  { role: 'assistant', content: `Noted for turn ${i}; the deployment review for item ${i * 7} is next.`, sourceKey: `a${i}` },
];

test('ledger, compaction, expand and pins: coverage from episode 1 within a small budget', async () => {
  for (const [name, store] of await stores()) {
    const engine = await createEngine({ store });
    const config = { engine: 'extractive', mode: 'eager', maxSummaryTokens: 20, summaryBudgetTokens: 250, ledgerTokens: 2000 };
    for (let i = 1; i <= 60; i++) {
      await engine.append('s', turn(i));
      await engine.afterEpisodeWritten('s', config);
    }
    // A budget the history does not fit (one it fits gets the history verbatim).
    const c = await engine.context('s', { budget: 1500, pairs: 2, pins: [1] }, config);
    assert.ok(c.fullTokens > 1500, `${name}: ${c.fullTokens}`);
    assert.equal(c.coveredFrom, 1, name);
    assert.deepEqual(c.omittedRanges, [], name);
    // An offline chain is read at its finest level: its lines are picked within the budget.
    assert.equal(c.level, 0, name);
    assert.equal(c.pinned, 1, name);
    assert.ok(c.tokens <= 1500 && c.tokens >= 1350, `${name}: ${c.tokens}`);
    const p = c.parts;
    assert.equal(p.summary + p.ledger + p.digest + p.pinned + p.recent + p.days, c.tokens, name);
    assert.equal(c.budget, 1500, name);
    const text = c.messages.map((m) => m.content).join('\n');
    // The pinned first turn, the newest identifiers, and a ledger that says what it left out.
    for (const id of ['src/mod1.rs', 'v2.59.0', 'older identifiers left out']) assert.ok(text.includes(id), `${name}: ${id}`);
    // The ledger's slice is at most a quarter of the stable head (docs/context.md).
    assert.ok(c.identifiers > 10 && p.ledger > 0, `${name}: ${c.identifiers}`);
    // Nothing is deleted: the history has the compacted rows, and each row expands to
    // exactly its episodes.
    const history = await engine.history('s');
    const chain = await engine.chain('s');
    assert.ok(history.length > chain.length, name);
    assert.ok(chain.some((r) => r.level >= 1), `${name}: a second level was written`);
    const earlier = history.find((r) => r.level > 0);
    const x = await engine.expand('s', earlier.id, { limit: 10000 });
    assert.deepEqual(
      x.episodes.map((e) => e.id),
      Array.from({ length: earlier.lastEpisode - earlier.firstEpisode + 1 }, (_, i) => earlier.firstEpisode + i),
      name,
    );
    assert.ok(x.compacted.length >= 2, name);
    const entry = chain.at(-1).ledger.at(-1);
    const y = await engine.expand('s', chain.at(-1).id, { identifier: entry.text });
    assert.equal(y.episodes[0].id, entry.episode, name);
    await assert.rejects(engine.expand('s', 99999), /no summary row/, name);
  }
});

test('window mode folds only what left the recent window and never misses a message', async () => {
  const engine = await createEngine({ store: await SqliteStore.open(':memory:') });
  const config = { engine: 'extractive', mode: 'window', thresholdTokens: 0, windowMessages: 8 };
  for (let i = 1; i <= 60; i++) {
    await engine.append('w', turn(i));
    await engine.refresh('w', config);
    const c = await engine.context('w', { budget: 8000 }, config);
    assert.deepEqual(c.omittedRanges, [], `turn ${i}`);
    const covered = (await engine.chain('w')).at(-1)?.lastEpisode ?? 0;
    assert.ok(covered === 0 || covered <= 2 * i - 8, `turn ${i}: covered ${covered}`);
  }
});
