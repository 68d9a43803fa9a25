//! Responses renderings of a typed turn: the whole `response` object, and the stream of spec
//! §3.4 (`response.created` … `response.completed`), built from the same output items.

use kiln_engine::{FinishReason, GenerateOutput};
use serde_json::{Value, json};

use super::store::StoredResponse;
use crate::generation::{Framer, event_frame};
use crate::state::SharedState;
use crate::turn::{Delta, Turn, TurnBuilder, TurnShape};

/// What a response echoes and where it is stored, fixed when the request is planned.
pub struct ResponseContext {
    /// `resp_…`.
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    /// Request fields the response object repeats (`instructions`, `tools`, `metadata`…).
    pub echo: serde_json::Map<String, Value>,
    /// The conversation so far (chat messages, no system message), for the store.
    pub conversation: Vec<Value>,
    /// The instructions in force, for the store.
    pub instructions: Option<String>,
    /// Whether to store the result (`store`, default true).
    pub store: bool,
}

/// The response object around `output`.
pub fn response_object(
    state: &SharedState,
    ctx: &ResponseContext,
    output: Vec<Value>,
    out: Option<&GenerateOutput>,
    reasoning_tokens: usize,
) -> Value {
    let (status, incomplete) = match out.map(|o| o.finish_reason) {
        None => ("in_progress", Value::Null),
        Some(FinishReason::Length) => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some(_) => ("completed", Value::Null),
    };
    let mut r = json!({
        "id": ctx.id,
        "object": "response",
        "created_at": ctx.created_at,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "model": state.info.id,
        "output": output,
        "parallel_tool_calls": true,
        "reasoning": null,
        "truncation": "disabled",
        "usage": out.map(|o| usage(o, reasoning_tokens)),
    });
    if let Some(obj) = r.as_object_mut() {
        for (k, v) in &ctx.echo {
            obj.insert(k.clone(), v.clone());
        }
    }
    r
}

fn usage(out: &GenerateOutput, reasoning_tokens: usize) -> Value {
    let (p, n) = (out.stats.prompt_tokens, out.tokens.len());
    json!({
        "input_tokens": p,
        "input_tokens_details": {"cached_tokens": out.stats.cached_tokens},
        "output_tokens": n,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens.min(n)},
        "total_tokens": p + n,
    })
}

