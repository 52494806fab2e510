//! The `/v1` routes, their OpenAPI annotations, the error body, and event streams.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post, put};
use axum::{Json, Router};
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;
use utoipa::{IntoParams, OpenApi, ToSchema};

use super::memories as mem;
use super::{ServeOptions, Srv, auth, metrics};
use crate::app::Tenant;
use crate::app::tokens::{CreatedToken, TokenView};
use crate::app::{
    AppError, Appended, Bring, ContextAsk, ContextView, ErrorKind, Event, ExpansionView,
    ImportRequest, Imported, JobView, MessageIn, MessagesView, RemovedView, Scoped, SearchView,
    SessionView, SummaryView,
};
use crate::sources::SessionMode;
use crate::transcript::{Format, Input, Options};
use crate::types::Mode;

/// An app error on its way out: status, JSON body, `Retry-After` when rate limited.
pub(crate) struct ApiError(pub(crate) AppError);

impl From<AppError> for ApiError {
    fn from(e: AppError) -> Self {
        ApiError(e)
    }
}

/// The error body.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable code: `invalid_input`, `unprocessable`, `not_found`, `conflict`, `too_large`,
    /// `unauthenticated`, `forbidden`, `rate_limited`, `model_failed`, `storage_failed`,
    /// `unavailable`, `internal`.
    pub code: String,
    /// What happened.
    pub message: String,
    /// How to fix it, when known.
    pub hint: Option<String>,
    /// For `quota_exhausted`: what was spent, the limit and when it resets.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub quota: Option<serde_json::Value>,
}

fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorKind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::RateLimited { .. } | ErrorKind::QuotaExhausted { .. } => {
            StatusCode::TOO_MANY_REQUESTS
        }
        ErrorKind::Model => StatusCode::BAD_GATEWAY,
        ErrorKind::Storage | ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The hint an HTTP caller can act on, when the app layer gave none.
fn http_hint(kind: ErrorKind) -> Option<&'static str> {
    Some(match kind {
        ErrorKind::NotFound => {
            "list what exists with GET /v1/sessions, GET /v1/jobs, GET /v1/memories or GET /v1/clusters"
        }
        ErrorKind::TooLarge => "split the body into smaller requests",
        ErrorKind::Model => {
            "the model server failed; the messages are stored and the previous summary kept — retry later, or ask the operator to check the model server"
        }
        ErrorKind::Storage | ErrorKind::Unavailable => "retry in a moment",
        _ => return None,
    })
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let e = self.0;
        let status = status_of(e.kind);
        if status.is_server_error() {
            tracing::warn!(code = e.kind.code(), error = %e.message, "request failed");
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: e.kind.code().into(),
                message: crate::text::printable(&e.message).into_owned(),
                hint: e.hint.or_else(|| http_hint(e.kind).map(str::to_string)),
                quota: match e.kind {
                    ErrorKind::QuotaExhausted {
                        spent,
                        limit,
                        resets_at_ms,
                    } => {
                        Some(json!({"spent": spent, "limit": limit, "resets_at_ms": resets_at_ms}))
                    }
                    _ => None,
                },
            },
        };
        let mut r = (status, Json(body)).into_response();
        if let ErrorKind::RateLimited { retry_after_secs } = e.kind {
            r.headers_mut().insert(
                header::RETRY_AFTER,
                retry_after_secs.to_string().parse().expect("digits"),
            );
        }
        r
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// A body, or the reason it could not be read (over the limit: 413).
pub(crate) fn body(b: Result<Bytes, BytesRejection>, limit: usize) -> ApiResult<Bytes> {
    b.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError(AppError::new(
                ErrorKind::TooLarge,
                format!("the request body is over the {limit}-byte limit"),
            ))
        } else {
            ApiError(AppError::invalid(format!(
                "cannot read the request body: {r}"
            )))
        }
    })
}

/// JSON from a body; a syntax error names its line and column, and a key given twice in one
/// object is refused (which of the two would count is a guess two parsers make differently).
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(b: &[u8]) -> ApiResult<T> {
    let mut de = serde_json::Deserializer::from_slice(b);
    let budget = std::cell::Cell::new(MAX_JSON_VALUES);
    let v = serde::de::DeserializeSeed::deserialize(Unique(&budget), &mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| {
            if budget.get() == 0 {
                return ApiError(
                    AppError::new(
                        ErrorKind::TooLarge,
                        format!("the body holds more than {MAX_JSON_VALUES} JSON values"),
                    )
                    .hint("split it into smaller requests"),
                );
            }
            // serde_json's message ends with "at line L column C".
            ApiError(AppError::invalid(format!(
                "the body is not valid JSON: {e}"
            )))
        })?;
    serde_json::from_value(v).map_err(|e| {
        ApiError(AppError::new(
            ErrorKind::Unprocessable,
            format!("the body does not have the expected shape: {e}"),
        ))
    })
}

/// Most JSON values (objects, arrays, strings, numbers…) one body may hold: reading a body
/// costs memory per value, not per byte, so a body of many tiny values is refused before it
/// is built (10,000 messages of a few fields each are about 60,000).
const MAX_JSON_VALUES: usize = 200_000;

/// Reads a JSON value whose objects have no key twice, counting values against a budget.
#[derive(Clone, Copy)]
struct Unique<'b>(&'b std::cell::Cell<usize>);

impl<'de> serde::de::DeserializeSeed<'de> for Unique<'_> {
    type Value = serde_json::Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        let left = self.0.get();
        if left == 0 {
            return Err(serde::de::Error::custom("too many JSON values"));
        }
        self.0.set(left - 1);
        d.deserialize_any(UniqueVisitor(self))
    }
}

struct UniqueVisitor<'b>(Unique<'b>);

impl<'de> serde::de::Visitor<'de> for UniqueVisitor<'_> {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = a.next_element_seed(self.0)? {
            out.push(v);
        }
        Ok(out.into())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(k) = a.next_key::<String>()? {
            let v = a.next_value_seed(self.0)?;
            if out.contains_key(&k) {
                return Err(serde::de::Error::custom(format_args!(
                    "the key \"{}\" is given twice in one object",
                    crate::text::printable(&k)
                )));
            }
            out.insert(k, v);
        }
        Ok(out.into())
    }
}

/// A JSON body of type `T`; a body of the wrong shape is a 422 that names the field (serde's
/// message) and shows `example`, a body that would do.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(b: &[u8], example: &str) -> ApiResult<T> {
    parse_json(b).map_err(|ApiError(e)| {
        if e.kind == ErrorKind::Unprocessable && e.hint.is_none() {
            ApiError(e.hint(format!("send e.g. {example}")))
        } else {
            ApiError(e)
        }
    })
}

/// What a body of records looks like, for the 422 that shows it.
pub(crate) struct Shape {
    /// The key of the wrapped list (`{"messages": [...]}`).
    pub(crate) key: &'static str,
    /// What one record needs.
    pub(crate) needs: &'static str,
    /// The smallest record.
    pub(crate) example: &'static str,
    /// Its optional fields.
    pub(crate) optional: &'static str,
    /// Fields clients often send under another name: (theirs, ours).
    pub(crate) renamed: &'static [(&'static str, &'static str)],
}

