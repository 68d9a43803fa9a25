//! Chat prompts: validate OpenAI-style messages, render the model's template (with tools), and
//! tokenize.

use serde_json::{Map, Value, json};

use crate::errors::ApiError;
use crate::state::ModelInfo;

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// Checks and normalises `messages` for the template: content parts become one string,
/// `developer` becomes `system`, and JSON-string tool-call arguments become objects (a
/// malformed one is kept as the string, so a bad history never blocks a request).
pub fn normalize_messages(raw: &Value) -> Result<Vec<Value>, ApiError> {
    let list = raw
        .as_array()
        .ok_or_else(|| ApiError::bad_request("messages must be an array"))?;
    if list.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| normalize_one(i, m))
        .collect()
}

fn normalize_one(i: usize, m: &Value) -> Result<Value, ApiError> {
    let obj = m
        .as_object()
        .ok_or_else(|| ApiError::bad_request(format!("messages[{i}] must be an object")))?;
    let role = match obj.get("role") {
        Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.as_str(),
        Some(Value::String(r)) => {
            return Err(ApiError::bad_request(format!(
                "messages[{i}].role: unknown role {r:?} (expected one of {})",
                ROLES.join(", ")
            )));
        }
        _ => {
            return Err(ApiError::bad_request(format!(
                "messages[{i}].role is required and must be a string"
            )));
        }
    };
    let has_calls = obj.get("tool_calls").is_some_and(|c| !c.is_null());
    let content = match obj.get("content") {
        None | Some(Value::Null) if role == "assistant" || role == "tool" || has_calls => {
            String::new()
        }
        None | Some(Value::Null) => {
            return Err(ApiError::bad_request(format!(
                "messages[{i}].content is required"
            )));
        }
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => join_parts(i, parts)?,
        Some(_) => {
            return Err(ApiError::bad_request(format!(
                "messages[{i}].content must be a string or an array of content parts"
            )));
        }
    };
    let mut out = Map::new();
    let role = if role == "developer" { "system" } else { role };
    out.insert("role".into(), json!(role));
    out.insert("content".into(), json!(content));
    if has_calls {
        out.insert("tool_calls".into(), normalize_calls(i, &obj["tool_calls"])?);
    }
    for key in ["tool_call_id", "name"] {
        match obj.get(key) {
            Some(Value::String(s)) => {
                out.insert(key.into(), json!(s));
            }
            None | Some(Value::Null) => {}
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}].{key} must be a string"
                )));
            }
        }
    }
    Ok(Value::Object(out))
}

fn join_parts(i: usize, parts: &[Value]) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        match p.get("type").and_then(Value::as_str) {
            Some("text") | Some("input_text") => {
                let t = p.get("text").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "messages[{i}].content[{j}].text must be a string"
                    ))
                })?;
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
            }
            Some("image_url") | Some("image") | Some("input_image") => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}].content[{j}]: this model has no vision tower and cannot read images"
                )));
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}].content[{j}].type must be \"text\""
                )));
            }
        }
    }
    Ok(text)
}

fn normalize_calls(i: usize, calls: &Value) -> Result<Value, ApiError> {
    let list = calls.as_array().ok_or_else(|| {
        ApiError::bad_request(format!("messages[{i}].tool_calls must be an array"))
    })?;
    let mut out = Vec::with_capacity(list.len());
    for (j, c) in list.iter().enumerate() {
        let f = c.get("function").ok_or_else(|| {
            ApiError::bad_request(format!(
                "messages[{i}].tool_calls[{j}].function is required"
            ))
        })?;
        let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_request(format!(
                "messages[{i}].tool_calls[{j}].function.name must be a string"
            ))
        })?;
        let args = match f.get("arguments") {
            Some(Value::String(s)) => serde_json::from_str::<Value>(s)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!(s)),
            Some(v @ Value::Object(_)) => v.clone(),
            _ => json!({}),
        };
        out.push(json!({
            "id": c.get("id").cloned().unwrap_or(Value::Null),
            "type": "function",
            "function": {"name": name, "arguments": args},
        }));
    }
    Ok(Value::Array(out))
}

/// Checks OpenAI `tools`: a list of `{type:"function", function:{name,…}}`.
pub fn validate_tools(tools: &Value) -> Result<Vec<Value>, ApiError> {
    let list = tools
        .as_array()
        .ok_or_else(|| ApiError::bad_request("tools must be an array"))?;
    for (i, t) in list.iter().enumerate() {
        let name = t
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str);
        if name.is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(format!(
                "tools[{i}].function.name is required"
            )));
        }
    }
    Ok(list.clone())
}

/// A rendered, tokenized conversation.
#[derive(Debug, Clone)]
pub struct ChatPrompt {
    /// Token ids.
    pub ids: Vec<u32>,
    /// The prompt leaves the model inside an open `<think>`.
    pub thinking_open: bool,
}

/// Renders and tokenizes a conversation.
pub fn chat_prompt(
    info: &ModelInfo,
    messages: &[Value],
    tools: Option<&[Value]>,
    extra: Option<&Map<String, Value>>,
) -> Result<ChatPrompt, ApiError> {
    let template = info.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template; send raw text to /v1/completions instead",
        )
    })?;
    let rendered = template
        .render(messages, tools.filter(|t| !t.is_empty()), true, extra)
        .map_err(|e| ApiError::bad_request(format!("prompt build failed: {e}")))?;
    let ids = kiln_model::chat_template::prompt_ids(&info.tokenizer, &rendered)
        .map_err(|e| ApiError::bad_request(format!("prompt build failed: {e}")))?;
    Ok(ChatPrompt {
        ids,
        thinking_open: crate::turn::reasoning::ThinkSplitter::prompt_opens(&rendered),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        let e = normalize_messages(&json!([])).unwrap_err();
        assert!(e.message.contains("must not be empty"));
        let e = normalize_messages(&json!([{"role": "wizard", "content": "x"}])).unwrap_err();
        assert!(e.message.starts_with("messages[0].role"), "{}", e.message);
        let e = normalize_messages(&json!([{"role": "user", "content": 5}])).unwrap_err();
        assert!(
            e.message.starts_with("messages[0].content"),
            "{}",
            e.message
        );
        let e = normalize_messages(&json!("hi")).unwrap_err();
        assert!(e.message.contains("array"));
    }

    #[test]
    fn parts_join_and_arguments_normalise() {
        let m = normalize_messages(&json!([
            {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{broken"}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}
        ]))
        .unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "a\nb"}));
        assert_eq!(
            m[1]["tool_calls"][0]["function"]["arguments"],
            json!({"x": 1})
        );
        assert_eq!(
            m[1]["tool_calls"][1]["function"]["arguments"],
            json!("{broken")
        );
        assert_eq!(m[2]["tool_call_id"], "c1");
    }
}
