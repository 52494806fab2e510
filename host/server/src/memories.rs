//! The memory routes: `/v1/memories`, `/v1/recall`, `/v1/clusters`, `/v1/summaries/{id}`.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::Srv;
use super::api::{ApiError, ApiResult, ErrorBody, Shape, body, parse_body, several_or_one};
use crate::app::memories::{
    ClusterSummaryView, ClusterView, MemoryInput, MemoryView, RecallView, Summaries, filter,
};
use crate::app::{AppError, ErrorKind, Scoped};
use crate::types::MemoryFilter;

/// `{"memories": [...]}` or one memory: the body's schema in the OpenAPI document
/// ([`several_or_one`] reads it, to name the field at fault).
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum MemoriesBody {
    /// Many.
    Many {
        /// The memories.
        memories: Vec<MemoryInput>,
    },
    /// One.
    One(MemoryInput),
}

/// What a write stored.
#[derive(Serialize, ToSchema)]
pub struct WrittenMemory {
    id: String,
    cluster: u64,
    /// False when the id was already stored (nothing changed).
    created: bool,
    /// The cluster's members now.
    members: u32,
    /// The cluster's summary is being made or refreshed (in the background).
    summarizing: bool,
    /// The memory this one replaced (named in `replaces`, or the same fact found in the text:
    /// "I moved to Lyon" after "I live in Porto"). It is kept, marked `superseded_by` this
    /// one, and recalled after it.
    supersedes: Option<String>,
}

/// The `202` answer to a memory write.
#[derive(Serialize, ToSchema)]
pub struct WrittenBody {
    memories: Vec<WrittenMemory>,
    /// Present when the tenant's monthly ceiling is reached: the memories are stored, but no
    /// cluster is summarized (`{"code": "quota_exhausted", "spent", "limit", "resets_at_ms",
    /// "message"}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    summaries_refused: Option<serde_json::Value>,
}

/// Store memories; each joins its cluster. A cluster brought to the minimum (or changed) is
/// summarized after the answer; follow it with `GET /v1/events`.
#[utoipa::path(post, path = "/v1/memories", tag = "memories", request_body = MemoriesBody,
    responses((status = 202, body = WrittenBody), (status = 400, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn post_memories(
    State(srv): State<Srv>,
    Extension(t): Extension<Scoped>,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<impl IntoResponse> {
    let b = body(b, srv.body_limit)?;
    let list: Vec<MemoryInput> = several_or_one(
        &b,
        &Shape {
            key: "memories",
            needs: "a memory needs \"user\" and \"text\" (strings)",
            example: crate::app::memories::EXAMPLE,
            optional: "type, key, project, environment, importance, id, replaces",
            renamed: &[("content", "text")],
        },
    )?;
    let w = t.remember(list, Summaries::Later).await?;
    let summarizing = w.summarizing;
    let memories = w
        .memories
        .into_iter()
        .map(|m| WrittenMemory {
            summarizing: m.due && summarizing,
            id: m.id,
            cluster: m.cluster,
            created: m.created,
            members: m.members,
            supersedes: m.supersedes,
        })
        .collect();
    let refused = w.refused;
    let summaries_refused = refused.map(|e| match e.kind {
        ErrorKind::QuotaExhausted {
            spent,
            limit,
            resets_at_ms,
        } => json!({"code": "quota_exhausted", "spent": spent, "limit": limit,
                    "resets_at_ms": resets_at_ms, "message": e.message}),
        _ => json!({"code": e.kind.code(), "message": e.message}),
    });
    Ok((
        StatusCode::ACCEPTED,
        Json(WrittenBody {
            memories,
            summaries_refused,
        }),
    ))
}

/// Which memories (every field given must match), and a page.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct MemoryQuery {
    user: Option<String>,
    project: Option<String>,
    environment: Option<String>,
    #[serde(rename = "type")]
    #[param(rename = "type")]
    kind: Option<String>,
    key: Option<String>,
    /// Skip this many (default 0).
    #[serde(default)]
    offset: usize,
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
}

impl MemoryQuery {
    fn filter(&self) -> MemoryFilter {
        filter(
            self.user.clone(),
            self.project.clone(),
            self.environment.clone(),
            self.kind.clone(),
            self.key.clone(),
        )
    }
}

/// A page of memories.
#[derive(Serialize, ToSchema)]
pub struct MemoriesPage {
    memories: Vec<MemoryView>,
    total: usize,
    offset: usize,
    limit: usize,
}

/// Memories, oldest first.
#[utoipa::path(get, path = "/v1/memories", tag = "memories", params(MemoryQuery),
    responses((status = 200, body = MemoriesPage)))]
pub(crate) async fn list_memories(
    Extension(t): Extension<Scoped>,
    Query(q): Query<MemoryQuery>,
) -> ApiResult<Json<MemoriesPage>> {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let (memories, total) = t.memories(&q.filter(), q.offset, limit).await?;
    Ok(Json(MemoriesPage {
        memories,
        total,
        offset: q.offset,
        limit,
    }))
}

