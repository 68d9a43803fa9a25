//! `GET /v1/models` (loaded, loading and available models, and mounted adapters),
//! `GET /v1/models/{id}`, `POST /api/models/load` and `POST /api/models/unload`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use kiln_model::lora::ServedAdapter;
use serde::{Deserialize, Serialize};

use super::{KeepAlive, ModelStatus, ServedModel};
use crate::body::parse_json;
use crate::errors::{ApiError, Flavor};
use crate::routes::rfc3339;
use crate::state::SharedState;

/// One model or mounted adapter of `/v1/models`, readable by the OpenAI and Anthropic SDKs;
/// `root`/`parent` follow vLLM (an adapter's parent is the model it runs on).
#[derive(Serialize)]
pub struct ModelCard {
    id: String,
    object: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    display_name: String,
    created: u64,
    created_at: String,
    owned_by: &'static str,
    /// `loaded`: answers at once; `loading`: being read; `unloaded`: loads on first request.
    status: ModelStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    context_length: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_model_len: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_input_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    context_window: Option<usize>,
    root: String,
    parent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    architecture: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_scheme: Option<String>,
    /// Bytes of the memory budget a loaded model holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_bytes: Option<u64>,
    /// A loaded model's keep-alive (`forever`, or seconds after its last request).
    #[serde(skip_serializing_if = "Option::is_none")]
    keep_alive: Option<String>,
    /// An unloaded model's size on disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    size_bytes: Option<u64>,
    reasoning: bool,
    vision: bool,
}

fn bare_card(state: &SharedState, id: &str, status: ModelStatus, root: String) -> ModelCard {
    ModelCard {
        id: id.to_string(),
        object: "model",
        kind: "model",
        display_name: id.to_string(),
        created: state.started_at,
        created_at: rfc3339(state.started_at),
        owned_by: "kiln",
        status,
        context_length: None,
        max_model_len: None,
        max_input_tokens: None,
        context_window: None,
        root,
        parent: None,
        architecture: None,
        kv_scheme: None,
        memory_bytes: None,
        keep_alive: None,
        size_bytes: None,
        reasoning: false,
        vision: false,
    }
}

/// The card of a loaded model.
pub fn loaded_card(
    state: &SharedState,
    m: &ServedModel,
    keep_alive: Option<KeepAlive>,
) -> ModelCard {
    let info = &m.info;
    let ctx = Some(info.context_len);
    ModelCard {
        context_length: ctx,
        max_model_len: ctx,
        max_input_tokens: ctx,
        context_window: ctx,
        architecture: Some(info.arch.clone()),
        kv_scheme: Some(info.kv_scheme.clone()),
        memory_bytes: Some(m.bill_bytes),
        keep_alive: keep_alive.map(|k| k.to_string()),
        ..bare_card(state, &info.id, ModelStatus::Loaded, info.id.clone())
    }
}

fn adapter_card(state: &SharedState, m: &ServedModel, a: &ServedAdapter) -> ModelCard {
    ModelCard {
        id: a.id().to_string(),
        display_name: a.id().to_string(),
        root: a.path().display().to_string(),
        parent: Some(m.info.id.clone()),
        architecture: None,
        kv_scheme: None,
        memory_bytes: None,
        keep_alive: None,
        ..loaded_card(state, m, None)
    }
}

/// Every card: loaded models (with their adapters), the one loading, then the rest available.
fn cards(state: &SharedState) -> Vec<ModelCard> {
    let (loaded, loading) = state.models.loaded();
    let mut out = Vec::new();
    let mut seen: Vec<std::path::PathBuf> = Vec::new();
    for e in &loaded {
        out.push(loaded_card(state, &e.model, Some(e.keep_alive)));
        if let Some(r) = &e.model.adapters {
            out.extend(r.list().iter().map(|a| adapter_card(state, &e.model, a)));
        }
        seen.push(e.path.clone());
    }
    if let Some(id) = &loading {
        out.push(bare_card(state, id, ModelStatus::Loading, id.clone()));
    }
    for l in state.models.available() {
        let id = l.name.trim_end_matches(".gguf");
        let taken = seen.contains(&l.path) || out.iter().any(|c| c.id == id);
        if !taken {
            out.push(ModelCard {
                size_bytes: Some(l.size_bytes),
                ..bare_card(
                    state,
                    id,
                    ModelStatus::Unloaded,
                    l.path.display().to_string(),
                )
            });
        }
    }
    out
}

