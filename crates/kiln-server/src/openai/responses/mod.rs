//! `POST /v1/responses` (spec §3.4): OpenAI's Responses API over the same typed turn as chat.
//! `input` items become chat messages, `previous_response_id` splices a stored conversation in
//! front, and the answer is rendered as output items (whole, or as the event stream).

pub mod input;
mod render;
pub mod store;
mod stream;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use kiln_engine::GenerateRequest;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use render::{Echo, ResponseContext, TextConfig};
use stream::ResponsesFramer;

use super::chat::DEFAULT_CHAT_MAX_TOKENS;

use crate::body::parse_request;
use crate::chat_plan::{ChatInput, plan_chat};
use crate::errors::{ApiError, Flavor};
use crate::generation::{blocking, collect, plan_max_tokens, sse_response, submit};
use crate::models::ServedModel;
use crate::prompt::validate_tools;
use crate::sampling::SamplingFields;
use crate::state::{SharedState, unix_now};
use crate::structured::{openai_tool_choice, text_format};
use crate::turn::{TurnBuilder, TurnShape};

/// The request body (unknown fields are ignored).
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    /// The model: a loaded or available model's name (loaded on demand), or a mounted
    /// adapter's id, which runs that adapter on its model (vLLM's convention) when `adapter` is
    /// absent; absent: the default model.
    pub model: Option<Value>,
    /// How long the model stays loaded once idle (Ollama's `keep_alive`).
    pub keep_alive: Option<Value>,
    /// A string or a list of input items.
    pub input: Option<Value>,
    /// The system prompt; carried forward from the previous response when omitted.
    pub instructions: Option<String>,
    /// Most tokens to generate.
    pub max_output_tokens: Option<u64>,
    /// Flat function tools (other tool types are dropped).
    pub tools: Option<Value>,
    /// `none|auto|required` or `{type:"function", name}`.
    pub tool_choice: Option<Value>,
    /// Stream as server-sent events.
    pub stream: Option<bool>,
    /// Continue the conversation of this stored response.
    pub previous_response_id: Option<String>,
    /// Keep the response for `previous_response_id` (default true).
    pub store: Option<bool>,
    /// `{format: {type: text|json_object|json_schema, …}}`.
    pub text: Option<Value>,
    /// `{effort}`: `none` turns thinking off, any other level on.
    pub reasoning: Option<Value>,
    /// Echoed back.
    pub metadata: Option<Value>,
    /// Accepted and echoed (calls are parsed however many the model writes).
    pub parallel_tool_calls: Option<bool>,
    /// LoRA adapter: a mounted id, `"a+b"` to stack, `"none"` for the base model.
    pub adapter: Option<Value>,
    /// Run in the background (refused: responses are answered on the request).
    pub background: Option<bool>,
    /// `disabled` (the default) or `auto` (refused: an overlong input is a 400).
    pub truncation: Option<String>,
    /// Alternatives per output token (refused).
    pub top_logprobs: Option<u64>,
    /// A stored conversation object (refused: kiln keeps responses, not conversations).
    pub conversation: Option<Value>,
    /// A reusable prompt template reference (refused).
    pub prompt: Option<Value>,
    /// Most tool calls in the answer.
    pub max_tool_calls: Option<u64>,
    /// Sampling.
    #[serde(skip)]
    pub sampling: SamplingFields,
}

impl crate::body::WithSampling for ResponsesRequest {
    fn set_sampling(&mut self, s: SamplingFields) {
        self.sampling = s;
    }
}

struct ResponsesPlan {
    request: GenerateRequest,
    shape: TurnShape,
    ctx: ResponseContext,
}

/// Instructions and any system/developer messages become one leading system message.
fn with_system(instructions: Option<&str>, conversation: &[Value]) -> Vec<Value> {
    let mut system: Vec<String> = instructions
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .into_iter()
        .collect();
    let mut rest = Vec::new();
    for m in conversation {
        match m["role"].as_str() {
            Some("system" | "developer") => {
                system.push(m["content"].as_str().unwrap_or("").to_string());
            }
            _ => rest.push(m.clone()),
        }
    }
    if !system.is_empty() {
        rest.insert(0, json!({"role": "system", "content": system.join("\n\n")}));
    }
    rest
}

fn thinking_vars(reasoning: Option<&Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    let Some(effort) = reasoning
        .and_then(|r| r.get("effort"))
        .filter(|e| !e.is_null())
    else {
        return Ok(None);
    };
    let on = match effort.as_str() {
        Some("none") => false,
        Some("minimal" | "low" | "medium" | "high") => true,
        _ => {
            return Err(ApiError::bad_request(
                "reasoning.effort must be one of none, minimal, low, medium, high",
            ));
        }
    };
    let mut vars = Map::new();
    vars.insert("enable_thinking".into(), Value::Bool(on));
    Ok(Some(vars))
}

/// Fields kiln does not implement are refused by name, never ignored.
fn refuse_unsupported(req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.background == Some(true) {
        return Err(ApiError::bad_request(
            "background responses are not supported",
        ));
    }
    if req.truncation.as_deref().is_some_and(|t| t != "disabled") {
        return Err(ApiError::bad_request(
            "truncation must be \"disabled\": an input longer than the context is refused",
        ));
    }
    if req.top_logprobs.is_some_and(|n| n > 0) {
        return Err(ApiError::bad_request(
            "top_logprobs is not supported on /v1/responses",
        ));
    }
    if req.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(ApiError::bad_request(
            "conversation is not supported: continue with previous_response_id",
        ));
    }
    if req.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(ApiError::bad_request(
            "prompt (a stored prompt template) is not supported: send instructions and input",
        ));
    }
    Ok(())
}

