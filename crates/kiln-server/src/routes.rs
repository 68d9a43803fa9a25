//! The router: every route, discovery endpoints, and the 404/405 fallbacks.

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, Uri};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::Serialize;

use crate::errors::{ApiError, Flavor};
use crate::state::SharedState;
use crate::{anthropic, auth, openai, openapi, page, stats};

/// One route's description: `(method, path, summary)`.
pub type RouteDoc = (&'static str, &'static str, &'static str);

/// Every route of the server's own router; `/v1` and `/openapi.json` are built from it and the
/// extensions' routes (`AppState::routes`).
pub const ROUTES: &[RouteDoc] = &[
    ("GET", "/", "The chat page"),
    ("GET", "/health", "Liveness: {\"status\":\"ok\"}"),
    (
        "GET",
        "/ready",
        "Readiness: 200 once the model is loaded, 503 while shutting down",
    ),
    ("GET", "/v1", "This index of endpoints"),
    (
        "GET",
        "/v1/models",
        "Loaded, loading and available models (status loaded|loading|unloaded) and mounted adapters (parent: their model)",
    ),
    ("GET", "/v1/models/{id}", "One model or adapter by id"),
    (
        "POST",
        "/api/models/load",
        "Load a model: {model, keep_alive?} -> its /v1/models card",
    ),
    (
        "POST",
        "/api/models/unload",
        "Unload a model: {model} -> {id, status: unloaded|unloading}",
    ),
    (
        "POST",
        "/v1/chat/completions",
        "OpenAI chat completions (stream and not)",
    ),
    (
        "POST",
        "/v1/completions",
        "OpenAI text completions (stream and not)",
    ),
    (
        "POST",
        "/v1/embeddings",
        "OpenAI embeddings: input string|string[]|token ids|token-id lists, encoding_format float|base64, dimensions",
    ),
    (
        "POST",
        "/v1/rerank",
        "Rerank documents with a cross-encoder: {query, documents, top_n?} -> {results:[{index, relevance_score}]}",
    ),
    (
        "POST",
        "/v1/reranking",
        "The same as /v1/rerank (llama-server's other name)",
    ),
    (
        "POST",
        "/rerank",
        "/v1/rerank, or TEI's form: {query, texts} -> [{index, score}]",
    ),
    (
        "POST",
        "/api/embed",
        "Ollama embeddings: {model, input, truncate?, dimensions?} -> {embeddings}",
    ),
    (
        "POST",
        "/v1/responses",
        "OpenAI Responses (stream and not; previous_response_id)",
    ),
    (
        "POST",
        "/v1/messages",
        "Anthropic messages (stream and not)",
    ),
    (
        "POST",
        "/v1/messages/count_tokens",
        "Anthropic token count of a messages request",
    ),
    (
        "GET",
        "/v1/adapters",
        "Mounted LoRA adapters: {adapters:[{id,path,rank,scale,size_bytes,mounted_layers}]}",
    ),
    (
        "GET",
        "/v1/adapters/available",
        "Adapter folders in the fine-tune output folder that fit the served model: {adapters:[{id,path,rank,scale,base_model,mounted}], skipped:[{path,reason}]}",
    ),
    (
        "POST",
        "/v1/adapters",
        "Mount a LoRA adapter folder: {id,path} -> {id,mounted_layers,rank,scale}",
    ),
    (
        "DELETE",
        "/v1/adapters/{id}",
        "Unmount a LoRA adapter (requests running with it finish): {id,removed_layers}",
    ),
    (
        "GET",
        "/stats",
        "Server, queue, KV and prompt-cache statistics (JSON)",
    ),
    (
        "GET",
        "/metrics",
        "Prometheus metrics, with vLLM-style gauges",
    ),
    (
        "GET",
        "/openapi.json",
        "OpenAPI 3.1 description of every route",
    ),
];

/// Builds the application.
pub fn router(state: SharedState) -> Router {
    router_with(state, None, None)
}

/// Adds `x-kiln-job-gate` to generation responses while `note` says generations wait.
async fn gate_header(
    State(note): State<GateNote>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let is_generation =
        req.method() == axum::http::Method::POST && req.uri().path().starts_with("/v1/");
    let waiting = if is_generation { note() } else { None };
    let mut resp = next.run(req).await;
    if let Some(v) = waiting.and_then(|w| axum::http::HeaderValue::from_str(&w).ok()) {
        resp.headers_mut().insert("x-kiln-job-gate", v);
    }
    resp
}

type GateNote = std::sync::Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Builds the application with extra routes merged in (behind the same auth and Host checks)
/// and, with `gate_note`, the job-gate response header. After the auth and Host checks
/// (whose refusals drain the body unread), bodies are read whole, within the limits, before
/// routing (`body_guard`).
pub fn router_with(
    state: SharedState,
    extra: Option<Router>,
    gate_note: Option<GateNote>,
) -> Router {
    let limit = state.config.body_limit.max(1024);
    let base = Router::new()
        .route("/", get(page::index))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/v1", get(index))
        .route("/v1/models", get(crate::models::http::list))
        .route("/v1/models/{*id}", get(crate::models::http::one))
        .route("/api/models/load", post(crate::models::http::load))
        .route("/api/models/unload", post(crate::models::http::unload))
        .route("/v1/chat/completions", post(openai::chat::handler))
        .route("/v1/completions", post(openai::completions::handler))
        .route("/v1/embeddings", post(crate::embeddings::handler))
        .route("/api/embed", post(crate::embeddings::ollama_handler))
        .route("/v1/rerank", post(crate::embeddings::rerank::handler))
        .route("/v1/reranking", post(crate::embeddings::rerank::handler))
        .route("/rerank", post(crate::embeddings::rerank::tei_handler))
        .route("/v1/responses", post(openai::responses::handler))
        .route("/v1/messages", post(anthropic::messages::handler))
        .route(
            "/v1/messages/count_tokens",
            post(anthropic::messages::count_tokens),
        )
        .route(
            "/v1/adapters",
            get(crate::adapters::list).post(crate::adapters::mount),
        )
        .route(
            "/v1/adapters/available",
            get(crate::adapters::available).delete(crate::adapters::unmount_available),
        )
        .route("/v1/adapters/{id}", delete(crate::adapters::unmount))
        .route("/stats", get(stats::stats))
        .route("/metrics", get(crate::metrics::metrics))
        .route("/openapi.json", get(openapi::spec))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state.clone());
    let mut app = match extra {
        Some(extra) => base.merge(extra),
        None => base,
    };
    if let Some(note) = gate_note {
        app = app.layer(middleware::from_fn_with_state(note, gate_header));
    }
    let body_limits = crate::body_guard::BodyLimits {
        max_bytes: limit,
        timeout: state.config.limits.body_timeout,
    };
    app.layer(middleware::from_fn_with_state(
        body_limits,
        crate::body_guard::read_body,
    ))
    .layer(middleware::from_fn_with_state(state, auth::guard))
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!("not found: {}", uri.path())).flavor(Flavor::for_path(uri.path()))
}

