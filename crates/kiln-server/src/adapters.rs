//! LoRA adapters over HTTP (spec §3.7): `GET /v1/adapters` lists the mounted ones,
//! `POST /v1/adapters {id, path}` mounts a folder (checked whole against the served model),
//! `DELETE /v1/adapters/{id}` unmounts; and the per-request `adapter` field of the generation
//! endpoints is resolved here. The registry itself lives in the engine crate
//! ([`kiln_engine::AdapterRegistry`]); requests in flight hold what they resolved, so an
//! unmount never cuts one short.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use kiln_engine::adapters::expand_path;
use kiln_engine::{AdapterError, AdapterRegistry};
use kiln_model::lora::{AdapterStack, ServedAdapter};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::body::parse_json;
use crate::errors::{ApiError, Flavor};
use crate::models::ServedModel;
use crate::state::{AppState, SharedState};

/// What `GET /v1/adapters` says about one adapter.
#[derive(Serialize)]
pub struct MountedAdapter<'a> {
    id: &'a str,
    path: String,
    rank: usize,
    scale: f32,
    /// A and B in f32.
    size_bytes: u64,
    mounted_layers: usize,
    base_model: Option<&'a str>,
}

/// The entry of `a`.
pub fn entry(a: &ServedAdapter) -> MountedAdapter<'_> {
    MountedAdapter {
        id: a.id(),
        path: a.path().display().to_string(),
        rank: a.info().rank,
        scale: a.info().scale,
        size_bytes: a.size_bytes(),
        mounted_layers: a.mounted_layers(),
        base_model: a.base_model(),
    }
}

/// The adapters of the default model (the one named on the command line), when it is loaded:
/// `/v1/adapters` manages those.
fn registry(state: &AppState) -> Option<Arc<AdapterRegistry>> {
    state
        .models
        .get(state.models.default_id())
        .and_then(|m| m.adapters.clone())
}

/// `GET /v1/adapters`: `{adapters:[{id,path,rank,scale,size_bytes,mounted_layers}], default}`.
pub async fn list(State(state): State<SharedState>) -> Response {
    let mounted = mounted(&state);
    Json(section(&state, &mounted)).into_response()
}

/// The mounted adapters (none without a registry).
pub fn mounted(state: &AppState) -> Vec<Arc<ServedAdapter>> {
    registry(state).map(|r| r.list()).unwrap_or_default()
}

/// The adapters of `model`, as `/stats` lists them.
pub fn section_of(model: &ServedModel) -> serde_json::Value {
    let mounted = model
        .adapters
        .as_ref()
        .map(|r| r.list())
        .unwrap_or_default();
    let list = AdapterList {
        adapters: mounted.iter().map(|a| entry(a)).collect(),
        default: model.adapters.as_ref().map_or_else(
            || kiln_model::lora::NO_ADAPTER.to_string(),
            |r| r.default_spec(),
        ),
    };
    serde_json::to_value(list).unwrap_or_default()
}

/// `GET /v1/adapters`' body.
#[derive(Serialize)]
pub struct AdapterList<'a> {
    adapters: Vec<MountedAdapter<'a>>,
    /// The stack requests without an `adapter` field run with.
    default: String,
}

/// The list of `mounted` (from [`mounted`]).
pub fn section<'a>(state: &AppState, mounted: &'a [Arc<ServedAdapter>]) -> AdapterList<'a> {
    AdapterList {
        adapters: mounted.iter().map(|a| entry(a)).collect(),
        default: registry(state).map_or_else(
            || kiln_model::lora::NO_ADAPTER.to_string(),
            |r| r.default_spec(),
        ),
    }
}

/// `POST /v1/adapters`' answer.
#[derive(Serialize)]
struct Mounted<'a> {
    id: &'a str,
    mounted_layers: usize,
    rank: usize,
    scale: f32,
}

