//! Anthropic requests → OpenAI-style messages and tools (spec §3.3).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::errors::ApiError;
use crate::sampling::SamplingFields;

/// The request body.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    /// The model: a loaded or available model's name (loaded on demand), or a mounted
    /// adapter's id, which runs that adapter on its model (vLLM's convention) when `adapter` is
    /// absent; absent: the default model.
    pub model: Option<Value>,
    /// How long the model stays loaded once idle (Ollama's `keep_alive`).
    pub keep_alive: Option<Value>,
    /// Conversation turns.
    pub messages: Value,
    /// System prompt: a string or text blocks.
    pub system: Option<Value>,
    /// Most tokens to generate (required, as by the API: the handler answers 400 without it).
    pub max_tokens: Option<u64>,
    /// Stop sequences.
    pub stop_sequences: Option<Value>,
    /// Stream as server-sent events.
    pub stream: Option<bool>,
    /// Tools.
    pub tools: Option<Value>,
    /// `{type:"none"}` disables tools.
    pub tool_choice: Option<Value>,
    /// LoRA adapter (a kiln extension): a mounted id, `"a+b"` to stack, `"none"` for the base.
    pub adapter: Option<Value>,
    /// Sampling.
    #[serde(skip)]
    pub sampling: SamplingFields,
}

impl crate::body::WithSampling for MessagesRequest {
    fn set_sampling(&mut self, s: SamplingFields) {
        self.sampling = s;
    }
}

fn text_of_blocks(v: &Value, field: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = Vec::new();
            for (j, b) in blocks.iter().enumerate() {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => out.push(
                        b.get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                ApiError::bad_request(format!("{field}[{j}].text must be a string"))
                            })?
                            .to_string(),
                    ),
                    Some("image") => {
                        return Err(ApiError::bad_request(format!(
                            "{field}[{j}]: this model has no vision tower and cannot read images"
                        )));
                    }
                    _ => {}
                }
            }
            Ok(out.join("\n"))
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::bad_request(format!(
            "{field} must be a string or an array of content blocks"
        ))),
    }
}

/// OpenAI-style `(messages, tools)` for an Anthropic request; tools are `None` when disabled.
pub fn to_openai(req: &MessagesRequest) -> Result<(Value, Option<Value>), ApiError> {
    let list = req
        .messages
        .as_array()
        .ok_or_else(|| ApiError::bad_request("messages must be an array"))?;
    if list.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty"));
    }
    let mut out = Vec::new();
    if let Some(sys) = &req.system {
        let text = text_of_blocks(sys, "system")?;
        if !text.is_empty() {
            out.push(json!({"role": "system", "content": text}));
        }
    }
    for (i, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        let role = match role {
            Some(r @ ("user" | "assistant")) => r,
            Some(r) => {
                return Err(ApiError::bad_request(format!(
                    "messages.{i}.role: unknown role {r:?} (expected user or assistant)"
                )));
            }
            None => {
                return Err(ApiError::bad_request(format!(
                    "messages.{i}.role is required"
                )));
            }
        };
        let field = format!("messages.{i}.content");
        match m.get("content") {
            Some(Value::String(s)) => out.push(json!({"role": role, "content": s})),
            Some(Value::Array(blocks)) => convert_blocks(role, blocks, &field, &mut out)?,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "{field} must be a string or an array of content blocks"
                )));
            }
        }
    }
    let tools = match &req.tools {
        Some(Value::Array(t)) if !t.is_empty() => {
            let disabled = req
                .tool_choice
                .as_ref()
                .and_then(|c| c.get("type"))
                .and_then(Value::as_str)
                == Some("none");
            let converted = convert_tools(t)?;
            (!disabled && !converted.is_empty()).then_some(Value::Array(converted))
        }
        None | Some(Value::Null) | Some(Value::Array(_)) => None,
        Some(_) => return Err(ApiError::bad_request("tools must be an array")),
    };
    Ok((Value::Array(out), tools))
}

fn convert_blocks(
    role: &str,
    blocks: &[Value],
    field: &str,
    out: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push(
                b.get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("{field}.{j}.text must be a string"))
                    })?
                    .to_string(),
            ),
            Some("image") | Some("document") => {
                return Err(ApiError::bad_request(format!(
                    "{field}.{j}: this model has no vision tower and cannot read images or documents"
                )));
            }
            Some("tool_use") => {
                let name = b.get("name").and_then(Value::as_str).unwrap_or_default();
                calls.push(json!({
                    "id": b.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {"name": name, "arguments": b.get("input").cloned().unwrap_or(json!({}))},
                }));
            }
            Some("tool_result") => {
                let content = text_of_blocks(
                    b.get("content").unwrap_or(&Value::Null),
                    &format!("{field}.{j}.content"),
                )?;
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                    "content": content,
                }));
            }
            Some("thinking") | Some("redacted_thinking") => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "{field}.{j}.type: unsupported content block type {other:?}"
                )));
            }
            None => {
                return Err(ApiError::bad_request(format!(
                    "{field}.{j}.type is required"
                )));
            }
        }
    }
    if !text.is_empty() || !calls.is_empty() {
        let mut m = json!({"role": role, "content": text.join("\n")});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        out.push(m);
    }
    Ok(())
}

fn convert_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        // Server tools (web_search_…, bash_…) have a `type` and no schema: dropped.
        let Some(schema) = t.get("input_schema") else {
            continue;
        };
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad_request(format!("tools.{i}.name is required")))?;
        out.push(json!({"type": "function", "function": {
            "name": name,
            "description": t.get("description").cloned().unwrap_or(json!("")),
            "parameters": schema,
        }}));
    }
    Ok(out)
}