/// The records of a body that is `{"KEY": [...]}`, a bare array, or one record. A record of
/// the wrong shape is a 422 naming it (`messages[1]: missing field ...`) and the field at
/// fault, with the smallest record as the hint.
pub(crate) fn several_or_one<T: serde::de::DeserializeOwned>(
    b: &[u8],
    shape: &Shape,
) -> ApiResult<Vec<T>> {
    let v: serde_json::Value = parse_json(b)?;
    let wrong = |what: String, item: Option<&serde_json::Value>| {
        let renamed: String = shape
            .renamed
            .iter()
            .filter(|(theirs, ours)| {
                item.and_then(|i| i.as_object())
                    .is_some_and(|o| o.contains_key(*theirs) && !o.contains_key(*ours))
            })
            .map(|(theirs, ours)| format!(" (it has \"{theirs}\": name that field \"{ours}\")"))
            .collect();
        ApiError(
            AppError::new(
                ErrorKind::Unprocessable,
                format!("{what}{renamed}; {}, the rest is optional", shape.needs),
            )
            .hint(format!(
                "send {}, or {{\"{}\": [ … ]}} for several (optional: {})",
                shape.example, shape.key, shape.optional
            )),
        )
    };
    let one = |i: Option<usize>, item: serde_json::Value| -> ApiResult<T> {
        let at = i.map_or(String::new(), |i| format!("{}[{i}]: ", shape.key));
        if !item.is_object() {
            return Err(wrong(format!("{at}not a JSON object"), None));
        }
        serde_json::from_value(item.clone()).map_err(|e| wrong(format!("{at}{e}"), Some(&item)))
    };
    let many = |items: Vec<serde_json::Value>| {
        items
            .into_iter()
            .enumerate()
            .map(|(i, m)| one(Some(i), m))
            .collect::<ApiResult<Vec<T>>>()
    };
    match v {
        serde_json::Value::Object(mut o) if o.contains_key(shape.key) => {
            match o.remove(shape.key) {
                Some(serde_json::Value::Array(items)) => many(items),
                _ => Err(wrong(format!("\"{}\" is not a list", shape.key), None)),
            }
        }
        serde_json::Value::Array(items) => many(items),
        v @ serde_json::Value::Object(_) => Ok(vec![one(None, v)?]),
        _ => Err(wrong("the body is not a JSON object".into(), None)),
    }
}

/// Messages to store: `{"messages": [...]}`, a bare array, or one message object (the
/// schema in the OpenAPI document; [`several_or_one`] reads it).
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum MessagesBody {
    /// `{"messages": [...]}`.
    Wrapped {
        /// The messages, oldest first.
        messages: Vec<MessageIn>,
    },
    /// `[...]`.
    List(Vec<MessageIn>),
    /// One message.
    One(MessageIn),
}

/// The `202` answer to posted messages.
#[derive(Serialize, ToSchema)]
pub struct AppendedBody {
    #[serde(flatten)]
    appended: Appended,
    /// Where to follow the queued refresh: `{"id", "url", "events"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    job_links: Option<serde_json::Value>,
}

fn job_links(j: &JobView) -> serde_json::Value {
    json!({"id": j.id, "url": format!("/v1/jobs/{}", j.id), "events": format!("/v1/jobs/{}/events", j.id)})
}

/// Store messages in a session (created on first use). Answers at once; a refresh that is
/// due is queued as a job and named in the answer. Never waits for the model.
#[utoipa::path(post, path = "/v1/sessions/{id}/messages", tag = "sessions",
    params(("id" = String, Path, description = "Session id (percent-encode '/')")),
    request_body = MessagesBody,
    responses((status = 202, body = AppendedBody), (status = 400, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody), (status = 429, body = ErrorBody)))]
