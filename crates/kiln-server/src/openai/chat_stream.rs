//! Chat completion chunks: `{role}` → reasoning/content deltas → (tool calls) → finish →
//! (usage) → `[DONE]`, rendered from the typed turn.

use kiln_engine::GenerateOutput;
use kiln_engine::request::TokenLogprob;
use serde::Serialize;

use super::logprobs::ChatLogprobs;
use super::{Usage, usage};
use crate::errors::ApiError;
use crate::generation::{Framer, data_frame, finish_reason_str};
use std::sync::Arc;

use crate::models::ServedModel;
use crate::state::{SharedState, unix_now};
use crate::turn::{Delta, Turn, TurnBuilder, TurnShape};

/// Frames one chat stream.
pub struct ChatFramer {
    state: SharedState,
    model: Arc<ServedModel>,
    id: String,
    created: u64,
    include_usage: bool,
    logprobs: bool,
    turn: TurnBuilder,
    /// Logprobs of tokens whose text has not gone out yet.
    pending: Vec<TokenLogprob>,
    /// Logprob entries already sent.
    sent: usize,
}

/// One entry of `tool_calls` (`index` only in stream deltas).
#[derive(Serialize)]
pub struct ToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionCall<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
}

/// The called function and its arguments (a JSON string).
#[derive(Serialize)]
pub struct FunctionCall<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// `tool_calls` of a turn (`indexed`: with the `index` stream deltas carry).
pub fn tool_calls(turn: &Turn, indexed: bool) -> Vec<ToolCall<'_>> {
    turn.calls
        .iter()
        .enumerate()
        .map(|(i, c)| ToolCall {
            id: &c.id,
            kind: "function",
            function: FunctionCall {
                name: &c.name,
                arguments: &c.arguments,
            },
            index: indexed.then_some(i),
        })
        .collect()
}

/// The `delta` of a chunk: only the fields it changes.
#[derive(Serialize, Default)]
struct ChunkDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCall<'a>>>,
}

/// One `chat.completion.chunk`: a delta of the one choice, or (last, with
/// `stream_options.include_usage`) no choice and the usage.
#[derive(Serialize)]
struct ChatChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<ChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

/// The choice's part of a chunk (`finish_reason` null until the end).
#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: ChunkDelta<'a>,
    logprobs: Option<ChatLogprobs>,
    finish_reason: Option<&'a str>,
}

impl ChatFramer {
    /// A framer for response `id`.
    pub fn new(
        state: SharedState,
        model: Arc<ServedModel>,
        id: String,
        shape: TurnShape,
        include_usage: bool,
        logprobs: bool,
    ) -> Self {
        Self {
            turn: TurnBuilder::new(shape),
            pending: Vec::new(),
            sent: 0,
            logprobs,
            state,
            model,
            id,
            created: unix_now(),
            include_usage,
        }
    }

    fn chunk(&self, delta: ChunkDelta<'_>, finish: Option<&str>) -> String {
        self.chunk_with(delta, finish, None)
    }

    fn chunk_with(
        &self,
        delta: ChunkDelta<'_>,
        finish: Option<&str>,
        logprobs: Option<ChatLogprobs>,
    ) -> String {
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs,
            finish_reason: finish,
        };
        data_frame(&self.frame(vec![choice], None))
    }

    fn frame<'a>(&'a self, choices: Vec<ChunkChoice<'a>>, usage: Option<Usage>) -> ChatChunk<'a> {
        ChatChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model.info.id,
            choices,
            usage,
        }
    }

    /// Reasoning deltas as `{reasoning}`, content as `{content}`; the pending logprobs ride
    /// on the first chunk.
    fn deltas(&mut self, deltas: Vec<Delta>) -> String {
        let mut frames = String::new();
        for d in deltas {
            let delta = match &d {
                Delta::Reasoning(r) => ChunkDelta {
                    reasoning: Some(r),
                    ..ChunkDelta::default()
                },
                Delta::Content(c) => ChunkDelta {
                    content: Some(c),
                    ..ChunkDelta::default()
                },
            };
            let lp = self.take_pending();
            frames.push_str(&self.chunk_with(delta, None, lp));
        }
        frames
    }

    /// The pending logprobs in OpenAI's shape (`null` when none, or not asked for).
    fn take_pending(&mut self) -> Option<ChatLogprobs> {
        if self.pending.is_empty() {
            return None;
        }
        self.sent += self.pending.len();
        let lp = std::mem::take(&mut self.pending);
        Some(super::logprobs::chat(&self.model.info.tokenizer, &lp))
    }
}

impl Framer for ChatFramer {
    fn start(&mut self) -> String {
        let delta = ChunkDelta {
            role: Some("assistant"),
            content: Some(""),
            ..ChunkDelta::default()
        };
        self.chunk(delta, None)
    }

    fn text(&mut self, piece: &str, logprobs: Vec<TokenLogprob>) -> String {
        if self.logprobs {
            self.pending.extend(logprobs);
        }
        let deltas = self.turn.push(piece);
        self.deltas(deltas)
    }

    fn done(&mut self, out: &GenerateOutput) -> String {
        let state = self.state.clone();
        let (tail, turn) = self.turn.finish(|| state.new_id("call_"));
        let mut frames = self.deltas(tail);
        if !turn.calls.is_empty() {
            let delta = ChunkDelta {
                tool_calls: Some(tool_calls(&turn, true)),
                ..ChunkDelta::default()
            };
            frames.push_str(&self.chunk(delta, None));
        }
        // Logprobs go out with their tokens' text; those of tokens whose text was withheld
        // (tool markup) or never came out ride on the finishing chunk. SDKs concatenate
        // `logprobs.content` across chunks.
        let lp = self.logprobs.then(|| {
            let rest = out.logprobs.get(self.sent..).unwrap_or_default();
            super::logprobs::chat(&self.model.info.tokenizer, rest)
        });
        let finish = finish_reason_str(out, !turn.calls.is_empty());
        frames.push_str(&self.chunk_with(ChunkDelta::default(), Some(finish), lp));
        if self.include_usage {
            frames.push_str(&data_frame(&self.frame(Vec::new(), Some(usage(out)))));
        }
        frames.push_str("data: [DONE]\n\n");
        frames
    }

    fn failed(&mut self, message: &str) -> String {
        let e = ApiError::internal(message);
        format!("{}data: [DONE]\n\n", data_frame(&e.body()))
    }
}
