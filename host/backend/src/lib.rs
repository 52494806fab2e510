//! abridge's model backends: the Ollama and OpenAI-compatible servers over HTTP behind the
//! engine's [`LlmBackend`] trait, the server embedders behind its [`Embedder`] trait, retries,
//! TLS, and opening a backend from settings. Every front end uses them.
#![deny(missing_docs)]

use abridge_engine::types;
use types::Error;

pub mod embedding;
mod ollama;
pub mod open;
mod openai;
mod retry;
pub mod tls;

pub use abridge_engine::{Adaptive, Embedder, LlmBackend, NoModel, Vectors};
pub use ollama::Ollama;
pub use open::{Choice, Opened, open};
pub use openai::OpenAi;
pub use retry::{Attempt, RetryPolicy};

/// `url` with any credentials (`user:pass@`) replaced by `***`, for every message, log line,
/// job error and failure marker: a secret in a URL is used, never shown.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{}://***@{}", &url[..scheme_end], &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// A model server's address and HTTP client, as both backends need them: `base` checked (see
/// [`check_base_url`]), a timeout of at least a second, https through [`tls`], and the base
/// both as used (`.0`, credentials kept) and as shown (`.1`, credentials redacted).
pub(crate) fn server_client(
    base: &str,
    what: &str,
    timeout: std::time::Duration,
    builder: impl FnOnce(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
) -> Result<(reqwest::Client, String, String), Error> {
    check_base_url(base, what)?;
    if timeout.is_zero() {
        return Err(Error::InvalidInput(
            "a timeout of 0 seconds leaves no time to answer; pass --timeout-secs 1 or more".into(),
        ));
    }
    let http = builder(tls::client_builder()?)
        .timeout(timeout)
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()
        .map_err(|e| Error::InvalidInput(format!("cannot build an HTTP client: {e}")))?;
    let base = base.trim_end_matches('/');
    Ok((http, base.to_string(), redact_url(base)))
}

/// Check a server base URL: it must parse, and speak http or https. The message shows it
/// redacted.
pub fn check_base_url(base: &str, what: &str) -> Result<reqwest::Url, Error> {
    let shown = redact_url(base);
    let url = reqwest::Url::parse(base).map_err(|e| {
        Error::InvalidInput(format!(
            "{shown} is not a valid URL ({e}); {what} takes a URL such as http://localhost:11434"
        ))
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(Error::InvalidInput(format!(
            "{shown} is not an http:// or https:// URL with a host; {what} takes a URL such as http://localhost:11434"
        )));
    }
    Ok(url)
}

/// Whether `url`'s host is this machine (loopback), where plain HTTP exposes nothing.
pub(crate) fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.to_ascii_lowercase().ends_with(".localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
}

/// Most bytes read of one model response. A summary call asks for a few hundred tokens; a
/// body past this is a babbling or broken server, and reading on would only cost memory.
pub const MAX_RESPONSE_BYTES: usize = 4 << 20;

/// The body of `resp`, read chunk by chunk and abandoned past `cap` bytes: memory stays
/// bounded whatever the server sends. `Err(None)` means over the cap.
pub(crate) async fn read_capped(
    mut resp: reqwest::Response,
    cap: usize,
) -> Result<String, Option<reqwest::Error>> {
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(Some)? {
        if buf.len() + chunk.len() > cap {
            return Err(None);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The failure for a response over [`MAX_RESPONSE_BYTES`]: a model failure, not retried (the
/// same request would babble again).
pub(crate) fn oversized(url: &str) -> Error {
    Error::Server(format!(
        "{url} sent a response of more than {} MiB for one summary call; the model or server is misbehaving (check it, or lower --max-output-tokens)",
        MAX_RESPONSE_BYTES >> 20
    ))
}

/// Whether a server's error message says the prompt did not fit the context window, in any
/// wording Ollama (old and new runners), llama.cpp's server or OpenAI-compatible servers use.
pub fn is_context_overflow(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    [
        "context length", // "...longer than the context length currently available..."
        "exceeds the available context", // "request (2130 tokens) exceeds the available context size (2048 tokens)"
        "exceed_context_size",           // llama.cpp's error type exceed_context_size_error
        "context size",
        "context window",
        "context_length_exceeded", // OpenAI's error code
        "maximum context",         // "This model's maximum context length is ..."
        "input length exceeds",    // embeddings
        "too many tokens",
    ]
    .iter()
    .any(|w| m.contains(w))
}

/// Map a server's `done_reason` / `finish_reason` (absent means a normal stop).
pub(crate) fn finish_reason(reason: Option<&str>) -> crate::types::FinishReason {
    use crate::types::FinishReason;
    match reason {
        Some("stop") | None => FinishReason::Stop,
        Some("length") => FinishReason::Length,
        Some(_) => FinishReason::Other,
    }
}

/// A transport failure as an attempt: all of them may pass, so all are retried.
pub(crate) fn transport_attempt<T>(
    server: &str,
    url: &str,
    e: reqwest::Error,
    hint: &str,
) -> Attempt<T> {
    Attempt::Retry(transport_error(server, url, e, hint))
}

/// Classify a failed HTTP answer for the retry policy, as every backend does: 404 is
/// `not_found` (a model that is not there), an over-long input is a context overflow (final),
/// 429 and 5xx may pass (retried), anything else is final.
pub(crate) fn status_attempt<T>(
    code: u16,
    url: &str,
    msg: String,
    not_found: impl FnOnce() -> Error,
) -> Attempt<T> {
    match code {
        404 => Attempt::Done(Err(not_found())),
        400 | 413 | 500 if is_context_overflow(&msg) => {
            Attempt::Done(Err(Error::ContextOverflow(msg)))
        }
        429 | 500..=599 => Attempt::Retry(Error::Server(format!("HTTP {code} from {url}: {msg}"))),
        _ => Attempt::Done(Err(Error::Server(format!("HTTP {code} from {url}: {msg}")))),
    }
}

/// Map a reqwest transport failure to an engine error that says how to fix it.
pub(crate) fn transport_error(server: &str, url: &str, e: reqwest::Error, hint: &str) -> Error {
    let url = &redact_url(url);
    let cause = root_cause(&e);
    // A TLS failure is not a server that is down: say so, and never let `auto` fall back.
    if cause.contains("certificate")
        || cause.to_ascii_lowercase().contains("tls")
        || cause.contains("handshake")
    {
        return Error::Server(format!(
            "{server} at {url}: the TLS connection failed ({cause}) — if the server's certificate comes from a private CA, set {}=/path/to/ca.pem",
            tls::CA_CERT_ENV
        ));
    }
    if e.is_timeout() {
        Error::Timeout(format!(
            "{server} at {url} did not answer in time; raise --timeout-secs or check the server's load"
        ))
    } else if e.is_connect() {
        Error::Unreachable(format!(
            "{server} at {url} is not reachable ({cause}) — {hint}"
        ))
    } else {
        Error::Server(format!("{server} at {url}: {cause}"))
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}
