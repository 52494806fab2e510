//! The console's only way to the data: the public HTTP API, called in-process (the same
//! router, authentication and tenant scoping as a remote client), with the visitor's token.
//!
//! The records below are the console's reading of the API's JSON: only the fields it shows,
//! so a page that renders proves the public API carries what it needs.

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, StatusCode, header};
use axum::response::Response;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tower::ServiceExt;

/// Characters kept as they are in a path segment or query value (RFC 3986 unreserved).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `s` as one path segment or query value.
pub(crate) fn enc(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// Largest API answer the console reads (a page of messages or clusters is far smaller).
const ANSWER_LIMIT: usize = 64 << 20;

/// An API call that did not succeed: its status and error body.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub status: StatusCode,
    pub message: String,
    pub hint: Option<String>,
}

impl Failure {
    fn internal(message: impl Into<String>) -> Self {
        Failure {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            hint: None,
        }
    }
}

/// The API as one visitor sees it.
pub(crate) struct Api<'a> {
    pub router: &'a Router,
    pub token: Option<&'a str>,
}

impl Api<'_> {
    fn request(&self, method: Method, uri: &str, body: Option<&Value>) -> Request<Body> {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = self.token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        match body {
            Some(b) => req
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        }
        .expect("a request from a valid URI")
    }

    /// Send a request; the answer's JSON, or the failure the API reported.
    pub async fn send(
        &self,
        method: Method,
        uri: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), Failure> {
        let r = self.raw(self.request(method, uri, body)).await;
        let status = r.status();
        let bytes = axum::body::to_bytes(r.into_body(), ANSWER_LIMIT)
            .await
            .map_err(|e| Failure::internal(format!("reading the API's answer: {e}")))?;
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok((status, v));
        }
        let e = &v["error"];
        Err(Failure {
            status,
            message: e["message"]
                .as_str()
                .map_or_else(|| format!("the API answered {status}"), str::to_string),
            hint: e["hint"].as_str().map(str::to_string),
        })
    }

    /// `GET uri` read as `T`.
    pub async fn get<T: DeserializeOwned>(&self, uri: &str) -> Result<T, Failure> {
        let (_, v) = self.send(Method::GET, uri, None).await?;
        serde_json::from_value(v).map_err(|e| {
            Failure::internal(format!("the API's answer to {uri} is not understood: {e}"))
        })
    }

    /// An event stream, passed through as the API answered it.
    pub async fn stream(&self, uri: &str, last_event_id: Option<&HeaderValue>) -> Response {
        let mut req = self.request(Method::GET, uri, None);
        if let Some(v) = last_event_id {
            req.headers_mut().insert("last-event-id", v.clone());
        }
        self.raw(req).await
    }

    async fn raw(&self, req: Request<Body>) -> Response {
        match self.router.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }
}

/// `GET /v1/sessions`.
#[derive(Deserialize)]
pub(crate) struct SessionsPage {
    pub sessions: Vec<Session>,
    pub total: usize,
    pub offset: usize,
    pub limit: usize,
}

/// A session and its freshness.
#[derive(Deserialize, Clone)]
pub(crate) struct Session {
    pub id: String,
    pub state: String,
    pub reason: String,
    pub mode: String,
    pub own_mode: bool,
    pub episodes: u64,
    pub covered: u64,
    pub backlog_tokens: u64,
    pub last_activity_ms: Option<i64>,
    pub due_at_ms: Option<u64>,
    pub failures: u32,
    pub last_error: Option<String>,
    pub active_job: Option<u64>,
    pub history_tokens: u64,
    pub summary_tokens: u64,
    pub tokens_saved: u64,
    /// Display names (not part of the id).
    pub title: Option<String>,
    pub project: Option<String>,
}

impl Session {
    /// The display names as one line (`"Fix CI" in -home-me-shop`), empty without them.
    pub fn label(&self) -> String {
        match (&self.title, &self.project) {
            (Some(t), Some(p)) => format!("“{t}” in {p}"),
            (Some(t), None) => format!("“{t}”"),
            (None, Some(p)) => format!("in {p}"),
            (None, None) => String::new(),
        }
    }
}

/// `GET /v1/sessions/{id}/summaries?coverage=true`.
#[derive(Deserialize)]
pub(crate) struct Summaries {
    /// The rows in the API's own shape (the app's `SummaryView`: one summary-row record for
    /// the API, the CLI's `--json` and the console).
    pub summaries: Vec<abridge_app::SummaryView>,
}

