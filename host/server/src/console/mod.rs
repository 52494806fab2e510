//! The web console at `/`: server-rendered pages over the public API.
//!
//! Every page is HTML made on the server (askama templates), readable without JavaScript;
//! a small script (`/assets/console.js`) adds live job progress over the API's event stream
//! and swaps in a session's new summary without a reload. The console reads and writes only
//! through the `/v1` routes, called in-process with the visitor's token ([`client::Api`]), so
//! it has exactly a remote client's rights: the same tenant scoping, read-only tokens stay
//! read-only, and another tenant's session is a 404.
//!
//! Signing in stores the token in an `HttpOnly`, `SameSite=Strict` cookie. Forms that change
//! something carry a token derived from it and are refused from another origin.

mod client;
mod pages;

use std::collections::BTreeMap;

use askama::Template;
use axum::Router;
use axum::extract::{Form, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use client::{Api, Failure, enc};
use pages::*;

const COOKIE: &str = "abridge_token";
const CSS: &str = include_str!("../../assets/console.css");
const JS: &str = include_str!("../../assets/console.js");
/// Sessions per page of the list.
const PAGE: usize = 25;
/// Memories the flat list of the memories view shows (the newest).
pub(crate) const MEMORIES: usize = 200;
/// Clusters per page of the memories view.
const CLUSTERS: usize = 30;
/// Messages per page of a session.
const MESSAGES: u32 = 200;

/// What the console's handlers share.
#[derive(Clone)]
struct Console {
    /// The authenticated API routes (nothing else reaches the data).
    api: Router,
    /// Whether requests without a token are the local tenant (loopback, no tokens).
    open_local: bool,
    /// The server's clock, for "3 min ago" (time comes only from the app's clock).
    now: std::sync::Arc<dyn Fn() -> u64 + Send + Sync>,
}

/// The console's routes, over `api` (the authenticated API router).
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(
    api: Router,
    open_local: bool,
    now: std::sync::Arc<dyn Fn() -> u64 + Send + Sync>,
) -> Router<S> {
    Router::new()
        .route("/", get(sessions_page))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/sessions/{id}", get(session_page))
        .route("/sessions/{id}/chain", get(chain_part))
        .route("/sessions/{id}/refresh", post(refresh))
        .route("/sessions/{id}/mode", post(set_mode))
        .route("/sessions/{id}/reset", get(reset_page).post(reset))
        .route("/jobs", get(jobs_page))
        .route("/jobs/{id}/cancel", post(cancel))
        .route("/jobs/{id}/events", get(job_events))
        .route("/memories", get(memories_page))
        .route("/memories/{id}/delete", post(delete_memory))
        .route("/usage", get(usage_page))
        .route("/events", get(events))
        .route("/assets/console.css", get(css))
        .route("/assets/console.js", get(js))
        .with_state(Console {
            api,
            open_local,
            now,
        })
}

/// Whether a request is a browser's asking for a page.
pub(crate) fn wants_html(h: &HeaderMap) -> bool {
    h.get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"))
}

/// The page for a path that is no route.
pub(crate) fn not_found_page() -> Response {
    error_page(
        layout("Not found", "", String::new(), false),
        StatusCode::NOT_FOUND,
        "There is no such page.",
        Some("Start from the sessions list."),
    )
}

/// A visitor without a token where one is needed: off to the sign-in page.
struct SignIn;

impl IntoResponse for SignIn {
    fn into_response(self) -> Response {
        Redirect::to("/login").into_response()
    }
}

impl FromRequestParts<Console> for Visitor {
    type Rejection = SignIn;

    async fn from_request_parts(parts: &mut Parts, c: &Console) -> Result<Self, SignIn> {
        c.visitor(&parts.headers)
    }
}

/// The visitor: their token (from the cookie) and the form token derived from it.
struct Visitor {
    token: Option<String>,
    csrf: String,
}

fn cookie_token(h: &HeaderMap) -> Option<String> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
        .filter(|v| !v.is_empty())
}

