// The JS half of `cargo bench --bench engine -- --js`: the same measurements as the Rust half, printed as
// one JSON line. Usage: node scripts/bench.mjs --url URL [--episodes N] [--runs N]
import { createEngine, ollama } from '../src/index.js';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const url = args.url;
const episodes = Number(args.episodes ?? 40);
const runs = Number(args.runs ?? 3);
const median = (xs) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const now = () => performance.now();

const engine = await createEngine({ llm: ollama({ url }) });

// Instantiate only, and a fresh instance plus an export call with a 50 KiB string.
const N = 300;
for (let i = 0; i < 20; i++) await engine.instantiateOnly(); // warm-up
let t = now();
for (let i = 0; i < N; i++) await engine.instantiateOnly();
const instantiateMs = (now() - t) / N;
const big = 'word '.repeat((50 * 1024) / 5);
t = now();
for (let i = 0; i < N; i++) await engine.estimateTokens(big);
const call50kUs = ((now() - t) / N) * 1000;

// Summarize a session through the model (several passes), wall time.
const words = ['database', 'upgrade', 'window', 'replica', 'backup', 'migration', 'latency', 'index', 'query', 'rollout'];
const sentence = (i, n) => Array.from({ length: n }, (_, k) => words[(i * 7 + k * 3) % words.length]).join(' ') + '.';
const cfg = { contextLength: 1024, maxOutputTokens: 200 };
const times = [];
let passes = 0;
for (let r = 0; r < runs; r++) {
  // A fresh store per run: cached partial summaries and calibration must not carry over.
  const engine = await createEngine({ llm: ollama({ url }) });
  const session = `bench-${r}`;
  await engine.append(session, Array.from({ length: episodes }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: sentence(i, 60), sourceKey: String(i) })));
  t = now();
  const out = await engine.summarizeNow(session, cfg);
  times.push(now() - t);
  passes = out.passes;
}
console.log(JSON.stringify({ node: process.versions.node, instantiate_ms: instantiateMs, call50k_us: call50kUs, summarize_ms: median(times), passes }));
