//! Chat completion chunks: `{role}` → content deltas → (tool calls) → finish → (usage) → `[DONE]`.

use kiln_engine::GenerateOutput;
use serde_json::{Value, json};

use super::usage;
use crate::generation::{Framer, data_frame, finish_reason_str};
use crate::reasoning::{Piece, ThinkSplitter};
use crate::state::{SharedState, unix_now};
use crate::tools::ToolStreamFilter;

/// Frames one chat stream.
pub struct ChatFramer {
    state: SharedState,
    id: String,
    created: u64,
    tools: Option<ToolStreamFilter>,
    include_usage: bool,
    logprobs: bool,
    think: ThinkSplitter,
}

impl ChatFramer {
    /// A framer for response `id`.
    pub fn new(
        state: SharedState,
        id: String,
        tools_active: bool,
        include_usage: bool,
        logprobs: bool,
        thinking_open: bool,
    ) -> Self {
        Self {
            think: ThinkSplitter::new(thinking_open),
            logprobs,
            state,
            id,
            created: unix_now(),
            tools: tools_active.then(ToolStreamFilter::default),
            include_usage,
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> String {
        self.chunk_with(delta, finish, Value::Null)
    }

    fn chunk_with(&self, delta: Value, finish: Option<&str>, logprobs: Value) -> String {
        data_frame(&json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.state.info.id,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }))
    }
}

impl ChatFramer {
    /// Reasoning deltas as `{reasoning}`, content through the tool filter as `{content}`.
    fn pieces(&mut self, pieces: Vec<Piece>) -> String {
        let mut frames = String::new();
        for p in pieces {
            match p {
                Piece::Reasoning(r) => frames.push_str(&self.chunk(json!({"reasoning": r}), None)),
                Piece::Content(c) => {
                    let shown = match &mut self.tools {
                        Some(f) => f.push(&c),
                        None => c,
                    };
                    if !shown.is_empty() {
                        frames.push_str(&self.chunk(json!({"content": shown}), None));
                    }
                }
            }
        }
        frames
    }
}

impl Framer for ChatFramer {
    fn start(&mut self) -> String {
        self.chunk(json!({"role": "assistant", "content": ""}), None)
    }

    fn text(&mut self, piece: &str) -> String {
        let pieces = self.think.push(piece);
        self.pieces(pieces)
    }

    fn done(&mut self, out: &GenerateOutput) -> String {
        let tail = self.think.finish();
        let mut frames = self.pieces(tail);
        let mut has_calls = false;
        let answer = self.think.content().to_string();
        if let Some(f) = &mut self.tools {
            let (parsed, rest) = f.finish(&answer);
            if !rest.is_empty() {
                frames.push_str(&self.chunk(json!({"content": rest}), None));
            }
            if !parsed.calls.is_empty() {
                has_calls = true;
                let calls: Vec<Value> = parsed
                    .calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        json!({"index": i, "id": self.state.new_id("call_"), "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect();
                frames.push_str(&self.chunk(json!({"tool_calls": calls}), None));
            }
        }
        // Text streams before the engine reports per-token logprobs, so they all ride on the
        // finishing chunk; SDKs concatenate `logprobs.content` across chunks.
        let lp = if self.logprobs {
            super::logprobs::chat(&self.state.info.tokenizer, &out.logprobs)
        } else {
            Value::Null
        };
        let finish = finish_reason_str(out, has_calls);
        frames.push_str(&self.chunk_with(json!({}), Some(finish), lp));
        if self.include_usage {
            frames.push_str(&data_frame(&json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.state.info.id,
                "choices": [],
                "usage": usage(out),
            })));
        }
        frames.push_str("data: [DONE]\n\n");
        frames
    }

    fn failed(&mut self, message: &str) -> String {
        let e = json!({"error": {"message": message, "type": "server_error", "code": null}});
        format!("{}data: [DONE]\n\n", data_frame(&e))
    }
}
