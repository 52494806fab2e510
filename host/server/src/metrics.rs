//! `/metrics` in the Prometheus text format: requests by route and status, jobs by state,
//! queue depth, model calls, tokens and latency.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::Srv;
use crate::app::App;
use crate::app::limits::LATENCY_BUCKETS_S;

/// Requests of one (method, route, status): how many, and their summed seconds.
type RequestFigures = BTreeMap<(String, String, u16), (u64, f64)>;

/// HTTP figures.
#[derive(Default)]
pub(crate) struct Http {
    /// (method, route, status) → (count, summed seconds).
    requests: Mutex<RequestFigures>,
}

/// The middleware that counts requests.
pub(crate) async fn count(State(srv): State<Srv>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    // A fixed set of labels: made-up methods are counted together, never a series each.
    let method = match req.method().as_str() {
        m @ ("GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS") => m.to_string(),
        _ => "other".to_string(),
    };
    let started = Instant::now();
    let resp = next.run(req).await;
    let took = started.elapsed().as_secs_f64();
    let mut m = srv.metrics.requests.lock().expect("metrics lock");
    let e = m
        .entry((method, route, resp.status().as_u16()))
        .or_insert((0, 0.0));
    e.0 += 1;
    e.1 += took;
    resp
}

/// The text exposition.
pub(crate) async fn render(srv: &Srv) -> String {
    let mut out = String::new();
    let app: &App = &srv.app;
    out.push_str("# HELP abridge_http_requests_total HTTP requests by method, route and status.\n# TYPE abridge_http_requests_total counter\n");
    let reqs = srv.metrics.requests.lock().expect("metrics lock").clone();
    for ((method, route, status), (n, _)) in &reqs {
        let _ = writeln!(
            out,
            "abridge_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {n}"
        );
    }
    out.push_str("# HELP abridge_http_request_seconds_sum Summed request time by method and route.\n# TYPE abridge_http_request_seconds_sum counter\n");
    let mut by_route: BTreeMap<(String, String), f64> = BTreeMap::new();
    for ((method, route, _), (_, s)) in &reqs {
        *by_route.entry((method.clone(), route.clone())).or_default() += s;
    }
    for ((method, route), s) in by_route {
        let _ = writeln!(
            out,
            "abridge_http_request_seconds_sum{{method=\"{method}\",route=\"{route}\"}} {s:.6}"
        );
    }
    out.push_str("# HELP abridge_jobs Jobs in the table by state.\n# TYPE abridge_jobs gauge\n");
    let counts = app.job_counts().await.unwrap_or_default();
    let mut queued = 0;
    for state in ["queued", "running", "succeeded", "failed", "cancelled"] {
        let n = counts
            .iter()
            .find(|(s, _)| s == state)
            .map_or(0, |(_, n)| *n);
        if state == "queued" {
            queued = n;
        }
        let _ = writeln!(out, "abridge_jobs{{state=\"{state}\"}} {n}");
    }
    let m = app.model_metrics();
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    for (name, kind, help, value) in [
        (
            "abridge_queue_depth",
            "gauge",
            "Jobs waiting for a worker.",
            queued,
        ),
        (
            "abridge_model_calls_total",
            "counter",
            "Model requests made.",
            get(&m.calls),
        ),
        (
            "abridge_model_failures_total",
            "counter",
            "Model requests that failed.",
            get(&m.failures),
        ),
        (
            "abridge_model_in_flight",
            "gauge",
            "Model requests in flight.",
            get(&m.in_flight),
        ),
        (
            "abridge_guest_instances_total",
            "counter",
            "Guest instances made (each call into the component is one).",
            crate::app::work_done().0,
        ),
        (
            "abridge_store_calls_total",
            "counter",
            "Store calls made (transactions and statements on the database).",
            crate::app::work_done().1,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP abridge_model_tokens_total Tokens the model reported, by kind.\n# TYPE abridge_model_tokens_total counter\nabridge_model_tokens_total{{kind=\"prompt\"}} {}\nabridge_model_tokens_total{{kind=\"output\"}} {}",
        get(&m.prompt_tokens),
        get(&m.output_tokens)
    );
    out.push_str("# HELP abridge_model_latency_seconds Model request latency.\n# TYPE abridge_model_latency_seconds histogram\n");
    let buckets = *m.buckets.lock().expect("buckets lock");
    let mut cum = 0;
    for (i, le) in LATENCY_BUCKETS_S.iter().enumerate() {
        cum += buckets[i];
        let _ = writeln!(
            out,
            "abridge_model_latency_seconds_bucket{{le=\"{le}\"}} {cum}"
        );
    }
    let _ = writeln!(
        out,
        "abridge_model_latency_seconds_bucket{{le=\"+Inf\"}} {}\nabridge_model_latency_seconds_sum {:.6}\nabridge_model_latency_seconds_count {}",
        get(&m.calls),
        get(&m.latency_us) as f64 / 1e6,
        get(&m.calls)
    );
    out
}