async fn method_not_allowed(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed on {}", uri.path()),
    )
    .flavor(Flavor::for_path(uri.path()))
}

/// `/health` and `/ready`'s body (`model` only when ready).
#[derive(Serialize)]
struct Health<'a> {
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
}

async fn health() -> axum::Json<Health<'static>> {
    axum::Json(Health {
        status: "ok",
        model: None,
    })
}

async fn ready(State(state): State<SharedState>) -> Response {
    if state.models.is_open() {
        let body = Health {
            status: "ready",
            model: Some(state.models.default_id()),
        };
        axum::Json(body).into_response()
    } else {
        let body = Health {
            status: "shutting_down",
            model: None,
        };
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
    }
}

/// `GET /v1`: what this server is and every route it answers.
#[derive(Serialize)]
struct Index<'a> {
    name: &'static str,
    version: &'static str,
    model: &'a str,
    endpoints: Vec<Endpoint<'a>>,
}

/// One route of the index.
#[derive(Serialize)]
struct Endpoint<'a> {
    method: &'a str,
    path: &'a str,
    description: &'a str,
}

async fn index(State(state): State<SharedState>) -> Response {
    let endpoints = (state.routes.iter())
        .map(|(method, path, description)| Endpoint {
            method,
            path,
            description,
        })
        .collect();
    let body = Index {
        name: "kiln",
        version: env!("CARGO_PKG_VERSION"),
        model: state.models.default_id(),
        endpoints,
    };
    axum::Json(body).into_response()
}

/// Unix seconds as RFC 3339 UTC (Anthropic's `created_at`), by Howard Hinnant's civil-from-days.
pub(crate) fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_dates() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1_796_013_131), "2026-11-30T04:32:11Z");
    }
}
