//! `POST /v1/completions`: raw text in, no template.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use kiln_engine::GenerateOutput;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::logprobs::{self, CompletionLogprobs};
use super::{Usage, usage};
use kiln_engine::GenerateRequest;

use crate::body::parse_request;
use crate::errors::{ApiError, Flavor};
use crate::generation::{
    Framer, blocking, collect, data_frame, finish_reason_str, plan_max_tokens, sse_response, submit,
};
use crate::models::ServedModel;
use crate::sampling::{SamplingFields, parse_stop};
use crate::state::{SharedState, unix_now};

/// Built-in `max_tokens` default for completions (spec §3.2).
pub const DEFAULT_COMPLETION_MAX_TOKENS: usize = 512;

/// The request body.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// The model: a loaded or available model's name (loaded on demand), or a mounted
    /// adapter's id, which runs that adapter on its model (vLLM's convention) when `adapter` is
    /// absent; absent: the default model.
    pub model: Option<Value>,
    /// How long the model stays loaded once idle (Ollama's `keep_alive`).
    pub keep_alive: Option<Value>,
    /// The prompt text.
    pub prompt: Value,
    /// Stream as server-sent events.
    pub stream: Option<bool>,
    /// Most tokens to generate.
    pub max_tokens: Option<u64>,
    /// Stop strings.
    pub stop: Option<Value>,
    /// Legacy logprobs: how many alternatives per token (0..=11).
    pub logprobs: Option<Value>,
    /// Echo the prompt (unsupported).
    pub echo: Option<bool>,
    /// Generate past EOS (vLLM extension, for benchmarks).
    pub ignore_eos: Option<bool>,
    /// Choices to generate (only 1).
    pub n: Option<u64>,
    /// Candidates to pick the best of (only 1).
    pub best_of: Option<u64>,
    /// Text after the completion (insertion; unsupported).
    pub suffix: Option<String>,
    /// LoRA adapter: a mounted id, `"a+b"` to stack, `"none"` for the base model.
    pub adapter: Option<Value>,
    /// Sampling.
    #[serde(skip)]
    pub sampling: SamplingFields,
}

impl crate::body::WithSampling for CompletionRequest {
    fn set_sampling(&mut self, s: SamplingFields) {
        self.sampling = s;
    }
}

/// The handler.
pub async fn handler(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_request(body, Flavor::OpenAi)?;
    let prompt = match &req.prompt {
        Value::String(s) => s,
        Value::Array(_) => {
            return Err(ApiError::bad_request(
                "prompt must be a string; token arrays and batches are not supported",
            ));
        }
        _ => return Err(ApiError::bad_request("prompt must be a string")),
    };
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request(
            "n must be 1: kiln generates one choice per request",
        ));
    }
    if req.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request(
            "best_of must be 1: kiln generates one candidate per request",
        ));
    }
    if req.echo == Some(true) {
        return Err(ApiError::bad_request(
            "echo is not supported: the prompt is not repeated in the completion",
        ));
    }
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_request(
            "suffix is not supported: kiln does not fill in the middle",
        ));
    }
    let top = match &req.logprobs {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n <= 11 => Some(n as usize),
            _ => {
                return Err(ApiError::bad_request(
                    "logprobs must be an integer between 0 and 11",
                ));
            }
        },
    };
    let stop = parse_stop(req.stop.as_ref(), "stop")?;
    let lease = crate::models::acquire_generative(
        &state.models,
        req.model.as_ref(),
        req.keep_alive.as_ref(),
    )
    .await?;
    let model = lease.model().clone();
    let sampling =
        req.sampling
            .resolve(&state, &model.info, top.is_some(), top.unwrap_or(0), true)?;
    let adapters = crate::adapters::resolve_for(&model, req.adapter.as_ref(), req.model.as_ref())?;
    let (m, text) = (model.clone(), prompt.clone());
    let ids = blocking(Flavor::OpenAi, move || {
        m.info
            .tokenizer
            .encode(&text, true)
            .map_err(|e| ApiError::bad_request(format!("prompt: {e}")))
    })
    .await?;
    let max_tokens = plan_max_tokens(
        &state,
        &model,
        ids.len(),
        req.max_tokens,
        DEFAULT_COMPLETION_MAX_TOKENS,
        "max_tokens",
    )?;
    let rx = submit(
        &model,
        GenerateRequest {
            prompt: ids,
            max_tokens,
            sampling,
            stop,
            ignore_eos: req.ignore_eos.unwrap_or(false),
            adapters,
            grammar: None,
        },
        Flavor::OpenAi,
    )?;
    let id = state.new_id("cmpl-");
    if req.stream.unwrap_or(false) {
        return Ok(sse_response(
            rx,
            CompletionFramer {
                model: model.clone(),
                id,
                created: unix_now(),
                top,
                pending: Vec::new(),
                sent: 0,
                offset: 0,
            },
        ));
    }
    let out = collect(rx, Flavor::OpenAi).await?;
    let lp = top.map(|k| logprobs::completion(&model.info.tokenizer, &out.logprobs, k > 0));
    let body = TextCompletion {
        id: &id,
        object: "text_completion",
        created: unix_now(),
        model: &model.info.id,
        choices: [TextChoice {
            index: 0,
            text: &out.text,
            logprobs: lp,
            finish_reason: Some(finish_reason_str(&out, false)),
        }],
        usage: Some(usage(&out)),
    };
    Ok(axum::Json(body).into_response())
}

