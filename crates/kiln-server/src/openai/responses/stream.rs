//! The Responses event stream (spec §3.4): `response.created` … `response.completed`, built
//! from the same output items as the whole response.

use kiln_engine::GenerateOutput;
use kiln_engine::request::TokenLogprob;
use serde::Serialize;

use super::render::{
    OutputItem, OutputText, ResponseContext, ResponseObject, SummaryText, call_item, item_status,
    message_item, reasoning_item, reasoning_tokens, remember, response_object, text_part,
};
use crate::generation::{Framer, event_frame};
use crate::state::SharedState;
use crate::turn::{Delta, Turn, TurnBuilder, TurnShape};

/// One event of the stream; its `type` is also the SSE event name.
#[derive(Serialize)]
#[serde(tag = "type")]
enum Event<'a> {
    #[serde(rename = "response.created")]
    Created { response: &'a ResponseObject<'a> },
    #[serde(rename = "response.in_progress")]
    InProgress { response: &'a ResponseObject<'a> },
    #[serde(rename = "response.completed")]
    Completed { response: &'a ResponseObject<'a> },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: &'a ResponseObject<'a> },
    #[serde(rename = "response.failed")]
    Failed { response: &'a ResponseObject<'a> },
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        output_index: usize,
        item: &'a OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        output_index: usize,
        item: &'a OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    PartAdded {
        #[serde(flatten)]
        at: ContentAt<'a>,
        part: &'a OutputText,
    },
    #[serde(rename = "response.content_part.done")]
    PartDone {
        #[serde(flatten)]
        at: ContentAt<'a>,
        part: &'a OutputText,
    },
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        #[serde(flatten)]
        at: ContentAt<'a>,
        delta: &'a str,
        logprobs: [(); 0],
    },
    #[serde(rename = "response.output_text.done")]
    TextDone {
        #[serde(flatten)]
        at: ContentAt<'a>,
        text: &'a str,
        logprobs: [(); 0],
    },
    #[serde(rename = "response.reasoning_summary_part.added")]
    SummaryPartAdded {
        #[serde(flatten)]
        at: SummaryAt<'a>,
        part: &'a SummaryText,
    },
    #[serde(rename = "response.reasoning_summary_part.done")]
    SummaryPartDone {
        #[serde(flatten)]
        at: SummaryAt<'a>,
        part: &'a SummaryText,
    },
    #[serde(rename = "response.reasoning_summary_text.delta")]
    SummaryDelta {
        #[serde(flatten)]
        at: SummaryAt<'a>,
        delta: &'a str,
    },
    #[serde(rename = "response.reasoning_summary_text.done")]
    SummaryDone {
        #[serde(flatten)]
        at: SummaryAt<'a>,
        text: &'a str,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        item_id: &'a str,
        output_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        item_id: &'a str,
        output_index: usize,
        name: &'a str,
        arguments: &'a str,
    },
}

impl Event<'_> {
    /// The SSE event name: the same as the serialised `type`.
    fn name(&self) -> &'static str {
        match self {
            Event::Created { .. } => "response.created",
            Event::InProgress { .. } => "response.in_progress",
            Event::Completed { .. } => "response.completed",
            Event::Incomplete { .. } => "response.incomplete",
            Event::Failed { .. } => "response.failed",
            Event::ItemAdded { .. } => "response.output_item.added",
            Event::ItemDone { .. } => "response.output_item.done",
            Event::PartAdded { .. } => "response.content_part.added",
            Event::PartDone { .. } => "response.content_part.done",
            Event::TextDelta { .. } => "response.output_text.delta",
            Event::TextDone { .. } => "response.output_text.done",
            Event::SummaryPartAdded { .. } => "response.reasoning_summary_part.added",
            Event::SummaryPartDone { .. } => "response.reasoning_summary_part.done",
            Event::SummaryDelta { .. } => "response.reasoning_summary_text.delta",
            Event::SummaryDone { .. } => "response.reasoning_summary_text.done",
            Event::ArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Event::ArgumentsDone { .. } => "response.function_call_arguments.done",
        }
    }
}

/// The content part an event is about (kiln's messages have one).
#[derive(Serialize)]
struct ContentAt<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
}

