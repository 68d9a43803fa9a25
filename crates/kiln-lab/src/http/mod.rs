//! The lab's HTTP routes (spec §3.8) and its pages: dataset templates and submit, quantize and
//! fine-tune submit (the job API with the spec's answers), the data folder inspection the
//! fine-tune page previews, the quantize preview, the model list, and the wizard pages under
//! `/lab`. Merged into the server behind its API key.

mod pages;

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kiln_jobs::{JobError, JobHost};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::LabError;
use crate::quantize::job::Resolver;

/// A model the pages offer as a source or base.
#[derive(Debug, Clone, Serialize)]
pub struct ModelEntry {
    /// What to type to use it.
    pub name: String,
    /// Where it is.
    pub path: PathBuf,
    /// Bytes on disk.
    pub size_bytes: u64,
    /// `file` or `folder`.
    pub kind: &'static str,
}

/// Lists the models the lab can start from.
pub type ModelLister = Arc<dyn Fn() -> Vec<ModelEntry> + Send + Sync>;

/// What the routes need from the server.
#[derive(Clone)]
pub struct LabState {
    /// The job host (dataset jobs are submitted to it).
    pub jobs: JobHost,
    /// The cached models.
    pub models: ModelLister,
    /// The model being served.
    pub served: ModelEntry,
    /// Finds a model by name without downloading.
    pub resolve: Resolver,
}

/// Every route of [`router`] as `(method, path, summary)`, for the server's `/openapi.json`.
pub const ROUTES: &[(&str, &str, &str)] = &[
    (
        "GET",
        "/api/dataset/templates",
        "Dataset generation templates",
    ),
    ("POST", "/api/dataset/submit", "Submit a dataset job"),
    (
        "POST",
        "/api/finetune/inspect-dataset",
        "Check a fine-tuning dataset: format, rows, problems",
    ),
    ("POST", "/api/finetune/submit", "Submit a fine-tuning job"),
    ("POST", "/api/quantize/submit", "Submit a quantization job"),
    (
        "POST",
        "/api/quantize/preview",
        "A quantization plan's size and bits, before running it",
    ),
    (
        "GET",
        "/api/lab/models",
        "Models the lab can use (cached and served)",
    ),
    ("GET", "/lab", "The lab's pages"),
    (
        "GET",
        "/lab/assets/{name}",
        "The lab pages' scripts and styles",
    ),
    ("GET", "/quantize", "Redirect to the lab's quantize page"),
    ("GET", "/finetune", "Redirect to the lab's fine-tune page"),
    ("GET", "/dataset", "Redirect to the lab's dataset page"),
    ("GET", "/status", "Redirect to the lab's job status page"),
    ("GET", "/jobs", "Redirect to the lab's job status page"),
];

/// `/api/dataset/*`, `/api/finetune/inspect-dataset`, `/api/quantize/preview`,
/// `/api/lab/models`, and the pages.
pub fn router(state: LabState) -> Router {
    Router::new()
        .route("/api/dataset/templates", get(templates))
        .route("/api/dataset/submit", post(submit_dataset))
        .route("/api/finetune/inspect-dataset", post(inspect_dataset))
        .route("/api/finetune/submit", post(submit_finetune))
        .route("/api/quantize/submit", post(submit_quantize))
        .route("/api/quantize/preview", post(quantize_preview))
        .route("/api/lab/models", get(models))
        .with_state(state)
        .merge(pages::router())
}

/// Paths the pages are served at; they ask for the key themselves, so they need none.
pub const OPEN_PATHS: [&str; 7] = [
    "/lab",
    "/lab/assets/",
    "/quantize",
    "/finetune",
    "/dataset",
    "/status",
    "/jobs",
];

/// A refused request: `{ok:false,error}` with its status.
#[derive(Debug)]
pub struct Refusal(StatusCode, String);

impl Refusal {
    fn bad(message: impl std::fmt::Display) -> Self {
        Refusal(StatusCode::BAD_REQUEST, message.to_string())
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, axum::Json(json!({"ok": false, "error": self.1}))).into_response()
    }
}

