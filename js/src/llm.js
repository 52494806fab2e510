// Language-model backends over fetch: Ollama's native API and OpenAI-compatible servers.
// Requests mirror the Rust host's: num_ctx and truncate:false always, stream:false.
import { AbridgeError } from './errors.js';

const OLLAMA_HINT = "start it with 'ollama serve', set the url, or use the extractive engine";

function snippet(text) {
  return text.length > 120 ? `${text.slice(0, 120)}…` : text;
}

async function post(server, base, url, body, { timeoutMs, headers = {}, hint }) {
  let resp;
  try {
    resp = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    });
  } catch (e) {
    if (e.name === 'TimeoutError') {
      throw new Transient(new AbridgeError('timeout', `${server} at ${base} did not answer in time; raise timeoutMs or check the server's load`));
    }
    const cause = e.cause?.code ?? e.cause?.message ?? e.message;
    throw new Transient(new AbridgeError('unreachable', `${server} at ${base} is not reachable (${cause}) — ${hint}`));
  }
  let text;
  try {
    text = await resp.text();
  } catch (e) {
    throw new Transient(new AbridgeError('server', `${server} at ${base}: ${e.message}`));
  }
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: resp.status, text, json };
}

/** Retry policy: the Rust host's defaults (3 attempts, 500 ms doubling, capped at 10 s). */
export const defaultRetry = Object.freeze({ attempts: 3, baseMs: 500, maxMs: 10_000 });

/** A failure that may pass by itself: retried. */
class Transient {
  constructor(error) {
    this.error = error;
  }
}

/** Delay after failed attempt n (1-based): base·2^(n-1), capped, with equal jitter. */
export function retryDelay(policy, n) {
  const exp = Math.min(policy.baseMs * 2 ** (n - 1), policy.maxMs);
  return exp / 2 + Math.random() * (exp / 2);
}

async function withRetry(policy, attempt) {
  const attempts = Math.max(1, policy.attempts);
  for (let n = 1; ; n++) {
    try {
      return await attempt();
    } catch (e) {
      if (!(e instanceof Transient)) throw e;
      if (n >= attempts) {
        const err = e.error;
        throw attempts > 1 && ['unreachable', 'timeout', 'server'].includes(err.kind) ? new AbridgeError(err.kind, `${err.detail} (after ${attempts} attempts)`) : err;
      }
      await new Promise((r) => setTimeout(r, retryDelay(policy, n)));
    }
  }
}

function finish(reason) {
  if (reason === 'stop' || reason == null) return 'stop';
  return reason === 'length' ? 'length' : 'other';
}

/** Run requests through `generate` with at most `limit` in flight (a sliding window). */
export async function slidingWindow(reqs, limit, generate) {
  const results = new Array(reqs.length);
  let next = 0;
  const worker = async () => {
    while (next < reqs.length) {
      const i = next++;
      try {
        results[i] = { tag: 'ok', val: await generate(reqs[i]) };
      } catch (e) {
        if (!(e instanceof AbridgeError)) throw e;
        results[i] = { tag: 'err', val: { tag: e.kind, val: e.detail } };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, reqs.length) }, worker));
  return results;
}

/** Ollama's native API. */
export function ollama({ url = 'http://localhost:11434', timeoutMs = 300_000, retry = defaultRetry } = {}) {
  const base = url.replace(/\/+$/, '');
  return {
    name: 'ollama',
    generate: (req) => withRetry(retry, () => ollamaAttempt(base, timeoutMs, req)),
  };
}

