//! A deterministic, Ollama-compatible LLM server for abridge's tests.
//!
//! It speaks the parts of the Ollama API abridge uses (`/api/chat`, `/api/generate`,
//! `/api/tags`, `/api/version`, `/`), and OpenAI's `/v1/chat/completions` and `/v1/models`,
//! on a free loopback port. Replies are computed from the prompt, so the same prompt always
//! gets the same summary. It records every request and can inject delays and faults.
//!
//! Like Ollama it counts prompt tokens itself (its own rule: one token per started four
//! characters of each whitespace-separated word), honours `num_ctx` and `num_predict`, and
//! either refuses a prompt over the context (`truncate: false`, HTTP 400) or truncates it
//! silently and reports `prompt_eval_count = num_ctx`.
//!
//! Control endpoints (for tests in other languages): `POST /_control/faults` with a JSON
//! array of [`Fault`]s, `POST /_control/delay` with `{"ms": N}`, `GET /_control/requests`,
//! `POST /_control/reset`.
#![deny(missing_docs)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A fault applied to one generation request (chat, generate or completions), in order.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// Answer with this HTTP status and an Ollama-style `{"error": message}` body.
    Status {
        /// HTTP status code.
        code: u16,
        /// Error message.
        message: String,
    },
    /// Answer 200 with a body that is not JSON.
    Garbage,
    /// Close the connection without answering.
    Disconnect,
    /// Wait this long before answering normally.
    Delay {
        /// Milliseconds.
        ms: u64,
    },
    /// Answer with this text in full, as `stop`, ignoring the request's output limit (a server
    /// that does not honour `num_predict`, or a babbling model).
    Unlimited {
        /// The text.
        text: String,
    },
    /// Answer normally but with this text as the model's output.
    Reply {
        /// The text.
        text: String,
        /// `done_reason` / `finish_reason`; default `stop`.
        #[serde(default)]
        done_reason: Option<String>,
    },
}

/// One request as received.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoggedRequest {
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// Parsed JSON body (`null` when empty or not JSON).
    pub body: Value,
    /// Milliseconds since the server started, when the request arrived.
    pub at_ms: u64,
}

/// Server settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// Models the server has "pulled".
    pub models: Vec<String>,
    /// Delay before every generation answer.
    pub delay: Duration,
    /// Context length when a request sends no `num_ctx` (Ollama's default before v0.6.7).
    pub default_num_ctx: u32,
    /// A heavy tail: every `n`-th generation request (by arrival) waits this long instead of
    /// `delay`. Deterministic, so runs compare.
    pub tail: Option<(u32, Duration)>,
    /// Multiplies the server's prompt token counts: a model whose tokenizer counts more (or
    /// fewer) tokens than the client estimates. 1.0 by default.
    pub token_ratio: f64,
    /// Whether Ollama's own API (`/`, `/api/*`) answers; off, the server is a plain
    /// OpenAI-compatible one (vLLM, llama.cpp) with only `/v1`.
    pub ollama_api: bool,
    /// Generation slots, like `OLLAMA_NUM_PARALLEL`: with `Some(n)`, at most `n` requests
    /// are processed at once and the rest wait their turn in a queue (and the wait counts
    /// against the client's timeout, as with Ollama). `None`: no limit.
    pub slots: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            models: vec!["qwen2.5:3b".into(), "llama3.2:1b".into()],
            delay: Duration::ZERO,
            default_num_ctx: 2048,
            token_ratio: 1.0,
            tail: None,
            ollama_api: true,
            slots: None,
        }
    }
}

struct State {
    opts: Options,
    generations: u32,
    faults: VecDeque<Fault>,
    log: Vec<LoggedRequest>,
    started: std::time::Instant,
    /// Generation requests being processed now (for `Options::slots`).
    busy: usize,
    /// The last generation request's prompt, and what each one shared with the one before.
    last_prompt: String,
    shares: Vec<PrefixShare>,
}

/// What a generation request's prompt shares with the one before it, as a local runner's KV
/// cache would reuse it (llama.cpp keeps the longest common prefix; Ollama runs llama.cpp).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixShare {
    /// Characters of the prompt the previous prompt began with too.
    pub shared: usize,
    /// Characters of the prompt.
    pub total: usize,
}