/// A random secret made when the server starts: form tokens are derived from it, so no other
/// site can compute one (not even on an open loopback server without API tokens, where every
/// visitor would otherwise have the same).
fn form_secret() -> &'static [u8; 32] {
    static SECRET: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    SECRET.get_or_init(|| {
        let mut k = [0u8; 32];
        getrandom::fill(&mut k).expect("the operating system's random source");
        k
    })
}

/// The form token of a visitor: a keyed hash (the server's secret) of their API token.
fn csrf_of(token: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update(b"abridge console form\0");
    h.update(form_secret());
    h.update(token.unwrap_or("").as_bytes());
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Tokens are what `abridge tokens create` prints: nothing that could break a cookie.
fn cookie_safe(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 512
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~+/=".contains(&b))
}

impl Console {
    /// The visitor, or the sign-in page when the server needs a token and they gave none.
    fn visitor(&self, h: &HeaderMap) -> Result<Visitor, SignIn> {
        let token = cookie_token(h);
        if token.is_none() && !self.open_local {
            return Err(SignIn);
        }
        Ok(Visitor {
            csrf: csrf_of(token.as_deref()),
            token,
        })
    }

    fn api<'a>(&'a self, v: &'a Visitor) -> Api<'a> {
        Api {
            router: &self.api,
            token: v.token.as_deref(),
        }
    }

    fn now(&self) -> u64 {
        (self.now)()
    }
}

fn layout(title: &str, nav: &'static str, csrf: String, signed_in: bool) -> Layout {
    Layout {
        title: title.to_string(),
        nav,
        csrf,
        signed_in,
        notice: None,
    }
}

impl Visitor {
    fn layout(&self, title: &str, nav: &'static str, notice: Option<String>) -> Layout {
        Layout {
            notice,
            ..layout(title, nav, self.csrf.clone(), self.token.is_some())
        }
    }
}

fn html(t: &impl Template, status: StatusCode) -> Response {
    match t.render() {
        Ok(body) => (
            status,
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "a console page failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page failed to render",
            )
                .into_response()
        }
    }
}

fn error_page(layout: Layout, status: StatusCode, message: &str, hint: Option<&str>) -> Response {
    html(
        &ErrorPage {
            layout,
            status: status.as_u16(),
            message: message.to_string(),
            hint: hint.map(str::to_string),
        },
        status,
    )
}

/// An API failure as a page: a token that stopped working sends the visitor to sign in (a
/// visitor who never signed in, to a plain sign-in: the server now asks for a token).
fn failed(v: &Visitor, f: Failure) -> Response {
    if f.status == StatusCode::UNAUTHORIZED {
        return Redirect::to(if v.token.is_some() {
            "/login?expired=1"
        } else {
            "/login"
        })
        .into_response();
    }
    let title = if f.status == StatusCode::NOT_FOUND {
        "Not found"
    } else {
        "Something went wrong"
    };
    error_page(
        v.layout(title, "", None),
        f.status,
        &f.message,
        f.hint.as_deref(),
    )
}

/// A change asked from a page of this origin, with the visitor's form token.
fn check_form(h: &HeaderMap, v: &Visitor, csrf: &str) -> Result<(), Box<Response>> {
    let host = h.get(header::HOST).and_then(|v| v.to_str().ok());
    let same_origin = match h.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        Some(origin) => crate::guard::same_origin(origin, host, h),
        // Browsers send Origin with every POST; without one, trust only a same-origin fetch.
        None => !h
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|s| s != "same-origin" && s != "none"),
    };
    if !same_origin || csrf != v.csrf {
        return Err(Box::new(error_page(
            v.layout("Refused", "", None),
            StatusCode::FORBIDDEN,
            "This form did not come from this console, or it is from an earlier sign-in.",
            Some("Reload the page and try again."),
        )));
    }
    Ok(())
}

#[derive(Deserialize)]
struct ListQuery {
    q: Option<String>,
    #[serde(default)]
    offset: usize,
    notice: Option<String>,
}