async fn post_messages(
    State(srv): State<Srv>,
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<impl IntoResponse> {
    let b = body(b, srv.body_limit)?;
    let messages: Vec<MessageIn> = several_or_one(
        &b,
        &Shape {
            key: "messages",
            needs: "a message needs \"role\" and \"content\" (strings)",
            example: r#"{"role": "user", "content": "Book the room for Thursday", "id": "m1"}"#,
            optional: "timestamp, id, name, item",
            renamed: &[("text", "content")],
        },
    )?;
    // Each copy of a large body costs its size: the raw bytes go as soon as they are read.
    drop(b);
    if messages.is_empty() {
        return Err(ApiError(AppError::new(
            ErrorKind::Unprocessable,
            "no messages in the body",
        )));
    }
    // The records go to the sandbox as they are, checked there by the same rules as
    // `abridge ingest`'s lines, stored and judged in one call.
    let appended = t.post(&id, messages).await?;
    let links = appended.job.as_ref().map(job_links);
    Ok((
        StatusCode::ACCEPTED,
        Json(AppendedBody {
            appended,
            job_links: links,
        }),
    ))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct TranscriptQuery {
    /// `jsonl`, `openai`, `claude-code` or `chatgpt` (default: detected).
    format: Option<String>,
    /// The session for a single-conversation transcript (default: the naming rule).
    session: Option<String>,
    /// A name for the transcript (used in session names and messages; default `upload`).
    name: Option<String>,
    /// Keep tool calls and results as episodes.
    #[serde(default)]
    include_tools: bool,
}

/// The `202` answer to a transcript.
#[derive(Serialize, ToSchema)]
pub struct ImportedBody {
    /// One entry per conversation, each with its job.
    conversations: Vec<Imported>,
    /// Lines skipped, and why.
    warnings: Vec<String>,
}

/// Import a transcript in any supported format: one session per conversation, each with a
/// summarization job.
#[utoipa::path(post, path = "/v1/transcripts", tag = "sessions", params(TranscriptQuery),
    request_body(content = String, description = "The transcript", content_type = "application/octet-stream"),
    responses((status = 202, body = ImportedBody), (status = 400, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn post_transcript(
    State(srv): State<Srv>,
    Extension(t): Extension<Scoped>,
    Query(q): Query<TranscriptQuery>,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<impl IntoResponse> {
    let b = body(b, srv.body_limit)?;
    let format = match q.format.as_deref() {
        None => None,
        Some(f) => Format::parse(f).map_err(|e| ApiError(AppError::invalid(e)))?,
    };
    let name = q.name.as_deref().unwrap_or("upload");
    let opts = Options {
        include_tools: q.include_tools,
        format_flag: Some("?format="),
        ..Options::default()
    };
    let req = ImportRequest {
        format,
        session: q.session.as_deref(),
        opts,
        ..ImportRequest::new(name, Input::Bytes(&b))
    };
    let done = t.import(req, Bring::Queue).await.map_err(AppError::from)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(ImportedBody {
            conversations: done.conversations.into_iter().map(Imported::from).collect(),
            warnings: done.warnings,
        }),
    ))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct Page {
    /// Skip this many (default 0).
    #[serde(default)]
    offset: usize,
    /// At most this many (default 50, at most 500).
    limit: Option<usize>,
    /// Only sessions whose id contains this text (ignoring case).
    q: Option<String>,
}

/// A page of sessions.
#[derive(Serialize, ToSchema)]
pub struct SessionsBody {
    sessions: Vec<SessionView>,
    /// Sessions in all.
    total: usize,
    offset: usize,
    limit: usize,
}

/// The tenant's sessions, most recently changed first, with their freshness (`?q=`: those
/// whose id contains the text).
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", params(Page),
    responses((status = 200, body = SessionsBody)))]
async fn list_sessions(
    Extension(t): Extension<Scoped>,
    Query(p): Query<Page>,
) -> ApiResult<Json<SessionsBody>> {
    let limit = p.limit.unwrap_or(50).clamp(1, 500);
    let (sessions, total) = t.sessions(p.offset, limit, p.q.as_deref()).await?;
    Ok(Json(SessionsBody {
        sessions,
        total,
        offset: p.offset,
        limit,
    }))
}

/// One session and how fresh its summary is.
#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 200, body = SessionView), (status = 404, body = ErrorBody)))]
async fn get_session(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionView>> {
    let id = t.resolve(&id).await?;
    Ok(Json(t.session(&id).await?))
}

/// Delete a session and everything kept for it.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 200, description = "Deleted", body = Object), (status = 404, body = ErrorBody)))]
async fn delete_session(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let n = t.reset(&id).await?;
    Ok(Json(json!({"session": id, "deleted_episodes": n})))
}

/// The answer to removing a session's newest message.
#[derive(Serialize, ToSchema)]
pub struct RemovedBody {
    #[serde(flatten)]
    removed: RemovedView,
    /// Where to follow the refresh that folds the rest again: `{"id", "url", "events"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    job_links: Option<serde_json::Value>,
}

/// Remove the session's newest message (an undo). Every summary row that covered it is
/// deleted in the same transaction, rows an earlier compaction had folded into those are
/// active again, and a refresh folds the rest again without it (named in `job`). The message's
/// id is free again. Removing the only message removes the session.
#[utoipa::path(delete, path = "/v1/sessions/{id}/messages/last", tag = "sessions",
    params(("id" = String, Path, description = "Session id (percent-encode '/')")),
    responses((status = 200, body = RemovedBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)))]
async fn delete_last_message(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<RemovedBody>> {
    let removed = t.pop(&id).await?;
    let job_links = removed.job.as_ref().map(job_links);
    Ok(Json(RemovedBody { removed, job_links }))
}

/// This tenant's API tokens.
#[derive(Serialize, ToSchema)]
pub struct TokensBody {
    /// Live and revoked, oldest first; never the tokens themselves.
    tokens: Vec<TokenView>,
}

/// A token to create.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTokenBody {
    /// Whether it may only read (default false).
    #[serde(default)]
    read_only: bool,
    /// A label to recognise it by (at most 200 characters).
    label: Option<String>,
}

/// The calling tenant's API tokens (never the tokens: their first characters).
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens",
    responses((status = 200, body = TokensBody)))]
async fn list_tokens(Extension(t): Extension<Scoped>) -> ApiResult<Json<TokensBody>> {
    Ok(Json(TokensBody {
        tokens: t.tokens().await?,
    }))
}

/// Create a token for the calling tenant (not with a read-only token). The answer is the
/// only time the token is shown: only its hash is kept.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = NewTokenBody,
    responses((status = 201, body = CreatedToken), (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody)))]
