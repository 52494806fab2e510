//! Who is calling: a bearer token names its tenant; on loopback with no tokens at all, every
//! caller is the local tenant. Also the per-tenant request rate, and a limit on failed
//! authentications per client address (so tokens cannot be guessed at speed).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

use axum::extract::ConnectInfo;

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Srv;
use super::api::ApiError;
use crate::app::Tenant;
use crate::app::{AppError, ErrorKind};

fn unauthenticated(msg: &str) -> Response {
    let mut r = ApiError(
        AppError::new(ErrorKind::Unauthenticated, msg)
            .hint("send 'Authorization: Bearer TOKEN' with a token from 'abridge tokens create --tenant NAME'"),
    )
    .into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        "Bearer".parse().expect("static header"),
    );
    r
}

/// Failed authentications allowed per client address in one window.
pub(crate) const FAILURES_PER_WINDOW: u32 = 20;
/// The window, ms.
const WINDOW_MS: u64 = 60_000;
/// Addresses remembered at most (the oldest windows are forgotten first).
const ADDRESSES: usize = 10_000;

/// Failed authentications per client address: after [`FAILURES_PER_WINDOW`] in a minute the
/// address is answered 429 until its window ends, valid token or not.
#[derive(Default)]
pub(crate) struct Failures(Mutex<BTreeMap<IpAddr, (u64, u32)>>);

impl Failures {
    /// Seconds until `ip` may try again, if it is over the limit now.
    fn blocked(&self, ip: IpAddr, now: u64) -> Option<u64> {
        let m = self.0.lock().expect("failures lock");
        let (start, n) = *m.get(&ip)?;
        let end = start + WINDOW_MS;
        (n >= FAILURES_PER_WINDOW && now < end).then(|| (end - now).div_ceil(1000).max(1))
    }

    /// Count a failure of `ip`.
    fn failed(&self, ip: IpAddr, now: u64) {
        let mut m = self.0.lock().expect("failures lock");
        let e = m.entry(ip).or_insert((now, 0));
        if now >= e.0 + WINDOW_MS {
            *e = (now, 0);
        }
        e.1 += 1;
        if m.len() > ADDRESSES {
            // Forget the addresses whose windows are over, then the oldest.
            m.retain(|_, (start, _)| now < *start + WINDOW_MS);
            while m.len() > ADDRESSES {
                let oldest = m.iter().min_by_key(|(_, (s, _))| *s).map(|(ip, _)| *ip);
                match oldest {
                    Some(ip) => m.remove(&ip),
                    None => break,
                };
            }
        }
    }
}

fn bad_request(msg: &str) -> Response {
    ApiError(AppError::invalid(msg).hint("send one header 'Authorization: Bearer TOKEN'"))
        .into_response()
}

/// The token a request was authenticated with (none on an open loopback server): a stream
/// checks it is still live, and ends when it is revoked.
#[derive(Clone)]
pub(crate) struct Caller(pub(crate) Option<String>);

/// The token of an `Authorization` value: the `Bearer` scheme in any case (RFC 9110: schemes
/// are case-insensitive), one or more spaces, the token.
pub(crate) fn bearer(v: &str) -> Option<&str> {
    let (scheme, rest) = v.trim_start().split_once(' ')?;
    let token = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The middleware: find the caller's tenant, check a read-only token does not write, count the
/// request against the tenant's rate, and hand the handlers the tenant's scoped app (the only
/// way they reach data).
pub(crate) async fn authenticate(State(srv): State<Srv>, mut req: Request, next: Next) -> Response {
    // The client's address (none for the console's in-process calls: the console's own
    // request was counted on its way in).
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let mut given = req.headers().get_all(header::AUTHORIZATION).iter();
    let first = given.next().map(|v| v.to_str().unwrap_or("").to_string());
    if given.next().is_some() {
        return bad_request("the request has two Authorization headers");
    }
    let now = srv.app.now_ms();
    let mut caller = Caller(None);
    let (tenant, read_only) = match first {
        Some(v) => {
            if let Some(ip) = ip
                && let Some(secs) = srv.auth_failures.blocked(ip, now)
            {
                return ApiError(
                    AppError::new(
                        ErrorKind::RateLimited {
                            retry_after_secs: secs as u32,
                        },
                        format!(
                            "too many failed authentications from {ip}: more than {FAILURES_PER_WINDOW} a minute"
                        ),
                    )
                    .hint("check the token; wait for Retry-After seconds"),
                )
                .into_response();
            }
            let Some(token) = bearer(&v) else {
                if let Some(ip) = ip {
                    srv.auth_failures.failed(ip, now);
                }
                return unauthenticated("the Authorization header is not 'Bearer TOKEN'");
            };
            match srv.app.tokens().check(token).await {
                Ok(Some(g)) => {
                    caller = Caller(Some(token.to_string()));
                    (g.tenant, g.read_only)
                }
                Ok(None) => {
                    if let Some(ip) = ip {
                        srv.auth_failures.failed(ip, now);
                    }
                    return unauthenticated("the token is not valid (unknown or revoked)");
                }
                Err(e) => return ApiError(e).into_response(),
            }
        }
        None => {
            // Tokens created after the start close the open door at once.
            let open = srv.open_local && matches!(srv.app.tokens().any_live().await, Ok(false));
            if !open {
                return unauthenticated("this server requires a token");
            }
            (Tenant::local(), false)
        }
    };
    // Recall is a read, sent as POST for its body.
    let reads = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS)
        || req.uri().path() == "/v1/recall";
    if read_only && !reads {
        return ApiError(
            AppError::new(ErrorKind::Forbidden, "this token is read-only")
                .hint("use a token created without --read-only to write"),
        )
        .into_response();
    }
    let scoped = srv.app.tenant(&tenant);
    let scoped = if read_only {
        scoped.reading_only()
    } else {
        scoped
    };
    if let Err(e) = scoped.admit() {
        return ApiError(e).into_response();
    }
    req.extensions_mut().insert(scoped);
    req.extensions_mut().insert(caller);
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("BEARER abc"), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
        assert_eq!(bearer("Bearer "), None);
    }

    #[test]
    fn failures_block_an_address_for_the_rest_of_its_window() {
        let f = Failures::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        for _ in 0..FAILURES_PER_WINDOW {
            assert!(f.blocked(ip, 1_000).is_none());
            f.failed(ip, 1_000);
        }
        assert_eq!(f.blocked(ip, 1_000), Some(60));
        assert_eq!(f.blocked(ip, 60_500), Some(1));
        assert!(f.blocked(ip, 61_000).is_none());
        assert!(f.blocked("10.0.0.2".parse().unwrap(), 1_000).is_none());
    }
}