fn notice_text(n: Option<&str>) -> Option<String> {
    Some(
        match n? {
            "reset" => "The session was reset: its messages and summaries are deleted.",
            "mode" => "The refresh mode was changed.",
            "refresh" => "A refresh was queued; it shows under Jobs and on this page when done.",
            "covered" => "Nothing to refresh: every message is already covered.",
            "cancel" => "The job was cancelled.",
            "forgotten" => "The memory was deleted (from disk; a summary that covered it is rebuilt without it).",
            _ => return None,
        }
        .to_string(),
    )
}

async fn sessions_page(
    State(c): State<Console>,
    v: Visitor,
    Query(q): Query<ListQuery>,
) -> Response {
    let search = q.q.clone().unwrap_or_default();
    let uri = format!(
        "/v1/sessions?offset={}&limit={PAGE}&q={}",
        q.offset,
        enc(search.trim())
    );
    let page: client::SessionsPage = match c.api(&v).get(&uri).await {
        Ok(p) => p,
        Err(f) => return failed(&v, f),
    };
    let now = c.now();
    let link = |offset: usize| format!("/?q={}&offset={offset}", enc(search.trim()));
    html(
        &SessionsPage {
            layout: v.layout("Sessions", "sessions", notice_text(q.notice.as_deref())),
            lines: page
                .sessions
                .iter()
                .map(|s| SessionLine::new(s, now))
                .collect(),
            first: (page.offset + 1).min(page.total),
            last: page.offset + page.sessions.len(),
            prev: (page.offset > 0).then(|| link(page.offset.saturating_sub(page.limit))),
            next: (page.offset + page.sessions.len() < page.total)
                .then(|| link(page.offset + page.limit)),
            total: page.total,
            q: search,
        },
        StatusCode::OK,
    )
}

#[derive(Deserialize)]
struct SessionQuery {
    budget: Option<u32>,
    #[serde(default)]
    after: u64,
    notice: Option<String>,
}

async fn chain_of(
    api: &Api<'_>,
    id: &str,
    s: &client::Session,
    now: u64,
) -> Result<ChainPart, Failure> {
    let rows: client::Summaries = api
        .get(&format!("/v1/sessions/{}/summaries?coverage=true", enc(id)))
        .await?;
    Ok(ChainPart {
        cards: rows.summaries.iter().map(|r| Card::new(r, now)).collect(),
        covered: s.covered,
        episodes: s.episodes,
    })
}

async fn session_page(
    State(c): State<Console>,
    v: Visitor,
    Path(id): Path<String>,
    Query(q): Query<SessionQuery>,
) -> Response {
    let api = c.api(&v);
    let now = c.now();
    let base = format!("/v1/sessions/{}", enc(&id));
    let s: client::Session = match api.get(&base).await {
        Ok(s) => s,
        Err(f) => return failed(&v, f),
    };
    let chain = match chain_of(&api, &id, &s, now).await {
        Ok(c) => c.render().unwrap_or_default(),
        Err(f) => return failed(&v, f),
    };
    let msgs: client::Messages = match api
        .get(&format!(
            "{base}/messages?after={}&limit={MESSAGES}",
            q.after
        ))
        .await
    {
        Ok(m) => m,
        Err(f) => return failed(&v, f),
    };
    let budget = q.budget.unwrap_or(2000).clamp(100, 1_000_000);
    // The preview is a real context request, as the next model call would make it.
    let (preview, preview_error) = match api
        .get::<client::Context>(&format!("{base}/context?budget={budget}"))
        .await
    {
        Ok(ctx) => (Some(Preview::new(&ctx)), None),
        Err(f) if f.status == StatusCode::UNAUTHORIZED => return failed(&v, f),
        Err(f) => (None, Some(f.message)),
    };
    let job = match s.active_job {
        Some(j) => api
            .get::<client::Job>(&format!("/v1/jobs/{j}"))
            .await
            .ok()
            .map(|j| JobLine::new(&j, now)),
        None => None,
    };
    let href = session_href(&id);
    html(
        &SessionPage {
            layout: v.layout(&id, "sessions", notice_text(q.notice.as_deref())),
            state_text: state_text(&s, now),
            last_activity: when(s.last_activity_ms, now),
            history_tokens: num(s.history_tokens),
            summary_tokens: num(s.summary_tokens),
            tokens_saved: num(s.tokens_saved),
            backlog_tokens: num(s.backlog_tokens),
            chain,
            messages: msgs
                .messages
                .into_iter()
                .map(|m| MessageLine {
                    id: m.id,
                    role: m.role,
                    speaker: m.speaker,
                    time: m.timestamp_ms.map_or_else(String::new, pages::at),
                    tokens: m.tokens,
                    covered_by: m.covered_by,
                    content: m.content,
                })
                .collect(),
            messages_total: msgs.total,
            messages_next: msgs
                .next_after
                .map(|a| format!("{href}?budget={budget}&after={a}#messages")),
            messages_first: (q.after > 0).then(|| format!("{href}?budget={budget}#messages")),
            budget,
            preview,
            preview_error,
            job,
            href,
            s,
        },
        StatusCode::OK,
    )
}

