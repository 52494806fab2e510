// Summarize a Claude Code session file through the JS host.
//   node examples/summarize-transcript.mjs FILE [--url http://127.0.0.1:11434]
// Without --url it uses the extractive engine (no model).
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import { MemoryStore, createEngine, ollama } from '../src/index.js';

const [file, flag, url] = process.argv.slice(2);
if (!file) throw new Error('usage: node examples/summarize-transcript.mjs FILE [--url URL]');
const episodes = [];
for (const line of readFileSync(file, 'utf8').split('\n')) {
  let v;
  try { v = JSON.parse(line); } catch { continue; } // blank or partial lines
  if (!['user', 'assistant'].includes(v.type) || v.isMeta || v.isSidechain || !v.message) continue;
  const c = v.message.content;
  const text = typeof c === 'string' ? c : (c ?? []).filter((b) => b.type === 'text').map((b) => b.text).join('\n');
  if (text.trim() && !/^<(command-|local-command|system-reminder)/.test(text)) episodes.push({ role: v.message.role, content: text, sourceKey: v.uuid });
}
const engine = await createEngine({ store: new MemoryStore(), llm: flag === '--url' ? ollama({ url }) : undefined });
await engine.append(basename(file), episodes);
const out = await engine.summarizeNow(basename(file), { engine: flag === '--url' ? 'llm' : 'extractive' });
console.log(`${episodes.length} episodes, ${out.passes} pass(es)\n${out.written.at(-1).content}`);
