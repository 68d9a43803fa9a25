//! One typed assistant turn, built once from the engine's text and rendered by every API.
//!
//! A [`TurnBuilder`] splits streamed text into reasoning and content (think tags, spec §12.1)
//! and withholds tool-call markup in the model's own format (spec §12.2); at the end it parses
//! the calls and gives each its id. The chat, messages and responses endpoints are renderers of
//! its [`Delta`]s (streams) and of the finished [`Turn`] (whole responses), so the split and the
//! parsing are done in one place and a stream always agrees with the whole response.

pub mod reasoning;

use reasoning::{Piece, ThinkSplitter};

use crate::tools::{ToolFormat, ToolStreamFilter};

/// What a turn's text is parsed for, fixed when the request is planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnShape {
    /// The prompt leaves the model inside `<think>`.
    pub thinking_open: bool,
    /// Tool calls are parsed, in this format (`None`: no tools offered).
    pub tools: Option<ToolFormat>,
    /// Most calls kept (`parallel_tool_calls: false` → 1; `None`: all the model writes).
    pub max_calls: Option<usize>,
}

/// A piece of the turn that can be shown now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Reasoning text.
    Reasoning(String),
    /// Answer text.
    Content(String),
}

/// A parsed tool call with its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// `call_…` (OpenAI), also used for Anthropic's `toolu_…` and Responses' `call_id`.
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments as JSON text of an object.
    pub arguments: String,
}

/// The finished turn.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Turn {
    /// All reasoning text.
    pub reasoning: String,
    /// All answer text outside tool-call markup.
    pub content: String,
    /// The tool calls, in order.
    pub calls: Vec<Call>,
}

/// Builds a turn from streamed text.
#[derive(Debug)]
pub struct TurnBuilder {
    think: ThinkSplitter,
    tools: Option<ToolStreamFilter>,
    reasoning: String,
    max_calls: Option<usize>,
}

impl TurnBuilder {
    /// A builder for a turn of `shape`.
    pub fn new(shape: TurnShape) -> Self {
        Self {
            think: ThinkSplitter::new(shape.thinking_open),
            tools: shape.tools.map(ToolStreamFilter::new),
            reasoning: String::new(),
            max_calls: shape.max_calls,
        }
    }

    /// Adds generated text; returns what can be shown now.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        let pieces = self.think.push(text);
        self.deltas(pieces)
    }

    fn deltas(&mut self, pieces: Vec<Piece>) -> Vec<Delta> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Reasoning(r) => {
                    self.reasoning.push_str(&r);
                    out.push(Delta::Reasoning(r));
                }
                Piece::Content(c) => {
                    let shown = match &mut self.tools {
                        Some(f) => f.push(&c),
                        None => c,
                    };
                    if !shown.is_empty() {
                        out.push(Delta::Content(shown));
                    }
                }
            }
        }
        out
    }

    /// Ends the turn: the deltas still held back, and the whole turn (calls get ids from
    /// `new_id`).
    pub fn finish(&mut self, mut new_id: impl FnMut() -> String) -> (Vec<Delta>, Turn) {
        let tail = self.think.finish();
        let mut deltas = self.deltas(tail);
        let answer = self.think.content().to_string();
        let (content, calls) = match &mut self.tools {
            Some(f) => {
                let (parsed, rest) = f.finish(&answer);
                if !rest.is_empty() {
                    deltas.push(Delta::Content(rest));
                }
                let keep = self.max_calls.unwrap_or(usize::MAX);
                let calls = parsed
                    .calls
                    .into_iter()
                    .take(keep)
                    .map(|c| Call {
                        id: new_id(),
                        name: c.name,
                        arguments: c.arguments,
                    })
                    .collect();
                (parsed.content, calls)
            }
            None => (answer, Vec::new()),
        };
        let turn = Turn {
            reasoning: std::mem::take(&mut self.reasoning),
            content,
            calls,
        };
        (deltas, turn)
    }

    /// The turn of a whole generated `text`.
    pub fn whole(shape: TurnShape, text: &str, new_id: impl FnMut() -> String) -> Turn {
        let mut b = Self::new(shape);
        b.push(text);
        b.finish(new_id).1
    }
}

#[cfg(test)]
mod tests;
