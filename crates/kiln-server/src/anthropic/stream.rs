//! The Anthropic stream grammar (spec §3.3): `message_start`, then per block
//! `content_block_start` / `content_block_delta`… / `content_block_stop`, then `message_delta`
//! and `message_stop`.

use std::sync::Arc;

use kiln_engine::GenerateOutput;
use serde::Serialize;
use serde_json::{Map, Value};

use super::messages::{ContentBlock, Usage, stop_reason, usage};
use crate::errors::{ApiError, Flavor};
use crate::generation::{Framer, event_frame};
use crate::models::ServedModel;
use crate::state::SharedState;
use crate::turn::{Delta, TurnBuilder, TurnShape};

/// One event of the stream; its `type` is also the SSE event name.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent<'a> {
    MessageStart {
        message: StartMessage<'a>,
    },
    ContentBlockStart {
        index: usize,
        content_block: ContentBlock<'a>,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta<'a>,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: StopDelta<'a>,
        usage: Usage,
    },
    MessageStop,
}

impl StreamEvent<'_> {
    fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
        }
    }

    fn frame(&self) -> String {
        event_frame(self.name(), self)
    }
}

/// The message as `message_start` announces it: no content yet.
#[derive(Serialize)]
struct StartMessage<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    content: [(); 0],
    model: &'a str,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<&'static str>,
    usage: StartUsage,
}

/// The usage known at the start.
#[derive(Serialize)]
struct StartUsage {
    input_tokens: usize,
    output_tokens: usize,
}

/// A piece of the open block.
#[derive(Serialize)]
#[serde(tag = "type")]
enum BlockDelta<'a> {
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "signature_delta")]
    Signature { signature: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

/// `message_delta`'s stop fields.
#[derive(Serialize)]
struct StopDelta<'a> {
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
}

/// The kinds of block text streams into.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TextBlock {
    Text,
    Thinking,
}

impl TextBlock {
    fn start(self) -> ContentBlock<'static> {
        match self {
            TextBlock::Text => ContentBlock::Text { text: "" },
            TextBlock::Thinking => ContentBlock::Thinking {
                thinking: "",
                signature: None,
            },
        }
    }

    fn delta(self, text: &str) -> BlockDelta<'_> {
        match self {
            TextBlock::Text => BlockDelta::Text { text },
            TextBlock::Thinking => BlockDelta::Thinking { thinking: text },
        }
    }
}

/// Frames one messages stream.
pub struct MessagesFramer {
    state: SharedState,
    model: Arc<ServedModel>,
    id: String,
    turn: TurnBuilder,
    stops: Vec<String>,
    input_tokens: usize,
    /// The kind of the open block, at `next_index`.
    open: Option<TextBlock>,
    had_text: bool,
    next_index: usize,
}

impl MessagesFramer {
    /// A framer for message `id`, whose answer has `shape`.
    pub fn new(
        state: SharedState,
        model: Arc<ServedModel>,
        id: String,
        shape: TurnShape,
        stops: Vec<String>,
        input_tokens: usize,
    ) -> Self {
        Self {
            input_tokens,
            state,
            model,
            id,
            turn: TurnBuilder::new(shape),
            stops,
            open: None,
            had_text: false,
            next_index: 0,
        }
    }

    /// A delta of `kind`, opening (and closing the previous) block as needed.
    fn delta(&mut self, kind: TextBlock, text: &str) -> String {
        let mut f = String::new();
        if self.open != Some(kind) {
            f.push_str(&self.close());
            self.open = Some(kind);
            let start = StreamEvent::ContentBlockStart {
                index: self.next_index,
                content_block: kind.start(),
            };
            f.push_str(&start.frame());
        }
        if kind == TextBlock::Text {
            self.had_text = true;
        }
        let delta = StreamEvent::ContentBlockDelta {
            index: self.next_index,
            delta: kind.delta(text),
        };
        f.push_str(&delta.frame());
        f
    }

    fn close(&mut self) -> String {
        let Some(kind) = self.open.take() else {
            return String::new();
        };
        let index = self.next_index;
        let mut f = String::new();
        if kind == TextBlock::Thinking {
            let delta = BlockDelta::Signature { signature: "" };
            f.push_str(&StreamEvent::ContentBlockDelta { index, delta }.frame());
        }
        f.push_str(&StreamEvent::ContentBlockStop { index }.frame());
        self.next_index += 1;
        f
    }

    fn deltas(&mut self, deltas: Vec<Delta>) -> String {
        let mut f = String::new();
        for d in deltas {
            match d {
                Delta::Reasoning(r) => f.push_str(&self.delta(TextBlock::Thinking, &r)),
                Delta::Content(c) => f.push_str(&self.delta(TextBlock::Text, &c)),
            }
        }
        f
    }
}

impl Framer for MessagesFramer {
    fn start(&mut self) -> String {
        let message = StartMessage {
            id: &self.id,
            kind: "message",
            role: "assistant",
            content: [],
            model: &self.model.info.id,
            stop_reason: None,
            stop_sequence: None,
            usage: StartUsage {
                input_tokens: self.input_tokens,
                output_tokens: 0,
            },
        };
        StreamEvent::MessageStart { message }.frame()
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
            f.push_str(&self.delta(TextBlock::Text, ""));
        }
        f.push_str(&self.close());
        for c in &calls {
            let index = self.next_index;
            self.next_index += 1;
            let content_block = ContentBlock::ToolUse {
                id: &c.id,
                name: &c.name,
                input: Value::Object(Map::new()),
            };
            f.push_str(
                &StreamEvent::ContentBlockStart {
                    index,
                    content_block,
                }
                .frame(),
            );
            let delta = BlockDelta::InputJson {
                partial_json: &c.arguments,
            };
            f.push_str(&StreamEvent::ContentBlockDelta { index, delta }.frame());
            f.push_str(&StreamEvent::ContentBlockStop { index }.frame());
        }
        let (stop_reason, stop_sequence) = stop_reason(out, &self.stops, !calls.is_empty());
        let end = StreamEvent::MessageDelta {
            delta: StopDelta {
                stop_reason,
                stop_sequence,
            },
            usage: usage(out),
        };
        f.push_str(&end.frame());
        f.push_str(&StreamEvent::MessageStop.frame());
        f
    }

    fn failed(&mut self, message: &str) -> String {
        let e = ApiError::internal(message).flavor(Flavor::Anthropic);
        event_frame("error", &e.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn json_of(e: &StreamEvent<'_>) -> Value {
        serde_json::to_value(e).expect("an event serialises")
    }

    #[test]
    fn events_carry_their_name_as_type() {
        let delta = StreamEvent::ContentBlockDelta {
            index: 2,
            delta: TextBlock::Thinking.delta("hm"),
        };
        assert_eq!(
            json_of(&delta),
            json!({"type": "content_block_delta", "index": 2,
                   "delta": {"type": "thinking_delta", "thinking": "hm"}})
        );
        assert!(
            delta
                .frame()
                .starts_with("event: content_block_delta\ndata: {")
        );
        let start = StreamEvent::ContentBlockStart {
            index: 0,
            content_block: TextBlock::Thinking.start(),
        };
        assert_eq!(
            json_of(&start)["content_block"],
            json!({"type": "thinking", "thinking": ""})
        );
        for e in [
            StreamEvent::MessageStop,
            StreamEvent::ContentBlockStop { index: 1 },
        ] {
            assert_eq!(json_of(&e)["type"], e.name());
        }
    }
}
