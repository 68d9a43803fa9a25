//! The parsers.

use serde_json::{Map, Value};

use super::{ParsedOutput, ToolCall, ToolFormat};

/// Splits `text` into content and tool calls, trying every format (see the module docs).
pub fn parse_tool_calls(text: &str) -> ParsedOutput {
    parse_tool_calls_as(ToolFormat::Generic, text)
}

/// Splits `text` into content and tool calls written in `format` (any format for `Generic`).
pub fn parse_tool_calls_as(format: ToolFormat, text: &str) -> ParsedOutput {
    use ToolFormat::*;
    let is = |f: &[ToolFormat]| format == Generic || f.contains(&format);
    let parsed = if let Some(i) = text.find("<tool_call>").filter(|_| is(&[Hermes, QwenXml])) {
        hermes(&text[i..]).map(|c| (&text[..i], c))
    } else if let Some(i) = text.find("[TOOL_CALLS]").filter(|_| is(&[Mistral])) {
        mistral(&text[i + "[TOOL_CALLS]".len()..]).map(|c| (&text[..i], c))
    } else if let Some(i) = text.find("<|python_tag|>").filter(|_| is(&[Llama3])) {
        json_calls(&text[i + "<|python_tag|>".len()..]).map(|c| (&text[..i], c))
    } else if let Some(i) = text.find("<function=").filter(|_| is(&[QwenXml])) {
        qwen_xml(&text[i..]).map(|c| (&text[..i], vec![c]))
    } else if text.trim_start().starts_with('{') && format.bare_json() {
        json_calls(text).map(|c| ("", c))
    } else {
        None
    };
    match parsed {
        Some((content, calls)) if !calls.is_empty() => ParsedOutput {
            content: content.trim_end().to_string(),
            calls,
        },
        _ => ParsedOutput {
            content: text.to_string(),
            calls: Vec::new(),
        },
    }
}

/// `{"name": …, "arguments"|"parameters": …}` → a call; arguments become JSON text.
fn call_from_json(v: &Value) -> Option<ToolCall> {
    let obj = v.as_object()?;
    let (name, args) = match obj.get("function") {
        // OpenAI-shaped: {"type":"function","function":{"name","arguments"}}
        Some(Value::Object(f)) => (f.get("name")?, f.get("arguments")),
        _ => (
            obj.get("name")?,
            obj.get("arguments").or_else(|| obj.get("parameters")),
        ),
    };
    let name = name.as_str()?.to_string();
    let arguments = match args {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::Object(_)) => args?.to_string(),
        // Some models emit the arguments already as a JSON string: keep it if it is an object.
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v.to_string(),
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(ToolCall { name, arguments })
}

/// Every `<tool_call>…</tool_call>` block (the last may be unterminated at EOS).
fn hermes(mut s: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    while let Some(rest) = s.trim_start().strip_prefix("<tool_call>") {
        let (body, after) = match rest.find("</tool_call>") {
            Some(end) => (&rest[..end], &rest[end + "</tool_call>".len()..]),
            None => (rest, ""),
        };
        let body = body.trim();
        let call = if body.starts_with("<function=") {
            qwen_xml(body)?
        } else {
            call_from_json(&serde_json::from_str(body).ok()?)?
        };
        calls.push(call);
        s = after;
    }
    // Anything other than whitespace after the calls means this was not clean markup.
    if s.trim().is_empty() {
        Some(calls)
    } else {
        None
    }
}

/// Qwen3-Coder style `<function=NAME><parameter=K>V</parameter>…</function>`.
fn qwen_xml(s: &str) -> Option<ToolCall> {
    let rest = s.trim().strip_prefix("<function=")?;
    let close = rest.find('>')?;
    let name = rest[..close].trim().to_string();
    let mut body = &rest[close + 1..];
    let end = body.find("</function>").unwrap_or(body.len());
    body = &body[..end];
    let mut args = Map::new();
    while let Some(start) = body.find("<parameter=") {
        let after = &body[start + "<parameter=".len()..];
        let gt = after.find('>')?;
        let key = after[..gt].trim().to_string();
        let val_start = &after[gt + 1..];
        let vend = val_start.find("</parameter>")?;
        let raw = val_start[..vend].trim_matches('\n');
        // Non-string values are JSON-decoded when they parse; everything else stays text.
        let value = match serde_json::from_str::<Value>(raw) {
            Ok(v) if !v.is_string() => v,
            _ => Value::String(raw.to_string()),
        };
        args.insert(key, value);
        body = &val_start[vend + "</parameter>".len()..];
    }
    if name.is_empty() {
        return None;
    }
    Some(ToolCall {
        name,
        arguments: Value::Object(args).to_string(),
    })
}

/// Mistral: `[TOOL_CALLS][{…},…]` or the v11 form `[TOOL_CALLS]name[ARGS]{…}`.
fn mistral(s: &str) -> Option<Vec<ToolCall>> {
    let t = s.trim();
    if t.starts_with('[') {
        let v: Value = serde_json::from_str(t).ok()?;
        return v.as_array()?.iter().map(call_from_json).collect();
    }
    let mut calls = Vec::new();
    for part in t.split("[TOOL_CALLS]") {
        let (name, args) = part.split_once("[ARGS]")?;
        let v: Value = serde_json::from_str(args.trim()).ok()?;
        if !v.is_object() {
            return None;
        }
        calls.push(ToolCall {
            name: name.trim().to_string(),
            arguments: v.to_string(),
        });
    }
    Some(calls)
}

/// Llama 3: one or more JSON objects, separated by whitespace or `;`, and nothing else.
fn json_calls(s: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for chunk in split_objects(s.trim())? {
        let v: Value = serde_json::from_str(chunk).ok()?;
        if let Value::Array(items) = v {
            for item in &items {
                calls.push(call_from_json(item)?);
            }
        } else {
            calls.push(call_from_json(&v)?);
        }
    }
    Some(calls)
}

/// Splits `a; b` / `a b` into top-level JSON values using a serde stream.
fn split_objects(s: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.trim().is_empty() {
        rest = rest.trim_start().trim_start_matches(';').trim_start();
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        it.next()?.ok()?;
        let used = it.byte_offset();
        out.push(&rest[..used]);
        rest = &rest[used..];
    }
    Some(out)
}