/// The summary part an event is about (kiln's reasoning has one).
#[derive(Serialize)]
struct SummaryAt<'a> {
    item_id: &'a str,
    output_index: usize,
    summary_index: usize,
}

/// An event with its place in the stream.
#[derive(Serialize)]
struct Sequenced<'a> {
    #[serde(flatten)]
    event: &'a Event<'a>,
    sequence_number: u64,
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
    done_items: Vec<OutputItem>,
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

    fn frame(seq: &mut u64, event: &Event<'_>) -> String {
        let sequence_number = *seq;
        *seq += 1;
        event_frame(
            event.name(),
            &Sequenced {
                event,
                sequence_number,
            },
        )
    }

    fn event(&mut self, event: &Event<'_>) -> String {
        Self::frame(&mut self.seq, event)
    }

    fn index(&self) -> usize {
        self.done_items.len()
    }

    fn close(&mut self) -> String {
        let output_index = self.index();
        let (mut f, item) = match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return String::new(),
            Open::Reasoning { id, text } => {
                let at = || SummaryAt {
                    item_id: &id,
                    output_index,
                    summary_index: 0,
                };
                let part = SummaryText { text: text.clone() };
                let mut f = self.event(&Event::SummaryDone {
                    at: at(),
                    text: &text,
                });
                f.push_str(&self.event(&Event::SummaryPartDone {
                    at: at(),
                    part: &part,
                }));
                (f, reasoning_item(&id, &text))
            }
            Open::Message { id, text } => {
                let at = || ContentAt {
                    item_id: &id,
                    output_index,
                    content_index: 0,
                };
                let part = text_part(&text);
                let done = Event::TextDone {
                    at: at(),
                    text: &text,
                    logprobs: [],
                };
                let mut f = self.event(&done);
                f.push_str(&self.event(&Event::PartDone {
                    at: at(),
                    part: &part,
                }));
                (f, message_item(&id, &text, self.status))
            }
        };
        f.push_str(&self.event(&Event::ItemDone {
            output_index,
            item: &item,
        }));
        self.done_items.push(item);
        f
    }

    fn open_reasoning(&mut self) -> String {
        let id = self.state.new_id("rs_");
        let output_index = self.index();
        let item = reasoning_item(&id, "");
        let mut f = self.event(&Event::ItemAdded {
            output_index,
            item: &item,
        });
        let at = SummaryAt {
            item_id: &id,
            output_index,
            summary_index: 0,
        };
        let part = SummaryText {
            text: String::new(),
        };
        f.push_str(&self.event(&Event::SummaryPartAdded { at, part: &part }));
        self.open = Open::Reasoning {
            id,
            text: String::new(),
        };
        f
    }

    fn open_message(&mut self) -> String {
        let id = self.state.new_id("msg_");
        let output_index = self.index();
        let item = message_item(&id, "", "in_progress");
        let mut f = self.event(&Event::ItemAdded {
            output_index,
            item: &item,
        });
        let at = ContentAt {
            item_id: &id,
            output_index,
            content_index: 0,
        };
        let part = text_part("");
        f.push_str(&self.event(&Event::PartAdded { at, part: &part }));
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
            let output_index = self.index();
            let (Open::Reasoning { id, text } | Open::Message { id, text }) = &mut self.open else {
                continue;
            };
            text.push_str(&piece);
            let event = if reasoning {
                let at = SummaryAt {
                    item_id: id,
                    output_index,
                    summary_index: 0,
                };
                Event::SummaryDelta { at, delta: &piece }
            } else {
                let at = ContentAt {
                    item_id: id,
                    output_index,
                    content_index: 0,
                };
                Event::TextDelta {
                    at,
                    delta: &piece,
                    logprobs: [],
                }
            };
            f.push_str(&Self::frame(&mut self.seq, &event));
        }
        f
    }

    fn calls(&mut self, turn: &Turn) -> String {
        let mut f = String::new();
        for c in &turn.calls {
            let item_id = self.state.new_id("fc_");
            let output_index = self.index();
            let added = call_item(&item_id, c, "in_progress");
            f.push_str(&self.event(&Event::ItemAdded {
                output_index,
                item: &added,
            }));
            f.push_str(&self.event(&Event::ArgumentsDelta {
                item_id: &item_id,
                output_index,
                delta: &c.arguments,
            }));
            f.push_str(&self.event(&Event::ArgumentsDone {
                item_id: &item_id,
                output_index,
                name: &c.name,
                arguments: &c.arguments,
            }));
            let item = call_item(&item_id, c, self.status);
            f.push_str(&self.event(&Event::ItemDone {
                output_index,
                item: &item,
            }));
            self.done_items.push(item);
        }
        f
    }
}