fn plan(
    state: &SharedState,
    model: &Arc<ServedModel>,
    req: &ResponsesRequest,
) -> Result<ResponsesPlan, ApiError> {
    refuse_unsupported(req)?;
    let input = req
        .input
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("input is required"))?;
    let mut conversation = Vec::new();
    let mut instructions = req.instructions.clone();
    if let Some(prev) = &req.previous_response_id {
        let stored = state.responses.get(prev).ok_or_else(|| {
            ApiError::not_found(format!(
                "previous response {prev:?} not found (unknown, expired, or stored with store: false)"
            ))
            .with_code("previous_response_not_found")
        })?;
        conversation = stored.messages;
        if instructions.is_none() {
            instructions = stored.instructions;
        }
    }
    conversation.extend(input::messages(input)?);
    let messages = Value::Array(with_system(instructions.as_deref(), &conversation));
    let one = (req.parallel_tool_calls == Some(false)).then_some(1);
    let max_calls = match (req.max_tool_calls, one) {
        (Some(n), one) => Some((n as usize).min(one.unwrap_or(usize::MAX))),
        (None, one) => one,
    };
    let turn = plan_chat(
        &model.info,
        ChatInput {
            messages: &messages,
            tools: validate_tools(&Value::Array(input::tools(req.tools.as_ref())?))?,
            choice: openai_tool_choice(req.tool_choice.as_ref())?,
            answer: text_format(req.text.as_ref())?,
            answer_field: "text.format",
            vars: thinking_vars(req.reasoning.as_ref())?,
            max_calls,
        },
    )?;
    let max_tokens = plan_max_tokens(
        state,
        model,
        turn.prompt.len(),
        req.max_output_tokens,
        DEFAULT_CHAT_MAX_TOKENS,
        "max_output_tokens",
    )?;
    let sampling = req.sampling.resolve(state, &model.info, false, 0, true)?;
    let ctx = ResponseContext {
        id: state.new_id("resp_"),
        created_at: unix_now(),
        echo: echo(req, &sampling, max_tokens, instructions.as_deref()),
        // System and developer items stay in the stored conversation (they are merged into
        // the leading system message again on the next turn).
        conversation,
        instructions,
        store: req.store.unwrap_or(true),
        model: model.clone(),
    };
    let request = GenerateRequest {
        prompt: turn.prompt,
        max_tokens,
        sampling,
        stop: Vec::new(),
        ignore_eos: false,
        adapters: crate::adapters::resolve_for(model, req.adapter.as_ref(), req.model.as_ref())?,
        grammar: turn.grammar,
    };
    Ok(ResponsesPlan {
        request,
        shape: turn.shape,
        ctx,
    })
}

/// The request fields a response object repeats.
fn echo(
    req: &ResponsesRequest,
    sampling: &kiln_engine::sampler::SamplingParams,
    max_tokens: usize,
    instructions: Option<&str>,
) -> Echo {
    let format = req
        .text
        .as_ref()
        .and_then(|t| t.get("format"))
        .cloned()
        .unwrap_or(json!({"type": "text"}));
    Echo {
        instructions: instructions.map(str::to_string),
        max_output_tokens: req.max_output_tokens.map(|_| max_tokens),
        temperature: sampling.temperature,
        top_p: if sampling.top_p > 0.0 {
            sampling.top_p
        } else {
            1.0
        },
        tools: req.tools.clone().unwrap_or(json!([])),
        tool_choice: req.tool_choice.clone().unwrap_or(json!("auto")),
        previous_response_id: req.previous_response_id.clone(),
        store: req.store.unwrap_or(true),
        metadata: req.metadata.clone().unwrap_or(json!({})),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        text: TextConfig { format },
    }
}

/// The handler.
pub async fn handler(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ResponsesRequest = parse_request(body, Flavor::OpenAi)?;
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
    if req.stream.unwrap_or(false) {
        let framer = ResponsesFramer::new(state.clone(), plan.ctx, plan.shape);
        return Ok(sse_response(rx, framer));
    }
    let out = collect(rx, Flavor::OpenAi).await?;
    let turn = TurnBuilder::whole(plan.shape, &out.text, || state.new_id("call_"));
    render::remember(&state, &plan.ctx, &turn);
    let items = render::output_items(&state, &turn, render::item_status(&out));
    let reasoning = render::reasoning_tokens(&plan.ctx, &turn);
    let body = render::response_object(&plan.ctx, items, Some(&out), reasoning);
    Ok(axum::Json(body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_and_system_items_merge_first() {
        let conv = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "developer", "content": "be brief"}),
        ];
        let m = with_system(Some("You are kiln."), &conv);
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[0],
            json!({"role": "system", "content": "You are kiln.\n\nbe brief"})
        );
        assert_eq!(m[1]["role"], "user");
        assert_eq!(with_system(None, &conv[..1]).len(), 1);
    }
}
