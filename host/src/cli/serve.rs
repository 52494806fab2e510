//! `abridge serve` and `abridge tokens`: thin shells over the app layer and the HTTP edge.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use clap::{Args, Subcommand};

use abridge_app::Tenant;
use abridge_app::{App, Limits};
use abridge_server::{ConnectionLimits, ServeOptions};

use super::commands::{Backend, choose_backend};
use super::progress::utc_text;
use super::{Exit, Failure, Settings};

/// The flags' defaults are `ServeOptions::default()` and `Limits::default()`: written once, in
/// the server and the app, and shown by `--help` from there.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on; a non-loopback address needs an API token
    #[arg(long, default_value_t = ServeOptions::default().listen, env = "ABRIDGE_LISTEN")]
    listen: SocketAddr,
    /// Jobs run at once
    #[arg(long, default_value_t = ServeOptions::default().workers, env = "ABRIDGE_WORKERS")]
    workers: usize,
    /// On SIGTERM/Ctrl-C, seconds running jobs get to finish before they are released to
    /// the queue (the next start resumes them)
    #[arg(long, default_value_t = ServeOptions::default().shutdown_grace.as_secs())]
    shutdown_secs: u64,
    /// Largest request body in MiB
    #[arg(long, default_value_t = ServeOptions::default().body_limit >> 20)]
    max_body_mib: usize,
    /// Most messages one POST of messages may carry (0: unlimited)
    #[arg(long, default_value_t = Limits::default().messages_per_request)]
    max_messages: u64,
    /// Most messages one uploaded transcript may hold (0: unlimited)
    #[arg(long, default_value_t = Limits::default().episodes_per_upload)]
    max_upload_messages: u64,
    /// Most conversations one uploaded transcript may hold (0: unlimited)
    #[arg(long, default_value_t = Limits::default().conversations_per_upload)]
    max_upload_conversations: usize,
    /// Cluster summaries one tenant may have running at once
    #[arg(long, default_value_t = Limits::default().cluster_jobs_per_tenant)]
    tenant_cluster_jobs: usize,
    /// Seconds between runs of the cluster sweeper, which summarizes memory clusters whose
    /// summary is missing, stale or failed (0: off)
    #[arg(
        long,
        default_value_t = ServeOptions::default().sweep_every.as_secs(),
        env = "ABRIDGE_SWEEP_SECS"
    )]
    sweep_secs: u64,
    /// Time limit of a request in seconds (event streams have none)
    #[arg(long, default_value_t = ServeOptions::default().request_timeout.as_secs())]
    request_timeout_secs: u64,
    /// Requests per second per tenant, with bursts of twice that (0: unlimited)
    #[arg(long, default_value_t = Limits::default().requests_per_sec)]
    rate_limit: u32,
    /// Jobs one tenant may have running at once
    #[arg(long, default_value_t = Limits::default().jobs_per_tenant)]
    tenant_jobs: usize,
    /// Jobs one tenant may have queued; past it, requests that would queue another get 429
    /// with Retry-After (0: unlimited)
    #[arg(long, default_value_t = Limits::default().queued_per_tenant)]
    tenant_queue: usize,
    /// Days finished jobs (and their events) are kept; older ones are deleted
    #[arg(long, default_value_t = abridge_app::limits::JOB_RETENTION.as_secs() / 86_400)]
    job_retention_days: u64,
    /// Finished jobs each tenant keeps at most (its newest; older ones are deleted)
    #[arg(long, default_value_t = Limits::default().job_retention_count)]
    job_retention_count: u32,
    /// Model requests one tenant may have in flight
    #[arg(long, default_value_t = Limits::default().model_per_tenant)]
    tenant_model_requests: usize,
    /// Model requests in flight overall
    #[arg(long, default_value_t = Limits::default().model_total)]
    model_requests: usize,
    /// A name the server is reached by besides its listen address and loopback names (a
    /// proxy's or DNS name; repeatable): requests whose Host is another name are refused
    #[arg(
        long = "public-host",
        value_name = "NAME",
        env = "ABRIDGE_PUBLIC_HOSTS",
        value_delimiter = ','
    )]
    public_hosts: Vec<String>,
    /// An origin (scheme://host[:port]) whose web pages may call the API (CORS;
    /// repeatable); none by default, so no page on another origin can
    #[arg(
        long = "cors-origin",
        value_name = "ORIGIN",
        env = "ABRIDGE_CORS_ORIGINS",
        value_delimiter = ','
    )]
    cors_origins: Vec<String>,
    /// A token /metrics and /readyz require (sent as 'Authorization: Bearer TOKEN'); without
    /// it they are open. Prefer the environment variable: flags show in process lists
    #[arg(long, env = "ABRIDGE_METRICS_TOKEN", hide_env_values = true)]
    metrics_token: Option<String>,
    /// Most connections served at once (lowered to fit the file limit, which is raised to
    /// its hard limit at start); past it /healthz still answers and the rest get 503
    #[arg(long, default_value_t = ConnectionLimits::default().max)]
    max_connections: usize,
    /// Seconds a client has to send a request's head; a kept-alive connection idle this
    /// long is closed
    #[arg(long, default_value_t = ConnectionLimits::default().header_timeout.as_secs())]
    header_timeout_secs: u64,
}