impl From<LabError> for Refusal {
    fn from(e: LabError) -> Self {
        let status = match e {
            LabError::Config { .. }
            | LabError::Data { .. }
            | LabError::Io { .. }
            | LabError::Model(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Refusal(status, e.to_string())
    }
}

impl From<JobError> for Refusal {
    fn from(e: JobError) -> Self {
        let status = match &e {
            JobError::UnknownKind(_) | JobError::BadConfig(_) => StatusCode::BAD_REQUEST,
            JobError::Closed => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Refusal(status, e.to_string())
    }
}

type Answer = Result<Response, Refusal>;

/// The body as a JSON object, or the 400 that says why not.
fn object(body: &Bytes) -> Result<Map<String, Value>, Refusal> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Refusal::bad("the body must be a JSON object")),
        Err(e) => Err(Refusal::bad(format!("malformed JSON: {e}"))),
    }
}

/// Runs blocking work (file headers, folder reads) off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        let msg = format!("the request's work failed: {e}");
        Refusal(StatusCode::INTERNAL_SERVER_ERROR, msg)
    })
}

/// `value` with `ok: true` added.
fn ok(value: impl Serialize) -> Response {
    let mut v = serde_json::to_value(value).unwrap_or_default();
    v["ok"] = true.into();
    axum::Json(v).into_response()
}

async fn templates() -> Response {
    ok(json!({"templates": crate::dataset::templates::all()}))
}

/// `POST /api/dataset/submit {template_id, inputs?, model_name?, output_dir?, max_tokens?,
/// temperature?}` → `{ok, job_id, output_dir}`.
async fn submit_dataset(State(s): State<LabState>, body: Bytes) -> Answer {
    let config = object(&body)?;
    let jobs = s.jobs.clone();
    let job = blocking(move || jobs.submit("dataset", Value::Object(config))).await??;
    Ok(ok(json!({"job_id": job.id, "output_dir": job.output_path})))
}

/// `POST /api/quantize/submit` (the quantize job's config as the body) → `{ok, job_id,
/// output_dir}` (spec §3.8).
async fn submit_quantize(State(s): State<LabState>, body: Bytes) -> Answer {
    submit_kind(&s, "quantize", &body, "output_dir").await
}

/// `POST /api/finetune/submit` (the fine-tune job's config as the body) → `{ok, job_id,
/// adapter_path}` (spec §3.8).
async fn submit_finetune(State(s): State<LabState>, body: Bytes) -> Answer {
    submit_kind(&s, "finetune", &body, "adapter_path").await
}

async fn submit_kind(s: &LabState, kind: &'static str, body: &Bytes, out_key: &str) -> Answer {
    let config = object(body)?;
    let jobs = s.jobs.clone();
    let job = blocking(move || jobs.submit(kind, Value::Object(config))).await??;
    let mut answer = json!({"job_id": job.id});
    answer[out_key] = job.output_path.into();
    Ok(ok(answer))
}

/// Rows previewed by default, and at most.
const PREVIEW_ROWS: usize = 5;
const MAX_PREVIEW_ROWS: usize = 50;

/// `POST /api/finetune/inspect-dataset {path, limit?}` → `{ok, format, n_train, n_valid, rows}`.
async fn inspect_dataset(body: Bytes) -> Answer {
    let req = object(&body)?;
    let path = (req.get("path").and_then(Value::as_str))
        .filter(|p| !p.trim().is_empty())
        .ok_or_else(|| Refusal::bad("path is required: a data folder or JSONL file"))?;
    let limit = match req.get("limit") {
        None | Some(Value::Null) => PREVIEW_ROWS,
        Some(v) => v
            .as_u64()
            .map(|n| (n as usize).min(MAX_PREVIEW_ROWS))
            .ok_or_else(|| Refusal::bad("limit must be a non-negative integer"))?,
    };
    let path = crate::expand_home(path);
    let preview = blocking(move || crate::finetune::data::preview_data_dir(&path, limit)).await??;
    Ok(ok(preview))
}

/// `POST /api/quantize/preview` with the quantize job's config keys.
async fn quantize_preview(State(s): State<LabState>, body: Bytes) -> Answer {
    let config = object(&body)?;
    let resolve = s.resolve.clone();
    let preview =
        blocking(move || crate::quantize::preview::preview(&config, &*resolve, None)).await??;
    Ok(ok(preview))
}

async fn models(State(s): State<LabState>) -> Answer {
    let list = s.models.clone();
    let models = blocking(move || list()).await?;
    Ok(ok(json!({"models": models, "served": s.served})))
}
