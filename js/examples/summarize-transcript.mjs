// Summarize a transcript file (Claude Code, JSON lines, OpenAI messages, ChatGPT export)
// through the JS host; the file is parsed inside the sandbox, by the same parser as the Rust
// runner.
//   node examples/summarize-transcript.mjs FILE [--url http://127.0.0.1:11434]
// Without --url it uses the extractive engine (no model).
import { createReadStream } from 'node:fs';
import { basename } from 'node:path';
import { createEngine, ollama } from '../src/index.js';

/** `n` and a noun in the number it takes: "1 episode", "3 episodes". */
const count = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

const [file, flag, url] = process.argv.slice(2);
if (!file) throw new Error('usage: node examples/summarize-transcript.mjs FILE [--url URL]');
const engine = await createEngine({ llm: flag === '--url' ? ollama({ url }) : undefined });
const parsed = await engine.parseTranscript(createReadStream(file), { name: basename(file) });
for (const w of parsed.warnings) console.error(w);
for (const conv of parsed.conversations) {
  const session = conv.id ?? basename(file);
  await engine.appendImported(session, conv.episodes);
  const out = await engine.summarizeNow(session, { engine: flag === '--url' ? 'llm' : 'extractive' });
  console.log(`${session} (${parsed.format}): ${count(conv.episodes.length, 'episode')}, ${count(out.passes, 'summary pass', 'summary passes')}\n${out.written.at(-1).content}`);
}
