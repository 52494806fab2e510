//! The door against the browser: every request passes here before anything else.
//!
//! - **Host.** A request whose `Host` names neither the listen address, a loopback name
//!   (`localhost`, `127.0.0.1`, `[::1]`) nor a configured public name (`--public-host`) is
//!   refused: a page on another name that rebinds its DNS to this machine (DNS rebinding)
//!   cannot talk to the server.
//! - **Origin.** A browser names the page behind every cross-origin request (`Origin`). A
//!   state-changing request (any method but GET, HEAD and OPTIONS), and any console request,
//!   that comes from another origin is refused, unless that origin is on the CORS allow-list
//!   (`--cors-origin`); `Origin: null` (sandboxed frames, files) is another origin.
//! - **Content types.** A body sent to the API must say it is JSON (or, for transcripts, a
//!   transcript type): the types a page may send without asking first (`text/plain`, forms,
//!   multipart) are refused, so a browser must preflight, and the preflight finds no CORS
//!   permission unless the origin is allowed.
//! - **Headers.** Every answer carries `X-Content-Type-Options: nosniff` and
//!   `Referrer-Policy: no-referrer`; pages also `X-Frame-Options: DENY` and a content security
//!   policy without inline script (`frame-ancestors 'none'`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::api::ApiError;
use crate::app::{AppError, ErrorKind};

/// Who may talk to the server from a browser, and under which names.
#[derive(Clone, Debug, Default)]
pub(crate) struct Door {
    /// Host names (lower case, without port) requests may carry.
    hosts: Vec<String>,
    /// Origins allowed cross-origin requests (`scheme://host[:port]`, lower case).
    cors: Vec<String>,
}

/// The content security policy of every page: the console's own script and styles only.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

impl Door {
    /// The names of a server listening on `listen`, plus `public` names and `cors` origins.
    pub(crate) fn new(listen: std::net::SocketAddr, public: &[String], cors: &[String]) -> Door {
        let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
        hosts.push(listen.ip().to_string());
        hosts.extend(public.iter().map(|h| host_name(h).to_ascii_lowercase()));
        Door {
            hosts,
            cors: cors
                .iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
                .collect(),
        }
    }

    /// Whether `origin` may make cross-origin requests.
    pub(crate) fn allows_origin(&self, origin: &str) -> bool {
        self.cors.iter().any(|o| o == &origin.to_ascii_lowercase())
    }

    /// The CORS allow-list.
    pub(crate) fn cors(&self) -> &[String] {
        &self.cors
    }

    fn host_ok(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        // Any loopback address names this machine.
        self.hosts.contains(&name)
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

/// The host name of a `Host` value or `host[:port]` (IPv6 in brackets).
fn host_name(h: &str) -> &str {
    let h = h.trim();
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match h.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => h,
    }
}

fn refused(status: StatusCode, kind: ErrorKind, msg: String, hint: &str) -> Response {
    let mut r = ApiError(AppError::new(kind, msg).hint(hint)).into_response();
    *r.status_mut() = status;
    r
}

/// Whether a path belongs to the API (`/v1`) or the service routes, not the console.
fn is_api(path: &str) -> bool {
    path.starts_with("/v1/")
        || matches!(path, "/healthz" | "/readyz" | "/metrics" | "/openapi.json")
}

/// The body types a route takes: JSON everywhere, transcript types for transcripts.
fn content_ok(path: &str, h: &HeaderMap) -> bool {
    let Some(ct) = h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let json = essence == "application/json" || essence.ends_with("+json");
    if path == "/v1/transcripts" {
        return json
            || matches!(
                essence.as_str(),
                "application/x-ndjson" | "application/jsonl" | "application/octet-stream"
            );
    }
    json
}

/// Whether a request's `Origin` is this server as called (`host`, the `Host` header): the same
/// name and port, or `null` from a page of this origin (see [`same_site_fetch`]). The one
/// rule for the guard and the console's forms.
pub(crate) fn same_origin(origin: &str, host: Option<&str>, h: &HeaderMap) -> bool {
    if origin == "null" {
        return same_site_fetch(h);
    }
    host.is_some_and(|host| {
        origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|o| o.eq_ignore_ascii_case(host))
    })
}

