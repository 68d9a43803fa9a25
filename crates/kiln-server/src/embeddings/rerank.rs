//! Reranking with a cross-encoder: `POST /v1/rerank` (llama-server's and Jina's shape:
//! `query`, `documents`, `top_n` → `results[{index, relevance_score}]`, best first) and
//! `POST /rerank`, which also takes TEI's form (`texts` → `[{index, score}]`). Each document is
//! scored with the query as one (query, document) pair; scores are the model's raw logits.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::body::parse_json;
use crate::errors::{ApiError, Flavor};
use crate::generation::blocking;
use crate::models::ServedModel;
use crate::state::SharedState;

/// The body of both routes.
#[derive(Debug, Deserialize)]
pub struct RerankRequest {
    model: Option<Value>,
    query: Option<Value>,
    /// Strings, or `{"text": …}` objects (Jina, Cohere).
    documents: Option<Value>,
    /// TEI's name for the documents.
    texts: Option<Value>,
    /// Keep the best this many (default: all).
    top_n: Option<Value>,
    /// Echo each document's text (`document: {text}`; TEI: `text`).
    return_documents: Option<bool>,
    /// TEI's name for it.
    return_text: Option<bool>,
    /// Cut pairs longer than the context instead of refusing them.
    truncate: Option<bool>,
    keep_alive: Option<Value>,
    /// Accepted (TEI): scores are always the raw logits.
    #[allow(dead_code)]
    raw_scores: Option<bool>,
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg).with_code("invalid_input")
}

fn documents(field: &Value, name: &str, max: usize) -> Result<Vec<String>, ApiError> {
    let Value::Array(items) = field else {
        return Err(bad(format!("{name} must be a list of strings")));
    };
    if items.is_empty() {
        return Err(bad(format!("{name} is an empty list")));
    }
    if items.len() > max {
        return Err(bad(format!(
            "{name} has {} items; at most {max} are taken per request (--max-batch-inputs)",
            items.len()
        )));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, d)| match d {
            Value::String(s) if !s.is_empty() => Ok(s.clone()),
            Value::Object(o) => match o.get("text") {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                _ => Err(bad(format!("{name}[{i}].text must be a non-empty string"))),
            },
            Value::String(_) => Err(bad(format!("{name}[{i}] is empty"))),
            _ => Err(bad(format!("{name}[{i}] must be a string"))),
        })
        .collect()
}

/// Each pair's token types (0: the query's part, 1: the document's).
type TokenTypes = Vec<Vec<u32>>;

/// Token ids and types of each (query, document) pair, as the model's tokenizer pairs them.
fn pairs(
    model: &ServedModel,
    query: &str,
    docs: &[String],
    truncate: bool,
) -> Result<(Vec<Vec<u32>>, TokenTypes), ApiError> {
    let ctx = model.info.context_len;
    let tok = model.info.tokenizer.inner();
    let mut ids = Vec::with_capacity(docs.len());
    let mut types = Vec::with_capacity(docs.len());
    for (i, d) in docs.iter().enumerate() {
        let enc = tok
            .encode((query, d.as_str()), true)
            .map_err(|e| bad(format!("documents[{i}]: {e}")))?;
        let (mut a, mut b) = (enc.get_ids().to_vec(), enc.get_type_ids().to_vec());
        if a.len() > ctx {
            if !truncate {
                return Err(bad(format!(
                    "the query with documents[{i}] has {} tokens but the context holds {ctx} — shorten it or pass truncate: true",
                    a.len()
                ))
                .with_code("context_length_exceeded"));
            }
            a.truncate(ctx);
            b.truncate(ctx);
        }
        ids.push(a);
        types.push(b);
    }
    Ok((ids, types))
}

/// One scored document.
struct Scored {
    index: usize,
    score: f32,
}

/// A request's answer before rendering.
struct Ranked {
    model: std::sync::Arc<ServedModel>,
    scored: Vec<Scored>,
    docs: Vec<String>,
    tokens: usize,
}

