//! `POST /v1/chat/completions`.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use kiln_engine::GenerateRequest;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::chat_stream::{ChatFramer, ToolCall};
use super::logprobs::ChatLogprobs;
use super::{Usage, logprobs, usage};

use crate::body::parse_request;
use crate::chat_plan::{ChatInput, plan_chat};
use crate::errors::{ApiError, Flavor};
use crate::generation::{
    blocking, collect, finish_reason_str, plan_max_tokens, sse_response, submit,
};
use crate::models::ServedModel;
use crate::prompt::validate_tools;
use crate::sampling::{SamplingFields, parse_stop, parse_top_logprobs};
use crate::state::{SharedState, unix_now};
use crate::structured::{chat_response_format, openai_tool_choice};
use crate::turn::{Turn, TurnBuilder, TurnShape};

/// Built-in `max_tokens` default for chat (spec §3.1), capped by the context left.
pub const DEFAULT_CHAT_MAX_TOKENS: usize = 65536;

/// The request body (unknown fields are ignored).
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The model: a loaded or available model's name (loaded on demand), or a mounted
    /// adapter's id, which runs that adapter on its model (vLLM's convention) when `adapter` is
    /// absent; absent: the default model.
    pub model: Option<Value>,
    /// How long the model stays loaded once idle (Ollama's `keep_alive`).
    pub keep_alive: Option<Value>,
    /// Conversation.
    pub messages: Value,
    /// Stream as server-sent events.
    pub stream: Option<bool>,
    /// `{include_usage}`.
    pub stream_options: Option<StreamOptions>,
    /// Most tokens to generate.
    pub max_tokens: Option<u64>,
    /// Same; wins over `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// Stop strings.
    pub stop: Option<Value>,
    /// Report the chosen tokens' logprobs.
    pub logprobs: Option<Value>,
    /// Alternatives per token.
    pub top_logprobs: Option<Value>,
    /// Function tools.
    pub tools: Option<Value>,
    /// `none|auto|required` or a named function.
    pub tool_choice: Option<Value>,
    /// `text`, `json_object` or `json_schema`: constrains the answer.
    pub response_format: Option<Value>,
    /// `false`: at most one tool call is returned.
    pub parallel_tool_calls: Option<bool>,
    /// Extra template variables (`enable_thinking`…).
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Generate past EOS (vLLM extension, for benchmarks).
    pub ignore_eos: Option<bool>,
    /// `none|minimal|low|medium|high`: `none` turns thinking off.
    pub reasoning_effort: Option<String>,
    /// Choices to generate (only 1).
    pub n: Option<u64>,
    /// LoRA adapter: a mounted id, `"a+b"` to stack, `"none"` for the base model.
    pub adapter: Option<Value>,
    /// Legacy function calling (refused: use `tools`).
    pub functions: Option<Value>,
    /// Output modalities (only text).
    pub modalities: Option<Value>,
    /// Audio output (refused).
    pub audio: Option<Value>,
    /// Predicted output (refused).
    pub prediction: Option<Value>,
    /// Sampling.
    #[serde(skip)]
    pub sampling: SamplingFields,
}