/// One memory.
#[utoipa::path(get, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "Memory id")),
    responses((status = 200, body = MemoryView), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_memory(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<MemoryView>> {
    Ok(Json(t.memory(&id).await?))
}

/// Delete a memory. A summary that covered it is deleted at once (its text cannot come back)
/// and rebuilt from the remaining members in the background when enough remain.
#[utoipa::path(delete, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "Memory id")),
    responses((status = 200, body = Object), (status = 404, body = ErrorBody)))]
pub(crate) async fn delete_memory(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let f = t.forget(&id, Summaries::Later).await?;
    Ok(Json(json!({
        "id": id, "cluster": f.cluster, "summary_deleted": f.summary_deleted, "summarizing": f.due
    })))
}

/// What to recall.
#[derive(Deserialize, ToSchema)]
pub struct RecallBody {
    /// The question or topic.
    query: String,
    user: Option<String>,
    project: Option<String>,
    environment: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    key: Option<String>,
    /// How many results (default 5, at most 100).
    k: Option<u32>,
    /// Rank by the exact scan of every matching vector instead of the approximate index
    /// (default false): slower on a large tenant, and what the index's answers are measured
    /// against.
    #[serde(default)]
    exact: bool,
}

/// Recall results, best first.
#[derive(Serialize, ToSchema)]
pub struct RecallResults {
    results: Vec<RecallView>,
}

/// The memories and cluster summaries most related to a query, ranked by similarity weighted
/// by importance; a summary carries its source ids (`GET /v1/summaries/{id}/sources`).
#[utoipa::path(post, path = "/v1/recall", tag = "memories", request_body = RecallBody,
    responses((status = 200, body = RecallResults), (status = 400, body = ErrorBody)))]
pub(crate) async fn post_recall(
    State(srv): State<Srv>,
    Extension(t): Extension<Scoped>,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<RecallResults>> {
    let b = body(b, srv.body_limit)?;
    let q: RecallBody = parse_body(
        &b,
        r#"{"query": "which editor theme", "user": "alice", "k": 5}"#,
    )?;
    let mut f = filter(q.user, q.project, q.environment, q.kind, q.key);
    f.exact = q.exact;
    let results = t.recall(&q.query, &f, q.k.unwrap_or(5)).await?;
    Ok(Json(RecallResults { results }))
}

/// Clusters.
#[derive(Serialize, ToSchema)]
pub struct ClustersBody {
    clusters: Vec<ClusterView>,
}

/// Clusters with their key, members and summary id.
#[utoipa::path(get, path = "/v1/clusters", tag = "memories", params(MemoryQuery),
    responses((status = 200, body = ClustersBody)))]
pub(crate) async fn list_clusters(
    Extension(t): Extension<Scoped>,
    Query(q): Query<MemoryQuery>,
) -> ApiResult<Json<ClustersBody>> {
    Ok(Json(ClustersBody {
        clusters: t.clusters(&q.filter()).await?,
    }))
}

fn summary_id(id: &str) -> ApiResult<u64> {
    id.parse().map_err(|_| {
        ApiError(AppError::new(
            ErrorKind::NotFound,
            format!("no summary '{}'", crate::text::printable(id)),
        ))
    })
}

/// One cluster summary.
#[utoipa::path(get, path = "/v1/summaries/{id}", tag = "memories",
    params(("id" = u64, Path, description = "Summary id")),
    responses((status = 200, body = ClusterSummaryView), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_summary(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<ClusterSummaryView>> {
    Ok(Json(t.cluster_summary(summary_id(&id)?).await?))
}

/// The memories a cluster summary covers.
#[derive(Serialize, ToSchema)]
pub struct SourcesBody {
    summary: u64,
    sources: Vec<MemoryView>,
}

/// A cluster summary's sources, in its order.
#[utoipa::path(get, path = "/v1/summaries/{id}/sources", tag = "memories",
    params(("id" = u64, Path, description = "Summary id")),
    responses((status = 200, body = SourcesBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_summary_sources(
    Extension(t): Extension<Scoped>,
    Path(id): Path<String>,
) -> ApiResult<Json<SourcesBody>> {
    let id = summary_id(&id)?;
    Ok(Json(SourcesBody {
        summary: id,
        sources: t.summary_sources(id).await?,
    }))
}

/// The tenant's model usage for cluster summaries this month, against its ceiling.
#[utoipa::path(get, path = "/v1/usage", tag = "memories",
    responses((status = 200, body = crate::app::memories::UsageView)))]
pub(crate) async fn get_usage(
    Extension(t): Extension<Scoped>,
) -> ApiResult<Json<crate::app::memories::UsageView>> {
    Ok(Json(t.usage().await?))
}
