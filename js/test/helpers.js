// Shared test helpers: the project's Rust test LLM server (built by cargo), spawned on a free
// loopback port and stopped after the tests.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = dirname(dirname(dirname(fileURLToPath(import.meta.url))));
export const GOLDEN = join(ROOT, 'tests', 'golden');
export const SHARED = join(dirname(ROOT), 'shared', 'data', 'transcripts');

let built = false;

function serverBinary() {
  const bin = join(ROOT, 'target', 'debug', 'abridge-test-llm');
  // cargo is a no-op when the binary is current; a stale one would give other replies.
  if (!built) {
    execFileSync('cargo', ['build', '-q', '-p', 'abridge-test-llm'], { cwd: ROOT, stdio: 'inherit' });
    built = true;
  }
  if (!existsSync(bin)) throw new Error(`cargo did not build ${bin}`);
  return bin;
}

/** The loopback URL a started `child` says it is `listening on` (the test server and `abridge serve` both say it on stdout); `what` names it if it exits first. */
export function listeningUrl(child, what) {
  return new Promise((resolve, reject) => {
    let buf = '';
    child.stdout.on('data', (d) => {
      buf += d;
      const m = buf.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) resolve(m[1]);
    });
    child.on('exit', (code) => reject(new Error(`${what} exited with ${code}`)));
  });
}

/** Start the test server; resolves to { url, requests(), generations(), faults(list), delay(ms), reset(), close() }. */
export async function startServer(args = []) {
  const child = spawn(serverBinary(), ['--port', '0', ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
  const url = await listeningUrl(child, 'test server');
  const control = async (path, body) => {
    const r = await fetch(`${url}/_control/${path}`, body === undefined ? {} : { method: 'POST', body: JSON.stringify(body) });
    return r.json();
  };
  return {
    url,
    requests: () => control('requests'),
    generations: async () => (await control('requests')).filter((r) => ['/api/chat', '/api/generate', '/v1/chat/completions'].includes(r.path)),
    faults: (list) => control('faults', list),
    delay: (ms) => control('delay', { ms }),
    reset: () => control('reset', {}),
    close: () => child.kill(),
  };
}

/** A loopback URL with nothing listening. */
export async function closedPortUrl() {
  const net = await import('node:net');
  const srv = net.createServer();
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address();
  await new Promise((r) => srv.close(r));
  return `http://127.0.0.1:${port}`;
}

/** Check rows cover episodes 1..=n exactly once, in order. */
export function assertCovers(assert, rows, n) {
  let next = 1;
  for (const r of rows) {
    assert.equal(r.firstEpisode, next);
    next = r.lastEpisode + 1;
  }
  assert.equal(next, n + 1);
}
