//! `abridge serve`: the app layer over HTTP (axum on hyper/tokio).
//!
//! A thin edge: handlers check the caller's token, turn paths, queries and bodies into app
//! calls on the caller's tenant, and map [`AppError`] kinds to statuses and a JSON body
//! `{"error": {"code", "message", "hint"}}`. tower-http adds request tracing, a body limit and
//! timeouts; job events are Server-Sent Events. The OpenAPI document is generated from the
//! handlers' annotations and types (utoipa).

mod api;
mod auth;
mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::sync::watch;

pub use api::ApiDoc;

use crate::app::{App, AppError, AppResult, ErrorKind};

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Workers running jobs at once.
    pub workers: usize,
    /// How long a shutdown waits for running jobs before releasing them to the queue.
    pub shutdown_grace: Duration,
    /// Largest request body, bytes.
    pub body_limit: usize,
    /// Time limit of a request (not of event streams).
    pub request_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 8787)),
            workers: 2,
            shutdown_grace: Duration::from_secs(30),
            body_limit: 16 << 20,
            request_timeout: Duration::from_secs(120),
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct Srv {
    pub(crate) app: App,
    /// Whether requests without a token act as the local tenant (loopback, no tokens).
    pub(crate) open_local: bool,
    pub(crate) metrics: Arc<metrics::Http>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) body_limit: usize,
}

/// The router for `app` (used by [`serve`], and by tests in-process).
pub fn router(
    app: App,
    open_local: bool,
    opts: &ServeOptions,
    shutdown: watch::Receiver<bool>,
) -> Router {
    let srv = Srv {
        app,
        open_local,
        metrics: Arc::new(metrics::Http::default()),
        shutdown,
        body_limit: opts.body_limit,
    };
    api::routes(srv, opts)
}

/// Check that the server may listen where asked: a non-loopback address needs a token.
pub fn check_listen(app: &App, addr: &SocketAddr) -> AppResult<bool> {
    let tokens = app.tokens().any_live()?;
    if !addr.ip().is_loopback() && !tokens {
        return Err(AppError::new(
            ErrorKind::InvalidInput,
            format!(
                "refusing to listen on {addr} without an API token: anyone who can reach it could read and write every session"
            ),
        )
        .hint("create a token with 'abridge tokens create --tenant NAME' (clients send it as 'Authorization: Bearer TOKEN'), or listen on 127.0.0.1"));
    }
    Ok(!tokens)
}

/// Serve until `stop` resolves (SIGTERM or Ctrl-C in the binary): stop accepting, end event
/// streams, let running jobs finish within the grace period (releasing the rest to the queue),
/// and return. Prints nothing; logs with `tracing`.
pub async fn serve(
    app: App,
    opts: ServeOptions,
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<ServeReport> {
    let open_local = check_listen(&app, &listener.local_addr()?).map_err(|e| {
        anyhow::anyhow!(e.message.clone() + &e.hint.map(|h| format!(" — {h}")).unwrap_or_default())
    })?;
    let (tx, rx) = watch::channel(false);
    let workers = app.start_workers(opts.workers);
    let router = router(app.clone(), open_local, &opts, rx);
    let signal = async move {
        stop.await;
        tracing::info!("shutting down: no new requests; event streams end");
        let _ = tx.send(true);
    };
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(signal)
    .await?;
    let released = workers.shutdown(opts.shutdown_grace).await;
    Ok(ServeReport { released })
}

/// How a server ended.
#[derive(Debug)]
pub struct ServeReport {
    /// Jobs still running at the end of the grace period, given back to the queue.
    pub released: usize,
}
