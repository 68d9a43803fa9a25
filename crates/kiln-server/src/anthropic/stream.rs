//! The Anthropic stream grammar (spec §3.3): `message_start`, then per block
//! `content_block_start` / `content_block_delta`… / `content_block_stop`, then `message_delta`
//! and `message_stop`.

use kiln_engine::GenerateOutput;
use serde_json::{Value, json};

use super::messages::{stop_reason, usage};
use crate::generation::{Framer, event_frame};
use crate::state::SharedState;
use crate::tools::ToolStreamFilter;

/// Frames one messages stream.
pub struct MessagesFramer {
    state: SharedState,
    id: String,
    tools: Option<ToolStreamFilter>,
    stops: Vec<String>,
    input_tokens: usize,
    /// Whether a text block is open (at `next_index`).
    text_open: bool,
    next_index: usize,
}

impl MessagesFramer {
    /// A framer for message `id`.
    pub fn new(
        state: SharedState,
        id: String,
        tools_active: bool,
        stops: Vec<String>,
        input_tokens: usize,
    ) -> Self {
        Self {
            input_tokens,
            state,
            id,
            tools: tools_active.then(ToolStreamFilter::default),
            stops,
            text_open: false,
            next_index: 0,
        }
    }

    fn text_delta(&mut self, text: &str) -> String {
        let mut f = String::new();
        if !self.text_open {
            self.text_open = true;
            f.push_str(&event_frame(
                "content_block_start",
                &json!({"type": "content_block_start", "index": self.next_index,
                        "content_block": {"type": "text", "text": ""}}),
            ));
        }
        f.push_str(&event_frame(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.next_index,
                    "delta": {"type": "text_delta", "text": text}}),
        ));
        f
    }

    fn close_text(&mut self) -> String {
        if !self.text_open {
            return String::new();
        }
        self.text_open = false;
        let f = event_frame(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": self.next_index}),
        );
        self.next_index += 1;
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

    fn text(&mut self, piece: &str) -> String {
        let shown = match &mut self.tools {
            Some(f) => f.push(piece),
            None => piece.to_string(),
        };
        if shown.is_empty() {
            return shown;
        }
        self.text_delta(&shown)
    }

    fn done(&mut self, out: &GenerateOutput) -> String {
        let mut f = String::new();
        let mut calls = Vec::new();
        if let Some(filter) = &mut self.tools {
            let (parsed, rest) = filter.finish(&out.text);
            calls = parsed.calls;
            if !rest.is_empty() {
                f.push_str(&self.text_delta(&rest));
            }
        }
        if calls.is_empty() && !self.text_open && self.next_index == 0 {
            // An empty answer still has one (empty) text block.
            f.push_str(&self.text_delta(""));
        }
        f.push_str(&self.close_text());
        for c in &calls {
            let i = self.next_index;
            self.next_index += 1;
            f.push_str(&event_frame(
                "content_block_start",
                &json!({"type": "content_block_start", "index": i, "content_block": {
                    "type": "tool_use", "id": self.state.new_id("toolu_"), "name": c.name, "input": {}}}),
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
