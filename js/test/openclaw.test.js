// abridge as OpenClaw's context engine, against the real `openclaw` from npm (pinned in
// .ci/run; ABRIDGE_OPENCLAW names its `openclaw.mjs`): the plugin folder installed with
// `openclaw plugins install -l`, selected in the contextEngine slot, and a conversation
// driven through OpenClaw's own agent loop (`openclaw agent --local`) against the project's
// test model server. Skipped with a note without OpenClaw, unless ABRIDGE_REQUIRE_OPENCLAW.
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { closedPortUrl, listeningUrl, ROOT, startServer } from './helpers.js';

function openclaw() {
  const given = process.env.ABRIDGE_OPENCLAW;
  const cached = join(homedir(), '.cache', 'abridge', 'openclaw', 'node_modules', 'openclaw', 'openclaw.mjs');
  const found = [given, cached].find((p) => p && existsSync(p));
  if (!found && process.env.ABRIDGE_REQUIRE_OPENCLAW) {
    throw new Error('ABRIDGE_REQUIRE_OPENCLAW is set but OpenClaw was not found (npm install --prefix ~/.cache/abridge/openclaw --ignore-scripts openclaw@2026.9.6, or set ABRIDGE_OPENCLAW to its openclaw.mjs)');
  }
  return found;
}

const text = (m) => (typeof m.content === 'string' ? m.content : (m.content ?? []).map((p) => p.text ?? '').join('\n'));