#[derive(Args, Debug)]
pub struct TokensArgs {
    #[command(subcommand)]
    cmd: TokensCmd,
}

#[derive(Subcommand, Debug)]
enum TokensCmd {
    /// Create a token for a tenant and print it (once: only its hash is kept).
    Create {
        /// The tenant (a-z, 0-9, '.', '_', '-'); `local` is the CLI's own sessions
        #[arg(long)]
        tenant: String,
        /// The token may only read
        #[arg(long)]
        read_only: bool,
        /// A label to recognise it by
        #[arg(long)]
        label: Option<String>,
    },
    /// List tokens (never the tokens themselves).
    List {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by id; requests with it fail from then on.
    Revoke {
        /// Token id (from `tokens list`)
        id: u64,
    },
}

/// The app for these settings and backend, logging through `tracing`.
pub fn open_app(s: &Settings, backend: &Backend, limits: Limits) -> Result<App, Failure> {
    super::app::open(
        s,
        backend,
        limits,
        Arc::new(|level, msg| match level {
            abridge_app::engine::types::Level::Warn => {
                tracing::warn!(target: "abridge::engine", "{msg}")
            }
            abridge_app::engine::types::Level::Info => {
                tracing::info!(target: "abridge::engine", "{msg}")
            }
            abridge_app::engine::types::Level::Debug => {
                tracing::debug!(target: "abridge::engine", "{msg}")
            }
        }),
    )
}

async fn stop_signal() {
    let term = async {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            match signal(SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        }
        #[cfg(not(unix))]
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

pub async fn serve_cmd(s: &Settings, a: ServeArgs) -> Result<(), Failure> {
    let backend = choose_backend(s).await?;
    let limits = Limits {
        requests_per_sec: a.rate_limit,
        jobs_per_tenant: a.tenant_jobs,
        queued_per_tenant: a.tenant_queue,
        messages_per_request: a.max_messages,
        episodes_per_upload: a.max_upload_messages,
        conversations_per_upload: a.max_upload_conversations,
        model_per_tenant: a.tenant_model_requests,
        model_total: a.model_requests,
        cluster_jobs_per_tenant: a.tenant_cluster_jobs,
        sweep_cooldown_ms: a.sweep_secs.saturating_mul(1000),
        ceiling: super::memory::ceiling()?,
        job_retention: Duration::from_secs(a.job_retention_days.saturating_mul(24 * 3600)),
        job_retention_count: a.job_retention_count,
    };
    let app = open_app(s, &backend, limits)?;
    let opts = ServeOptions {
        listen: a.listen,
        workers: a.workers,
        shutdown_grace: Duration::from_secs(a.shutdown_secs),
        sweep_every: Duration::from_secs(a.sweep_secs),
        sweep_per_scope: ServeOptions::default().sweep_per_scope,
        body_limit: a.max_body_mib.max(1) << 20,
        request_timeout: Duration::from_secs(a.request_timeout_secs.max(1)),
        public_hosts: a.public_hosts,
        cors_origins: a.cors_origins,
        metrics_token: a.metrics_token,
        connections: ConnectionLimits {
            max: a.max_connections.max(1),
            header_timeout: Duration::from_secs(a.header_timeout_secs.max(1)),
        },
    };
    let server = abridge_server::bind(app, opts).await?;
    let addr = server.local_addr();
    // The first line on stdout says where (tests and scripts read the port from it).
    println!("listening on http://{addr}");
    if server.open_local() {
        tracing::warn!(
            "no API tokens: every request acts as the single local tenant (loopback only), and /metrics is open; create one with 'abridge tokens create --tenant NAME' to require tokens (then /metrics needs --metrics-token)"
        );
    }
    tracing::info!(%addr, backend = backend.name, db = %abridge_app::db::shown(&s.db), workers = a.workers, "abridge serve started");
    let report = server
        .run(stop_signal())
        .await
        .map_err(|e| Failure::new(Exit::Internal, e))?;
    tracing::info!(
        released = report.released,
        "abridge serve stopped; jobs released to the queue resume at the next start"
    );
    Ok(())
}

pub async fn tokens_cmd(s: &Settings, a: TokensArgs) -> Result<(), Failure> {
    let tokens = abridge_app::Tokens::open(&s.db)?;
    let now = || {
        use abridge_app::engine::Clock;
        abridge_app::engine::SystemClock.now_ms()
    };
    match a.cmd {
        TokensCmd::Create {
            tenant,
            read_only,
            label,
        } => {
            let t = Tenant::new(&tenant).map_err(|e| Failure::new(Exit::Input, anyhow!(e)))?;
            let first = !tokens.any_live().await?;
            let (token, id) = tokens
                .create(&t, read_only, label.as_deref(), now())
                .await?;
            println!("{token}");
            super::commands::note(
                s,
                &format!(
                    "token {id} for tenant '{t}'{} created; it is shown only now — keep it secret (clients send 'Authorization: Bearer TOKEN')",
                    if read_only { " (read-only)" } else { "" }
                ),
            );
            if first {
                // The open door closes: an `abridge serve` that started with no tokens (every
                // request the `local` tenant's) now refuses requests without one.
                super::commands::note(
                    s,
                    "this is the database's first token: an 'abridge serve' running on it without tokens now refuses requests that carry none (the CLI keeps using the 'local' tenant; a token for it: abridge tokens create --tenant local)",
                );
            }
        }
        TokensCmd::List { json } => {
            let list = tokens.list().await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&list).expect("tokens serialize")
                );
            } else if list.is_empty() {
                println!("no tokens (create one with 'abridge tokens create --tenant NAME')");
            } else {
                println!(
                    "{:>4}  {:<20} {:<12} {:<9} {:<19}  label",
                    "id", "tenant", "token", "access", "created (UTC)"
                );
                for t in list {
                    println!(
                        "{:>4}  {:<20} {:<12} {:<9} {:<19}  {}{}",
                        t.id,
                        t.tenant,
                        format!("{}…", t.prefix),
                        if t.read_only { "read" } else { "readwrite" },
                        utc_text(t.created_ms),
                        t.label.as_deref().unwrap_or(""),
                        t.revoked_ms
                            .map(|r| format!(" (revoked {})", utc_text(r)))
                            .unwrap_or_default()
                    );
                }
            }
        }
        TokensCmd::Revoke { id } => {
            if !tokens.revoke(id, now()).await? {
                return Err(Failure::new(
                    Exit::Input,
                    anyhow!("no live token {id} — list them with 'abridge tokens list'"),
                ));
            }
            println!("token {id} revoked");
        }
    }
    Ok(())
}