/// Whether the browser says the request comes from this origin (`Sec-Fetch-Site`, which no
/// page can set). Our own console's forms need it: under `Referrer-Policy: no-referrer` a
/// browser sends `Origin: null` with a form's POST.
pub(crate) fn same_site_fetch(h: &HeaderMap) -> bool {
    h.get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|s| s == "same-origin")
}

/// Whether a request carries a body (a length above zero, or chunked).
fn has_body(h: &HeaderMap) -> bool {
    h.get(header::TRANSFER_ENCODING).is_some()
        || h.get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|n| n.trim() != "0")
}

/// The middleware (see the module's documentation).
pub(crate) async fn check(State(door): State<Arc<Door>>, req: Request, next: Next) -> Response {
    let h = req.headers();
    let path = req.uri().path().to_string();
    let host = h
        .get(header::HOST)
        .map(|v| v.to_str().unwrap_or("\u{fffd}").to_string())
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    if let Some(host) = &host
        && !door.host_ok(host)
    {
        return refused(
            StatusCode::MISDIRECTED_REQUEST,
            ErrorKind::Forbidden,
            format!(
                "this server does not answer to the name '{}'",
                crate::text::printable(host)
            ),
            "call it by its listen address or a loopback name; a name it is reached by through a proxy or DNS must be allowed with 'abridge serve --public-host NAME'",
        );
    }
    let writes = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let console = !is_api(&path);
    if let Some(origin) = h.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("null");
        let same = same_origin(origin, host.as_deref(), h);
        let preflight = *req.method() == Method::OPTIONS;
        if !same && !door.allows_origin(origin) && (writes || console) && !preflight {
            return refused(
                StatusCode::FORBIDDEN,
                ErrorKind::Forbidden,
                format!(
                    "requests from the web page at '{}' are refused",
                    crate::text::printable(origin)
                ),
                "a browser page may call the API only from an origin allowed with 'abridge serve --cors-origin ORIGIN'; other clients send no Origin header",
            );
        }
    }
    if writes && !console && has_body(h) && !content_ok(&path, h) {
        let want = if path == "/v1/transcripts" {
            "application/json, application/x-ndjson or application/octet-stream"
        } else {
            "application/json"
        };
        return refused(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorKind::InvalidInput,
            format!(
                "the body's Content-Type is {}; this route takes {want}",
                h.get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map_or("missing".to_string(), |c| format!(
                        "'{}'",
                        crate::text::printable(c)
                    ))
            ),
            &format!(
                "send the header 'Content-Type: {}'",
                want.split(',').next().unwrap_or(want)
            ),
        );
    }
    let mut r = next.run(req).await;
    let hs = r.headers_mut();
    hs.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    hs.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if console {
        hs.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        hs.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_read_with_and_without_ports() {
        assert_eq!(host_name("localhost:8787"), "localhost");
        assert_eq!(host_name("[::1]:8787"), "::1");
        assert_eq!(host_name("evil.example"), "evil.example");
        let d = Door::new(
            "127.0.0.1:8787".parse().unwrap(),
            &["Memory.Example.COM".into()],
            &["https://app.example".into()],
        );
        assert!(d.host_ok("127.0.0.1:8787"));
        assert!(d.host_ok("127.5.0.1"));
        assert!(d.host_ok("localhost"));
        assert!(d.host_ok("memory.example.com:443"));
        assert!(!d.host_ok("evil.example:8787"));
        assert!(!d.host_ok("localhost.evil.example"));
        assert!(d.allows_origin("https://APP.example"));
        assert!(!d.allows_origin("https://app.example.evil"));
    }

    #[test]
    fn bodies_must_say_they_are_json() {
        let mut h = HeaderMap::new();
        assert!(!content_ok("/v1/memories", &h));
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(!content_ok("/v1/memories", &h));
        assert!(!content_ok("/v1/transcripts", &h));
        h.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        assert!(content_ok("/v1/memories", &h));
        h.insert(
            header::CONTENT_TYPE,
            "application/octet-stream".parse().unwrap(),
        );
        assert!(content_ok("/v1/transcripts", &h));
        assert!(!content_ok("/v1/sessions/a/messages", &h));
    }
}
