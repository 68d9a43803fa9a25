//! The Anthropic stream grammar (spec §3.3): `message_start`, then per block
//! `content_block_start` / `content_block_delta`… / `content_block_stop`, then `message_delta`
//! and `message_stop`.

use kiln_engine::GenerateOutput;
use serde_json::{Value, json};

use super::messages::{stop_reason, usage};
use crate::generation::{Framer, event_frame};
use crate::state::SharedState;
use crate::turn::{Delta, TurnBuilder, TurnShape};

/// Frames one messages stream.
pub struct MessagesFramer {
    state: SharedState,
    id: String,
    turn: TurnBuilder,
    stops: Vec<String>,
    input_tokens: usize,
    /// The kind of the open block (`"text"` or `"thinking"`), at `next_index`.
    open: Option<&'static str>,
    had_text: bool,
    next_index: usize,
}

impl MessagesFramer {
    /// A framer for message `id`, whose answer has `shape`.
    pub fn new(
        state: SharedState,
        id: String,
        shape: TurnShape,
        stops: Vec<String>,
        input_tokens: usize,
    ) -> Self {
        Self {
            input_tokens,
            state,
            id,
            turn: TurnBuilder::new(shape),
            stops,
            open: None,
            had_text: false,
            next_index: 0,
        }
    }

    /// A delta of `kind`, opening (and closing the previous) block as needed.
    fn delta(&mut self, kind: &'static str, text: &str) -> String {
        let mut f = String::new();
        if self.open != Some(kind) {
            f.push_str(&self.close());
            self.open = Some(kind);
            f.push_str(&event_frame(
                "content_block_start",
                &json!({"type": "content_block_start", "index": self.next_index,
                        "content_block": {"type": kind, kind: ""}}),
            ));
        }
        if kind == "text" {
            self.had_text = true;
        }
        f.push_str(&event_frame(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.next_index,
                    "delta": {"type": format!("{kind}_delta"), kind: text}}),
        ));
        f
    }

    fn close(&mut self) -> String {
        let Some(kind) = self.open.take() else {
            return String::new();
        };
        let mut f = String::new();
        if kind == "thinking" {
            f.push_str(&event_frame(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": self.next_index,
                        "delta": {"type": "signature_delta", "signature": ""}}),
            ));
        }
        f.push_str(&event_frame(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": self.next_index}),
        ));
        self.next_index += 1;
        f
    }

    fn deltas(&mut self, deltas: Vec<Delta>) -> String {
        let mut f = String::new();
        for d in deltas {
            match d {
                Delta::Reasoning(r) => f.push_str(&self.delta("thinking", &r)),
                Delta::Content(c) => f.push_str(&self.delta("text", &c)),
            }
        }
        f
    }
}

impl Framer for MessagesFramer {
    fn start(&mut self) -> String {
        event_frame(
            "message_start",
            &json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "content": [],
                "model": self.state.info.id, "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
            }}),
        )
    }

    fn text(&mut self, piece: &str, _logprobs: Vec<kiln_engine::request::TokenLogprob>) -> String {
        let deltas = self.turn.push(piece);
        self.deltas(deltas)
    }

    fn done(&mut self, out: &GenerateOutput) -> String {
        let state = self.state.clone();
        let (tail, turn) = self.turn.finish(|| state.new_id("toolu_"));
        let mut f = self.deltas(tail);
        let calls = turn.calls;
        if calls.is_empty() && !self.had_text {
            // An answer without text still has one (empty) text block.
            f.push_str(&self.delta("text", ""));
        }
        f.push_str(&self.close());
        for c in &calls {
            let i = self.next_index;
            self.next_index += 1;
            f.push_str(&event_frame(
                "content_block_start",
                &json!({"type": "content_block_start", "index": i, "content_block": {
                    "type": "tool_use", "id": c.id, "name": c.name, "input": {}}}),
            ));
            f.push_str(&event_frame(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": c.arguments}}),
            ));
            f.push_str(&event_frame(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": i}),
            ));
        }
        let (reason, seq) = stop_reason(out, &self.stops, !calls.is_empty());
        let mut u: Value = usage(out);
        u["input_tokens"] = json!(out.stats.prompt_tokens);
        f.push_str(&event_frame(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                    "usage": u}),
        ));
        f.push_str(&event_frame(
            "message_stop",
            &json!({"type": "message_stop"}),
        ));
        f
    }

    fn failed(&mut self, message: &str) -> String {
        event_frame(
            "error",
            &json!({"type": "error", "error": {"type": "api_error", "message": message}}),
        )
    }
}