/// The chain alone, for the page's script to swap in after a refresh.
async fn chain_part(State(c): State<Console>, v: Visitor, Path(id): Path<String>) -> Response {
    let api = c.api(&v);
    let s: client::Session = match api.get(&format!("/v1/sessions/{}", enc(&id))).await {
        Ok(s) => s,
        Err(f) => return (f.status, f.message).into_response(),
    };
    match chain_of(&api, &id, &s, c.now()).await {
        Ok(part) => html(&part, StatusCode::OK),
        Err(f) => (f.status, f.message).into_response(),
    }
}

#[derive(Deserialize)]
struct Plain {
    #[serde(default)]
    csrf: String,
}

/// Whether the page's script asked (it wants JSON, not a redirect).
fn scripted(h: &HeaderMap) -> bool {
    h.get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.starts_with("application/json"))
}

async fn refresh(
    State(c): State<Console>,
    v: Visitor,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<Plain>,
) -> Response {
    if let Err(r) = check_form(&headers, &v, &f.csrf) {
        return *r;
    }
    let r = c
        .api(&v)
        .send(
            Method::POST,
            &format!("/v1/sessions/{}/refresh", enc(&id)),
            None,
        )
        .await;
    let href = session_href(&id);
    match r {
        Ok((status, job)) if scripted(&headers) => {
            let job = (status == StatusCode::ACCEPTED).then_some(job);
            axum::Json(json!({"job": job})).into_response()
        }
        Ok((status, _)) => {
            let n = if status == StatusCode::ACCEPTED {
                "refresh"
            } else {
                "covered"
            };
            Redirect::to(&format!("{href}?notice={n}")).into_response()
        }
        Err(f) if scripted(&headers) => (
            f.status,
            axum::Json(json!({"error": {"message": f.message, "hint": f.hint}})),
        )
            .into_response(),
        Err(f) => failed(&v, f),
    }
}

#[derive(Deserialize)]
struct ModeForm {
    #[serde(default)]
    csrf: String,
    mode: String,
    quiet_secs: Option<String>,
}

async fn set_mode(
    State(c): State<Console>,
    v: Visitor,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<ModeForm>,
) -> Response {
    let quiet = match f
        .quiet_secs
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        None => None,
        Some(n) => match n.parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) => {
                return error_page(
                    v.layout("Refused", "", None),
                    StatusCode::BAD_REQUEST,
                    "The quiet time must be a whole number of seconds.",
                    Some("Go back and enter a number, or leave it empty for the server's setting."),
                );
            }
        },
    };
    let body = json!({"mode": f.mode, "quiet_secs": quiet});
    let uri = format!("/v1/sessions/{}/mode", enc(&id));
    let then = format!("{}?notice=mode", session_href(&id));
    act(
        &c,
        &v,
        &headers,
        &f.csrf,
        (Method::PUT, &uri, Some(&body)),
        &then,
    )
    .await
}