impl crate::body::WithSampling for ChatRequest {
    fn set_sampling(&mut self, s: SamplingFields) {
        self.sampling = s;
    }
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a usage chunk before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// A validated chat request.
pub struct ChatPlan {
    /// What the engine runs.
    pub request: GenerateRequest,
    /// How the answer is parsed (reasoning, tool calls).
    pub shape: TurnShape,
    /// Whether logprobs go into the response.
    pub logprobs: bool,
}

/// Template variables: `chat_template_kwargs`, plus `enable_thinking` from `reasoning_effort`
/// (`none` turns thinking off, any other level on) unless the kwargs set it themselves.
fn template_vars(req: &ChatRequest) -> Result<Option<Map<String, Value>>, ApiError> {
    let mut vars = req.chat_template_kwargs.clone();
    if let Some(effort) = &req.reasoning_effort {
        let on = match effort.as_str() {
            "none" => false,
            "minimal" | "low" | "medium" | "high" => true,
            other => {
                return Err(ApiError::bad_request(format!(
                    "reasoning_effort must be one of none, minimal, low, medium, high; got {other:?}"
                )));
            }
        };
        let v = vars.get_or_insert_with(Map::new);
        v.entry("enable_thinking").or_insert(Value::Bool(on));
    }
    Ok(vars)
}

/// Fields kiln does not implement are refused by name, never ignored.
fn refuse_unsupported(req: &ChatRequest) -> Result<(), ApiError> {
    let set = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
    if set(&req.functions) {
        return Err(ApiError::bad_request(
            "functions is not supported: send the functions as tools",
        ));
    }
    if set(&req.audio) {
        return Err(ApiError::bad_request("audio output is not supported"));
    }
    if set(&req.prediction) {
        return Err(ApiError::bad_request("prediction is not supported"));
    }
    if let Some(m) = req.modalities.as_ref().and_then(Value::as_array)
        && m.iter().any(|x| x != "text")
    {
        return Err(ApiError::bad_request(
            "modalities: only \"text\" is supported",
        ));
    }
    Ok(())
}

/// Validates `req` and builds its prompt.
pub fn plan(
    state: &SharedState,
    model: &ServedModel,
    req: &ChatRequest,
) -> Result<ChatPlan, ApiError> {
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request(
            "n must be 1: kiln generates one choice per request",
        ));
    }
    refuse_unsupported(req)?;
    let adapters = crate::adapters::resolve_for(model, req.adapter.as_ref(), req.model.as_ref())?;
    let tools = match &req.tools {
        Some(t) if !t.is_null() => validate_tools(t)?,
        _ => Vec::new(),
    };
    let logprobs = match &req.logprobs {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad_request("logprobs must be of type bool")),
    };
    let top = parse_top_logprobs(req.top_logprobs.as_ref())?;
    let stop = parse_stop(req.stop.as_ref(), "stop")?;
    let sampling = req.sampling.resolve(
        state,
        &model.info,
        logprobs,
        if logprobs { top } else { 0 },
        true,
    )?;
    let turn = plan_chat(
        &model.info,
        ChatInput {
            messages: &req.messages,
            tools,
            choice: openai_tool_choice(req.tool_choice.as_ref())?,
            answer: chat_response_format(req.response_format.as_ref())?,
            answer_field: "response_format",
            vars: template_vars(req)?,
            max_calls: (req.parallel_tool_calls == Some(false)).then_some(1),
        },
    )?;
    let prompt = turn.prompt;
    let (requested, field) = match req.max_completion_tokens {
        Some(n) => (Some(n), "max_completion_tokens"),
        None => (req.max_tokens, "max_tokens"),
    };
    let max_tokens = plan_max_tokens(
        state,
        model,
        prompt.len(),
        requested,
        DEFAULT_CHAT_MAX_TOKENS,
        field,
    )?;
    Ok(ChatPlan {
        request: GenerateRequest {
            prompt,
            max_tokens,
            sampling,
            stop,
            ignore_eos: req.ignore_eos.unwrap_or(false),
            adapters,
            grammar: turn.grammar,
        },
        shape: turn.shape,
        logprobs,
    })
}

/// The handler.
pub async fn handler(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse_request(body, Flavor::OpenAi)?;
    let lease = crate::models::acquire_generative(
        &state.models,
        req.model.as_ref(),
        req.keep_alive.as_ref(),
    )
    .await?;
    let model = lease.model().clone();
    let (st, m) = (state.clone(), model.clone());
    let (req, plan) = blocking(Flavor::OpenAi, move || {
        let p = plan(&st, &m, &req)?;
        Ok((req, p))
    })
    .await?;
    let rx = submit(&model, plan.request, Flavor::OpenAi)?;
    let id = state.new_id("chatcmpl-");
    if req.stream.unwrap_or(false) {
        let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
        let framer = ChatFramer::new(
            state.clone(),
            model.clone(),
            id,
            plan.shape,
            include_usage,
            plan.logprobs,
        );
        return Ok(sse_response(rx, framer));
    }
    let out = collect(rx, Flavor::OpenAi).await?;
    let turn = TurnBuilder::whole(plan.shape, &out.text, || state.new_id("call_"));
    let lp = plan
        .logprobs
        .then(|| logprobs::chat(&model.info.tokenizer, &out.logprobs));
    let body = ChatCompletion {
        id: &id,
        object: "chat.completion",
        created: unix_now(),
        model: &model.info.id,
        choices: [ChatChoice {
            index: 0,
            message: AssistantMessage::of(&turn),
            logprobs: lp,
            finish_reason: finish_reason_str(&out, !turn.calls.is_empty()),
        }],
        usage: usage(&out),
    };
    Ok(axum::Json(body).into_response())
}

/// A whole `chat.completion` body.
#[derive(Serialize)]
struct ChatCompletion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [ChatChoice<'a>; 1],
    usage: Usage,
}

/// The one choice kiln generates.
#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u32,
    message: AssistantMessage<'a>,
    logprobs: Option<ChatLogprobs>,
    finish_reason: &'static str,
}

/// The assistant's message: `content` is null when the turn only calls tools; `reasoning` and
/// `tool_calls` appear only when there are some.
#[derive(Serialize)]
struct AssistantMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    reasoning: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCall<'a>>>,
}

impl<'a> AssistantMessage<'a> {
    fn of(turn: &'a Turn) -> Self {
        let calls = !turn.calls.is_empty();
        Self {
            role: "assistant",
            content: (!calls || !turn.content.is_empty()).then_some(turn.content.as_str()),
            reasoning: &turn.reasoning,
            tool_calls: calls.then(|| super::chat_stream::tool_calls(turn, false)),
        }
    }
}