/// `DELETE /v1/adapters/{id}`'s answer.
#[derive(Serialize)]
pub struct Unmounted {
    id: String,
    removed_layers: usize,
}

/// `POST /v1/adapters`'s body.
#[derive(Debug, Deserialize)]
struct MountRequest {
    id: Option<String>,
    path: Option<String>,
    /// The model to mount it on (default: the default model, loaded if needed).
    model: Option<Value>,
}

/// `POST /v1/adapters {id, path}` → `{id, mounted_layers, rank, scale}`; 400 for a missing id
/// or path, a bad id, a folder that does not hold an adapter, a module that does not fit the
/// served model, or an id already mounted, each saying which.
pub async fn mount(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: MountRequest = parse_json(body, Flavor::OpenAi)?;
    let id = req
        .id
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ApiError::bad_request("id is required: the name requests will use"))?;
    let path = req
        .path
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ApiError::bad_request("path is required: the adapter's folder"))?;
    let base = crate::models::acquire(&state.models, req.model.as_ref(), None).await?;
    let Some(reg) = base.adapters.clone() else {
        return Err(ApiError::bad_request(format!(
            "model {} cannot mount adapters (it was loaded without an adapter registry)",
            base.info.id
        )));
    };
    // Reading the folder can take a while: off the async workers.
    let mounted = tokio::task::spawn_blocking(move || reg.mount(&id, &expand_path(&path)))
        .await
        .map_err(|e| ApiError::internal(format!("mounting failed: {e}")))?
        .map_err(|e| ApiError::bad_request(e.to_string()).with_code(code(&e)))?;
    let body = Mounted {
        id: mounted.id(),
        mounted_layers: mounted.mounted_layers(),
        rank: mounted.info().rank,
        scale: mounted.info().scale,
    };
    Ok(Json(body).into_response())
}

/// `DELETE /v1/adapters/{id}` → `{id, removed_layers}`, or 404 `adapter <id> not mounted`.
/// Requests already running with it finish with it.
pub async fn unmount(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Json<Unmounted>, ApiError> {
    let removed = match registry(&state) {
        Some(r) => r.unmount(&id),
        None => Err(AdapterError::NotMounted(id.clone())),
    }
    .map_err(|e| ApiError::not_found(e.to_string()).with_code("adapter_not_found"))?;
    Ok(Json(Unmounted {
        id: removed.id().to_string(),
        removed_layers: removed.mounted_layers(),
    }))
}

/// `DELETE /v1/adapters/available`: the static listing route shadows an adapter mounted under
/// that id, so its unmount is answered here.
pub async fn unmount_available(state: State<SharedState>) -> Result<Json<Unmounted>, ApiError> {
    unmount(state, Path("available".to_string())).await
}

/// Most subfolders one scan reads (each is read whole to be checked).
const MAX_SCANNED: usize = 256;

/// One adapter folder that fits the served model.
#[derive(Serialize)]
pub struct AvailableAdapter {
    /// The folder's name: the id to mount it under, unless another is chosen.
    id: String,
    path: String,
    rank: usize,
    scale: f32,
    base_model: Option<String>,
    /// Whether an adapter from this folder is mounted now.
    mounted: bool,
}

/// A folder the scan left out, and why.
#[derive(Serialize)]
pub struct SkippedFolder {
    path: String,
    reason: String,
}

/// `GET /v1/adapters/available`'s body.
#[derive(Serialize, Default)]
pub struct Available {
    adapters: Vec<AvailableAdapter>,
    skipped: Vec<SkippedFolder>,
}

/// Whether `dir` holds adapter files (PEFT's or mlx-lm's).
fn looks_like_adapter(dir: &std::path::Path) -> bool {
    [
        "adapter_config.json",
        "adapter_model.safetensors",
        "adapters.safetensors",
    ]
    .iter()
    .any(|f| dir.join(f).is_file())
}

/// The adapter subfolders of `dirs`, sorted, at most [`MAX_SCANNED`].
fn candidate_folders(dirs: &[std::path::PathBuf]) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir() && looks_like_adapter(p))
        .collect();
    found.sort();
    found.truncate(MAX_SCANNED);
    found
}

