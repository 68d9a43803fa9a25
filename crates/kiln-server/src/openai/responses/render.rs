//! Responses objects of a typed turn: the whole `response` object and its output items, which
//! the stream (`stream.rs`) sends one by one.

use kiln_engine::{FinishReason, GenerateOutput};
use serde::Serialize;
use serde_json::{Value, json};

use super::store::StoredResponse;
use crate::state::SharedState;
use crate::turn::{Call, Turn};

/// What a response echoes and where it is stored, fixed when the request is planned.
pub struct ResponseContext {
    /// `resp_…`.
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    /// Request fields the response object repeats.
    pub echo: Echo,
    /// The conversation so far (chat messages, no system message), for the store.
    pub conversation: Vec<Value>,
    /// The instructions in force, for the store.
    pub instructions: Option<String>,
    /// Whether to store the result (`store`, default true).
    pub store: bool,
    /// The model answering.
    pub model: std::sync::Arc<crate::models::ServedModel>,
}

/// The request fields a response object repeats (defaults filled in).
#[derive(Serialize)]
pub struct Echo {
    /// The instructions in force.
    pub instructions: Option<String>,
    /// The output cap, when the request set one.
    pub max_output_tokens: Option<usize>,
    /// Sampling temperature.
    pub temperature: f32,
    /// Nucleus mass (1 when off).
    pub top_p: f32,
    /// The request's tools, as sent.
    pub tools: Value,
    /// The request's tool choice, as sent (`auto` by default).
    pub tool_choice: Value,
    /// The response this one continues.
    pub previous_response_id: Option<String>,
    /// Whether it is stored.
    pub store: bool,
    /// The request's metadata (`{}` by default).
    pub metadata: Value,
    /// Accepted and echoed (calls are parsed however many the model writes).
    pub parallel_tool_calls: bool,
    /// `{"format": …}`, `text` by default.
    pub text: TextConfig,
}

/// The output format the response was asked for.
#[derive(Serialize)]
pub struct TextConfig {
    /// The request's `text.format`.
    pub format: Value,
}

/// The `response` object: in progress, finished, or failed.
#[derive(Serialize)]
pub struct ResponseObject<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    error: Option<ResponseError<'a>>,
    incomplete_details: Option<IncompleteDetails>,
    model: &'a str,
    output: Vec<OutputItem>,
    reasoning: Option<Value>,
    truncation: &'static str,
    usage: Option<ResponseUsage>,
    #[serde(flatten)]
    echo: &'a Echo,
}

impl<'a> ResponseObject<'a> {
    /// This response, failed with `message`.
    pub fn failed(mut self, message: &'a str) -> Self {
        self.status = "failed";
        self.error = Some(ResponseError {
            code: "server_error",
            message,
        });
        self
    }
}

/// Why a response failed.
#[derive(Serialize)]
struct ResponseError<'a> {
    code: &'static str,
    message: &'a str,
}

/// Why a response is incomplete.
#[derive(Serialize)]
struct IncompleteDetails {
    reason: &'static str,
}

/// Responses `usage`.
#[derive(Serialize)]
struct ResponseUsage {
    input_tokens: usize,
    input_tokens_details: crate::openai::CachedTokens,
    output_tokens: usize,
    output_tokens_details: ReasoningTokens,
    total_tokens: usize,
}

#[derive(Serialize)]
struct ReasoningTokens {
    reasoning_tokens: usize,
}

/// The response object around `output`.
pub fn response_object<'a>(
    ctx: &'a ResponseContext,
    output: Vec<OutputItem>,
    out: Option<&GenerateOutput>,
    reasoning_tokens: usize,
) -> ResponseObject<'a> {
    let (status, incomplete_details) = match out.map(|o| o.finish_reason) {
        None => ("in_progress", None),
        Some(FinishReason::Length) => (
            "incomplete",
            Some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
        ),
        Some(_) => ("completed", None),
    };
    ResponseObject {
        id: &ctx.id,
        object: "response",
        created_at: ctx.created_at,
        status,
        error: None,
        incomplete_details,
        model: &ctx.model.info.id,
        output,
        reasoning: None,
        truncation: "disabled",
        usage: out.map(|o| usage(o, reasoning_tokens)),
        echo: &ctx.echo,
    }
}

fn usage(out: &GenerateOutput, reasoning_tokens: usize) -> ResponseUsage {
    let (p, n) = (out.stats.prompt_tokens, out.tokens.len());
    ResponseUsage {
        input_tokens: p,
        input_tokens_details: crate::openai::CachedTokens::new(out.stats.cached_tokens),
        output_tokens: n,
        output_tokens_details: ReasoningTokens {
            reasoning_tokens: reasoning_tokens.min(n),
        },
        total_tokens: p + n,
    }
}