/// `GET /v1/sessions/{id}/messages`.
#[derive(Deserialize)]
pub(crate) struct Messages {
    pub messages: Vec<Message>,
    pub total: u64,
    pub next_after: Option<u64>,
}

/// One stored message.
#[derive(Deserialize)]
pub(crate) struct Message {
    pub id: u64,
    pub role: String,
    pub content: String,
    pub timestamp_ms: Option<i64>,
    pub speaker: Option<String>,
    pub tokens: u32,
    pub covered_by: Option<u64>,
}

/// `GET /v1/sessions/{id}/context`.
#[derive(Deserialize)]
pub(crate) struct Context {
    pub messages: Vec<ContextMessage>,
    pub tokens: u32,
    pub saving_percent: f64,
    pub covered: u64,
    pub recent: u32,
    pub omitted_ranges: Vec<[u64; 2]>,
    pub refresh_pending: bool,
}

/// A message of a context.
#[derive(Deserialize)]
pub(crate) struct ContextMessage {
    pub role: String,
    pub content: String,
}

/// `GET /v1/jobs`.
#[derive(Deserialize)]
pub(crate) struct JobsPage {
    pub jobs: Vec<Job>,
    pub next_before: Option<u64>,
}

/// A job.
#[derive(Deserialize, Clone)]
pub(crate) struct Job {
    pub id: u64,
    pub session: String,
    pub target: u64,
    pub state: String,
    pub progress: Progress,
    pub attempts: u32,
    pub error: Option<String>,
    pub cancel_requested: bool,
    pub created_ms: u64,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
}

/// A job's progress.
#[derive(Deserialize, Clone)]
pub(crate) struct Progress {
    pub stage: String,
    pub level: u32,
    pub done: u32,
    pub total: u32,
}

/// `GET /v1/clusters`.
#[derive(Deserialize)]
pub(crate) struct Clusters {
    pub clusters: Vec<Cluster>,
}

/// A cluster.
#[derive(Deserialize)]
pub(crate) struct Cluster {
    pub id: u64,
    pub user: String,
    pub project: String,
    pub environment: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub key: String,
    pub members: Vec<String>,
    pub summary: Option<u64>,
    pub note: Option<String>,
}

/// `GET /v1/summaries/{id}`.
#[derive(Deserialize)]
pub(crate) struct ClusterSummary {
    pub text: String,
    pub importance: f32,
    pub model: String,
    pub updated_ms: u64,
}

/// `GET /v1/summaries/{id}/sources`, and a memory.
#[derive(Deserialize)]
pub(crate) struct Sources {
    pub sources: Vec<Memory>,
}

/// A memory.
#[derive(Deserialize)]
pub(crate) struct Memory {
    pub id: String,
    pub text: String,
    pub importance: f32,
    pub created_ms: u64,
    #[serde(default)]
    pub user: String,
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub cluster: u64,
    /// The memory that replaced it (it is no longer current).
    #[serde(default)]
    pub superseded_by: Option<String>,
}

/// `GET /v1/memories`.
#[derive(Deserialize)]
pub(crate) struct Memories {
    pub memories: Vec<Memory>,
    pub total: usize,
}

/// `POST /v1/recall`.
#[derive(Deserialize)]
pub(crate) struct Recall {
    pub results: Vec<Recalled>,
}

/// One recall result.
#[derive(Deserialize)]
pub(crate) struct Recalled {
    pub kind: String,
    pub id: String,
    pub text: String,
    pub score: f32,
    pub importance: f32,
    pub sources: Vec<String>,
    /// The memory that replaced it (it is no longer current).
    #[serde(default)]
    pub superseded_by: Option<String>,
}

/// `GET /v1/usage`.
#[derive(Deserialize)]
pub(crate) struct Usage {
    pub month: String,
    pub calls: u64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub cost: f64,
    pub limit_tokens: Option<u64>,
    pub limit_cost: Option<f64>,
    pub exhausted: bool,
    pub resets_at_ms: u64,
    pub days: Vec<UsageDay>,
}

/// A day of usage.
#[derive(Deserialize)]
pub(crate) struct UsageDay {
    pub day: String,
    pub calls: u64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub cost: f64,
}
