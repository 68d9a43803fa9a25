//! The jobs HTTP API, as an axum `Router` the server merges (the status page is the lab's).

mod sse;

use std::collections::HashMap;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::error::JobError;
use crate::host::JobHost;

/// Largest accepted `POST /api/jobs` body.
pub const MAX_BODY: usize = 1 << 20;

/// Default and largest `limit` of `GET /api/jobs`.
const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1000;

/// Every route of [`router`] as `(method, path, summary)`, for the server's `/openapi.json`.
pub const ROUTES: &[(&str, &str, &str)] = &[
    ("GET", "/api/jobs", "Jobs, newest first (?limit=&kind=)"),
    (
        "POST",
        "/api/jobs",
        "Submit a job: {kind, config} -> {ok, job_id, job}",
    ),
    ("GET", "/api/jobs/{id}", "One job"),
    (
        "GET",
        "/api/jobs/{id}/stream",
        "A job's events as server-sent events (Last-Event-ID resumes)",
    ),
    ("POST", "/api/jobs/{id}/cancel", "Cancel a job"),
    (
        "POST",
        "/api/jobs/{id}/stop",
        "Ask a training job to save what it has and end",
    ),
];

/// `/api/jobs…`, with `host` as state.
pub fn router(host: JobHost) -> Router {
    Router::new()
        .route("/api/jobs", get(list).post(submit))
        .route("/api/jobs/{id}", get(show))
        .route("/api/jobs/{id}/stream", get(sse::stream))
        .route("/api/jobs/{id}/cancel", post(cancel))
        .route("/api/jobs/{id}/stop", post(request_stop))
        .with_state(host)
}

/// `{ok:false,error}` with `status`.
pub(crate) fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    (
        status,
        axum::Json(json!({"ok": false, "error": message.to_string()})),
    )
        .into_response()
}

fn job_error(e: JobError) -> Response {
    let status = match &e {
        JobError::NotFound(_) => return error(StatusCode::NOT_FOUND, "job not found"),
        JobError::Terminal { .. } => StatusCode::CONFLICT,
        JobError::UnknownKind(_) | JobError::BadConfig(_) => StatusCode::BAD_REQUEST,
        JobError::Closed => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e)
}

async fn submit(State(host): State<JobHost>, req: Request) -> Response {
    // Refuse an oversized body from its declared length, before reading any of it.
    let declared = (req.headers().get(header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return too_large();
    }
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(e) if crosses_limit(&e) => return too_large(),
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("request body unreadable: {e}"),
            );
        }
    };
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}")),
    };
    let Some(kind) = request.get("kind").and_then(Value::as_str) else {
        return error(StatusCode::BAD_REQUEST, "`kind` must be a string");
    };
    let config = match request.get("config") {
        None | Some(Value::Null) => json!({}),
        Some(c @ Value::Object(_)) => c.clone(),
        Some(_) => return error(StatusCode::BAD_REQUEST, "`config` must be a JSON object"),
    };
    match host.submit(kind, config) {
        Ok(job) => axum::Json(json!({"ok": true, "job_id": job.id, "job": job})).into_response(),
        Err(e) => job_error(e),
    }
}

/// A 413, as the server's other routes answer an oversized body.
fn too_large() -> Response {
    let msg = format!("request body too large (limit {MAX_BODY} bytes)");
    error(StatusCode::PAYLOAD_TOO_LARGE, msg)
}

/// Whether reading the body failed because it crossed [`MAX_BODY`] (a chunked body, or one
/// longer than it declared), rather than because the connection broke.
fn crosses_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

async fn list(State(host): State<JobHost>, Query(q): Query<HashMap<String, String>>) -> Response {
    let limit = match q.get("limit").map(|l| l.parse::<usize>()) {
        None => DEFAULT_LIMIT,
        Some(Ok(n)) => n.clamp(1, MAX_LIMIT),
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "`limit` must be a positive integer",
            );
        }
    };
    let kind = q.get("kind").map(String::as_str).filter(|k| !k.is_empty());
    match host.store().recent(limit, kind) {
        Ok(jobs) => axum::Json(json!({"ok": true, "jobs": jobs})).into_response(),
        Err(e) => job_error(e),
    }
}

async fn show(State(host): State<JobHost>, Path(id): Path<String>) -> Response {
    match host.store().get(&id) {
        Ok(Some(job)) => axum::Json(json!({"ok": true, "job": job})).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "job not found"),
        Err(e) => job_error(e),
    }
}

async fn cancel(State(host): State<JobHost>, Path(id): Path<String>) -> Response {
    match host.cancel(&id).await {
        Ok(job) => axum::Json(json!({"ok": true, "job": job})).into_response(),
        Err(e) => job_error(e),
    }
}

async fn request_stop(State(host): State<JobHost>, Path(id): Path<String>) -> Response {
    match host.request_stop(&id) {
        Ok(job) => axum::Json(json!({"ok": true, "job": job})).into_response(),
        Err(e) => job_error(e),
    }
}