/// A generation slot, held while a request is processed.
struct Slot<'a>(Option<&'a Mutex<State>>);

impl Slot<'_> {
    /// Wait for a free slot (none needed without `Options::slots`). `None` when the client
    /// hung up while queued: like Ollama, the server drops a request nobody waits for.
    fn take<'a>(state: &'a Mutex<State>, conn: &TcpStream) -> Option<Slot<'a>> {
        loop {
            let mut st = state.lock().unwrap();
            match st.opts.slots {
                None => return Some(Slot(None)),
                Some(n) if st.busy < n.max(1) => {
                    st.busy += 1;
                    return Some(Slot(Some(state)));
                }
                Some(_) => {}
            }
            drop(st);
            if client_gone(conn) {
                return None;
            }
            thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Whether the client closed its side of the connection.
fn client_gone(conn: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    let _ = conn.set_nonblocking(true);
    let gone = matches!(conn.peek(&mut b), Ok(0));
    let _ = conn.set_nonblocking(false);
    gone
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Some(state) = self.0 {
            state.lock().unwrap().busy -= 1;
        }
    }
}

/// A running test server; it stops when dropped.
pub struct TestServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Start with default options on a free loopback port.
    pub fn start() -> TestServer {
        Self::start_with(Options::default())
    }

    /// Start with the given options on a free loopback port.
    pub fn start_with(opts: Options) -> TestServer {
        Self::bind("127.0.0.1:0", opts).expect("binding a loopback port")
    }

    /// Start on a given loopback address (port 0 for a free one).
    pub fn bind(addr: &str, opts: Options) -> std::io::Result<TestServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() {
            return Err(std::io::Error::other(
                "the test server only listens on loopback",
            ));
        }
        let state = Arc::new(Mutex::new(State {
            opts,
            generations: 0,
            faults: VecDeque::new(),
            log: Vec::new(),
            started: std::time::Instant::now(),
            busy: 0,
            last_prompt: String::new(),
            shares: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let thread = thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                thread::spawn(move || {
                    let _ = handle(conn, &st);
                });
            }
        });
        Ok(TestServer {
            addr,
            state,
            stop,
            thread: Some(thread),
        })
    }

    /// Base URL, e.g. `http://127.0.0.1:43121`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queue faults for the next generation requests, one each.
    pub fn push_faults(&self, faults: impl IntoIterator<Item = Fault>) {
        self.state.lock().unwrap().faults.extend(faults);
    }

    /// Set the delay before every generation answer.
    pub fn set_delay(&self, delay: Duration) {
        self.state.lock().unwrap().opts.delay = delay;
    }

    /// All requests so far.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.state.lock().unwrap().log.clone()
    }

    /// For each generation request so far, the prefix its prompt shares with the one before
    /// (what a runner's KV cache would not evaluate again).
    pub fn prefix_shares(&self) -> Vec<PrefixShare> {
        self.state.lock().unwrap().shares.clone()
    }

    /// Generation requests so far (chat, generate, completions).
    pub fn generations(&self) -> Vec<LoggedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| is_generation(&r.path))
            .collect()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn is_embedding(path: &str) -> bool {
    matches!(path, "/api/embed" | "/v1/embeddings")
}

/// Dimension of this server's embeddings.
pub const EMBED_DIM: usize = 32;

