//! Tool calls in model output: Hermes/Qwen `<tool_call>{json}</tool_call>` (and Qwen's XML
//! `<function=…>` body), Llama 3 JSON (`{"name":…,"parameters":…}`, optionally after
//! `<|python_tag|>`), and Mistral `[TOOL_CALLS]`. `arguments` always comes out as a JSON
//! *string* of an object. Markup that does not parse stays plain content (spec §12.2).

mod format;
mod parse;
mod stream;

pub use format::ToolFormat;
pub use parse::{parse_tool_calls, parse_tool_calls_as};
pub use stream::ToolStreamFilter;

/// One parsed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// Function name.
    pub name: String,
    /// Arguments as JSON text of an object.
    pub arguments: String,
}

/// Model output split into content and calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedOutput {
    /// Text outside the call markup (the whole text when nothing parsed).
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<ToolCall>,
}

/// Strings that start tool-call markup; content is withheld from a stream once one appears.
pub const MARKERS: [&str; 4] = [
    "<tool_call>",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    "<function=",
];

#[cfg(test)]
mod tests;