async fn reset_page(State(c): State<Console>, v: Visitor, Path(id): Path<String>) -> Response {
    let api = c.api(&v);
    let s: client::Session = match api.get(&format!("/v1/sessions/{}", enc(&id))).await {
        Ok(s) => s,
        Err(f) => return failed(&v, f),
    };
    let summaries = match api
        .get::<client::Summaries>(&format!("/v1/sessions/{}/summaries", enc(&id)))
        .await
    {
        Ok(r) => r.summaries.len(),
        Err(f) => return failed(&v, f),
    };
    html(
        &ResetPage {
            layout: v.layout(&format!("Reset {id}?"), "sessions", None),
            href: session_href(&id),
            summaries,
            s,
        },
        StatusCode::OK,
    )
}

async fn reset(
    State(c): State<Console>,
    v: Visitor,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<Plain>,
) -> Response {
    let uri = format!("/v1/sessions/{}", enc(&id));
    act(
        &c,
        &v,
        &headers,
        &f.csrf,
        (Method::DELETE, &uri, None),
        "/?notice=reset",
    )
    .await
}

/// A change a form asked for: checked (origin and form token), sent to the API, then back to
/// the page `then`, or the API's refusal as a page.
async fn act(
    c: &Console,
    v: &Visitor,
    headers: &HeaderMap,
    csrf: &str,
    (method, uri, body): (Method, &str, Option<&serde_json::Value>),
    then: &str,
) -> Response {
    if let Err(r) = check_form(headers, v, csrf) {
        return *r;
    }
    match c.api(v).send(method, uri, body).await {
        Ok(_) => Redirect::to(then).into_response(),
        Err(f) => failed(v, f),
    }
}

#[derive(Deserialize)]
struct JobsQuery {
    before: Option<u64>,
    notice: Option<String>,
}

async fn jobs_page(State(c): State<Console>, v: Visitor, Query(q): Query<JobsQuery>) -> Response {
    let uri = match q.before {
        Some(b) => format!("/v1/jobs?limit=50&before={b}"),
        None => "/v1/jobs?limit=50".to_string(),
    };
    let page: client::JobsPage = match c.api(&v).get(&uri).await {
        Ok(p) => p,
        Err(f) => return failed(&v, f),
    };
    let now = c.now();
    html(
        &JobsPage {
            layout: v.layout("Jobs", "jobs", notice_text(q.notice.as_deref())),
            jobs: page.jobs.iter().map(|j| JobLine::new(j, now)).collect(),
            next: page.next_before.map(|b| format!("/jobs?before={b}")),
        },
        StatusCode::OK,
    )
}

async fn cancel(
    State(c): State<Console>,
    v: Visitor,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<Plain>,
) -> Response {
    let uri = format!("/v1/jobs/{}/cancel", enc(&id));
    act(
        &c,
        &v,
        &headers,
        &f.csrf,
        (Method::POST, &uri, None),
        "/jobs?notice=cancel",
    )
    .await
}

#[derive(Deserialize)]
struct MemoriesQuery {
    notice: Option<String>,
    #[serde(default)]
    user: String,
    #[serde(default)]
    project: String,
    #[serde(default)]
    q: String,
    #[serde(default)]
    offset: usize,
}

