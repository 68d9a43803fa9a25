//! Embeddings over HTTP: `POST /v1/embeddings` (OpenAI's shape) and `POST /api/embed`
//! (Ollama's), one path under both: inputs tokenized off the async workers, checked against the
//! context, embedded in one engine job (the engine batches them over its KV slots), then
//! truncated to `dimensions` and normalized (`--embd-normalize`).

pub mod input;
pub mod rerank;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::body::parse_json;
use crate::errors::{ApiError, Flavor};
use crate::generation::blocking;
use crate::models::ServedModel;
use crate::state::SharedState;
use input::Inputs;

/// Most inputs one request may carry when `--max-batch-inputs` is not set.
pub const DEFAULT_MAX_BATCH_INPUTS: usize = 2048;

/// `POST /v1/embeddings`' body.
#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    /// A loaded or available embedding model (absent: the default model).
    pub model: Option<Value>,
    /// A string, strings, token ids, or lists of token ids.
    pub input: Option<Value>,
    /// `float` (default) or `base64` (little-endian f32).
    pub encoding_format: Option<Value>,
    /// Keep the first this many dimensions (Matryoshka models), then normalize.
    pub dimensions: Option<Value>,
    /// Cut inputs longer than the context instead of refusing them (kiln and TEI).
    pub truncate: Option<bool>,
    /// How long the model stays loaded once idle (Ollama's `keep_alive`).
    pub keep_alive: Option<Value>,
    /// Accepted and ignored (OpenAI's end-user id).
    #[allow(dead_code)]
    pub user: Option<Value>,
}

/// What an embeddings request asks, checked.
pub struct Plan {
    /// Token ids of every input, in order.
    pub inputs: Vec<Vec<u32>>,
    /// Dimensions to keep.
    pub dimensions: Option<usize>,
}

fn dimensions(field: Option<&Value>, model: &ServedModel) -> Result<Option<usize>, ApiError> {
    let full = model.info.embedding_width;
    match field {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(d) if d >= 1 && d as usize <= full => Ok(Some(d as usize)),
            _ => Err(ApiError::bad_request(format!(
                "dimensions must be an integer from 1 to {full} (the model's embedding width)"
            ))),
        },
    }
}

/// Tokenizes and checks the inputs of a request for `model`.
pub fn plan(
    state: &SharedState,
    model: &ServedModel,
    input: Option<&Value>,
    dims: Option<&Value>,
    truncate: bool,
) -> Result<Plan, ApiError> {
    match &model.info.embedding {
        None => {
            return Err(ApiError::bad_request(format!(
                "model {} is not an embedding model (it declares no pooling: a sentence-transformers folder or a GGUF with pooling_type); it generates text",
                model.info.id
            ))
            .with_code("model_not_embedding"));
        }
        Some(e) if e.pooling == kiln_model::embedding::Pooling::Rank => {
            return Err(ApiError::bad_request(format!(
                "model {} is a reranker (a cross-encoder): it answers /v1/rerank, not embeddings",
                model.info.id
            ))
            .with_code("model_not_embedding"));
        }
        Some(_) => {}
    }
    let max = match state.config.max_batch_inputs {
        0 => DEFAULT_MAX_BATCH_INPUTS,
        n => n,
    };
    let inputs = Inputs::parse(input, max)?;
    let dimensions = dimensions(dims, model)?;
    let inputs = inputs.tokenize(&model.info, truncate)?;
    Ok(Plan { inputs, dimensions })
}

/// Runs `plan` on `model` and returns one finished vector per input.
pub async fn run(
    state: &SharedState,
    model: &ServedModel,
    plan: Plan,
    flavor: Flavor,
) -> Result<Vec<Vec<f32>>, ApiError> {
    let rx = model
        .gateway
        .submit_embed(plan.inputs, None)
        .map_err(|e| ApiError::busy(e.to_string()).flavor(flavor))?;
    let raw = rx
        .await
        .map_err(|_| ApiError::internal("the engine stopped before embedding").flavor(flavor))?
        .map_err(|e| ApiError::internal(e).flavor(flavor))?;
    let p = state.config.embd_normalize.unwrap_or(2);
    Ok(raw
        .into_iter()
        .map(|mut v| {
            if let Some(d) = plan.dimensions {
                v.truncate(d);
            }
            kiln_engine::embed::normalize(&mut v, p);
            v
        })
        .collect())
}

/// The fields both embedding routes take.
struct Fields {
    model: Option<Value>,
    keep_alive: Option<Value>,
    input: Option<Value>,
    dimensions: Option<Value>,
    truncate: bool,
}