async fn post_token(
    State(srv): State<Srv>,
    Extension(t): Extension<Scoped>,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<impl IntoResponse> {
    let b = body(b, srv.body_limit)?;
    let n: NewTokenBody = if b.is_empty() {
        NewTokenBody {
            read_only: false,
            label: None,
        }
    } else {
        parse_body(&b, r#"{"read_only": false, "label": "ci"}"#)?
    };
    let created = t.create_token(n.read_only, n.label.as_deref()).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Revoke one of the calling tenant's tokens (the one in use too). Another tenant's token is
/// a 404.
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens",
    params(("id" = u64, Path, description = "Token id")),
    responses((status = 200, body = TokenView), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn delete_token(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<TokenView>> {
    let id: u64 = id.parse().map_err(|_| {
        ApiError(
            AppError::not_found(format!("no token '{id}'"))
                .hint("token ids are numbers: GET /v1/tokens"),
        )
    })?;
    Ok(Json(t.revoke_token(id).await?))
}

/// A session's summary chain.
#[derive(Serialize, ToSchema)]
pub struct SummariesBody {
    session: String,
    /// Oldest first; together they cover episodes 1..n exactly once.
    summaries: Vec<SummaryView>,
}

/// A session's facts as they stand.
#[derive(Serialize, ToSchema)]
pub struct FactsBody {
    session: String,
    /// The facts changed most recently first: each with its current value (none when it
    /// ended), every value it had and the episode that said each (read them with
    /// `GET …/messages?after=EPISODE-1&limit=1`).
    facts: Vec<crate::app::FactView>,
}

/// The session's facts as its people stated them: where they live, where they work, their
/// number, their manager, a partner, a pet, a car, a regular day — each with what it replaced.
#[utoipa::path(get, path = "/v1/sessions/{id}/facts", tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 200, body = FactsBody), (status = 404, body = ErrorBody)))]
async fn get_facts(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<FactsBody>> {
    let id = t.resolve(&id).await?;
    let facts = t.facts(&id).await?;
    Ok(Json(FactsBody { session: id, facts }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SummariesQuery {
    /// Every row ever written, rows compacted into "earlier" rows included (default false).
    all: Option<bool>,
    /// Add each row's `coverage`: its last exchange's time, transcript bytes and messages
    /// (default false; reads every message of the session).
    coverage: Option<bool>,
}

/// The session's summary chain, oldest first (`?all=true`: compacted rows too).
#[utoipa::path(get, path = "/v1/sessions/{id}/summaries", tag = "sessions",
    params(("id" = String, Path, description = "Session id"), SummariesQuery),
    responses((status = 200, body = SummariesBody), (status = 404, body = ErrorBody)))]
async fn get_summaries(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
    Query(q): Query<SummariesQuery>,
) -> ApiResult<Json<SummariesBody>> {
    let id = t.resolve(&id).await?;
    let mut summaries = if q.all.unwrap_or(false) {
        t.summary_history(&id).await?
    } else {
        t.summaries(&id).await?
    };
    if q.coverage.unwrap_or(false) {
        summaries = t.with_coverage(&id, summaries).await?;
    }
    Ok(Json(SummariesBody {
        session: id,
        summaries,
    }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct MessagesQuery {
    /// Messages after this episode id (paging; default 0: from the first).
    #[serde(default)]
    after: u64,
    /// At most this many (default 200, at most 1000).
    limit: Option<u32>,
}

/// A page of the session's stored messages, oldest first, each with the active summary row
/// that covers it (`covered_by`).
#[utoipa::path(get, path = "/v1/sessions/{id}/messages", tag = "sessions",
    params(("id" = String, Path, description = "Session id"), MessagesQuery),
    responses((status = 200, body = MessagesView), (status = 404, body = ErrorBody)))]
async fn get_messages(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
    Query(q): Query<MessagesQuery>,
) -> ApiResult<Json<MessagesView>> {
    let id = t.resolve(&id).await?;
    Ok(Json(
        t.messages(&id, q.after, q.limit.unwrap_or(200)).await?,
    ))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ExpandQuery {
    /// Only the episode this ledger identifier was last seen in.
    identifier: Option<String>,
    /// Episodes after this id (paging; default: from the row's first).
    after: Option<u64>,
    /// Most episodes in the answer (default 1000, at most 10000).
    limit: Option<u32>,
}

/// Provenance: a summary row and exactly the episodes it covers, or the episode a ledger
/// identifier came from. A row of another session or tenant is a 404.
#[utoipa::path(get, path = "/v1/sessions/{id}/summaries/{row}/expand", tag = "sessions",
    params(("id" = String, Path, description = "Session id"),
        ("row" = u64, Path, description = "Summary row id"), ExpandQuery),
    responses((status = 200, body = ExpansionView), (status = 404, body = ErrorBody)))]
async fn get_expand(
    Extension(t): Extension<Scoped>,
    Path((id, row)): Path<(String, u64)>,
    Query(q): Query<ExpandQuery>,
) -> ApiResult<Json<ExpansionView>> {
    let id = t.resolve(&id).await?;
    Ok(Json(
        t.expand(
            &id,
            row,
            q.identifier.as_deref(),
            q.after.unwrap_or(0),
            q.limit.unwrap_or(1000),
        )
        .await?,
    ))
}

/// A session's focus instructions.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct FocusBody {
    /// Added to every fold prompt of the session; `null` or empty clears it.
    focus: Option<String>,
}

/// Set or clear the session's focus instructions.
#[utoipa::path(put, path = "/v1/sessions/{id}/focus", tag = "sessions",
    params(("id" = String, Path, description = "Session id")), request_body = FocusBody,
    responses((status = 200, body = FocusBody), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn put_focus(
    State(srv): State<Srv>,
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<FocusBody>> {
    let f: FocusBody = parse_body(
        &body(b, srv.body_limit)?,
        r#"{"focus": "Keep the decisions about the database schema"}"#,
    )?;
    let focus = t.set_focus(&id, f.focus.as_deref()).await?;
    Ok(Json(FocusBody { focus }))
}

/// A session's pinned episodes.
#[derive(Serialize, ToSchema)]
pub struct PinsBody {
    /// Episode ids, ascending: each is in every context verbatim, within the budget.
    pins: Vec<u64>,
}

/// The session's pinned episodes.
#[utoipa::path(get, path = "/v1/sessions/{id}/pins", tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 200, body = PinsBody), (status = 404, body = ErrorBody)))]
async fn get_pins(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<PinsBody>> {
    let id = t.resolve(&id).await?;
    Ok(Json(PinsBody {
        pins: t.pins(&id).await?,
    }))
}

/// Pin an episode: always in the context verbatim, within the budget, whatever its age.
#[utoipa::path(put, path = "/v1/sessions/{id}/pins/{episode}", tag = "sessions",
    params(("id" = String, Path, description = "Session id"),
        ("episode" = u64, Path, description = "Episode id")),
    responses((status = 200, body = PinsBody), (status = 404, body = ErrorBody)))]
async fn put_pin(
    Extension(t): Extension<Scoped>,
    Path((id, episode)): Path<(String, u64)>,
) -> ApiResult<Json<PinsBody>> {
    Ok(Json(PinsBody {
        pins: t.pin(&id, episode, true).await?,
    }))
}

/// Unpin an episode.
#[utoipa::path(delete, path = "/v1/sessions/{id}/pins/{episode}", tag = "sessions",
    params(("id" = String, Path, description = "Session id"),
        ("episode" = u64, Path, description = "Episode id")),
    responses((status = 200, body = PinsBody), (status = 404, body = ErrorBody)))]
async fn delete_pin(
    Extension(t): Extension<Scoped>,
    Path((id, episode)): Path<(String, u64)>,
) -> ApiResult<Json<PinsBody>> {
    Ok(Json(PinsBody {
        pins: t.pin(&id, episode, false).await?,
    }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ContextQuery {
    /// Most tokens the messages may take (default 2000).
    budget: Option<u32>,
    /// Recent message pairs verbatim (default 4).
    pairs: Option<u32>,
    /// Queue a refresh when more than this many messages lie beyond the summary (default 8).
    refresh_after: Option<u32>,
    /// Wait up to this many seconds (at most 60) for a due refresh first.
    wait: Option<u64>,
    /// What the next call is about (usually the user's newest message): the earlier turns
    /// that best match it are included verbatim beside the summary.
    query: Option<String>,
}

/// The context for the next model call: a system message with the summary, then the recent
/// turns, within the budget. Answers from what is summarized now; a due refresh is queued
/// and reported (`?wait=SECS` waits for it).
#[utoipa::path(get, path = "/v1/sessions/{id}/context", tag = "sessions",
    params(("id" = String, Path, description = "Session id"), ContextQuery),
    responses((status = 200, body = ContextView), (status = 404, body = ErrorBody)))]
async fn get_context(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
    Query(q): Query<ContextQuery>,
) -> ApiResult<Json<ContextView>> {
    let id = t.resolve(&id).await?;
    let v = t
        .context(
            &id,
            ContextAsk {
                budget: q.budget.unwrap_or(ContextAsk::DEFAULT_BUDGET),
                pairs: q.pairs.unwrap_or(ContextAsk::DEFAULT_PAIRS),
                refresh_after: q.refresh_after.unwrap_or(ContextAsk::DEFAULT_REFRESH_AFTER),
                wait: q.wait.map(|s| Duration::from_secs(s.min(60))),
                query: q.query.as_deref(),
            },
        )
        .await?;
    Ok(Json(v))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SearchQuery {
    /// The words to look for (required). Quotes, operators and punctuation are not a query
    /// language: they separate words.
    q: Option<String>,
    /// Only this session's messages.
    session: Option<String>,
    /// Hits per page (1 to 100; default 20).
    limit: Option<u32>,
    /// Hits to skip (a previous page's `next_offset`; at most 1000).
    offset: Option<u32>,
}

/// Full-text search of the tenant's messages: the best matches by BM25, each with its
/// session, episode, time, the matching text (matches between `**`) and a link to read it
/// with its neighbours. Paged by `offset`.
#[utoipa::path(get, path = "/v1/search", tag = "sessions",
    params(SearchQuery),
    responses((status = 200, body = SearchView), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn get_search(
    Extension(t): Extension<Scoped>,
    Query(q): Query<SearchQuery>,
) -> ApiResult<Json<SearchView>> {
    let session = match &q.session {
        Some(s) => Some(t.resolve(s).await?),
        None => None,
    };
    let Some(words) = q.q.as_deref() else {
        return Err(ApiError(AppError::invalid(
            "GET /v1/search needs the words to look for in q: /v1/search?q=health+check (and &session=ID for one session's messages)",
        )));
    };
    let limit = q.limit.unwrap_or(20);
    Ok(Json(
        t.search(words, session.as_deref(), q.offset.unwrap_or(0), limit)
            .await?,
    ))
}

/// Summarize the session now, whatever its mode or backoff: `202` with the job, or `200`
/// when every episode is already covered.
#[utoipa::path(post, path = "/v1/sessions/{id}/refresh", tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 202, body = JobView), (status = 200, description = "Already covered", body = Object),
        (status = 404, body = ErrorBody)))]
async fn post_refresh(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    Ok(match t.refresh(&id).await? {
        Some(job) => (StatusCode::ACCEPTED, Json(job)).into_response(),
        None => {
            Json(json!({"session": id, "job": null, "reason": "every episode is already covered"}))
                .into_response()
        }
    })
}

/// A session's refresh mode.
#[derive(Deserialize, ToSchema)]
pub struct ModeBody {
    /// `eager`, `idle`, `window`, or `default` (the server's setting).
    mode: String,
    /// Idle mode: quiet seconds before summarizing (default: the server's).
    quiet_secs: Option<u32>,
}

/// Set the session's own refresh mode.
#[utoipa::path(put, path = "/v1/sessions/{id}/mode", tag = "sessions",
    params(("id" = String, Path, description = "Session id")), request_body = ModeBody,
    responses((status = 200, body = SessionView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn put_mode(
    State(srv): State<Srv>,
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<SessionView>> {
    let m: ModeBody = parse_body(
        &body(b, srv.body_limit)?,
        r#"{"mode": "idle", "quiet_secs": 600}"#,
    )?;
    let own = match m.mode.as_str() {
        "default" => None,
        "eager" | "idle" | "window" => Some(SessionMode {
            mode: Mode::parse(&m.mode).unwrap_or(Mode::Eager),
            quiescence_secs: m.quiet_secs,
        }),
        other => {
            return Err(ApiError(AppError::invalid(format!(
                "mode '{}' is not one of eager, idle, window, default",
                crate::text::printable(other)
            ))));
        }
    };
    Ok(Json(t.set_mode(&id, own).await?))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct JobsQuery {
    /// Only jobs with an id below this (the previous page's `next_before`).
    before: Option<u64>,
    /// At most this many (default 50, at most 500).
    limit: Option<u32>,
}

/// A page of jobs.
#[derive(Serialize, ToSchema)]
pub struct JobsBody {
    /// Newest first.
    jobs: Vec<JobView>,
    /// Pass as `before` for the next page.
    next_before: Option<u64>,
}

/// The tenant's jobs, newest first.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(JobsQuery),
    responses((status = 200, body = JobsBody)))]
async fn list_jobs(
    Extension(t): Extension<Scoped>,
    Query(q): Query<JobsQuery>,
) -> ApiResult<Json<JobsBody>> {
    let limit = q.limit.unwrap_or(50).clamp(1, 500);
    let jobs = t.list_jobs(q.before, limit).await?;
    let next_before = (jobs.len() == limit as usize)
        .then(|| jobs.last().map(|j| j.id))
        .flatten();
    Ok(Json(JobsBody { jobs, next_before }))
}

/// One job.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = u64, Path, description = "Job id")),
    responses((status = 200, body = JobView), (status = 404, body = ErrorBody)))]
async fn get_job(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<JobView>> {
    Ok(Json(t.job(job_id(&id)?).await?))
}

/// A job id from a path: anything else is simply not a job.
fn job_id(s: &str) -> ApiResult<u64> {
    s.parse().map_err(|_| {
        ApiError(AppError::not_found(format!(
            "no job {}",
            crate::text::printable(s)
        )))
    })
}

/// Cancel a job: a queued one at once, a running one within a second (it writes nothing).
#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs",
    params(("id" = u64, Path, description = "Job id")),
    responses((status = 200, body = JobView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn cancel_job(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<JobView>> {
    Ok(Json(t.cancel_job(job_id(&id)?).await?))
}

fn last_event_id(h: &HeaderMap) -> Option<u64> {
    h.get("last-event-id")?.to_str().ok()?.trim().parse().ok()
}

fn sse_of(e: &Event) -> SseEvent {
    SseEvent::default()
        .id(e.id.to_string())
        .event(e.kind.clone())
        .data(serde_json::to_string(e).expect("events serialize"))
}

struct EventFeed {
    first: VecDeque<SseEvent>,
    missed: VecDeque<Event>,
    live: tokio::sync::broadcast::Receiver<Event>,
    tenant: Tenant,
    job: Option<u64>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    /// End once the backlog is sent (the job had already ended): at its ending event, or, when
    /// the backlog lacks it (it was published between the subscription and the job's read),
    /// once it arrives live or at [`ENDING_GRACE`].
    end_after_missed: bool,
    done: bool,
    /// The token the stream was opened with, checked every [`REVOCATION_CHECK`]: a revoked
    /// token's streams end.
    token: Option<(crate::app::App, String)>,
}

/// How often an open event stream checks that its token still stands.
const REVOCATION_CHECK: Duration = Duration::from_millis(400);

/// How long an ended job's stream waits for its ending event after its backlog.
const ENDING_GRACE: Duration = Duration::from_secs(3);

fn event_stream(s: EventFeed) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    futures::stream::unfold(s, |mut st| async move {
        if st.done {
            return None;
        }
        if let Some(e) = st.first.pop_front() {
            return Some((Ok(e), st));
        }
        let end_by = tokio::time::Instant::now() + ENDING_GRACE;
        loop {
            let ev = match st.missed.pop_front() {
                Some(e) => e,
                None if st.end_after_missed && tokio::time::Instant::now() >= end_by => {
                    return None;
                }
                None => {
                    let mut shutdown = st.shutdown.clone();
                    let checking = st.token.is_some();
                    let ending = st.end_after_missed;
                    // What woke the stream (decided first; the token is checked after the
                    // select, holding none of its futures).
                    let woke = tokio::select! {
                        _ = tokio::time::sleep_until(end_by), if ending => return None,
                        _ = tokio::time::sleep(REVOCATION_CHECK), if checking => None,
                        r = st.live.recv() => Some(r),
                        _ = shutdown.wait_for(|s| *s) => return None,
                    };
                    match woke {
                        None => {
                            let (app, token) = st.token.as_ref().expect("checking");
                            match app.tokens().check(token).await {
                                Ok(Some(_)) => continue,
                                // Revoked (or the store cannot say): the stream ends.
                                _ => return None,
                            }
                        }
                        Some(Ok(e)) => e,
                        Some(Err(RecvError::Lagged(n))) => {
                            let e = SseEvent::default()
                                .event("events.lost")
                                .data(json!({"lost": n}).to_string());
                            return Some((Ok(e), st));
                        }
                        Some(Err(RecvError::Closed)) => return None,
                    }
                }
            };
            if ev.tenant != st.tenant || st.job.is_some_and(|j| ev.job != Some(j)) {
                continue;
            }
            if st.job.is_some() && ev.what().is_some_and(|w| w.ends_job()) {
                st.done = true;
            }
            return Some((Ok(sse_of(&ev)), st));
        }
    })
}

/// Server-Sent Events of one job: first its state now (`job.state`), then state changes,
/// progress and the summary written, ending with its final state. Reconnect with
/// `Last-Event-ID` to get what was missed while it is still retained.
#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "events",
    params(("id" = u64, Path, description = "Job id"),
        ("Last-Event-ID" = Option<u64>, Header, description = "The last event id seen")),
    responses((status = 200, description = "An event stream", content_type = "text/event-stream", body = Event),
        (status = 404, body = ErrorBody)))]
async fn job_events(
    State(srv): State<Srv>,
    Extension(t): Extension<Scoped>,
    Extension(caller): Extension<super::auth::Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<impl IntoResponse> {
    let id = job_id(&id)?;
    let after = last_event_id(&headers);
    // Subscribe before reading the job, so nothing happens between the two unseen.
    let sub = srv.app.events().subscribe(t.tenant(), after).await;
    let job = t.job(id).await?;
    let missed: VecDeque<Event> = sub
        .missed
        .into_iter()
        .filter(|e| e.job == Some(id))
        .collect();
    let ended = !matches!(job.state.as_str(), "queued" | "running");
    let snapshot = SseEvent::default()
        .event("job.state")
        .data(serde_json::to_string(&job).expect("jobs serialize"));
    let st = EventFeed {
        first: VecDeque::from([snapshot]),
        missed,
        live: sub.live,
        tenant: t.tenant().clone(),
        job: Some(id),
        shutdown: srv.shutdown.clone(),
        end_after_missed: ended,
        done: false,
        token: caller.0.map(|tk| (srv.app.clone(), tk)),
    };
    Ok(Sse::new(event_stream(st)).keep_alive(KeepAlive::default()))
}

/// Server-Sent Events of every job of the tenant. Reconnect with `Last-Event-ID` to get
/// what was missed while it is still retained.
#[utoipa::path(get, path = "/v1/events", tag = "events",
    params(("Last-Event-ID" = Option<u64>, Header, description = "The last event id seen")),
    responses((status = 200, description = "An event stream", content_type = "text/event-stream", body = Event)))]
async fn all_events(
    State(srv): State<Srv>,
    Extension(t): Extension<Scoped>,
    Extension(caller): Extension<super::auth::Caller>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let after = last_event_id(&headers);
    let sub = srv.app.events().subscribe(t.tenant(), after).await;
    let mut first = VecDeque::new();
    if let Some(gap) = sub.gap_before {
        first.push_back(
            SseEvent::default()
                .event("events.lost")
                .data(json!({"retained_from": gap}).to_string()),
        );
    }
    let st = EventFeed {
        first,
        missed: sub.missed.into(),
        live: sub.live,
        tenant: t.tenant().clone(),
        job: None,
        shutdown: srv.shutdown.clone(),
        end_after_missed: false,
        done: false,
        token: caller.0.map(|tk| (srv.app.clone(), tk)),
    };
    Sse::new(event_stream(st)).keep_alive(KeepAlive::default())
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "service", responses((status = 200, body = Object)))]
async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// Readiness: recall's saved indexes are loaded, the database answers and the model server is
/// reachable.
#[utoipa::path(get, path = "/readyz", tag = "service",
    responses((status = 200, body = Object), (status = 503, body = ErrorBody)))]
async fn readyz(State(srv): State<Srv>, headers: HeaderMap) -> ApiResult<Json<serde_json::Value>> {
    operator(&srv, &headers)?;
    if srv.app.draining() {
        return Err(ApiError(AppError::new(
            ErrorKind::Unavailable,
            "shutting down",
        )));
    }
    // A small database loads in a moment: a probe right after the start waits up to a second.
    let loaded = tokio::time::timeout(std::time::Duration::from_secs(1), srv.app.warmed()).await;
    if loaded.is_err() {
        return Err(ApiError(AppError::new(
            ErrorKind::Unavailable,
            "loading the recall indexes saved by the last run",
        )));
    }
    srv.app.job_counts().await.map_err(ApiError)?;
    srv.app.config().llm.ready().await.map_err(|e| {
        ApiError(AppError::new(
            ErrorKind::Unavailable,
            format!(
                "the model server is not reachable: {}",
                crate::types::describe(&e)
            ),
        ))
    })?;
    Ok(Json(
        json!({"status": "ready", "backend": srv.app.config().backend_name}),
    ))
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "service",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)))]
async fn metrics_text(State(srv): State<Srv>, headers: HeaderMap) -> ApiResult<Response> {
    operator(&srv, &headers)?;
    // In token mode the service's activity is no one's business but its operator's: without
    // a metrics token to send, /metrics is closed (open only on a tokenless loopback server,
    // which says so as it starts).
    if srv.metrics_token.is_none() && !matches!(srv.app.tokens().any_live().await, Ok(false)) {
        return Err(ApiError(
            AppError::new(
                ErrorKind::Unauthenticated,
                "/metrics needs the metrics token on a server that takes API tokens",
            )
            .hint("start abridge serve with --metrics-token TOKEN (or ABRIDGE_METRICS_TOKEN) and send 'Authorization: Bearer TOKEN'"),
        ));
    }
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics::render(&srv).await,
    )
        .into_response())
}

