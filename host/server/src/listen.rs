//! The accept loop: HTTP/1.1 connections under a cap, with timeouts, so slow or idle clients
//! cannot hold the server.
//!
//! - **Header and idle timeout.** A client has `header_timeout` to send a request's head,
//!   and a kept-alive connection waiting for its next request is closed after the same time
//!   (hyper starts the head timer as soon as it waits for the next request).
//! - **A connection cap** below the process's file limit: at start the soft limit is raised
//!   to the hard limit where allowed, and the cap is at most the limit less a reserve for
//!   the database, the model server and files (logged at start).
//! - **Over the cap** a few more connections are still served, by a tiny service that answers
//!   `/healthz` (so probes see a live process) and `503` with `Retry-After` to anything else,
//!   then closes; past those, a connection is closed at once. Accepting never stops, so the
//!   listen queue cannot fill up behind idle clients.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Descriptors kept back from the connection cap: the database, the model server's
/// connections, files being read, the log.
const RESERVE_FDS: u64 = 128;
/// Connections over the cap that are still answered (`/healthz`, or 503).
const SPARE: usize = 256;
/// How long an over-the-cap connection may take to send its request: a probe sends at once;
/// an idle client holding a spare slot is let go quickly.
const SPARE_TIMEOUT: Duration = Duration::from_millis(250);

/// How connections are bounded.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// Most connections served at once (lowered to fit the file limit).
    pub max: usize,
    /// Time to send a request's head, and the most a kept-alive connection may idle.
    pub header_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max: 1024,
            header_timeout: Duration::from_secs(10),
        }
    }
}

/// Raise the soft file limit to the hard one where allowed; the limit then in force.
fn raise_file_limit() -> Option<u64> {
    // SAFETY: getrlimit/setrlimit read and write a plain struct we own.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return None;
        }
        if l.rlim_cur < l.rlim_max {
            let want = libc::rlimit {
                rlim_cur: l.rlim_max,
                rlim_max: l.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                l.rlim_cur = l.rlim_max;
            }
        }
        // `rlim_t` is not u64 on every platform.
        #[allow(clippy::unnecessary_cast)]
        Some(l.rlim_cur as u64)
    }
}

/// The cap in force: `asked`, lowered to fit the file limit (raised first where allowed).
pub(crate) fn effective_cap(asked: usize) -> (usize, Option<u64>) {
    let files = raise_file_limit();
    let fit = files.map_or(asked, |f| {
        usize::try_from(f.saturating_sub(RESERVE_FDS).max(16)).unwrap_or(usize::MAX)
    });
    (asked.min(fit).max(1), files)
}

/// What an over-the-cap connection gets.
async fn overloaded(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let json = |status: StatusCode, body: String| {
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONNECTION, "close")
            .header(header::RETRY_AFTER, "1")
            .body(Body::from(body))
            .expect("a static response")
    };
    Ok(if req.uri().path() == "/healthz" {
        json(
            StatusCode::OK,
            r#"{"status":"ok","connections":"at the cap"}"#.into(),
        )
    } else {
        json(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"code":"unavailable","message":"the server is at its connection cap","hint":"retry in a moment; a client should reuse one connection rather than open many"}}"#.into(),
        )
    })
}

/// Serve `router` on `listener` until `stop` resolves; then stop accepting, run `on_stop`
/// (which ends event streams) and wait up to `drain` for open connections to finish.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: &ConnectionLimits,
    stop: impl Future<Output = ()>,
    on_stop: impl FnOnce(),
    drain: Duration,
) {
    let (cap, files) = effective_cap(limits.max);
    tracing::info!(
        connections = cap,
        file_limit = files,
        header_timeout_secs = limits.header_timeout.as_secs(),
        "accepting connections (at most this many at once; idle ones close after the header timeout)"
    );
    let main = Arc::new(Semaphore::new(cap));
    let spare = Arc::new(Semaphore::new(SPARE));
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut spare_builder = http1::Builder::new();
    spare_builder
        .timer(TokioTimer::new())
        .header_read_timeout(SPARE_TIMEOUT)
        .keep_alive(false);
    tokio::pin!(stop);
    loop {
        let (stream, remote) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors (EMFILE) or a connection reset before it was
                    // taken: pause a moment rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        if let Ok(permit) = main.clone().try_acquire_owned() {
            let svc = router
                .clone()
                .layer(axum::Extension(ConnectInfo(remote)))
                .map_request(|r: Request<Incoming>| r.map(Body::new));
            let conn =
                builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
            let fut = graceful.watch(conn);
            tokio::spawn(async move {
                let _ = fut.await;
                drop(permit);
            });
        } else if let Ok(permit) = spare.clone().try_acquire_owned() {
            let conn = spare_builder
                .serve_connection(TokioIo::new(stream), hyper::service::service_fn(overloaded));
            tokio::spawn(async move {
                let _ = tokio::time::timeout(SPARE_TIMEOUT * 2, conn).await;
                drop(permit);
            });
        } else {
            drop(stream);
        }
    }
    drop(listener);
    on_stop();
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the drain time are closed");
    }
}