async fn memories_page(
    State(c): State<Console>,
    v: Visitor,
    Query(q): Query<MemoriesQuery>,
) -> Response {
    let api = c.api(&v);
    let now = c.now();
    let (user, project) = (q.user.trim(), q.project.trim());
    let mut filter = String::new();
    for (k, val) in [("user", user), ("project", project)] {
        if !val.is_empty() {
            filter.push_str(&format!(
                "{}{k}={}",
                if filter.is_empty() { "?" } else { "&" },
                enc(val)
            ));
        }
    }
    let all: client::Clusters = match api.get(&format!("/v1/clusters{filter}")).await {
        Ok(c) => c,
        Err(f) => return failed(&v, f),
    };
    // The flat list: every memory of the filter, newest first.
    let sep = if filter.is_empty() { "?" } else { "&" };
    let count: client::Memories = match api.get(&format!("/v1/memories{filter}{sep}limit=1")).await
    {
        Ok(m) => m,
        Err(f) => return failed(&v, f),
    };
    let from = count.total.saturating_sub(MEMORIES);
    let flat: client::Memories = match api
        .get(&format!(
            "/v1/memories{filter}{sep}offset={from}&limit={MEMORIES}"
        ))
        .await
    {
        Ok(m) => m,
        Err(f) => return failed(&v, f),
    };
    let all_total = flat.total;
    let flat: Vec<FlatMemory> = flat
        .memories
        .iter()
        .rev()
        .map(|m| FlatMemory::new(m, now))
        .collect();
    let total = all.clusters.len();
    let mut groups: BTreeMap<(String, String, String), ScopeGroup> = BTreeMap::new();
    let shown: Vec<&client::Cluster> = all.clusters.iter().skip(q.offset).take(CLUSTERS).collect();
    for cl in &shown {
        let (summary, sources) = match cl.summary {
            Some(sid) => {
                let s = api
                    .get::<client::ClusterSummary>(&format!("/v1/summaries/{sid}"))
                    .await;
                let src = api
                    .get::<client::Sources>(&format!("/v1/summaries/{sid}/sources"))
                    .await;
                match (s, src) {
                    (Ok(s), Ok(src)) => (Some(s), src.sources),
                    (Err(f), _) | (_, Err(f)) => return failed(&v, f),
                }
            }
            None => {
                let mut members = Vec::new();
                for m in &cl.members {
                    match api
                        .get::<client::Memory>(&format!("/v1/memories/{}", enc(m)))
                        .await
                    {
                        Ok(m) => members.push(m),
                        // Deleted since the cluster was listed.
                        Err(f) if f.status == StatusCode::NOT_FOUND => {}
                        Err(f) => return failed(&v, f),
                    }
                }
                (None, members)
            }
        };
        let card = ClusterCard {
            id: cl.id,
            kind: cl.kind.clone(),
            key: cl.key.clone(),
            importance: summary
                .as_ref()
                .map_or_else(String::new, |s| format!("{:.2}", s.importance)),
            model: summary
                .as_ref()
                .map_or_else(String::new, |s| s.model.clone()),
            updated: summary
                .as_ref()
                .map_or_else(String::new, |s| when(Some(s.updated_ms as i64), now)),
            summary: summary.map(|s| s.text),
            note: cl.note.clone(),
            sources: sources.iter().map(|m| MemoryLine::new(m, now)).collect(),
        };
        let g = groups
            .entry((cl.user.clone(), cl.project.clone(), cl.environment.clone()))
            .or_insert_with(|| ScopeGroup {
                title: format!(
                    "user {} · project {}{}",
                    cl.user,
                    if cl.project.is_empty() {
                        "—"
                    } else {
                        &cl.project
                    },
                    if cl.environment.is_empty() {
                        String::new()
                    } else {
                        format!(" · {}", cl.environment)
                    }
                ),
                summarized: Vec::new(),
                sparse: Vec::new(),
            });
        if card.summary.is_some() {
            g.summarized.push(card);
        } else {
            g.sparse.push(card);
        }
    }
    let (recall, recall_error) = if q.q.trim().is_empty() {
        (None, None)
    } else {
        let mut body = json!({"query": q.q.trim(), "k": 10});
        if !user.is_empty() {
            body["user"] = json!(user);
        }
        if !project.is_empty() {
            body["project"] = json!(project);
        }
        match api.send(Method::POST, "/v1/recall", Some(&body)).await {
            Ok((_, r)) => match serde_json::from_value::<client::Recall>(r) {
                Ok(r) => (
                    Some(
                        r.results
                            .into_iter()
                            .map(|x| RecallLine {
                                kind: x.kind,
                                id: x.id,
                                text: x.text,
                                score: format!("{:.3}", x.score),
                                importance: format!("{:.2}", x.importance),
                                sources: x.sources,
                                superseded_by: x.superseded_by,
                            })
                            .collect(),
                    ),
                    None,
                ),
                Err(e) => (
                    None,
                    Some(format!("the recall answer is not understood: {e}")),
                ),
            },
            Err(f) if f.status == StatusCode::UNAUTHORIZED => return failed(&v, f),
            Err(f) => (None, Some(f.message)),
        }
    };
    let next = q.offset + shown.len();
    html(
        &MemoriesPage {
            layout: v.layout("Memories", "memories", notice_text(q.notice.as_deref())),
            more: (next < total).then(|| {
                format!(
                    "/memories?user={}&project={}&offset={next}",
                    enc(user),
                    enc(project)
                )
            }),
            user: user.to_string(),
            project: project.to_string(),
            q: q.q.clone(),
            groups: groups.into_values().collect(),
            clusters: total,
            shown: shown.len(),
            recall,
            recall_error,
            all: flat,
            all_total,
        },
        StatusCode::OK,
    )
}