/// With `--metrics-token`, `/metrics` and `/readyz` answer only a caller who sends it.
fn operator(srv: &Srv, headers: &HeaderMap) -> ApiResult<()> {
    let Some(want) = &srv.metrics_token else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(super::auth::bearer)
        .map(str::as_bytes)
        .unwrap_or_default();
    // Compared in time that does not depend on where the two differ.
    let same = given.len() == want.len()
        && given
            .iter()
            .zip(want.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same {
        Ok(())
    } else {
        Err(ApiError(
            AppError::new(ErrorKind::Unauthenticated, "this route needs the metrics token")
                .hint("send 'Authorization: Bearer METRICS_TOKEN' (abridge serve --metrics-token, or ABRIDGE_METRICS_TOKEN)"),
        ))
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "service", responses((status = 200, body = Object)))]
async fn openapi() -> impl IntoResponse {
    Json(ApiDoc::openapi())
}

/// Every API error answers with the documented JSON body: what axum and tower-http answer in
/// plain text themselves (a query or path that does not parse, a method the route lacks, a
/// body over the limit, a request that timed out) is rewritten, its status kept.
async fn json_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let page = super::console::wants_html(req.headers());
    let r = next.run(req).await;
    let status = r.status();
    let json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json || page {
        return r;
    }
    let (parts, body) = r.into_parts();
    let said = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let said = String::from_utf8_lossy(&said).trim().to_string();
    let (kind, message, hint) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => (
            ErrorKind::TooLarge,
            "the request body is over the server's size limit".to_string(),
            "split the body into smaller requests",
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            ErrorKind::InvalidInput,
            "the route does not take this method".to_string(),
            "the routes and their methods are listed at /openapi.json",
        ),
        StatusCode::REQUEST_TIMEOUT
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => (
            ErrorKind::Unavailable,
            "the request took longer than the server's time limit".to_string(),
            "retry in a moment, or ask for less (a smaller page or budget)",
        ),
        s if s.is_server_error() => (
            ErrorKind::Internal,
            format!("the server failed: {said}"),
            "retry; if it keeps failing, report it with the server's log",
        ),
        _ => (
            ErrorKind::InvalidInput,
            if said.is_empty() {
                "the request is malformed".to_string()
            } else {
                format!("the request is malformed: {said}")
            },
            "check the path and query parameters against /openapi.json (ids are percent-encoded UTF-8)",
        ),
    };
    let mut out = ApiError(AppError::new(kind, message).hint(hint)).into_response();
    *out.status_mut() = status;
    for name in [header::ALLOW, header::RETRY_AFTER, header::WWW_AUTHENTICATE] {
        if let Some(v) = parts.headers.get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}