/// A `text_completion` body, whole or one stream chunk (no `usage` but on the last).
#[derive(Serialize)]
struct TextCompletion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [TextChoice<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

/// The one choice kiln generates (`finish_reason` null until the end).
#[derive(Serialize)]
struct TextChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<CompletionLogprobs>,
    finish_reason: Option<&'static str>,
}

struct CompletionFramer {
    model: Arc<ServedModel>,
    id: String,
    created: u64,
    /// Legacy `logprobs` (alternatives per token), when asked for.
    top: Option<usize>,
    /// Logprobs of tokens whose text has not gone out yet.
    pending: Vec<kiln_engine::request::TokenLogprob>,
    /// Logprob entries already sent.
    sent: usize,
    /// `text_offset` of the next token.
    offset: usize,
}

impl CompletionFramer {
    fn body<'a>(
        &'a self,
        text: &'a str,
        logprobs: Option<CompletionLogprobs>,
        finish_reason: Option<&'static str>,
        usage: Option<Usage>,
    ) -> TextCompletion<'a> {
        TextCompletion {
            id: &self.id,
            object: "text_completion",
            created: self.created,
            model: &self.model.info.id,
            choices: [TextChoice {
                index: 0,
                text,
                logprobs,
                finish_reason,
            }],
            usage,
        }
    }

    fn chunk(&mut self, text: &str) -> String {
        let lp = match self.top {
            Some(k) if !self.pending.is_empty() => {
                let lp = std::mem::take(&mut self.pending);
                self.sent += lp.len();
                let tok = &self.model.info.tokenizer;
                Some(logprobs::completion_from(tok, &lp, k > 0, &mut self.offset))
            }
            _ => None,
        };
        data_frame(&self.body(text, lp, None, None))
    }
}

impl Framer for CompletionFramer {
    fn start(&mut self) -> String {
        String::new()
    }

    fn text(&mut self, piece: &str, logprobs: Vec<kiln_engine::request::TokenLogprob>) -> String {
        if self.top.is_some() {
            self.pending.extend(logprobs);
        }
        self.chunk(piece)
    }

    fn done(&mut self, out: &GenerateOutput) -> String {
        // Logprobs went out with their text; the tokens whose text never came out (held back
        // at a stop string, or none) ride on the last chunk, whose text is empty.
        let lp = self.top.map(|k| {
            let rest = out.logprobs.get(self.sent..).unwrap_or_default();
            let tok = &self.model.info.tokenizer;
            logprobs::completion_from(tok, rest, k > 0, &mut self.offset)
        });
        let last = self.body(
            "",
            lp,
            Some(finish_reason_str(out, false)),
            Some(usage(out)),
        );
        format!("{}data: [DONE]\n\n", data_frame(&last))
    }

    fn failed(&mut self, message: &str) -> String {
        let e = ApiError::internal(message);
        format!("{}data: [DONE]\n\n", data_frame(&e.body()))
    }
}