/// Scores every document of `req` against its query, best first, cut to `top_n`.
async fn score(state: &SharedState, req: &RerankRequest) -> Result<Ranked, ApiError> {
    let lease =
        crate::models::acquire(&state.models, req.model.as_ref(), req.keep_alive.as_ref()).await?;
    let model = lease.model().clone();
    if model.info.embedding.as_ref().map(|e| e.pooling)
        != Some(kiln_model::embedding::Pooling::Rank)
    {
        return Err(ApiError::bad_request(format!(
            "model {} is not a reranker (a cross-encoder such as BertForSequenceClassification, or a GGUF with pooling_type 4)",
            model.info.id
        ))
        .with_code("model_not_reranker"));
    }
    let query = match &req.query {
        Some(Value::String(q)) if !q.is_empty() => q.clone(),
        Some(Value::String(_)) => return Err(bad("query is empty")),
        None | Some(Value::Null) => return Err(bad("query is required")),
        Some(_) => return Err(bad("query must be a string")),
    };
    let max = match state.config.max_batch_inputs {
        0 => super::DEFAULT_MAX_BATCH_INPUTS,
        n => n,
    };
    let docs = match (&req.documents, &req.texts) {
        (Some(d), _) if !d.is_null() => documents(d, "documents", max)?,
        (_, Some(t)) if !t.is_null() => documents(t, "texts", max)?,
        _ => return Err(bad("documents is required")),
    };
    let top_n = match &req.top_n {
        None | Some(Value::Null) => docs.len(),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => (n as usize).min(docs.len()),
            _ => return Err(bad("top_n must be a positive integer")),
        },
    };
    let truncate = req.truncate.unwrap_or(false);
    let (m, q, d) = (model.clone(), query.clone(), docs.clone());
    let (ids, types) = blocking(Flavor::OpenAi, move || pairs(&m, &q, &d, truncate)).await?;
    let tokens = ids.iter().map(Vec::len).sum();
    let rx = model
        .gateway
        .submit_embed(ids, Some(types))
        .map_err(|e| ApiError::busy(e.to_string()))?;
    let raw = rx
        .await
        .map_err(|_| ApiError::internal("the engine stopped before scoring"))?
        .map_err(ApiError::internal)?;
    let mut scored: Vec<Scored> = raw
        .iter()
        .enumerate()
        .map(|(index, s)| Scored {
            index,
            score: s.first().copied().unwrap_or(f32::NAN),
        })
        .collect();
    scored.sort_by(|a, b| b.score.total_cmp(&a.score));
    scored.truncate(top_n);
    Ok(Ranked {
        model,
        scored,
        docs,
        tokens,
    })
}

#[derive(Serialize)]
struct DocumentText<'a> {
    text: &'a str,
}

#[derive(Serialize)]
struct RerankResult<'a> {
    index: usize,
    relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<DocumentText<'a>>,
}

#[derive(Serialize)]
struct RerankUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize)]
struct RerankResponse<'a> {
    model: &'a str,
    object: &'static str,
    results: Vec<RerankResult<'a>>,
    usage: RerankUsage,
}

#[derive(Serialize)]
struct TeiResult<'a> {
    index: usize,
    score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
}

/// `POST /v1/rerank` (also `/v1/reranking`).
pub async fn handler(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: RerankRequest = parse_json(body, Flavor::OpenAi)?;
    let echo = req.return_documents.unwrap_or(false);
    let Ranked {
        model,
        scored,
        docs,
        tokens,
    } = score(&state, &req).await?;
    let results = scored
        .iter()
        .map(|s| RerankResult {
            index: s.index,
            relevance_score: s.score,
            document: echo.then(|| DocumentText {
                text: &docs[s.index],
            }),
        })
        .collect();
    let body = RerankResponse {
        model: &model.info.id,
        object: "list",
        results,
        usage: RerankUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    };
    Ok(Json(body).into_response())
}

/// `POST /rerank`: TEI's answer (`[{index, score}]`) for a body with `texts`, else
/// [`handler`]'s.
pub async fn tei_handler(
    state: State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body.map_err(|e| ApiError::bad_request(e.to_string()))?;
    let req: RerankRequest = parse_json(Ok(bytes.clone()), Flavor::OpenAi)?;
    if req.texts.is_none() {
        return handler(state, Ok(bytes)).await;
    }
    let echo = req.return_text.unwrap_or(false);
    let Ranked { scored, docs, .. } = score(&state.0, &req).await?;
    let body: Vec<TeiResult<'_>> = scored
        .iter()
        .map(|s| TeiResult {
            index: s.index,
            score: s.score,
            text: echo.then_some(docs[s.index].as_str()),
        })
        .collect();
    Ok(Json(body).into_response())
}