/// Every route that is not one of these: a page for a browser, the JSON error otherwise.
async fn no_route(headers: HeaderMap) -> Response {
    if super::console::wants_html(&headers) {
        return super::console::not_found_page();
    }
    ApiError(AppError::not_found("no such route").hint("the routes are listed at /openapi.json"))
        .into_response()
}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let c = doc.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI 3 document of `abridge serve`.
#[derive(OpenApi)]
#[openapi(
    info(title = "abridge", description = "Summaries of conversation memory, per tenant."),
    paths(post_messages, get_messages, delete_last_message, post_transcript, list_sessions, get_session, delete_session,
        get_summaries, get_expand, get_facts, put_focus, get_pins, put_pin, delete_pin,
        get_context, get_search, post_refresh, put_mode, list_jobs, get_job, cancel_job,
        job_events, all_events, healthz, readyz, metrics_text, openapi,
        mem::post_memories, mem::list_memories, mem::get_memory, mem::delete_memory,
        mem::post_recall, mem::list_clusters, mem::get_summary, mem::get_summary_sources,
        mem::get_usage, list_tokens, post_token, delete_token),
    components(schemas(ErrorBody, ErrorDetail, MessagesBody, MessageIn, AppendedBody, Appended,
        RemovedBody, RemovedView,
        ImportedBody, Imported, SessionsBody, SessionView, SummariesBody, SummaryView,
        ExpansionView, FactsBody, crate::app::FactView, crate::app::FactValueView,
        crate::app::FactEndView, crate::app::EpisodeView, MessagesView, crate::app::MessageView,
        crate::app::CoverageView, crate::app::SourceMarkView, crate::app::memories::UsageDayView, crate::app::LedgerView, FocusBody, PinsBody,
        ContextView, crate::app::ContextParts, crate::app::StableView, crate::app::SearchView, crate::app::SearchHitView, ModeBody, JobsBody, JobView, Event, crate::app::memories::MemoryInput, mem::MemoriesBody,
        mem::WrittenBody, mem::MemoriesPage, crate::app::memories::MemoryView, mem::RecallBody,
        mem::RecallResults, crate::app::memories::RecallView, mem::ClustersBody,
        crate::app::memories::ClusterView, crate::app::memories::ClusterSummaryView,
        mem::SourcesBody, crate::app::memories::UsageView, TokensBody, NewTokenBody, TokenView,
        CreatedToken)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiDoc;

/// The routes registered, as (method, path): the OpenAPI test compares them to the document.
pub(crate) fn route_table() -> Vec<(&'static str, &'static str, MethodRouter<Srv>)> {
    vec![
        ("post", "/v1/sessions/{id}/messages", post(post_messages)),
        ("get", "/v1/sessions/{id}/messages", get(get_messages)),
        (
            "delete",
            "/v1/sessions/{id}/messages/last",
            delete(delete_last_message),
        ),
        ("post", "/v1/transcripts", post(post_transcript)),
        ("get", "/v1/sessions", get(list_sessions)),
        ("get", "/v1/sessions/{id}", get(get_session)),
        ("delete", "/v1/sessions/{id}", delete(delete_session)),
        ("get", "/v1/sessions/{id}/summaries", get(get_summaries)),
        ("get", "/v1/sessions/{id}/facts", get(get_facts)),
        (
            "get",
            "/v1/sessions/{id}/summaries/{row}/expand",
            get(get_expand),
        ),
        ("put", "/v1/sessions/{id}/focus", put(put_focus)),
        ("get", "/v1/sessions/{id}/pins", get(get_pins)),
        ("put", "/v1/sessions/{id}/pins/{episode}", put(put_pin)),
        (
            "delete",
            "/v1/sessions/{id}/pins/{episode}",
            delete(delete_pin),
        ),
        ("get", "/v1/sessions/{id}/context", get(get_context)),
        ("get", "/v1/search", get(get_search)),
        ("post", "/v1/sessions/{id}/refresh", post(post_refresh)),
        ("put", "/v1/sessions/{id}/mode", put(put_mode)),
        ("get", "/v1/jobs", get(list_jobs)),
        ("get", "/v1/jobs/{id}", get(get_job)),
        ("post", "/v1/jobs/{id}/cancel", post(cancel_job)),
        ("get", "/v1/jobs/{id}/events", get(job_events)),
        ("get", "/v1/events", get(all_events)),
        ("post", "/v1/memories", post(mem::post_memories)),
        ("get", "/v1/memories", get(mem::list_memories)),
        ("get", "/v1/memories/{id}", get(mem::get_memory)),
        ("delete", "/v1/memories/{id}", delete(mem::delete_memory)),
        ("post", "/v1/recall", post(mem::post_recall)),
        ("get", "/v1/clusters", get(mem::list_clusters)),
        ("get", "/v1/summaries/{id}", get(mem::get_summary)),
        (
            "get",
            "/v1/summaries/{id}/sources",
            get(mem::get_summary_sources),
        ),
        ("get", "/v1/usage", get(mem::get_usage)),
        ("get", "/v1/tokens", get(list_tokens)),
        ("post", "/v1/tokens", post(post_token)),
        ("delete", "/v1/tokens/{id}", delete(delete_token)),
    ]
}

/// The service routes outside `/v1` (no token needed).
pub(crate) fn service_table() -> Vec<(&'static str, &'static str, MethodRouter<Srv>)> {
    vec![
        ("get", "/healthz", get(healthz)),
        ("get", "/readyz", get(readyz)),
        ("get", "/metrics", get(metrics_text)),
        ("get", "/openapi.json", get(openapi)),
    ]
}

/// The `/v1` and service routes with authentication: what clients call over HTTP, and what
/// the web console calls in-process.
fn api_routes(srv: &Srv, opts: &ServeOptions) -> Router<Srv> {
    use tower_http::timeout::TimeoutLayer;

    let mut api: Router<Srv> = Router::new();
    let mut streams: Router<Srv> = Router::new();
    for (_, path, r) in route_table() {
        if path.ends_with("/events") {
            streams = streams.route(path, r);
        } else {
            api = api.route(path, r);
        }
    }
    // Event streams are long-lived: no request time limit for them.
    let api = api.layer(TimeoutLayer::with_status_code(
        StatusCode::SERVICE_UNAVAILABLE,
        opts.request_timeout,
    ));
    let authed = api
        .merge(streams)
        .route_layer(axum::middleware::from_fn_with_state(
            srv.clone(),
            auth::authenticate,
        ));
    let mut service: Router<Srv> = Router::new();
    for (_, path, r) in service_table() {
        service = service.route(path, r);
    }
    // MCP over Streamable HTTP, for coding agents: the same tokens and tenants; the Host and
    // Origin checks are the server's own guard (every route has them), and rmcp refuses any
    // browser Origin besides the --cors-origin ones.
    let sessions = std::sync::Arc::new(McpSessions::default());
    let mcp: Router<Srv> = Router::new()
        .nest_service("/mcp", abridge_mcp::http_service(opts.cors_origins.clone()))
        .layer(axum::middleware::from_fn_with_state(sessions, mcp_guard))
        .layer(axum::middleware::from_fn_with_state(
            srv.clone(),
            auth::authenticate,
        ));
    service.merge(authed).merge(mcp)
}

/// The MCP sessions this server opened over HTTP, each with the tenant that opened it.
#[derive(Default)]
pub(crate) struct McpSessions(std::sync::Mutex<std::collections::BTreeMap<String, String>>);

/// Sessions remembered at most (the oldest ids are forgotten first; a forgotten one is then
/// unknown, a 404 the client answers by opening another).
const MCP_SESSIONS: usize = 10_000;

/// The MCP session id a request or answer carries.
fn mcp_session(h: &HeaderMap) -> Option<String> {
    h.get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// MCP over HTTP, as the specification says: a session id belongs to the tenant that opened
/// it — any other caller gets a 404 and cannot end it —, `DELETE` of a session answers 204
/// (the transport's 202 reads as a failed termination to the official SDKs), and of an
/// unknown id 404.
async fn mcp_guard(
    State(sessions): State<std::sync::Arc<McpSessions>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let tenant = req
        .extensions()
        .get::<Scoped>()
        .map(|s| s.tenant().name().to_string())
        .unwrap_or_default();
    // A request from this server's own origin (the Origin is the Host the guard accepted) is
    // not a foreign page's: the transport, which knows only the --cors-origin list, refuses
    // any Origin, so it does not see this one.
    let mut req = req;
    let own_origin = {
        let h = req.headers();
        let host = h
            .get(axum::http::header::HOST)
            .and_then(|v| v.to_str().ok());
        h.get(axum::http::header::ORIGIN)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|o| super::guard::same_origin(o, host, h))
    };
    if own_origin {
        req.headers_mut().remove(axum::http::header::ORIGIN);
    }
    // A body that is not JSON gets a JSON-RPC parse error (id null), not the transport's 415.
    let req = if req.method() == Method::POST {
        let (parts, body) = req.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, 2 << 20).await else {
            return ApiError(
                AppError::new(ErrorKind::TooLarge, "the MCP request is over 2 MiB")
                    .hint("send smaller requests"),
            )
            .into_response();
        };
        if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
            return (StatusCode::BAD_REQUEST, Json(abridge_mcp::parse_error(&e))).into_response();
        }
        axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes))
    } else {
        req
    };
    let delete = req.method() == Method::DELETE;
    let asked = mcp_session(req.headers());
    if let Some(id) = &asked {
        let owner = sessions.0.lock().expect("not poisoned").get(id).cloned();
        // Another tenant's session, or one this server does not know, is no session.
        if owner.as_deref() != Some(tenant.as_str()) {
            return ApiError(
                AppError::not_found(format!("no MCP session {id}"))
                    .hint("open a session with an initialize request"),
            )
            .into_response();
        }
    }
    let mut res = next.run(req).await;
    let mut map = sessions.0.lock().expect("not poisoned");
    if let Some(id) = mcp_session(res.headers())
        && asked.is_none()
        && res.status().is_success()
    {
        if map.len() >= MCP_SESSIONS
            && let Some(first) = map.keys().next().cloned()
        {
            map.remove(&first);
        }
        map.insert(id, tenant);
    }
    if delete && res.status().is_success() {
        if let Some(id) = &asked {
            map.remove(id);
        }
        if res.status() == StatusCode::ACCEPTED {
            *res.status_mut() = StatusCode::NO_CONTENT;
            *res.body_mut() = axum::body::Body::empty();
        }
    }
    res
}

