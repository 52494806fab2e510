//! `abridge serve`: the app layer over HTTP (axum on hyper/tokio).
//!
//! A thin edge: handlers check the caller's token, turn paths, queries and bodies into app
//! calls on the caller's tenant, and map [`AppError`] kinds to statuses and a JSON body
//! `{"error": {"code", "message", "hint"}}`. tower-http adds request tracing, a body limit and
//! timeouts; job events are Server-Sent Events. The OpenAPI document is generated from the
//! handlers' annotations and types (utoipa).
#![deny(missing_docs)]

use abridge_app as app;
use abridge_app::{sources, transcript};
use abridge_engine::{text, types};

mod api;
mod auth;
mod console;
mod guard;
mod listen;
mod memories;
mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use api::ApiDoc;
pub use listen::ConnectionLimits;

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
    /// How often the cluster sweeper runs (it also waits this long between runs for one
    /// tenant); zero turns it off.
    pub sweep_every: Duration,
    /// Most cluster summaries per user and project in one sweep.
    pub sweep_per_scope: usize,
    /// Names besides the listen address and loopback names that requests may carry in
    /// `Host` (a proxy's or a DNS name the server is reached by).
    pub public_hosts: Vec<String>,
    /// Origins whose web pages may call the API (CORS); none by default.
    pub cors_origins: Vec<String>,
    /// A token `/metrics` and `/readyz` require, when set (they are open without it).
    pub metrics_token: Option<String>,
    /// How many connections, and how long a client may take to send a request or idle.
    pub connections: ConnectionLimits,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 8787)),
            workers: 2,
            shutdown_grace: Duration::from_secs(30),
            body_limit: 16 << 20,
            request_timeout: Duration::from_secs(120),
            sweep_every: Duration::from_secs(120),
            sweep_per_scope: 20,
            public_hosts: Vec::new(),
            cors_origins: Vec::new(),
            metrics_token: None,
            connections: ConnectionLimits::default(),
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
    /// Failed authentications per client address.
    pub(crate) auth_failures: Arc<auth::Failures>,
    /// What `/metrics` and `/readyz` require, when set.
    pub(crate) metrics_token: Option<Arc<str>>,
}

/// A server bound to its address, not yet serving (see [`bind`]).
pub struct Bound {
    app: App,
    opts: ServeOptions,
    listener: tokio::net::TcpListener,
    open_local: bool,
}

/// Check that the server may listen where asked — a non-loopback address needs a token — and
/// bind it.
pub async fn bind(app: App, opts: ServeOptions) -> AppResult<Bound> {
    let tokens = app.tokens().any_live().await?;
    let addr = opts.listen;
    if !addr.ip().is_loopback() && !tokens {
        return Err(AppError::new(
            ErrorKind::InvalidInput,
            format!(
                "refusing to listen on {addr} without an API token: anyone who can reach it could read and write every session"
            ),
        )
        .hint("create a token with 'abridge tokens create --tenant NAME' (clients send it as 'Authorization: Bearer TOKEN'), or listen on 127.0.0.1"));
    }
    if !addr.ip().is_loopback() && app.config().master_key.is_none() {
        return Err(AppError::new(
            ErrorKind::InvalidInput,
            format!(
                "refusing to listen on {addr} without a master key: memories and their summaries would be stored unencrypted"
            ),
        )
        .hint("make a key with 'abridge keys new > KEYFILE' (keep it safe: without it the memories cannot be read), then set ABRIDGE_MASTER_KEY_FILE=KEYFILE; or listen on 127.0.0.1"));
    }
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        AppError::invalid(format!("cannot listen on {addr}: {e}"))
            .hint("pick another address with --listen")
    })?;
    Ok(Bound {
        app,
        opts,
        listener,
        open_local: !tokens,
    })
}

impl Bound {
    /// The address it listens on (the port chosen, when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound TCP listener has an address")
    }

    /// Whether requests without a token act as the local tenant (loopback and no tokens).
    pub fn open_local(&self) -> bool {
        self.open_local
    }

    /// Serve until `stop` resolves (SIGTERM or Ctrl-C in the binary): stop accepting, end
    /// event streams, let running jobs finish within the grace period (releasing the rest to
    /// the queue), and return. Prints nothing; logs with `tracing`.
    pub async fn run(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<ServeReport> {
        let Bound {
            app,
            opts,
            listener,
            open_local,
        } = self;
        let (tx, shutdown) = watch::channel(false);
        // Recall's saved indexes load while the server answers; `/readyz` waits for them.
        app.start_warming();
        // Messages stored before the full-text index are indexed in the background.
        app.start_indexing();
        let workers = app.start_workers(opts.workers);
        let events = app.events().clone();
        let sweeper = (!opts.sweep_every.is_zero())
            .then(|| app.start_sweeper(opts.sweep_every, opts.sweep_per_scope));
        let srv = Srv {
            app,
            open_local,
            metrics: Arc::new(metrics::Http::default()),
            shutdown,
            body_limit: opts.body_limit,
            auth_failures: Arc::new(auth::Failures::default()),
            metrics_token: opts.metrics_token.as_deref().map(Arc::from),
        };
        let router = api::routes(srv, &opts);
        listen::serve(
            listener,
            router,
            &opts.connections,
            stop,
            move || {
                tracing::info!("shutting down: no new requests; event streams end");
                let _ = tx.send(true);
            },
            opts.shutdown_grace,
        )
        .await;
        let released = workers.shutdown(opts.shutdown_grace).await;
        if let Some(s) = sweeper {
            s.stop().await;
        }
        // What the jobs published on their way out is written before the process ends.
        events.flush().await;
        Ok(ServeReport { released })
    }
}

/// How a server ended.
#[derive(Debug)]
pub struct ServeReport {
    /// Jobs still running at the end of the grace period, given back to the queue.
    pub released: usize,
}