impl Framer for ResponsesFramer {
    fn start(&mut self) -> String {
        let r = response_object(&self.ctx, Vec::new(), None, 0);
        let mut f = Self::frame(&mut self.seq, &Event::Created { response: &r });
        f.push_str(&Self::frame(
            &mut self.seq,
            &Event::InProgress { response: &r },
        ));
        f
    }

    fn text(&mut self, piece: &str, _logprobs: Vec<TokenLogprob>) -> String {
        let deltas = self.turn.push(piece);
        self.deltas(deltas)
    }

    fn done(&mut self, out: &GenerateOutput) -> String {
        let state = self.state.clone();
        let (tail, turn) = self.turn.finish(|| state.new_id("call_"));
        let mut f = self.deltas(tail);
        self.status = item_status(out);
        let has_message = matches!(self.open, Open::Message { .. })
            || self
                .done_items
                .iter()
                .any(|i| matches!(i, OutputItem::Message { .. }));
        if turn.calls.is_empty() && !has_message {
            // An answer with no text and no call still has its (empty) message.
            f.push_str(&self.close());
            f.push_str(&self.open_message());
        }
        f.push_str(&self.close());
        f.push_str(&self.calls(&turn));
        remember(&self.state, &self.ctx, &turn);
        let items = std::mem::take(&mut self.done_items);
        let reasoning = reasoning_tokens(&self.ctx, &turn);
        let r = response_object(&self.ctx, items, Some(out), reasoning);
        let end = if r.status == "incomplete" {
            Event::Incomplete { response: &r }
        } else {
            Event::Completed { response: &r }
        };
        f.push_str(&Self::frame(&mut self.seq, &end));
        f
    }

    fn failed(&mut self, message: &str) -> String {
        let r = response_object(&self.ctx, Vec::new(), None, 0).failed(message);
        Self::frame(&mut self.seq, &Event::Failed { response: &r })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn framed(event: &Event<'_>, seq: u64) -> (String, Value) {
        let mut n = seq;
        let f = ResponsesFramer::frame(&mut n, event);
        assert_eq!(n, seq + 1);
        let (head, data) = f.split_once("\ndata: ").expect("an SSE frame");
        let body = serde_json::from_str(data.trim_end()).expect("JSON data");
        (head.to_string(), body)
    }

    #[test]
    fn events_are_named_typed_and_numbered() {
        let at = ContentAt {
            item_id: "msg_1",
            output_index: 1,
            content_index: 0,
        };
        let delta = Event::TextDelta {
            at,
            delta: "hi",
            logprobs: [],
        };
        let (head, body) = framed(&delta, 7);
        assert_eq!(head, "event: response.output_text.delta");
        assert_eq!(
            body,
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1,
                   "content_index": 0, "delta": "hi", "logprobs": [], "sequence_number": 7})
        );
        let item = message_item("msg_1", "hello", "completed");
        let (head, body) = framed(
            &Event::ItemDone {
                output_index: 0,
                item: &item,
            },
            0,
        );
        assert_eq!(head, "event: response.output_item.done");
        assert_eq!(
            body["item"],
            json!({"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": "hello", "annotations": [],
                                "logprobs": []}]})
        );
        let part = SummaryText { text: "so".into() };
        let at = SummaryAt {
            item_id: "rs_1",
            output_index: 0,
            summary_index: 0,
        };
        let (_, body) = framed(&Event::SummaryPartDone { at, part: &part }, 3);
        assert_eq!(body["part"], json!({"type": "summary_text", "text": "so"}));
    }
}