pub(crate) fn routes(srv: Srv, opts: &ServeOptions) -> Router {
    use tower_http::limit::RequestBodyLimitLayer;
    use tower_http::trace::TraceLayer;

    let api = api_routes(&srv, opts);
    // The console reaches the data only through these same routes, with the visitor's token.
    let app = srv.app.clone();
    let console = super::console::routes(
        api.clone().with_state(srv.clone()),
        srv.open_local,
        std::sync::Arc::new(move || app.now_ms()),
    );
    let door = std::sync::Arc::new(super::guard::Door::new(
        opts.listen,
        &opts.public_hosts,
        &opts.cors_origins,
    ));
    let mut router = api.merge(console).fallback(no_route);
    if !door.cors().is_empty() {
        use tower_http::cors::{AllowOrigin, CorsLayer};
        let origins: Vec<HeaderValue> = door
            .cors()
            .iter()
            .filter_map(|o| HeaderValue::from_str(o).ok())
            .collect();
        router = router.layer(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(origins))
                .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
                .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
                .max_age(std::time::Duration::from_secs(600)),
        );
    }
    router
        .layer(axum::middleware::from_fn_with_state(
            srv.clone(),
            metrics::count,
        ))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(opts.body_limit))
        .layer(axum::middleware::from_fn(json_errors))
        .layer(axum::middleware::from_fn_with_state(
            door,
            super::guard::check,
        ))
        .layer(TraceLayer::new_for_http())
        // Every answer says which server gave it, so a client can tell a version mismatch
        // from a bug (`abridge-version`, the package version).
        .layer(tower_http::set_header::SetResponseHeaderLayer::overriding(
            header::HeaderName::from_static("abridge-version"),
            HeaderValue::from_static(env!("CARGO_PKG_VERSION")),
        ))
        .with_state(srv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_openapi_document_lists_every_route_and_no_other() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                documented.push((method.clone(), path.clone()));
            }
        }
        let mut routed: Vec<(String, String)> = route_table()
            .into_iter()
            .chain(service_table())
            .map(|(m, p, _)| (m.to_string(), p.to_string()))
            .collect();
        documented.sort();
        routed.sort();
        assert_eq!(documented, routed);
    }
}