/// Whether two paths name one folder (a mount's path is as the user wrote it).
fn same_folder(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Reads every adapter folder of the configured folders and keeps the ones that fit the served
/// model (the check a mount makes); the others are listed as skipped with the reason.
fn scan(state: &AppState) -> Available {
    let Some(registry) = registry(state) else {
        return Available::default();
    };
    let mounted = registry.list();
    let mut out = Available::default();
    for dir in candidate_folders(&state.config.adapter_dirs) {
        let id = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let path = dir.display().to_string();
        match registry.inspect(&dir) {
            Ok(a) => out.adapters.push(AvailableAdapter {
                mounted: mounted.iter().any(|m| same_folder(m.path(), &dir)),
                rank: a.info.rank,
                scale: a.info.scale,
                base_model: a.base_model,
                id,
                path,
            }),
            Err(e) => out.skipped.push(SkippedFolder {
                path,
                reason: e.to_string(),
            }),
        }
    }
    out
}

/// `GET /v1/adapters/available`.
pub async fn available(State(state): State<SharedState>) -> Result<Json<Available>, ApiError> {
    let list = tokio::task::spawn_blocking(move || scan(&state))
        .await
        .map_err(|e| ApiError::internal(format!("the adapter scan failed: {e}")))?;
    Ok(Json(list))
}

fn code(e: &AdapterError) -> &'static str {
    match e {
        AdapterError::Invalid(_) => "invalid_adapter",
        AdapterError::AlreadyMounted { .. } => "adapter_already_mounted",
        AdapterError::NotMounted(_) => "adapter_not_found",
    }
}

/// Resolves a request's adapters from its `adapter` field, or, when that is absent, from its
/// `model` when it names a mounted adapter (as vLLM serves LoRA adapters under their names).
pub fn resolve_for(
    base: &ServedModel,
    adapter: Option<&Value>,
    model: Option<&Value>,
) -> Result<Option<Arc<AdapterStack>>, ApiError> {
    let named = match (adapter, model, &base.adapters) {
        (None | Some(Value::Null), Some(Value::String(m)), Some(r)) if r.get(m).is_some() => {
            Some(Value::String(m.clone()))
        }
        _ => None,
    };
    resolve(base, named.as_ref().or(adapter))
}

/// A generation request's `adapter` field: absent or null → the server's default, `"none"` →
/// the base model, an id or `"a+b"` → those mounted adapters. Anything unknown is a 400 naming
/// it (never ignored).
pub fn resolve(
    base: &ServedModel,
    field: Option<&Value>,
) -> Result<Option<Arc<AdapterStack>>, ApiError> {
    let spec = match field {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => {
            return Err(ApiError::bad_request(
                "adapter must be a string: a mounted adapter's id, several joined with '+', or \"none\"",
            ));
        }
    };
    let result = match &base.adapters {
        Some(r) => r.resolve(spec),
        None => match spec {
            None | Some(kiln_model::lora::NO_ADAPTER) => Ok(None),
            Some(s) => Err(AdapterError::NotMounted(
                s.split(kiln_model::lora::STACK_SEPARATOR)
                    .next()
                    .unwrap_or(s)
                    .to_string(),
            )),
        },
    };
    result.map_err(|e| {
        let msg = match &e {
            AdapterError::NotMounted(id) => {
                let mounted = base.adapters.as_ref().map(|r| r.ids()).unwrap_or_default();
                if mounted.is_empty() {
                    format!("adapter {id} not mounted (no adapter is mounted)")
                } else {
                    format!("adapter {id} not mounted (mounted: {})", mounted.join(", "))
                }
            }
            other => other.to_string(),
        };
        ApiError::bad_request(msg).with_code(code(&e))
    })
}