async function ollamaAttempt(base, timeoutMs, req) {
  const options = { num_ctx: req.contextLength, num_predict: req.maxOutputTokens, temperature: req.temperature };
  if (req.stop.length) options.stop = req.stop;
  if (req.seed !== undefined) options.seed = req.seed;
  const [path, body] = req.prompt.tag === 'chat'
    ? ['/api/chat', { model: req.model, messages: req.prompt.val.map((m) => ({ role: m.role, content: m.content })), stream: false, truncate: false, options }]
    : ['/api/generate', { model: req.model, prompt: req.prompt.val, raw: true, stream: false, truncate: false, options }];
  const target = `${base}${path}`;
  const r = await post('Ollama', base, target, body, { timeoutMs, hint: OLLAMA_HINT });
  const errMsg = typeof r.json?.error === 'string' ? r.json.error : undefined;
  if (r.status < 200 || r.status >= 300) {
    const msg = errMsg ?? snippet(r.text);
    if (r.status === 404) {
      throw new AbridgeError('model-not-found', `model '${req.model}' is not available on the Ollama server — run 'ollama pull ${req.model}', pick another model, or use the extractive engine`);
    }
    if (r.status === 400 && msg.includes('context length')) throw new AbridgeError('context-overflow', msg);
    const err = new AbridgeError('server', `HTTP ${r.status} from ${target}: ${msg}`);
    throw r.status === 429 || r.status >= 500 ? new Transient(err) : err;
  }
  if (r.json === undefined) {
    throw new Transient(new AbridgeError('server', `${target} answered with something that is not JSON (${snippet(r.text)}); is it really an Ollama server?`));
  }
  if (errMsg !== undefined) throw new Transient(new AbridgeError('server', `${target}: ${errMsg}`));
  const text = r.json.message?.content ?? r.json.response;
  if (typeof text !== 'string') throw new Transient(new AbridgeError('server', `${target} answered without a message; is it really an Ollama server?`));
  return {
    text,
    finishReason: finish(r.json.done_reason),
    promptTokens: r.json.prompt_eval_count ?? undefined,
    outputTokens: r.json.eval_count ?? undefined,
  };
}

/** An OpenAI-compatible server (`baseUrl` ends in /v1). */
export function openai({ baseUrl, apiKey, timeoutMs = 300_000, retry = defaultRetry }) {
  const base = baseUrl.replace(/\/+$/, '');
  return {
    name: 'openai',
    generate: (req) => withRetry(retry, () => openaiAttempt(base, apiKey, timeoutMs, req)),
  };
}

async function openaiAttempt(base, apiKey, timeoutMs, req) {
  const hint = 'check baseUrl, or use the ollama backend or the extractive engine';
  if (req.prompt.tag !== 'chat') {
    throw new AbridgeError('invalid-input', "raw ChatML prompts need the Ollama backend; use rendering 'chat' with openai");
  }
  const body = {
    model: req.model,
    messages: req.prompt.val.map((m) => ({ role: m.role, content: m.content })),
    temperature: req.temperature,
    max_tokens: req.maxOutputTokens,
    stream: false,
  };
  if (req.stop.length) body.stop = req.stop;
  if (req.seed !== undefined) body.seed = req.seed;
  const target = `${base}/chat/completions`;
  const headers = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
  const r = await post('the OpenAI-compatible server', base, target, body, { timeoutMs, headers, hint });
  if (r.status < 200 || r.status >= 300) {
    const msg = r.json?.error?.message ?? (typeof r.json?.error === 'string' ? r.json.error : snippet(r.text));
    if (r.status === 401 || r.status === 403) throw new AbridgeError('server', `${target} refused the credentials (${msg}); set apiKey`);
    if (r.status === 404) throw new AbridgeError('model-not-found', `model '${req.model}' is not available at ${base} (${msg}); pick another model`);
    if (r.status === 400 && msg.includes('context')) throw new AbridgeError('context-overflow', msg);
    const err = new AbridgeError('server', `HTTP ${r.status} from ${target}: ${msg}`);
    throw r.status === 429 || r.status >= 500 ? new Transient(err) : err;
  }
  const choice = r.json?.choices?.[0];
  if (!choice) throw new Transient(new AbridgeError('server', `${target} answered without choices`));
  return {
    text: choice.message?.content ?? '',
    finishReason: finish(choice.finish_reason),
    promptTokens: r.json.usage?.prompt_tokens ?? undefined,
    outputTokens: r.json.usage?.completion_tokens ?? undefined,
  };
}

/** For the extractive engine: any model call is a configuration error. */
export const noModel = {
  name: 'none',
  async generate() {
    throw new AbridgeError('invalid-input', "no language model is configured; use engine 'extractive' or pass an llm backend");
  },
};
