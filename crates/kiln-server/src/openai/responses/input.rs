//! Responses `input` (a string or a list of items) and `tools` → OpenAI chat messages and
//! function tools, which the prompt builder already knows.

use serde_json::{Map, Value, json};

use crate::errors::ApiError;

/// Chat messages for `input`. `reasoning` items are dropped (they are never replayed).
pub fn messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::bad_request(
                "input must be a string or an array of input items",
            ));
        }
    };
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => out.push(message(i, item)?),
            "function_call" => push_call(&mut out, i, item)?,
            "function_call_output" => out.push(call_output(i, item)?),
            "reasoning" => {}
            other => {
                return Err(ApiError::bad_request(format!(
                    "input[{i}].type {other:?} is not supported (message, function_call, function_call_output, reasoning)"
                )));
            }
        }
    }
    Ok(out)
}

fn message(i: usize, item: &Value) -> Result<Value, ApiError> {
    let role = item.get("role").and_then(Value::as_str).ok_or_else(|| {
        ApiError::bad_request(format!("input[{i}].role is required for a message"))
    })?;
    if !matches!(role, "user" | "assistant" | "system" | "developer") {
        return Err(ApiError::bad_request(format!(
            "input[{i}].role must be user, assistant, system or developer; got {role:?}"
        )));
    }
    let text = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| part_text(i, j, p))
            .collect::<Result<Vec<_>, _>>()?
            .concat(),
        _ => {
            return Err(ApiError::bad_request(format!(
                "input[{i}].content must be a string or an array of content parts"
            )));
        }
    };
    Ok(json!({"role": role, "content": text}))
}

fn part_text(i: usize, j: usize, p: &Value) -> Result<String, ApiError> {
    match p.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text") => p
            .get("text")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                ApiError::bad_request(format!("input[{i}].content[{j}].text must be a string"))
            }),
        Some("refusal") => Ok(p
            .get("refusal")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()),
        Some("input_image" | "input_file" | "input_audio") => Err(ApiError::bad_request(format!(
            "input[{i}].content[{j}]: this model reads text only"
        ))),
        other => Err(ApiError::bad_request(format!(
            "input[{i}].content[{j}].type {other:?} is not supported"
        ))),
    }
}

/// A `function_call` joins the assistant message before it (or starts one).
fn push_call(out: &mut Vec<Value>, i: usize, item: &Value) -> Result<(), ApiError> {
    let field = |k: &str| {
        item.get(k).and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_request(format!("input[{i}].{k} is required for a function_call"))
        })
    };
    let call = json!({"id": field("call_id")?, "type": "function",
                      "function": {"name": field("name")?, "arguments": field("arguments")?}});
    // Calls join the assistant message right before them, as a stored turn keeps them.
    let joins = out.last().is_some_and(|m| m["role"] == "assistant");
    if joins && let Some(Value::Object(last)) = out.last_mut() {
        match last.get_mut("tool_calls") {
            Some(Value::Array(calls)) => calls.push(call),
            _ => {
                last.insert("tool_calls".into(), json!([call]));
            }
        }
    } else {
        out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]}));
    }
    Ok(())
}

fn call_output(i: usize, item: &Value) -> Result<Value, ApiError> {
    let call_id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| {
        ApiError::bad_request(format!(
            "input[{i}].call_id is required for a function_call_output"
        ))
    })?;
    let output = match item.get("output") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    Ok(json!({"role": "tool", "tool_call_id": call_id, "content": output}))
}

/// Flat Responses tools (`{type:"function", name, parameters}`) as chat tools; built-in tool
/// types (web search, file search…) are dropped, never an error.
pub fn tools(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(l)) => l,
        Some(_) => return Err(ApiError::bad_request("tools must be an array")),
    };
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            continue;
        }
        let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_request(format!("tools[{i}].name is required for a function tool"))
        })?;
        let mut f = Map::new();
        f.insert("name".into(), json!(name));
        for k in ["description", "parameters", "strict"] {
            if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                f.insert(k.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_messages() {
        let input = json!([
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"x\":1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]}
        ]);
        let m = messages(&input).unwrap();
        assert_eq!(m.len(), 4);
        let text_then_call = messages(&json!([
            {"role": "assistant", "content": "Let me check."},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"}
        ]))
        .unwrap();
        assert_eq!(text_then_call.len(), 1);
        assert_eq!(text_then_call[0]["content"], "Let me check.");
        assert_eq!(text_then_call[0]["tool_calls"][0]["id"], "c1");
        assert_eq!(m[0], json!({"role": "user", "content": "Weather?"}));
        assert_eq!(m[1]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(m[2]["tool_call_id"], "c1");
        assert_eq!(m[3]["content"], "Sunny.");
        assert_eq!(messages(&json!("hi")).unwrap()[0]["role"], "user");
        for bad in [
            json!(3),
            json!([{"type": "item_reference", "id": "x"}]),
            json!([{"role": "robot", "content": "x"}]),
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
            json!([{"type": "function_call", "name": "w"}]),
        ] {
            assert!(messages(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flat_tools_convert_and_builtins_drop() {
        let t = tools(Some(&json!([
            {"type": "function", "name": "w", "parameters": {"type": "object"}},
            {"type": "web_search_preview"}
        ])))
        .unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0]["function"]["name"], "w");
        assert!(tools(Some(&json!([{"type": "function"}]))).is_err());
    }
}
