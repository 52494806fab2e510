//! Who is calling: a bearer token names its tenant; on loopback with no tokens at all, every
//! caller is the local tenant. Also the per-tenant request rate.

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Srv;
use super::api::ApiError;
use crate::app::Tenant;
use crate::app::{AppError, ErrorKind};

fn unauthenticated(msg: &str) -> Response {
    let mut r = ApiError(
        AppError::new(ErrorKind::Unauthenticated, msg)
            .hint("send 'Authorization: Bearer TOKEN' with a token from 'abridge tokens create --tenant NAME'"),
    )
    .into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        "Bearer".parse().expect("static header"),
    );
    r
}

/// The middleware: find the caller's tenant, check a read-only token does not write, count the
/// request against the tenant's rate, and hand the handlers the tenant's scoped app (the only
/// way they reach data).
pub(crate) async fn authenticate(State(srv): State<Srv>, mut req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or("").to_string());
    let (tenant, read_only) = match given {
        Some(v) => {
            let Some(token) = v.strip_prefix("Bearer ").map(str::trim) else {
                return unauthenticated("the Authorization header is not 'Bearer TOKEN'");
            };
            match srv.app.tokens().check(token).await {
                Ok(Some(g)) => (g.tenant, g.read_only),
                Ok(None) => return unauthenticated("the token is not valid (unknown or revoked)"),
                Err(e) => return ApiError(e).into_response(),
            }
        }
        None => {
            // Tokens created after the start close the open door at once.
            let open = srv.open_local && matches!(srv.app.tokens().any_live().await, Ok(false));
            if !open {
                return unauthenticated("this server requires a token");
            }
            (Tenant::local(), false)
        }
    };
    // Recall is a read, sent as POST for its body.
    let reads = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS)
        || req.uri().path() == "/v1/recall";
    if read_only && !reads {
        return ApiError(
            AppError::new(ErrorKind::Forbidden, "this token is read-only")
                .hint("use a token created without --read-only to write"),
        )
        .into_response();
    }
    let scoped = srv.app.tenant(&tenant);
    if let Err(e) = scoped.admit() {
        return ApiError(e).into_response();
    }
    req.extensions_mut().insert(scoped);
    next.run(req).await
}
