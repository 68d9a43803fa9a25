//! One chat turn planned the same way for every API that asks for one (chat completions,
//! responses, messages): each adapts its request into a [`ChatInput`] — OpenAI-shaped messages
//! and tools, the tool choice, the answer's format, template variables — and gets back the
//! prompt, the compiled output constraint and how the answer is read. The rules live here
//! once: tools under `tool_choice: none` are neither shown nor parsed; a forcing choice or a
//! format constrains the answer (not both); strict tools under `auto` get the lazy call grammar.

use kiln_engine::structured::{Grammar, GrammarSpec};
use serde_json::{Map, Value};

use crate::errors::ApiError;
use crate::prompt::{chat_prompt, normalize_messages};
use crate::state::ModelInfo;
use crate::structured::{ToolChoice, answer_constraint, compile_answer};
use crate::turn::TurnShape;

/// A chat turn as every API describes it.
pub struct ChatInput<'a> {
    /// The conversation as an OpenAI `messages` array (system message included).
    pub messages: &'a Value,
    /// The tools offered, as OpenAI tool objects.
    pub tools: Vec<Value>,
    /// Which tool the answer may or must call.
    pub choice: ToolChoice,
    /// The answer's format (`response_format`, `text.format`), if constrained.
    pub answer: Option<GrammarSpec>,
    /// The request field `answer` came from, for errors.
    pub answer_field: &'a str,
    /// Chat-template variables (`enable_thinking`…).
    pub vars: Option<Map<String, Value>>,
    /// Most tool calls the answer may make (`None`: no limit).
    pub max_calls: Option<usize>,
}

/// What the engine runs for the turn and how its answer is read.
pub struct ChatTurn {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// The compiled output constraint, if any.
    pub grammar: Option<Grammar>,
    /// Reasoning split and tool markup of the answer.
    pub shape: TurnShape,
}

/// Plans `input` for the served model: the prompt with the tools shown, the constraint compiled
/// against that prompt (free reasoning first when it leaves `<think>` open).
pub fn plan_chat(info: &ModelInfo, input: ChatInput<'_>) -> Result<ChatTurn, ApiError> {
    let messages = normalize_messages(input.messages)?;
    let tools_active = !input.tools.is_empty() && input.choice != ToolChoice::None;
    let format = info.tool_format();
    let offered: &[Value] = if tools_active { &input.tools } else { &[] };
    let spec = answer_constraint(
        info,
        format,
        offered,
        &input.choice,
        input.answer,
        input.answer_field,
    )?;
    let prompt = chat_prompt(
        info,
        &messages,
        tools_active.then_some(offered),
        input.vars.as_ref(),
    )?;
    let grammar = compile_answer(
        info,
        spec,
        prompt.thinking_open,
        format,
        offered,
        &input.choice,
    )?;
    Ok(ChatTurn {
        prompt: prompt.ids,
        grammar,
        shape: TurnShape {
            thinking_open: prompt.thinking_open,
            tools: tools_active.then_some(format),
            max_calls: input.max_calls,
        },
    })
}