fn reasoning_item(id: &str, text: &str) -> Value {
    let summary = if text.is_empty() {
        json!([])
    } else {
        json!([{"type": "summary_text", "text": text}])
    };
    json!({"type": "reasoning", "id": id, "summary": summary})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([text_part(text)])
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn call_item(id: &str, call: &crate::turn::Call, status: &str) -> Value {
    let arguments = if status == "in_progress" {
        ""
    } else {
        call.arguments.as_str()
    };
    json!({"type": "function_call", "id": id, "call_id": call.id, "name": call.name,
           "arguments": arguments, "status": status})
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
pub fn output_items(state: &SharedState, turn: &Turn, status: &str) -> Vec<Value> {
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
pub fn reasoning_tokens(state: &SharedState, turn: &Turn) -> usize {
    if turn.reasoning.is_empty() {
        return 0;
    }
    state
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

/// The output item being streamed.
enum Open {
    None,
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
}

/// Frames one Responses stream.
pub struct ResponsesFramer {
    state: SharedState,
    ctx: ResponseContext,
    turn: TurnBuilder,
    seq: u64,
    open: Open,
    done_items: Vec<Value>,
    /// Status of the items closed from now on (`incomplete` once the answer was cut).
    status: &'static str,
}

impl ResponsesFramer {
    /// A framer for the response `ctx` describes, whose answer has `shape`.
    pub fn new(state: SharedState, ctx: ResponseContext, shape: TurnShape) -> Self {
        Self {
            state,
            ctx,
            turn: TurnBuilder::new(shape),
            seq: 0,
            open: Open::None,
            done_items: Vec::new(),
            status: "completed",
        }
    }

    fn event(&mut self, kind: &str, mut body: Value) -> String {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        event_frame(kind, &body)
    }

    fn index(&self) -> usize {
        self.done_items.len()
    }

    fn close(&mut self) -> String {
        let i = self.index();
        let (frames, item) = match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return String::new(),
            Open::Reasoning { id, text } => {
                let mut f = self.event(
                    "response.reasoning_summary_text.done",
                    json!({"item_id": id, "output_index": i, "summary_index": 0, "text": text}),
                );
                f.push_str(&self.event(
                    "response.reasoning_summary_part.done",
                    json!({"item_id": id, "output_index": i, "summary_index": 0,
                           "part": {"type": "summary_text", "text": text}}),
                ));
                (f, reasoning_item(&id, &text))
            }
            Open::Message { id, text } => {
                let mut f = self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []}),
                );
                f.push_str(&self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "part": text_part(&text)}),
                ));
                (f, message_item(&id, &text, self.status))
            }
        };
        let mut f = frames;
        f.push_str(&self.event(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        ));
        self.done_items.push(item);
        f
    }

    fn open_reasoning(&mut self) -> String {
        let id = self.state.new_id("rs_");
        let i = self.index();
        let mut f = self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": reasoning_item(&id, "")}),
        );
        f.push_str(&self.event(
            "response.reasoning_summary_part.added",
            json!({"item_id": id, "output_index": i, "summary_index": 0,
                   "part": {"type": "summary_text", "text": ""}}),
        ));
        self.open = Open::Reasoning {
            id,
            text: String::new(),
        };
        f
    }

    fn open_message(&mut self) -> String {
        let id = self.state.new_id("msg_");
        let i = self.index();
        let mut f = self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": message_item(&id, "", "in_progress")}),
        );
        f.push_str(&self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": i, "content_index": 0, "part": text_part("")}),
        ));
        self.open = Open::Message {
            id,
            text: String::new(),
        };
        f
    }

    /// Reasoning deltas into the open reasoning item, content into the open message, each
    /// opening its item (and closing the other) when needed.
    fn deltas(&mut self, deltas: Vec<Delta>) -> String {
        let mut f = String::new();
        for d in deltas {
            let (reasoning, piece) = match d {
                Delta::Reasoning(r) => (true, r),
                Delta::Content(c) => (false, c),
            };
            let same = match self.open {
                Open::Reasoning { .. } => reasoning,
                Open::Message { .. } => !reasoning,
                Open::None => false,
            };
            if !same {
                f.push_str(&self.close());
                f.push_str(&if reasoning {
                    self.open_reasoning()
                } else {
                    self.open_message()
                });
            }
            let i = self.index();
            let (Open::Reasoning { id, text } | Open::Message { id, text }) = &mut self.open else {
                continue;
            };
            text.push_str(&piece);
            let (kind, body) = if reasoning {
                let body =
                    json!({"item_id": id, "output_index": i, "summary_index": 0, "delta": piece});
                ("response.reasoning_summary_text.delta", body)
            } else {
                let body = json!({"item_id": id, "output_index": i, "content_index": 0, "delta": piece, "logprobs": []});
                ("response.output_text.delta", body)
            };
            f.push_str(&self.event(kind, body));
        }
        f
    }

    fn calls(&mut self, turn: &Turn) -> String {
        let mut f = String::new();
        for c in &turn.calls {
            let id = self.state.new_id("fc_");
            let i = self.index();
            f.push_str(&self.event(
                "response.output_item.added",
                json!({"output_index": i, "item": call_item(&id, c, "in_progress")}),
            ));
            f.push_str(&self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": i, "delta": c.arguments}),
            ));
            f.push_str(&self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": i, "name": c.name, "arguments": c.arguments}),
            ));
            let item = call_item(&id, c, self.status);
            f.push_str(&self.event(
                "response.output_item.done",
                json!({"output_index": i, "item": item}),
            ));
            self.done_items.push(item);
        }
        f
    }
}

impl Framer for ResponsesFramer {
    fn start(&mut self) -> String {
        let r = response_object(&self.state, &self.ctx, Vec::new(), None, 0);
        let mut f = self.event("response.created", json!({"response": r}));
        f.push_str(&self.event("response.in_progress", json!({"response": r})));
        f
    }

    fn text(&mut self, piece: &str, _logprobs: Vec<kiln_engine::request::TokenLogprob>) -> String {
        let deltas = self.turn.push(piece);
        self.deltas(deltas)
    }

    fn done(&mut self, out: &GenerateOutput) -> String {
        let state = self.state.clone();
        let (tail, turn) = self.turn.finish(|| state.new_id("call_"));
        let mut f = self.deltas(tail);
        self.status = item_status(out);
        let has_message = matches!(self.open, Open::Message { .. })
            || self.done_items.iter().any(|i| i["type"] == "message");
        if turn.calls.is_empty() && !has_message {
            // An answer with no text and no call still has its (empty) message.
            f.push_str(&self.close());
            f.push_str(&self.open_message());
        }
        f.push_str(&self.close());
        f.push_str(&self.calls(&turn));
        remember(&self.state, &self.ctx, &turn);
        let items = std::mem::take(&mut self.done_items);
        let r = response_object(
            &self.state,
            &self.ctx,
            items,
            Some(out),
            reasoning_tokens(&self.state, &turn),
        );
        let kind = if r["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        f.push_str(&self.event(kind, json!({"response": r})));
        f
    }

    fn failed(&mut self, message: &str) -> String {
        let mut r = response_object(&self.state, &self.ctx, Vec::new(), None, 0);
        r["status"] = json!("failed");
        r["error"] = json!({"code": "server_error", "message": message});
        self.event("response.failed", json!({"response": r}))
    }
}
