//! `POST /v1/messages` and `POST /v1/messages/count_tokens`.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use kiln_engine::{FinishReason, GenerateOutput, GenerateRequest};
use serde::Serialize;
use serde_json::{Value, json};

use super::stream::MessagesFramer;
use super::{MessagesRequest, to_openai};

use crate::body::parse_request;
use crate::chat_plan::{ChatInput, ChatTurn, plan_chat};
use crate::errors::{ApiError, Flavor};
use crate::generation::{blocking, collect, plan_max_tokens, sse_response, submit};
use crate::models::ServedModel;
use crate::state::SharedState;
use crate::structured::anthropic_tool_choice;
use crate::turn::{Turn, TurnBuilder};

fn plan(model: &ServedModel, req: &MessagesRequest) -> Result<ChatTurn, ApiError> {
    let choice = anthropic_tool_choice(req.tool_choice.as_ref())?;
    let (messages, tools) = to_openai(req)?;
    let single_call = req
        .tool_choice
        .as_ref()
        .and_then(|c| c.get("disable_parallel_tool_use"))
        .and_then(Value::as_bool)
        == Some(true);
    plan_chat(
        &model.info,
        ChatInput {
            messages: &messages,
            tools: tools
                .as_ref()
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            choice,
            answer: None,
            answer_field: "",
            vars: None,
            max_calls: single_call.then_some(1),
        },
    )
}

/// A whole `message` body.
#[derive(Serialize)]
struct Message<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<ContentBlock<'a>>,
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
    usage: Usage,
}

/// One content block of an assistant message (whole, or as a stream's block starts).
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock<'a> {
    /// Reasoning; `signature` is empty in whole messages and left out at a stream's start.
    Thinking {
        /// The reasoning text.
        thinking: &'a str,
        /// kiln does not sign its reasoning.
        #[serde(skip_serializing_if = "Option::is_none")]
        signature: Option<&'a str>,
    },
    /// Answer text.
    Text {
        /// The text.
        text: &'a str,
    },
    /// A tool call.
    ToolUse {
        /// `toolu_…`.
        id: &'a str,
        /// The tool.
        name: &'a str,
        /// Its arguments (an object; `{}` when the model wrote none that parse).
        input: Value,
    },
}

/// The `content` blocks of a whole turn.
fn content_blocks(turn: &Turn) -> Vec<ContentBlock<'_>> {
    let mut content = Vec::new();
    if !turn.reasoning.is_empty() {
        content.push(ContentBlock::Thinking {
            thinking: &turn.reasoning,
            signature: Some(""),
        });
    }
    if !turn.content.is_empty() {
        content.push(ContentBlock::Text {
            text: &turn.content,
        });
    }
    for c in &turn.calls {
        let input: Value = serde_json::from_str(&c.arguments).unwrap_or(json!({}));
        content.push(ContentBlock::ToolUse {
            id: &c.id,
            name: &c.name,
            input,
        });
    }
    if content.is_empty() {
        content.push(ContentBlock::Text { text: "" });
    }
    content
}

/// Anthropic `stop_reason` and `stop_sequence`.
pub fn stop_reason<'a>(
    out: &GenerateOutput,
    stops: &'a [String],
    tool_calls: bool,
) -> (&'static str, Option<&'a str>) {
    if tool_calls {
        return ("tool_use", None);
    }
    if let Some(i) = out.stop_index {
        return ("stop_sequence", stops.get(i).map(String::as_str));
    }
    match out.finish_reason {
        FinishReason::Length => ("max_tokens", None),
        _ => ("end_turn", None),
    }
}

/// Anthropic `usage`.
#[derive(Serialize)]
pub struct Usage {
    input_tokens: usize,
    output_tokens: usize,
    cache_read_input_tokens: usize,
    cache_creation_input_tokens: usize,
}

/// Anthropic `usage` of a finished answer.
pub fn usage(out: &GenerateOutput) -> Usage {
    Usage {
        input_tokens: out.stats.prompt_tokens,
        output_tokens: out.tokens.len(),
        cache_read_input_tokens: out.stats.cached_tokens,
        cache_creation_input_tokens: 0,
    }
}

/// The count_tokens body.
#[derive(Serialize)]
struct TokenCount {
    input_tokens: usize,
}

/// The messages handler.
pub async fn handler(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let f = Flavor::Anthropic;
    let req: MessagesRequest = parse_request(body, f)?;
    let Some(requested) = req.max_tokens else {
        // Anthropic's API answers exactly this; its SDKs make the field mandatory too.
        return Err(ApiError::bad_request("max_tokens: Field required").flavor(f));
    };
    let lease = crate::models::acquire_generative(
        &state.models,
        req.model.as_ref(),
        req.keep_alive.as_ref(),
    )
    .await
    .map_err(|e| e.flavor(f))?;
    let model = lease.model().clone();
    let adapters = crate::adapters::resolve_for(&model, req.adapter.as_ref(), req.model.as_ref())
        .map_err(|e| e.flavor(f))?;
    let m = model.clone();
    let (req, plan) = blocking(f, move || {
        let p = plan(&m, &req).map_err(|e| e.flavor(f))?;
        Ok((req, p))
    })
    .await?;
    let stop = crate::sampling::parse_stop(req.stop_sequences.as_ref(), "stop_sequences")
        .map_err(|e| e.flavor(f))?;
    let sampling = req
        .sampling
        .resolve(&state, &model.info, false, 0, false)
        .map_err(|e| e.flavor(f))?;
    let prompt = plan.prompt;
    // No default applies: the request always names its max_tokens.
    let max_tokens = plan_max_tokens(
        &state,
        &model,
        prompt.len(),
        Some(requested),
        1,
        "max_tokens",
    )
    .map_err(|e| e.flavor(f))?;
    let input_tokens = prompt.len();
    let rx = submit(
        &model,
        GenerateRequest {
            prompt,
            max_tokens,
            sampling,
            stop: stop.clone(),
            ignore_eos: false,
            adapters,
            grammar: plan.grammar,
        },
        f,
    )?;
    let id = state.new_id("msg_");
    if req.stream.unwrap_or(false) {
        let framer = MessagesFramer::new(
            state.clone(),
            model.clone(),
            id,
            plan.shape,
            stop,
            input_tokens,
        );
        return Ok(sse_response(rx, framer));
    }
    let out = collect(rx, f).await?;
    let turn = TurnBuilder::whole(plan.shape, &out.text, || state.new_id("toolu_"));
    let (stop_reason, stop_sequence) = stop_reason(&out, &stop, !turn.calls.is_empty());
    let body = Message {
        id: &id,
        kind: "message",
        role: "assistant",
        model: &model.info.id,
        content: content_blocks(&turn),
        stop_reason,
        stop_sequence,
        usage: usage(&out),
    };
    Ok(axum::Json(body).into_response())
}

/// The count_tokens handler: `{"input_tokens": N}`.
pub async fn count_tokens(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let f = Flavor::Anthropic;
    let req: MessagesRequest = parse_request(body, f)?;
    let lease = crate::models::acquire_generative(&state.models, req.model.as_ref(), None)
        .await
        .map_err(|e| e.flavor(f))?;
    let model = lease.model().clone();
    // Counted on the plan the messages call runs, so the two always agree.
    let turn = blocking(f, move || plan(&model, &req).map_err(|e| e.flavor(f))).await?;
    let body = TokenCount {
        input_tokens: turn.prompt.len(),
    };
    Ok(axum::Json(body).into_response())
}