/// This server's "embedding model": each lowercased word hashed (FNV-1a) to one of
/// [`EMBED_DIM`] slots with a sign from the hash, scaled to unit length. Texts sharing words
/// are close; the same text always gets the same vector.
pub fn embed(text: &str) -> Vec<f32> {
    let mut v = vec![0f32; EMBED_DIM];
    for w in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
    {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in w.to_lowercase().bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        v[(h % EMBED_DIM as u64) as usize] += if h >> 63 == 1 { -1.0 } else { 1.0 };
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

fn is_generation(path: &str) -> bool {
    matches!(path, "/api/chat" | "/api/generate" | "/v1/chat/completions")
}

/// Tokens as this server's "model" counts them: a started four characters of each word.
pub fn count_tokens(text: &str) -> u32 {
    text.split_whitespace()
        .map(|w| (w.chars().count() as u32).div_ceil(4))
        .sum()
}

struct HttpRequest {
    method: String,
    path: String,
    body: Vec<u8>,
}

fn read_request(conn: &TcpStream) -> std::io::Result<Option<HttpRequest>> {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("/").to_string();
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.trim().eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    Ok(Some(HttpRequest { method, path, body }))
}

fn respond(
    mut conn: &TcpStream,
    status: u16,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    write!(
        conn,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}

fn handle(conn: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    // Answer without waiting on Nagle's algorithm (a real server's latency is the delay option).
    conn.set_nodelay(true)?;
    let Some(req) = read_request(&conn)? else {
        return Ok(());
    };
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let (fault, mut delay, models, default_ctx, token_ratio, tail_hit) = {
        let mut st = state.lock().unwrap();
        let at_ms = st.started.elapsed().as_millis() as u64;
        st.log.push(LoggedRequest {
            method: req.method.clone(),
            path: req.path.clone(),
            body: body.clone(),
            at_ms,
        });
        if is_generation(&req.path) {
            let prompt = prompt_text(&req.path, &body);
            let shared = prompt
                .chars()
                .zip(st.last_prompt.chars())
                .take_while(|(a, b)| a == b)
                .count();
            let total = prompt.chars().count();
            st.shares.push(PrefixShare { shared, total });
            st.last_prompt = prompt;
        }
        let fault = if is_generation(&req.path) || is_embedding(&req.path) {
            st.faults.pop_front()
        } else {
            None
        };
        let tail_hit = if is_generation(&req.path) {
            st.generations += 1;
            st.opts
                .tail
                .filter(|(n, _)| *n > 0 && st.generations.is_multiple_of(*n))
                .map(|(_, d)| d)
        } else {
            None
        };
        (
            fault,
            st.opts.delay,
            st.opts.models.clone(),
            st.opts.default_num_ctx,
            st.opts.token_ratio,
            tail_hit,
        )
    };
    let ollama_api = state.lock().unwrap().opts.ollama_api;
    if !ollama_api && !req.path.starts_with("/v1/") && !req.path.starts_with("/_control/") {
        return respond(&conn, 404, "text/plain", "404 page not found");
    }
    let json = |status, v: Value| respond(&conn, status, "application/json", &v.to_string());
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/") => return respond(&conn, 200, "text/plain", "Ollama is running"),
        ("GET", "/api/version") => return json(200, json!({"version": "0.12.0-abridge-test"})),
        ("GET", "/api/tags") => {
            let list: Vec<Value> = models
                .iter()
                .map(|m| json!({"name": m, "model": m, "size": 1, "digest": "0"}))
                .collect();
            return json(200, json!({"models": list}));
        }
        ("GET", "/v1/models") => {
            let list: Vec<Value> = models
                .iter()
                .map(|m| json!({"id": m, "object": "model", "owned_by": "abridge-test"}))
                .collect();
            return json(200, json!({"object": "list", "data": list}));
        }
        ("GET", "/_control/requests") => {
            return json(
                200,
                serde_json::to_value(state.lock().unwrap().log.clone()).unwrap(),
            );
        }
        ("POST", "/_control/faults") => {
            return match serde_json::from_value::<Vec<Fault>>(body) {
                Ok(f) => {
                    state.lock().unwrap().faults.extend(f);
                    json(200, json!({"ok": true}))
                }
                Err(e) => json(400, json!({"error": e.to_string()})),
            };
        }
        ("POST", "/_control/delay") => {
            let ms = body.get("ms").and_then(Value::as_u64).unwrap_or(0);
            state.lock().unwrap().opts.delay = Duration::from_millis(ms);
            return json(200, json!({"ok": true}));
        }
        ("POST", "/_control/reset") => {
            let mut st = state.lock().unwrap();
            st.faults.clear();
            st.log.clear();
            return json(200, json!({"ok": true}));
        }
        ("POST", p) if is_generation(p) || is_embedding(p) => {}
        _ => {
            return json(
                404,
                json!({"error": format!("no route {} {}", req.method, req.path)}),
            );
        }
    }

    let openai = req.path.starts_with("/v1/");
    let err = |status: u16, msg: &str| {
        let v = if openai {
            json!({"error": {"message": msg, "type": if status == 404 { "not_found_error" } else { "invalid_request_error" }, "param": null, "code": null}})
        } else {
            json!({"error": msg})
        };
        respond(&conn, status, "application/json", &v.to_string())
    };
    if body.is_null() {
        return err(400, "missing request body");
    }
    if let Some(d) = tail_hit {
        delay = d;
    }
    // Queued behind other requests when the slots are taken; the processing time reported
    // as total_duration excludes that wait, as Ollama's does.
    let _slot = match is_generation(&req.path).then(|| Slot::take(state, &conn)) {
        Some(None) => return Ok(()),
        other => other.flatten(),
    };
    let processing = std::time::Instant::now();
    if _slot.is_some() {
        // Like Ollama, stop working on a request whose client has gone (it timed out).
        while processing.elapsed() < delay {
            if client_gone(&conn) {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(5).min(delay));
        }
    } else {
        thread::sleep(delay);
    }
    let mut reply_override = None;
    let mut unlimited = false;
    match fault {
        Some(Fault::Unlimited { text }) => {
            unlimited = true;
            reply_override = Some((text, "stop".into()));
        }
        Some(Fault::Status { code, message }) => return err(code, &message),
        Some(Fault::Garbage) => return respond(&conn, 200, "application/json", "<html>not json"),
        Some(Fault::Disconnect) => return conn.shutdown(Shutdown::Both),
        Some(Fault::Delay { ms }) => thread::sleep(Duration::from_millis(ms)),
        Some(Fault::Reply { text, done_reason }) => {
            reply_override = Some((text, done_reason.unwrap_or_else(|| "stop".into())))
        }
        None => {}
    }

    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !models
        .iter()
        .any(|m| *m == model || *m == format!("{model}:latest"))
    {
        return err(404, &format!("model '{model}' not found"));
    }
    let opts = body.get("options").cloned().unwrap_or(Value::Null);
    let (num_ctx, num_predict) = if openai {
        (
            default_ctx,
            body.get("max_tokens")
                .and_then(Value::as_u64)
                .map(|n| n as u32),
        )
    } else {
        (
            opts.get("num_ctx")
                .and_then(Value::as_u64)
                .map_or(default_ctx, |n| n as u32),
            opts.get("num_predict")
                .and_then(Value::as_i64)
                .filter(|n| *n >= 0)
                .map(|n| n as u32),
        )
    };
    if is_embedding(&req.path) {
        let inputs: Vec<String> = match body.get("input") {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        if inputs.is_empty() {
            return err(400, "input must be a string or a list of strings");
        }
        let num_ctx = body
            .pointer("/options/num_ctx")
            .and_then(Value::as_u64)
            .map_or(default_ctx, |n| n as u32);
        let truncate = body
            .get("truncate")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let mut tokens = 0u32;
        for t in &inputs {
            let n = (f64::from(count_tokens(t)) * token_ratio).ceil() as u32;
            if n > num_ctx && (!truncate || openai) {
                return err(400, "the input length exceeds the context length");
            }
            tokens += n.min(num_ctx);
        }
        let vectors: Vec<Vec<f32>> = inputs.iter().map(|t| embed(t)).collect();
        let v = if openai {
            let data: Vec<Value> = vectors
                .iter()
                .enumerate()
                .map(|(i, e)| json!({"object": "embedding", "embedding": e, "index": i}))
                .collect();
            json!({"object": "list", "data": data, "model": model,
                   "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
        } else {
            json!({"model": model, "embeddings": vectors, "total_duration": 1_000_000,
                   "load_duration": 0, "prompt_eval_count": tokens})
        };
        return json(200, v);
    }
    let prompt = prompt_text(&req.path, &body);
    let prompt_tokens = (f64::from(count_tokens(&prompt)) * token_ratio).ceil() as u32;
    let truncate = body
        .get("truncate")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    if prompt_tokens > num_ctx && (!truncate || openai) {
        return err(
            400,
            &format!(
                "the prompt is longer than the context length currently available to the model ({prompt_tokens} > {num_ctx})"
            ),
        );
    }
    let (mut text, mut reason) =
        reply_override.unwrap_or_else(|| (summarize(&prompt), "stop".to_string()));
    if let Some(limit) = num_predict
        && !unlimited
        && count_tokens(&text) > limit
    {
        text = text
            .split_whitespace()
            .take(limit as usize)
            .collect::<Vec<_>>()
            .join(" ");
        reason = "length".into();
    }
    let eval_count = count_tokens(&text);
    let prompt_eval_count = prompt_tokens.min(num_ctx);
    if openai && body.get("stream").and_then(Value::as_bool) == Some(true) {
        let usage = body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        return stream_sse(
            &conn,
            &model,
            &text,
            &reason,
            (prompt_eval_count, eval_count),
            usage,
        );
    }
    let streaming = !openai && body.get("stream").and_then(Value::as_bool).unwrap_or(true);
    if streaming {
        return stream_ndjson(
            &conn,
            &req.path,
            &model,
            &text,
            &reason,
            prompt_eval_count,
            eval_count,
        );
    }
    let v = match req.path.as_str() {
        "/api/chat" => json!({
            "model": model, "created_at": "2026-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": text},
            "done": true, "done_reason": reason,
            "total_duration": processing.elapsed().as_nanos() as u64, "prompt_eval_count": prompt_eval_count, "eval_count": eval_count,
        }),
        "/api/generate" => json!({
            "model": model, "created_at": "2026-01-01T00:00:00Z", "response": text,
            "done": true, "done_reason": reason,
            "total_duration": processing.elapsed().as_nanos() as u64, "prompt_eval_count": prompt_eval_count, "eval_count": eval_count,
        }),
        _ => json!({
            "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
            "system_fingerprint": "fp_ollama",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}],
            "usage": {"prompt_tokens": prompt_eval_count, "completion_tokens": eval_count, "total_tokens": prompt_eval_count + eval_count},
        }),
    };
    json(200, v)
}

/// Ollama's streaming answer: one NDJSON line per word, then a final line with the metrics.
fn stream_ndjson(
    mut conn: &TcpStream,
    path: &str,
    model: &str,
    text: &str,
    reason: &str,
    prompt_eval_count: u32,
    eval_count: u32,
) -> std::io::Result<()> {
    let chat = path == "/api/chat";
    let piece = |delta: &str, done: bool| {
        let mut v = if chat {
            json!({"model": model, "created_at": "2026-01-01T00:00:00Z", "message": {"role": "assistant", "content": delta}, "done": done})
        } else {
            json!({"model": model, "created_at": "2026-01-01T00:00:00Z", "response": delta, "done": done})
        };
        if done {
            v["done_reason"] = json!(reason);
            v["prompt_eval_count"] = json!(prompt_eval_count);
            v["eval_count"] = json!(eval_count);
        }
        v.to_string() + "\n"
    };
    let mut body = String::new();
    for (i, w) in text.split(' ').enumerate() {
        body.push_str(&piece(
            &if i == 0 {
                w.to_string()
            } else {
                format!(" {w}")
            },
            false,
        ));
    }
    body.push_str(&piece("", true));
    respond(conn, 200, "application/x-ndjson", &body)?;
    conn.flush()
}

/// OpenAI's streaming answer (`"stream": true` on `/v1/chat/completions`): server-sent
/// events, a chunk per word, a last chunk with the finish reason, the usage when
/// `stream_options.include_usage` asks for it, then `[DONE]`.
fn stream_sse(
    mut conn: &TcpStream,
    model: &str,
    text: &str,
    reason: &str,
    (prompt_tokens, completion_tokens): (u32, u32),
    usage: bool,
) -> std::io::Result<()> {
    let chunk = |delta: Value, finish: Value| {
        let v = json!({"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0,
            "model": model, "system_fingerprint": "fp_ollama",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {v}\n\n")
    };
    let mut body = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    for (i, w) in text.split(' ').enumerate() {
        let piece = if i == 0 {
            w.to_string()
        } else {
            format!(" {w}")
        };
        body.push_str(&chunk(json!({"content": piece}), Value::Null));
    }
    body.push_str(&chunk(json!({}), json!(reason)));
    if usage {
        let v = json!({"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0,
            "model": model, "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}});
        body.push_str(&format!("data: {v}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    respond(conn, 200, "text/event-stream", &body)?;
    conn.flush()
}

/// The prompt as one text (chat messages joined by newlines; a message whose content is a
/// list of parts gives its text parts).
fn prompt_text(path: &str, body: &Value) -> String {
    if path == "/api/generate" {
        return body
            .get("prompt")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
    }
    body.get("messages")
        .and_then(Value::as_array)
        .map(|ms| {
            ms.iter()
                .filter_map(|m| match m.get("content") {
                    Some(Value::String(t)) => Some(t.clone()),
                    Some(Value::Array(parts)) => Some(
                        parts
                            .iter()
                            .filter_map(|p| p.get("text").and_then(Value::as_str))
                            .collect::<Vec<_>>()
                            .join("\n"),
                    ),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// The deterministic "model": a short third-person summary built from the transcript lines
/// (`User: …`, `Assistant: …`) found in the prompt.
pub fn summarize(prompt: &str) -> String {
    if prompt.contains("Partial summaries, in order:") {
        return merge(prompt);
    }
    if prompt.contains("Facts:\n")
        || prompt.contains("New facts:\n")
        || prompt.contains("Partial summaries:\n")
    {
        return restate_facts(prompt);
    }
    let lines: Vec<&str> = prompt
        .lines()
        .filter(|l| {
            ["User: ", "Assistant: ", "Tool: ", "System: "]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    let mut out = format!(
        "The user and the assistant discussed {} over {} messages.",
        topics(&lines),
        lines.len()
    );
    if let Some(last) = lines.last() {
        let (who, text) = last.split_once(": ").unwrap_or(("User", last));
        let words: Vec<&str> = text.split_whitespace().take(8).collect();
        out.push_str(&format!(
            " The conversation ends with the {} saying \"{}\".",
            who.to_lowercase(),
            words.join(" ")
        ));
    }
    if prompt.contains("Current summary:") {
        out.push_str(" This continues an earlier summary.");
    }
    out
}

/// A memory-cluster summary: the current summary (if any), then every fact ("- …") or
/// partial summary ("Part N:") shown, each as a sentence.
fn restate_facts(prompt: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut block = "";
    for line in prompt.lines() {
        let t = line.trim();
        if t == "Current summary:" || (t.starts_with("Part ") && t.ends_with(':')) {
            block = "text";
            continue;
        }
        if t.is_empty() {
            block = "";
            continue;
        }
        if let Some(f) = t.strip_prefix("- ") {
            out.push(format!("{}.", f.trim_end_matches('.')));
        } else if block == "text" {
            out.push(t.to_string());
        }
    }
    out.join(" ")
}

/// The three most frequent words of five letters or more in `lines` (after any "Role: ").
fn topics(lines: &[&str]) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for l in lines {
        let text = l.split_once(": ").map_or(*l, |(_, t)| t);
        for w in text.split(|c: char| !c.is_alphanumeric()) {
            let w = w.to_lowercase();
            if w.chars().count() >= 5 {
                *counts.entry(w).or_default() += 1;
            }
        }
    }
    let mut top: Vec<(String, usize)> = counts.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let topics: Vec<String> = top.into_iter().take(3).map(|(w, _)| w).collect();
    match topics.len() {
        0 => "a few short messages".to_string(),
        1 => topics[0].clone(),
        _ => format!(
            "{} and {}",
            topics[..topics.len() - 1].join(", "),
            topics[topics.len() - 1]
        ),
    }
}

/// A reduce prompt: labelled partial summaries ("Episodes 1-40:" then the text) merged.
fn merge(prompt: &str) -> String {
    let mut labels = Vec::new();
    let mut texts = Vec::new();
    let mut lines = prompt.lines().peekable();
    while let Some(l) = lines.next() {
        let t = l.trim();
        if (t.starts_with("Episodes ") || t.starts_with("Episode ")) && t.ends_with(':') {
            labels.push(
                t.trim_end_matches(':')
                    .trim_start_matches("Episodes ")
                    .trim_start_matches("Episode ")
                    .to_string(),
            );
            if let Some(text) = lines.next() {
                texts.push(text);
            }
        }
    }
    let first = labels
        .first()
        .and_then(|l| l.split('-').next())
        .unwrap_or("?")
        .to_string();
    let last = labels
        .last()
        .and_then(|l| l.rsplit('-').next())
        .unwrap_or("?")
        .to_string();
    format!(
        "Across episodes {first}-{last}, in {} parts, the user and the assistant discussed {}.",
        labels.len(),
        topics(&texts)
    )
}

/// An https front for a [`TestServer`]: terminates TLS on its own loopback port with the given
/// certificate and forwards the bytes to the plain server. Stops when dropped.
pub struct TlsFront {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl TlsFront {
    /// Serve https in front of `server`, with a PEM certificate chain and PKCS#8 key.
    pub fn start(
        server: &TestServer,
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> std::io::Result<TlsFront> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(std::io::Error::other)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(std::io::Error::other)?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(std::io::Error::other)?;
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let backend = server.addr();
        let stop = Arc::new(AtomicBool::new(false));
        let sp = stop.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let config = config.clone();
                thread::spawn(move || {
                    let _ = tls_pump(conn, config, backend);
                });
            }
        });
        Ok(TlsFront { addr, stop })
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Move bytes between one TLS client and the plain server until both sides are done.
fn tls_pump(
    conn: TcpStream,
    config: Arc<rustls::ServerConfig>,
    backend: SocketAddr,
) -> std::io::Result<()> {
    use std::io::{ErrorKind, Read, Write};
    let mut tls = rustls::StreamOwned::new(
        rustls::ServerConnection::new(config).map_err(std::io::Error::other)?,
        conn,
    );
    let mut plain = TcpStream::connect(backend)?;
    let tick = Some(Duration::from_millis(5));
    tls.sock.set_read_timeout(tick)?;
    plain.set_read_timeout(tick)?;
    let idle = |e: &std::io::Error| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut);
    let mut buf = vec![0u8; 64 << 10];
    let (mut client_open, mut server_open) = (true, true);
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    while server_open && std::time::Instant::now() < deadline {
        if client_open {
            match tls.read(&mut buf) {
                Ok(0) => {
                    client_open = false;
                    let _ = plain.shutdown(Shutdown::Write);
                }
                Ok(n) => plain.write_all(&buf[..n])?,
                Err(e) if idle(&e) => {}
                Err(_) => {
                    client_open = false;
                    let _ = plain.shutdown(Shutdown::Write);
                }
            }
        }
        match plain.read(&mut buf) {
            Ok(0) => server_open = false,
            Ok(n) => {
                tls.write_all(&buf[..n])?;
                tls.flush()?;
            }
            Err(e) if idle(&e) => {}
            Err(_) => server_open = false,
        }
    }
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// POST `body` to `path` with a plain socket; returns (status, parsed body).
    fn post(server: &TestServer, path: &str, body: &Value) -> (u16, Value) {
        let mut conn = TcpStream::connect(server.addr()).unwrap();
        let body = body.to_string();
        write!(conn, "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let mut raw = String::new();
        conn.read_to_string(&mut raw).unwrap();
        let status = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
        let payload = raw.split_once("\r\n\r\n").unwrap().1;
        (status, serde_json::from_str(payload).unwrap_or(Value::Null))
    }

    #[test]
    fn context_behaviour_matches_ollama() {
        let server = TestServer::start();
        let long = "word ".repeat(300);
        let chat = |truncate: Option<bool>| {
            let mut b = json!({"model": "qwen2.5:3b", "stream": false, "options": {"num_ctx": 100},
                               "messages": [{"role": "user", "content": long}]});
            if let Some(t) = truncate {
                b["truncate"] = json!(t);
            }
            b
        };
        let (status, body) = post(&server, "/api/chat", &chat(Some(false)));
        assert_eq!(status, 400);
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("longer than the context length")
        );
        // With truncation on (Ollama's default) the prompt is cut silently.
        let (status, body) = post(&server, "/api/chat", &chat(None));
        assert_eq!(status, 200);
        assert_eq!(body["prompt_eval_count"], 100);
        // num_predict cuts the reply and reports done_reason "length".
        let (_, body) = post(
            &server,
            "/api/generate",
            &json!({"model": "qwen2.5:3b", "stream": false, "prompt": "User: hello there", "options": {"num_predict": 3}}),
        );
        assert_eq!(body["done_reason"], "length");
        assert_eq!(body["eval_count"], 3);
        // Unknown models are 404, as when a model is not pulled.
        let (status, _) = post(
            &server,
            "/api/chat",
            &json!({"model": "nope", "messages": []}),
        );
        assert_eq!(status, 404);
        // Without "stream": false the answer streams as NDJSON, like Ollama's.
        let mut conn = TcpStream::connect(server.addr()).unwrap();
        let b = json!({"model": "qwen2.5:3b", "prompt": "User: hello there"}).to_string();
        write!(
            conn,
            "POST /api/generate HTTP/1.1\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
        .unwrap();
        let mut raw = String::new();
        conn.read_to_string(&mut raw).unwrap();
        let lines: Vec<Value> = raw
            .split_once("\r\n\r\n")
            .unwrap()
            .1
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(lines.len() > 2);
        let text: String = lines
            .iter()
            .map(|l| l["response"].as_str().unwrap())
            .collect();
        assert!(text.starts_with("The user and the assistant"));
        assert_eq!(lines.last().unwrap()["done"], true);
        assert_eq!(server.generations().len(), 5);
    }

    #[test]
    fn embeddings_are_deterministic_batched_and_refuse_overlong_input() {
        let server = TestServer::start();
        let model = Options::default().models[0].clone();
        let (status, v) = post(
            &server,
            "/api/embed",
            &json!({"model": model, "input": ["dark theme", "dark theme please", "Fridays"], "truncate": false}),
        );
        assert_eq!(status, 200, "{v}");
        let e = v["embeddings"].as_array().unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].as_array().unwrap().len(), EMBED_DIM);
        assert_eq!(e[0], json!(embed("dark theme")));
        let long = "word ".repeat(5000);
        let (status, v) = post(
            &server,
            "/api/embed",
            &json!({"model": model, "input": [long], "truncate": false, "options": {"num_ctx": 64}}),
        );
        assert_eq!(
            (status, v["error"].as_str()),
            (400, Some("the input length exceeds the context length"))
        );
        let (status, v) = post(
            &server,
            "/v1/embeddings",
            &json!({"model": model, "input": "dark theme"}),
        );
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["data"][0]["embedding"], json!(embed("dark theme")));
    }

    #[test]
    fn faults_apply_in_order() {
        let server = TestServer::start();
        server.push_faults([
            Fault::Status {
                code: 503,
                message: "busy".into(),
            },
            Fault::Reply {
                text: "scripted".into(),
                done_reason: None,
            },
        ]);
        let req = json!({"model": "qwen2.5:3b", "stream": false, "messages": [{"role": "user", "content": "User: hi"}]});
        assert_eq!(post(&server, "/api/chat", &req).0, 503);
        assert_eq!(
            post(&server, "/api/chat", &req).1["message"]["content"],
            "scripted"
        );
        assert!(
            post(&server, "/api/chat", &req).1["message"]["content"]
                .as_str()
                .unwrap()
                .starts_with("The user and the assistant")
        );
    }

    #[test]
    fn reduce_prompts_are_merged_by_label() {
        let p = "Partial summaries, in order:\n\nEpisodes 1-40:\nThe database upgrade was planned.\n\nEpisode 41:\nThe database check failed.\n\nWrite the merged summary now.";
        assert_eq!(
            summarize(p),
            "Across episodes 1-41, in 2 parts, the user and the assistant discussed database, check and failed."
        );
    }

    #[test]
    fn summary_is_deterministic_and_names_topics() {
        let p = "Conversation:\n\nUser: The database migration failed twice.\n\nAssistant: Retry the database migration after the backup.";
        assert_eq!(summarize(p), summarize(p));
        assert!(
            summarize(p)
                .starts_with("The user and the assistant discussed database, migration and")
        );
    }
}