test('OpenClaw runs its turns with abridge as its context engine: within the budget, the same prefix between folds, /compact folds', { timeout: 900_000 }, async (t) => {
  const oc = openclaw();
  if (!oc) {
    t.skip('SKIPPED: OpenClaw is not installed (npm install --prefix ~/.cache/abridge/openclaw --ignore-scripts openclaw@2026.9.6)');
    return;
  }
  const server = await startServer(['--num-ctx', '400000']);
  const dir = mkdtempSync(join(tmpdir(), 'abridge-openclaw-'));
  try {
    // The plugin as a user installs it: its folder with the engine package (packed, so its
    // dist/ comes along) installed beside it.
    const plugin = join(dir, 'plugin');
    cpSync(join(ROOT, 'js', 'openclaw'), plugin, { recursive: true });
    const pack = join(dir, 'pack');
    mkdirSync(pack);
    execFileSync('npm', ['pack', '--silent', '--ignore-scripts', '--pack-destination', pack], { cwd: join(ROOT, 'js'), stdio: ['ignore', 'ignore', 'inherit'] });
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--legacy-peer-deps', join(pack, 'abridge-engine-0.1.0.tgz')], { cwd: plugin, stdio: ['ignore', 'ignore', 'inherit'] });

    const state = join(dir, 'state');
    const config = join(dir, 'openclaw.json');
    mkdirSync(state);
    writeFileSync(config, JSON.stringify({
      models: {
        mode: 'merge',
        providers: {
          test: {
            baseUrl: `${server.url}/v1`,
            apiKey: 'local',
            api: 'openai-completions',
            models: [{ id: 'qwen2.5:3b', name: 'test model', reasoning: false, input: ['text'], cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 16384, maxTokens: 1024 }],
          },
        },
      },
      agents: { defaults: { model: { primary: 'test/qwen2.5:3b' } } },
    }));
    const env = { ...process.env, OPENCLAW_STATE_DIR: state, OPENCLAW_CONFIG_PATH: config, HOME: dir };
    const run = (args) => {
      const r = spawnSync(process.execPath, [oc, ...args], { cwd: dir, env, encoding: 'utf8', timeout: 300_000 });
      assert.equal(r.status, 0, `openclaw ${args.join(' ')}:\n${r.stdout}\n${r.stderr}`);
      return r;
    };
    run(['plugins', 'install', '-l', plugin, '--force', '--accept-capabilities']);
    const cfg = JSON.parse(readFileSync(config, 'utf8'));
    assert.equal(cfg.plugins.slots.contextEngine, 'abridge');
    assert.equal(cfg.plugins.entries.abridge.enabled, true);
    // The plugin's own settings: where its database goes (here, where it would go anyway),
    // and abridge's: a fold every three turns (six messages), so some turns see a fold and
    // some do not.
    cfg.plugins.entries.abridge.config = {
      dbPath: join(state, 'agents', 'main', 'agent', 'abridge', 'abridge.db'),
      abridge: { mode: 'eager', minEpisodesSince: 6, maxBacklogTokens: 1000000 },
    };
    writeFileSync(config, JSON.stringify(cfg));

    // Turns long enough that the history outgrows OpenClaw's budget.
    const pad = (i) => Array.from({ length: 120 }, (_, k) => `step ${k} of release ${i}: check the build and the changelog,`).join(' ');
    const turns = 10;
    const say = (i) => `Turn ${i}: the code word of release ${i} is zephyr-${i}. ${pad(i)}`;
    const db = join(state, 'agents', 'main', 'agent', 'abridge', 'abridge.db');
    const chains = [];
    for (let i = 1; i <= turns; i++) {
      const r = run(['agent', '--local', '--agent', 'main', '--json', '--message', say(i)]);
      assert.doesNotMatch(r.stderr, /degraded to "legacy"/, r.stderr);
      chains.push(JSON.stringify(await rowsOf(db)));
    }
    // The turns' requests (OpenClaw's own pre-compaction memory flush, a turn of its own when
    // its transcript nears the window, is not one of them).
    const sent = (await server.generations())
      .filter((g) => g.path === '/v1/chat/completions')
      .map((g) => g.body.messages)
      .filter((m) => !m.some((x) => x.role === 'user' && text(x).startsWith('Pre-compaction memory flush.')));
    assert.equal(sent.length, turns);
    // abridge's part of the system prompt (its fenced addition), or null.
    const addition = (msgs) => text(msgs[0]).match(/<abridge-context>\n[\s\S]*?\n<\/abridge-context>/)?.[0] ?? null;
    const folded = sent.filter((m) => addition(m) !== null);
    assert.ok(folded.length >= 2, `abridge's summary reached the model in ${folded.length} of ${turns} turns`);
    // What the model receives is abridge's context, within the budget: the summary and the
    // newest turns, not the whole history.
    const last = sent[sent.length - 1];
    // OpenClaw gives the model's context window (16,384 tokens here, the least it takes) as
    // the budget, besides its own system prompt. The whole history outgrows it, counting a
    // token per 3 characters (more than a tokenizer makes of them); abridge's part of every
    // request (its addition and the messages) stays within it.
    const tokens = (chars) => Math.ceil(chars / 3);
    const history = Array.from({ length: turns }, (_, k) => say(k + 1).length).reduce((a, b) => a + b, 0);
    assert.ok(tokens(history) > 16384, `the history (${history} characters) fits the budget: the check below would prove nothing`);
    for (const [i, m] of sent.entries()) {
      const chars = (addition(m) ?? '').length + m.slice(1).reduce((n, x) => n + text(x).length, 0);
      assert.ok(tokens(chars) <= 16384, `turn ${i + 1}: abridge's part is ${chars} characters, over the budget`);
    }
    const userTurns = last.filter((m) => m.role === 'user' && /\] Turn \d+:/.test(text(m)));
    assert.ok(userTurns.length < turns - 1, `the last request carried ${userTurns.length} of ${turns} turns verbatim`);
    assert.match(addition(last), /\[abridge\] Summary of the earlier conversation/);
    assert.match(addition(last), /zephyr-1/);
    // Between folds abridge's part of the prompt is byte-identical: a request made when
    // abridge's chain had not changed since the one before carries the same addition.
    let stable = 0;
    for (let i = 2; i < turns; i++) {
      // Request i + 1 was assembled from the chain after turn i, request i from the one
      // after turn i - 1.
      if (chains[i - 1] !== chains[i - 2] || addition(sent[i - 1]) === null) continue;
      assert.equal(addition(sent[i]), addition(sent[i - 1]), `turn ${i + 1} changed abridge's part of the prompt without a fold`);
      stable++;
    }
    assert.ok(stable >= 1, `no two turns were assembled from the same chain (${chains.join(' ')})`);

    // `/compact` folds now (abridge owns compaction): OpenClaw's own `sessions compact`,
    // through a gateway on loopback, as `/compact` in a chat does.
    assert.ok(existsSync(db), `abridge's database is not at ${db}`);
    run(['agent', '--local', '--agent', 'main', '--json', '--message', `Turn ${turns + 1}: one more. ${pad(turns + 1)}`]);
    const before = await rowsOf(db);
    const port = new URL(await closedPortUrl()).port;
    const gateway = spawn(process.execPath, [oc, 'gateway', '--allow-unconfigured', '--auth', 'token', '--token', 'test-token', '--port', String(port), '--bind', 'loopback'], { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'] });
    try {
      await new Promise((resolve, reject) => {
        let out = '';
        const timer = setTimeout(() => reject(new Error(`the gateway did not start:\n${out}`)), 120_000);
        const seen = (d) => {
          out += d;
          if (/\[gateway\]\S*\s+\S*ready/.test(out.replace(/\x1b\[[0-9;]*m/g, ''))) {
            clearTimeout(timer);
            resolve();
          }
        };
        gateway.stdout.on('data', seen);
        gateway.stderr.on('data', seen);
        gateway.on('exit', (code) => reject(new Error(`the gateway exited with ${code}:\n${out}`)));
      });
      const r = run(['sessions', 'compact', 'agent:main:main', '--agent', 'main', '--url', `ws://127.0.0.1:${port}`, '--token', 'test-token', '--json']);
      const answer = JSON.parse(r.stdout.slice(r.stdout.indexOf('{')));
      assert.equal(answer.ok, true, r.stdout);
      assert.equal(answer.compacted, true, r.stdout);
      assert.match(answer.result.summary, /\[abridge\]|zephyr|release/i, r.stdout);
    } finally {
      gateway.kill();
    }
    const after = await rowsOf(db);
    assert.ok(after.covered > before.covered, `/compact did not fold: ${JSON.stringify({ before, after })}`);
  } finally {
    server.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

/** What abridge's chain of the one OpenClaw session covers (read with the engine itself). */
async function rowsOf(db) {
  const { createEngine, SqliteStore } = await import('../src/index.js');
  const store = await SqliteStore.open(db);
  try {
    const engine = await createEngine({ store });
    const session = store.sessions().map((s) => (typeof s === 'string' ? s : s.session ?? s.id)).find((s) => String(s).startsWith('openclaw-'));
    const chain = session ? await engine.chain(session) : [];
    return { rows: chain.length, covered: chain.length ? Math.max(...chain.map((r) => Number(r.lastEpisode))) : 0 };
  } finally {
    store.close();
  }
}

test('the OpenClaw engine says what to fix when its database is not usable', async () => {
  const { createContextEngine } = await import('../src/openclaw.js');
  const dir = mkdtempSync(join(tmpdir(), 'abridge-openclaw-db-'));
  try {
    // A file where the database's folder should be.
    writeFileSync(join(dir, 'blocker'), 'not a folder');
    const engine = createContextEngine({ dbPath: join(dir, 'blocker', 'abridge.db') });
    await assert.rejects(
      engine.assemble({ sessionId: 's1', messages: [], tokenBudget: 2000 }),
      /abridge cannot make the folder of its database .*set plugins\.entries\.abridge\.config\.dbPath/,
    );
    // A database file that is not one.
    writeFileSync(join(dir, 'garbage.db'), 'this is not a SQLite database, it is text '.repeat(200));
    const bad = createContextEngine({ dbPath: join(dir, 'garbage.db') });
    await assert.rejects(bad.assemble({ sessionId: 's1', messages: [], tokenBudget: 2000 }), /abridge cannot open its database .*garbage\.db/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the OpenClaw engine stores a turn once, and assembles the history as it is until abridge folds', async () => {
  const { createContextEngine } = await import('../src/openclaw.js');
  const dir = mkdtempSync(join(tmpdir(), 'abridge-openclaw-turn-'));
  try {
    const engine = createContextEngine({ dbPath: join(dir, 'a.db') });
    const turn = [
      { role: 'user', content: 'Book the small room for Thursday.', timestamp: 1_800_000_000_000 },
      { role: 'assistant', content: [{ type: 'text', text: 'Booked for Thursday at 10.' }], timestamp: 1_800_000_001_000 },
    ];
    assert.deepEqual(await engine.commitTurn({ advancementKey: 'k1', sessionId: 's1', messages: turn }), { status: 'committed' });
    assert.deepEqual(await engine.commitTurn({ advancementKey: 'k1', sessionId: 's1', messages: turn }), { status: 'duplicate' });
    const a = await engine.assemble({ sessionId: 's1', messages: turn, tokenBudget: 2000 });
    assert.equal(a.messages, turn);
    assert.equal(a.systemPromptAddition, undefined);
    await engine.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the OpenClaw engine answers a compaction it need not make as OpenClaw reads a no-op, and folds when asked', async () => {
  const { createContextEngine } = await import('../src/openclaw.js');
  const dir = mkdtempSync(join(tmpdir(), 'abridge-openclaw-compact-'));
  try {
    const engine = createContextEngine({ dbPath: join(dir, 'a.db') });
    const preflight = { forceReason: 'preflight_required' };
    // Nothing stored: nothing to compact (OpenClaw's "no compactable entries").
    let r = await engine.compact({ sessionId: 's1', force: true });
    assert.deepEqual([r.ok, r.compacted], [true, false]);
    assert.match(r.reason, /^nothing to compact/);
    const turns = Array.from({ length: 6 }, (_, i) => [
      { role: 'user', content: `Question ${i}: where does release ${i} ship from?` },
      { role: 'assistant', content: `Release ${i} ships from the ${i}th branch.` },
    ]);
    for (const [i, t] of turns.entries()) await engine.commitTurn({ advancementKey: `k${i}`, sessionId: 's1', messages: t });
    // OpenClaw's transcript check before a turn: what abridge assembles fits, so no fold.
    r = await engine.compact({ sessionId: 's1', force: true, tokenBudget: 8000, runtimeContext: preflight });
    assert.deepEqual([r.ok, r.compacted], [true, false]);
    assert.match(r.reason, /^already under target: what abridge assembles is \d+ of 8000 tokens/);
    // It does not fit 20 tokens: the fold runs.
    r = await engine.compact({ sessionId: 's1', force: true, tokenBudget: 20, runtimeContext: preflight });
    assert.deepEqual([r.ok, r.compacted], [true, true]);
    assert.ok(r.result.summary);
    // Everything folded: asked again (`/compact`), it says so.
    r = await engine.compact({ sessionId: 's1', force: true, runtimeContext: { forceReason: 'manual' } });
    assert.deepEqual([r.ok, r.compacted], [true, false]);
    assert.match(r.reason, /^already compacted/);
    await engine.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the OpenClaw engine over an abridge serve: turns stored there, /compact folds there, the summary assembled', { timeout: 120_000 }, async (t) => {
  const bin = join(ROOT, 'target', 'debug', 'abridge');
  if (!existsSync(bin)) {
    assert.ok(!process.env.ABRIDGE_REQUIRE_BINARY, `ABRIDGE_REQUIRE_BINARY is set but ${bin} is not built (run cargo test first)`);
    t.skip(`SKIPPED: ${bin} is not built (run cargo test first)`);
    return;
  }
  const { createContextEngine } = await import('../src/openclaw.js');
  const dir = mkdtempSync(join(tmpdir(), 'abridge-openclaw-serve-'));
  const serve = spawn(bin, ['serve', '--listen', '127.0.0.1:0'], {
    env: { ...process.env, ABRIDGE_DB: join(dir, 'serve.db'), ABRIDGE_BACKEND: 'extractive', HOME: dir },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  try {
    const url = await listeningUrl(serve, 'abridge serve');
    const engine = createContextEngine({ serveUrl: url });
    const given = [];
    for (let i = 1; i <= 12; i++) {
      const turn = [
        { role: 'user', content: `Turn ${i}: the code word of release ${i} is zephyr-${i}. ${'check the build and the changelog, '.repeat(40)}`, timestamp: 1_800_000_000_000 + i * 1000 },
        { role: 'assistant', content: [{ type: 'text', text: `Noted: release ${i} is zephyr-${i}.` }], timestamp: 1_800_000_000_500 + i * 1000 },
      ];
      given.push(...turn);
      assert.deepEqual(await engine.commitTurn({ advancementKey: `k${i}`, sessionId: 'serve-1', messages: turn }), { status: 'committed' });
    }
    assert.deepEqual(await engine.commitTurn({ advancementKey: 'k1', sessionId: 'serve-1', messages: given.slice(0, 2) }), { status: 'duplicate' });
    const compacted = await engine.compact({ sessionId: 'serve-1', sessionKey: 'main', force: true });
    assert.equal(compacted.ok, true);
    assert.match(compacted.result.summary, /zephyr-1/);
    const a = await engine.assemble({ sessionId: 'serve-1', messages: given, tokenBudget: 1200, prompt: 'What was the code word of release 2?' });
    assert.match(a.systemPromptAddition, /^<abridge-context>\n\[abridge\] Summary of the earlier conversation/);
    assert.ok(a.messages.length < given.length, `${a.messages.length} of ${given.length} messages`);
    assert.ok(a.estimatedTokens <= 1200, `${a.estimatedTokens} tokens`);
    await engine.dispose();
    // A server that is gone: an error that says where and what to fix.
    serve.kill();
    await new Promise((r) => serve.once('exit', r));
    const gone = createContextEngine({ serveUrl: url });
    await assert.rejects(gone.assemble({ sessionId: 'serve-1', messages: [], tokenBudget: 1200 }), /abridge serve at .* is not reachable .*serveUrl/);
  } finally {
    serve.kill();
    rmSync(dir, { recursive: true, force: true });
  }
});