/// One output item.
#[derive(Serialize, Clone)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The reasoning, as one summary part (none while it streams in or when empty).
    Reasoning {
        /// `rs_…`.
        id: String,
        /// Its summary parts.
        summary: Vec<SummaryText>,
    },
    /// The answer text (no content part while in progress).
    Message {
        /// `msg_…`.
        id: String,
        /// The item's status.
        status: &'static str,
        /// Always `assistant`.
        role: &'static str,
        /// Its content parts.
        content: Vec<OutputText>,
    },
    /// A tool call (`arguments` empty while in progress).
    FunctionCall {
        /// `fc_…`.
        id: String,
        /// The id the tool's output answers.
        call_id: String,
        /// The function.
        name: String,
        /// Its arguments (a JSON string).
        arguments: String,
        /// The item's status.
        status: &'static str,
    },
}

/// A reasoning summary part.
#[derive(Serialize, Clone)]
#[serde(tag = "type", rename = "summary_text")]
pub struct SummaryText {
    /// The text.
    pub text: String,
}

/// A message's text part (kiln sends no annotations and no per-part logprobs).
#[derive(Serialize, Clone)]
#[serde(tag = "type", rename = "output_text")]
pub struct OutputText {
    /// The text.
    pub text: String,
    annotations: [(); 0],
    logprobs: [(); 0],
}

/// The text part holding `text`.
pub fn text_part(text: &str) -> OutputText {
    OutputText {
        text: text.to_string(),
        annotations: [],
        logprobs: [],
    }
}

/// A reasoning item.
pub fn reasoning_item(id: &str, text: &str) -> OutputItem {
    let summary = if text.is_empty() {
        Vec::new()
    } else {
        vec![SummaryText {
            text: text.to_string(),
        }]
    };
    OutputItem::Reasoning {
        id: id.to_string(),
        summary,
    }
}

/// A message item (`in_progress`: no content yet).
pub fn message_item(id: &str, text: &str, status: &'static str) -> OutputItem {
    let content = if status == "in_progress" {
        Vec::new()
    } else {
        vec![text_part(text)]
    };
    OutputItem::Message {
        id: id.to_string(),
        status,
        role: "assistant",
        content,
    }
}

/// A function call item (`in_progress`: no arguments yet).
pub fn call_item(id: &str, call: &Call, status: &'static str) -> OutputItem {
    let arguments = if status == "in_progress" {
        ""
    } else {
        call.arguments.as_str()
    };
    OutputItem::FunctionCall {
        id: id.to_string(),
        call_id: call.id.clone(),
        name: call.name.clone(),
        arguments: arguments.to_string(),
        status,
    }
}

/// The status of a finished item: `incomplete` when `max_output_tokens` cut the answer.
pub fn item_status(out: &GenerateOutput) -> &'static str {
    if out.finish_reason == FinishReason::Length {
        "incomplete"
    } else {
        "completed"
    }
}

/// The output items of a whole turn: reasoning, the message (when there is text, or nothing
/// else), then each call; `status` is the finished items' status.
pub fn output_items(state: &SharedState, turn: &Turn, status: &'static str) -> Vec<OutputItem> {
    let mut items = Vec::new();
    if !turn.reasoning.is_empty() {
        items.push(reasoning_item(&state.new_id("rs_"), &turn.reasoning));
    }
    if !turn.content.is_empty() || turn.calls.is_empty() {
        items.push(message_item(&state.new_id("msg_"), &turn.content, status));
    }
    for c in &turn.calls {
        items.push(call_item(&state.new_id("fc_"), c, status));
    }
    items
}

/// Tokens of the reasoning text (the engine does not tag tokens by channel).
pub fn reasoning_tokens(ctx: &ResponseContext, turn: &Turn) -> usize {
    if turn.reasoning.is_empty() {
        return 0;
    }
    ctx.model
        .info
        .tokenizer
        .encode(&turn.reasoning, false)
        .map_or(0, |ids| ids.len())
}

/// Saves the turn's conversation for `previous_response_id`.
pub fn remember(state: &SharedState, ctx: &ResponseContext, turn: &Turn) {
    if !ctx.store {
        return;
    }
    let mut messages = ctx.conversation.clone();
    let mut answer = json!({"role": "assistant", "content": turn.content});
    if !turn.calls.is_empty() {
        answer["tool_calls"] = turn
            .calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
    }
    messages.push(answer);
    state.responses.put(
        ctx.id.clone(),
        StoredResponse {
            messages,
            instructions: ctx.instructions.clone(),
        },
    );
}