/// The `/v1/models` list (OpenAI's shape, with Anthropic's paging fields).
#[derive(Serialize)]
struct ModelList {
    object: &'static str,
    data: Vec<ModelCard>,
    has_more: bool,
    first_id: Option<String>,
    last_id: Option<String>,
}

/// `GET /v1/models`.
pub async fn list(State(state): State<SharedState>) -> Result<Response, ApiError> {
    let data = tokio::task::spawn_blocking(move || cards(&state))
        .await
        .map_err(|e| ApiError::internal(format!("listing models failed: {e}")))?;
    let list = ModelList {
        object: "list",
        has_more: false,
        first_id: data.first().map(|c| c.id.clone()),
        last_id: data.last().map(|c| c.id.clone()),
        data,
    };
    Ok(Json(list).into_response())
}

/// `GET /v1/models/{id}`.
pub async fn one(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let st = state.clone();
    let all = tokio::task::spawn_blocking(move || cards(&st))
        .await
        .map_err(|e| ApiError::internal(format!("listing models failed: {e}")))?;
    let known: Vec<String> = all.iter().map(|c| c.id.clone()).collect();
    match all.into_iter().find(|c| c.id == id) {
        Some(card) => Ok(Json(card).into_response()),
        None => Err(ApiError::not_found(format!(
            "model {id:?} does not exist; available: {}",
            known.join(", ")
        ))
        .with_code("model_not_found")),
    }
}

/// `POST /api/models/load` and `/unload`'s body.
#[derive(Deserialize)]
pub struct ModelRequest {
    /// The model's name.
    model: Option<serde_json::Value>,
    /// How long it stays loaded once idle (Ollama's `keep_alive`).
    keep_alive: Option<serde_json::Value>,
}

fn required_model(req: &ModelRequest) -> Result<&serde_json::Value, ApiError> {
    req.model
        .as_ref()
        .filter(|m| !m.is_null())
        .ok_or_else(|| ApiError::bad_request("model is required"))
}

/// `POST /api/models/load`: loads a model (evicting idle ones as a request would) and answers
/// its card.
pub async fn load(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ModelRequest = parse_json(body, Flavor::OpenAi)?;
    let model = required_model(&req)?;
    let lease = super::acquire(&state.models, Some(model), req.keep_alive.as_ref()).await?;
    let keep = state
        .models
        .loaded()
        .0
        .into_iter()
        .find(|e| Arc::ptr_eq(&e.model, lease.model()))
        .map(|e| e.keep_alive);
    Ok(Json(loaded_card(&state, &lease, keep)).into_response())
}

/// `POST /api/models/unload`'s answer.
#[derive(Serialize)]
struct Unloaded {
    id: String,
    /// `unloaded`, or `unloading` while requests still run on it (it goes when they end).
    status: &'static str,
}

/// `POST /api/models/unload`.
pub async fn unload(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ModelRequest = parse_json(body, Flavor::OpenAi)?;
    let name = super::model_name(Some(required_model(&req)?))?.unwrap_or_default();
    if super::pool::is_path_shaped(name) {
        return Err(super::PoolError::PathName(name.to_string()).into());
    }
    let id = state
        .models
        .get(name)
        .map_or_else(|| name.to_string(), |m| m.info.id.clone());
    let now = state.models.unload(name).await?;
    let status = if now { "unloaded" } else { "unloading" };
    Ok(Json(Unloaded { id, status }).into_response())
}