/// A request's vectors, with the model that made them.
struct Embedded {
    model: std::sync::Arc<ServedModel>,
    vectors: Vec<Vec<f32>>,
    /// Tokens embedded.
    tokens: usize,
    /// When the model was ready.
    loaded: std::time::Instant,
}

/// Loads the model, plans the inputs off the async workers and embeds them.
async fn embed(state: &SharedState, f: Fields) -> Result<Embedded, ApiError> {
    let lease =
        crate::models::acquire(&state.models, f.model.as_ref(), f.keep_alive.as_ref()).await?;
    let loaded = std::time::Instant::now();
    let model = lease.model().clone();
    let (st, m) = (state.clone(), model.clone());
    let plan = blocking(Flavor::OpenAi, move || {
        plan(&st, &m, f.input.as_ref(), f.dimensions.as_ref(), f.truncate)
    })
    .await?;
    let tokens = plan.inputs.iter().map(Vec::len).sum();
    let vectors = run(state, &model, plan, Flavor::OpenAi).await?;
    Ok(Embedded {
        model,
        vectors,
        tokens,
        loaded,
    })
}

/// One vector of the OpenAI answer.
#[derive(Serialize)]
struct EmbeddingItem {
    object: &'static str,
    index: usize,
    embedding: EmbeddingValue,
}

/// Floats, or their little-endian f32 bytes in base64.
#[derive(Serialize)]
#[serde(untagged)]
enum EmbeddingValue {
    Floats(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct EmbeddingUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize)]
struct EmbeddingList<'a> {
    object: &'static str,
    data: Vec<EmbeddingItem>,
    model: &'a str,
    usage: EmbeddingUsage,
}

fn base64_f32(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `POST /v1/embeddings`.
pub async fn handler(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: EmbeddingsRequest = parse_json(body, Flavor::OpenAi)?;
    let base64 = match req.encoding_format.as_ref() {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "float" => false,
        Some(Value::String(s)) if s == "base64" => true,
        Some(_) => {
            return Err(ApiError::bad_request(
                "encoding_format must be \"float\" or \"base64\"",
            ));
        }
    };
    let fields = Fields {
        model: req.model,
        keep_alive: req.keep_alive,
        input: req.input,
        dimensions: req.dimensions,
        truncate: req.truncate.unwrap_or(false),
    };
    let Embedded {
        model,
        vectors,
        tokens,
        ..
    } = embed(&state, fields).await?;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| EmbeddingItem {
            object: "embedding",
            index,
            embedding: if base64 {
                EmbeddingValue::Base64(base64_f32(&v))
            } else {
                EmbeddingValue::Floats(v)
            },
        })
        .collect();
    let body = EmbeddingList {
        object: "list",
        data,
        model: &model.info.id,
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    };
    Ok(Json(body).into_response())
}

/// `POST /api/embed`'s body (Ollama).
#[derive(Debug, Deserialize)]
pub struct OllamaEmbedRequest {
    model: Option<Value>,
    input: Option<Value>,
    /// Ollama truncates by default.
    truncate: Option<bool>,
    dimensions: Option<Value>,
    keep_alive: Option<Value>,
    /// Accepted and ignored (Ollama's runtime options).
    #[allow(dead_code)]
    options: Option<Value>,
}

#[derive(Serialize)]
struct OllamaEmbedResponse<'a> {
    model: &'a str,
    embeddings: Vec<Vec<f32>>,
    total_duration: u64,
    load_duration: u64,
    prompt_eval_count: usize,
}

/// `POST /api/embed` (Ollama's shape; durations in nanoseconds).
pub async fn ollama_handler(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let req: OllamaEmbedRequest = parse_json(body, Flavor::OpenAi)?;
    let fields = Fields {
        model: req.model,
        keep_alive: req.keep_alive,
        input: req.input,
        dimensions: req.dimensions,
        // Ollama truncates by default.
        truncate: req.truncate.unwrap_or(true),
    };
    let Embedded {
        model,
        vectors: embeddings,
        tokens,
        loaded,
    } = embed(&state, fields).await?;
    let loaded = loaded.duration_since(started);
    let body = OllamaEmbedResponse {
        model: &model.info.id,
        embeddings,
        total_duration: started.elapsed().as_nanos() as u64,
        load_duration: loaded.as_nanos() as u64,
        prompt_eval_count: tokens,
    };
    Ok(Json(body).into_response())
}
