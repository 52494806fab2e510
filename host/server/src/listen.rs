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
//! - **Idle connections make room.** At the cap, a kept-alive connection waiting for its next
//!   request is closed to let a new one in: the oldest idle one of the peer address that holds
//!   the most connections (so one client holding many idle connections cannot keep the others
//!   out). A connection streaming events is busy, never idle.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
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

/// How long a new connection at the cap waits for the slot an idle one gives up.
const EVICT_WAIT: Duration = Duration::from_millis(300);

/// One served connection, as the cap sees it.
struct Conn {
    peer: IpAddr,
    /// Requests (or event streams) under way.
    busy: usize,
    /// Since when it has waited for a next request (none while busy).
    idle_since: Option<Instant>,
    /// Asks it to close once idle (hyper's graceful shutdown closes an idle one at once).
    close: Arc<tokio::sync::Notify>,
}

/// The served connections.
#[derive(Default)]
struct Registry {
    next: u64,
    conns: BTreeMap<u64, Conn>,
}

type Shared = Arc<Mutex<Registry>>;

fn lock(r: &Shared) -> std::sync::MutexGuard<'_, Registry> {
    r.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Registry {
    fn add(&mut self, peer: IpAddr) -> (u64, Arc<tokio::sync::Notify>) {
        self.next += 1;
        let close = Arc::new(tokio::sync::Notify::new());
        self.conns.insert(
            self.next,
            Conn {
                peer,
                busy: 0,
                idle_since: Some(Instant::now()),
                close: close.clone(),
            },
        );
        (self.next, close)
    }

    fn busy(&mut self, id: u64) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.busy += 1;
            c.idle_since = None;
        }
    }

    fn done(&mut self, id: u64) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.busy = c.busy.saturating_sub(1);
            if c.busy == 0 {
                c.idle_since = Some(Instant::now());
            }
        }
    }

    /// Ask the oldest idle connection of the peer holding the most connections to close;
    /// whether there was one.
    fn evict(&mut self) -> bool {
        let mut per: BTreeMap<IpAddr, usize> = BTreeMap::new();
        for c in self.conns.values() {
            *per.entry(c.peer).or_default() += 1;
        }
        let victim = self
            .conns
            .iter()
            .filter_map(|(id, c)| c.idle_since.map(|t| (per[&c.peer], t, *id)))
            // The most connections first, then the longest idle.
            .min_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)))
            .map(|(_, _, id)| id);
        match victim.and_then(|id| self.conns.get_mut(&id)) {
            Some(c) => {
                // Not idle any more as far as choosing goes: one eviction per connection.
                c.idle_since = None;
                c.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Marks a connection idle again when dropped (its response, or its event stream, is done).
struct Done(Shared, u64);

impl Drop for Done {
    fn drop(&mut self) {
        lock(&self.0).done(self.1);
    }
}

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
    let registry: Shared = Arc::default();
    let (stopping, stop_rx) = tokio::sync::watch::channel(false);
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
        let permit = match main.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            // At the cap: an idle connection makes room, if there is one.
            Err(_) if lock(&registry).evict() => None,
            Err(_) => {
                overflow(&spare, &spare_builder, stream);
                continue;
            }
        };
        let (main, spare, spare_builder, builder) = (
            main.clone(),
            spare.clone(),
            spare_builder.clone(),
            builder.clone(),
        );
        let (router, registry, mut stop_rx) = (router.clone(), registry.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let permit = match permit {
                Some(p) => p,
                None => match tokio::time::timeout(EVICT_WAIT, main.acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => {
                        overflow(&spare, &spare_builder, stream);
                        return;
                    }
                },
            };
            let (id, close) = lock(&registry).add(remote.ip());
            let reg = registry.clone();
            let svc = tower::service_fn(move |req: Request<Incoming>| {
                lock(&reg).busy(id);
                let done = Done(reg.clone(), id);
                let router = router.clone().layer(axum::Extension(ConnectInfo(remote)));
                async move {
                    let res = router.oneshot(req.map(Body::new)).await?;
                    // An event stream is busy until it ends; any other answer is done.
                    let streaming = res
                        .headers()
                        .get(header::CONTENT_TYPE)
                        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                    Ok::<_, Infallible>(if streaming {
                        use futures::StreamExt;
                        res.map(|b| {
                            Body::from_stream(b.into_data_stream().map(move |x| {
                                let _ = &done;
                                x
                            }))
                        })
                    } else {
                        drop(done);
                        res
                    })
                }
            });
            let conn =
                builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
            let mut conn = std::pin::pin!(conn);
            let mut closing = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = close.notified(), if !closing => {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    _ = stop_rx.changed(), if !closing => {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            lock(&registry).conns.remove(&id);
            drop(permit);
        });
    }
    drop(listener);
    on_stop();
    let _ = stopping.send(true);
    let drained = async {
        while !lock(&registry).conns.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(drain, drained).await.is_err() {
        tracing::warn!("connections still open after the drain time are closed");
    }
}

/// A connection over the cap: a spare slot answers `/healthz` (or 503) and closes; past the
/// spares it is closed at once.
fn overflow(spare: &Arc<Semaphore>, spare_builder: &http1::Builder, stream: tokio::net::TcpStream) {
    if let Ok(permit) = spare.clone().try_acquire_owned() {
        let conn = spare_builder
            .serve_connection(TokioIo::new(stream), hyper::service::service_fn(overloaded));
        tokio::spawn(async move {
            let _ = tokio::time::timeout(SPARE_TIMEOUT * 2, conn).await;
            drop(permit);
        });
    }
}