async fn delete_memory(
    State(c): State<Console>,
    v: Visitor,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<Plain>,
) -> Response {
    let uri = format!("/v1/memories/{}", enc(&id));
    act(
        &c,
        &v,
        &headers,
        &f.csrf,
        (Method::DELETE, &uri, None),
        "/memories?notice=forgotten",
    )
    .await
}

/// The month `YYYY-MM` as the chart's axis names it ("Nov").
fn month_abbr(month: &str) -> String {
    const NAMES: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    month
        .split_once('-')
        .and_then(|(_, m)| m.parse::<usize>().ok())
        .and_then(|m| NAMES.get(m.wrapping_sub(1)))
        .map_or_else(String::new, |n| (*n).to_string())
}

/// Days in the month `YYYY-MM`.
fn month_len(month: &str) -> u32 {
    let (y, m) = month.split_once('-').unwrap_or(("1970", "01"));
    let (y, m): (i16, i8) = (y.parse().unwrap_or(1970), m.parse().unwrap_or(1));
    jiff::civil::date(y, m, 1).days_in_month() as u32
}

async fn usage_page(State(c): State<Console>, v: Visitor) -> Response {
    let u: client::Usage = match c.api(&v).get("/v1/usage").await {
        Ok(u) => u,
        Err(f) => return failed(&v, f),
    };
    let now = c.now();
    let spent = u.prompt_tokens + u.output_tokens;
    let ceiling = match (u.limit_tokens, u.limit_cost) {
        (Some(t), Some(c)) => format!("{} tokens or {c:.2} a month", num(t)),
        (Some(t), None) => format!("{} tokens a month", num(t)),
        (None, Some(c)) => format!("{c:.2} a month"),
        (None, None) => "none set".into(),
    };
    let spent_percent = match (u.limit_tokens, u.limit_cost) {
        (Some(t), _) if t > 0 => Some((spent * 100 / t) as u32),
        (_, Some(c)) if c > 0.0 => Some((u.cost * 100.0 / c) as u32),
        _ => None,
    };
    let days: Vec<(u32, u64)> = u
        .days
        .iter()
        .filter_map(|d| {
            let day = d.day.get(8..10)?.parse().ok()?;
            Some((day, d.prompt_tokens + d.output_tokens))
        })
        .collect();
    html(
        &UsagePage {
            layout: v.layout("Usage", "usage", None),
            chart: Chart::new(
                &days,
                month_len(&u.month),
                u.limit_tokens,
                &month_abbr(&u.month),
            ),
            calls: num(u.calls),
            tokens: format!(
                "{} ({} prompt, {} output)",
                num(spent),
                num(u.prompt_tokens),
                num(u.output_tokens)
            ),
            cost: format!("{:.4}", u.cost),
            ceiling,
            spent_percent: spent_percent.map(|p| p.min(100)),
            exhausted: u.exhausted,
            resets: when(Some(u.resets_at_ms as i64), now),
            days: u
                .days
                .iter()
                .map(|d| DayLine {
                    day: d.day.clone(),
                    calls: num(d.calls),
                    prompt_tokens: num(d.prompt_tokens),
                    output_tokens: num(d.output_tokens),
                    cost: format!("{:.4}", d.cost),
                })
                .collect(),
            month: u.month,
        },
        StatusCode::OK,
    )
}

/// The tenant's job events for the page's script: the API's stream, passed through.
async fn events(State(c): State<Console>, headers: HeaderMap) -> Response {
    let v = match c.visitor(&headers) {
        Ok(v) => v,
        Err(_) => return StatusCode::UNAUTHORIZED.into_response(),
    };
    c.api(&v)
        .stream("/v1/events", headers.get("last-event-id"))
        .await
}

/// One job's events for the page's script: the API's stream, passed through.
async fn job_events(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let v = match c.visitor(&headers) {
        Ok(v) => v,
        Err(_) => return StatusCode::UNAUTHORIZED.into_response(),
    };
    c.api(&v)
        .stream(
            &format!("/v1/jobs/{}/events", enc(&id)),
            headers.get("last-event-id"),
        )
        .await
}

#[derive(Deserialize)]
struct LoginQuery {
    expired: Option<String>,
}

async fn login_page(Query(q): Query<LoginQuery>) -> Response {
    let error = q.expired.is_some().then(|| {
        "Your token is no longer accepted (revoked, or the server changed). Sign in again."
            .to_string()
    });
    html(
        &LoginPage {
            layout: layout("Sign in", "", csrf_of(None), false),
            error,
        },
        StatusCode::OK,
    )
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(c): State<Console>, headers: HeaderMap, Form(f): Form<LoginForm>) -> Response {
    let token = f.token.trim().to_string();
    let anon = Visitor {
        token: None,
        csrf: csrf_of(None),
    };
    if let Err(r) = check_form(&headers, &anon, &anon.csrf) {
        return *r;
    }
    let refuse = |msg: &str| {
        html(
            &LoginPage {
                layout: layout("Sign in", "", csrf_of(None), false),
                error: Some(msg.to_string()),
            },
            StatusCode::UNAUTHORIZED,
        )
    };
    if !cookie_safe(&token) {
        return refuse("That is not an abridge token: paste what 'abridge tokens create' printed.");
    }
    let api = Api {
        router: &c.api,
        token: Some(&token),
    };
    match api.send(Method::GET, "/v1/sessions?limit=1", None).await {
        Ok(_) => {}
        Err(f) if f.status == StatusCode::UNAUTHORIZED => {
            return refuse("The server does not accept this token (unknown or revoked).");
        }
        Err(f) => return refuse(&f.message),
    }
    let cookie = format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
    let mut r = Redirect::to("/").into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("a cookie-safe token"),
    );
    r
}

async fn logout(headers: HeaderMap) -> Response {
    let v = Visitor {
        csrf: csrf_of(cookie_token(&headers).as_deref()),
        token: cookie_token(&headers),
    };
    if let Err(r) = check_form(&headers, &v, &v.csrf) {
        return *r;
    }
    let mut r = Redirect::to("/login").into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("abridge_token=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    r
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_token_depends_on_the_api_token_and_cookies_are_read_exactly() {
        assert_ne!(csrf_of(Some("a")), csrf_of(Some("b")));
        assert_eq!(csrf_of(None).len(), 32);
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("x=1; abridge_token=abc_1; y=2"),
        );
        assert_eq!(cookie_token(&h).as_deref(), Some("abc_1"));
        assert!(cookie_safe("abr_x-Y.z"));
        assert!(!cookie_safe("a;b") && !cookie_safe("a b") && !cookie_safe(""));
    }

    #[test]
    fn forms_from_another_origin_are_refused() {
        let v = Visitor {
            token: Some("t".into()),
            csrf: csrf_of(Some("t")),
        };
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8787"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8787"),
        );
        assert!(check_form(&h, &v, &v.csrf).is_ok());
        assert!(check_form(&h, &v, "wrong").is_err());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(check_form(&h, &v, &v.csrf).is_err());
        h.remove(header::ORIGIN);
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(check_form(&h, &v, &v.csrf).is_err());
        assert_eq!(month_len("2026-02"), 28);
        assert_eq!(month_abbr("2026-11"), "Nov");
        assert_eq!(month_abbr("junk"), "");
        assert_eq!(month_len("2026-11"), 30);
    }
}
