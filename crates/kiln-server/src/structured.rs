//! Request fields that constrain the output (structured output, forced tool calls), turned into
//! a compiled grammar before the request reaches the engine. Every form kiln does not follow is
//! a 400 that names it; nothing is silently ignored.

use kiln_engine::structured::{Grammar, GrammarSpec};
use serde_json::{Value, json};

use crate::errors::ApiError;
use crate::state::ModelInfo;
use crate::tools::ToolFormat;

/// `response_format` of chat completions: `text`, `json_object`, or
/// `json_schema` with `{name, schema, strict}`.
pub fn chat_response_format(v: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    format_spec(v, "response_format", |f| {
        let inner = f
            .get("json_schema")
            .filter(|j| j.is_object())
            .ok_or_else(|| {
                ApiError::bad_request("response_format.json_schema must be an object with a schema")
            })?;
        schema_of(inner, "response_format.json_schema")
    })
}

/// Responses' `text.format`: the same kinds, with the schema fields beside `type`.
pub fn text_format(v: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    if v.is_some_and(|t| !t.is_object() && !t.is_null()) {
        return Err(ApiError::bad_request(
            "text must be an object with a format",
        ));
    }
    let Some(format) = v.and_then(|t| t.get("format")).filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    format_spec(format, "text.format", |f| schema_of(f, "text.format"))
}

/// A format object at `field` (`{type: text|json_object|json_schema, …}`); `json_schema` reads
/// its schema with `schema`.
fn format_spec(
    format: &Value,
    field: &str,
    schema: impl FnOnce(&Value) -> Result<GrammarSpec, ApiError>,
) -> Result<Option<GrammarSpec>, ApiError> {
    let kind = format
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request(format!("{field}.type is required")))?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonSchema(json!({"type": "object"})))),
        "json_schema" => schema(format).map(Some),
        other => Err(unknown_format(other, &format!("{field}.type"))),
    }
}

fn unknown_format(kind: &str, field: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{field} must be one of text, json_object, json_schema; got {kind:?}"
    ))
}

fn schema_of(holder: &Value, field: &str) -> Result<GrammarSpec, ApiError> {
    if let Some(name) = holder.get("name")
        && !name.as_str().is_some_and(valid_schema_name)
    {
        return Err(ApiError::bad_request(format!(
            "{field}.name must be 1 to 64 letters, digits, '_' or '-'"
        )));
    }
    let strict = holder.get("strict").and_then(Value::as_bool) == Some(true);
    match holder.get("schema") {
        Some(s @ Value::Object(_)) => {
            let mut schema = s.clone();
            if strict {
                close_objects(&mut schema);
            }
            Ok(GrammarSpec::JsonSchema(schema))
        }
        Some(_) => Err(ApiError::bad_request(format!(
            "{field}.schema must be a JSON schema object"
        ))),
        None => Err(ApiError::bad_request(format!("{field}.schema is required"))),
    }
}

/// Strict mode (OpenAI's `strict: true`): an object schema that does not say otherwise admits
/// only its listed properties, as OpenAI's strict schemas must. Without this a model may add
/// properties of its own without end.
pub fn close_objects(schema: &mut Value) {
    let Value::Object(obj) = schema else {
        return;
    };
    // Only an object that lists its properties is closed: `additionalProperties` speaks of the
    // sibling `properties`, so closing an object whose properties live in `anyOf` branches
    // would admit only `{}`.
    if obj.contains_key("properties") && !obj.contains_key("additionalProperties") {
        obj.insert("additionalProperties".into(), Value::Bool(false));
    }
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(Value::Object(map)) = obj.get_mut(key) {
            map.values_mut().for_each(close_objects);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(list)) = obj.get_mut(key) {
            list.iter_mut().for_each(close_objects);
        }
    }
    for key in ["items", "additionalProperties", "not", "then", "else", "if"] {
        if let Some(v) = obj.get_mut(key) {
            close_objects(v);
        }
    }
}

fn valid_schema_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Which tool the model must call, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Tools are not offered.
    None,
    /// The model may call one or answer.
    Auto,
    /// The model must call one of the tools.
    Required,
    /// The model must call this tool.
    Named(String),
}

/// OpenAI's `tool_choice`: `none|auto|required`, `{type:"function", function:{name}}`, or
/// Responses' flat `{type:"function", name}`.
pub fn openai_tool_choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}",
        )
    };
    match v {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            _ => Err(bad()),
        },
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(bad)?;
            Ok(ToolChoice::Named(name.to_string()))
        }
        Some(_) => Err(bad()),
    }
}

/// Anthropic's `tool_choice`: `{type: auto|any|none}` or `{type:"tool", name}`.
pub fn anthropic_tool_choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(ToolChoice::Auto);
    };
    let bad = || ApiError::bad_request("tool_choice.type must be auto, any, tool or none");
    match v.get("type").and_then(Value::as_str) {
        Some("auto") => Ok(ToolChoice::Auto),
        Some("any") => Ok(ToolChoice::Required),
        Some("none") => Ok(ToolChoice::None),
        Some("tool") => v
            .get("name")
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Named(n.to_string()))
            .ok_or_else(|| ApiError::bad_request("tool_choice.name is required for type tool")),
        _ => Err(bad()),
    }
}

/// The grammar forcing one call under `choice` (none for `auto`/`none`), in the model's format.
/// `tools` are OpenAI-style `{type:"function", function:{name, parameters}}`.
pub fn forced_call(
    info: &ModelInfo,
    format: ToolFormat,
    tools: &[Value],
    choice: &ToolChoice,
) -> Result<Option<GrammarSpec>, ApiError> {
    let chosen: Vec<&Value> = match choice {
        ToolChoice::None | ToolChoice::Auto => return Ok(None),
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(name) => {
            let t: Vec<&Value> = tools
                .iter()
                .filter(|t| t["function"]["name"].as_str() == Some(name))
                .collect();
            if t.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "tool_choice names {name:?}, which is not among the tools"
                )));
            }
            t
        }
    };
    if chosen.is_empty() {
        return Err(ApiError::bad_request(
            "tool_choice requires a tool call but no tools were given",
        ));
    }
    let chosen: Vec<Value> = chosen
        .into_iter()
        .map(|t| {
            let mut t = t.clone();
            if t["function"]["strict"] == Value::Bool(true) {
                close_objects(&mut t["function"]["parameters"]);
            }
            t
        })
        .collect();
    let chosen: Vec<&Value> = chosen.iter().collect();
    Ok(Some(GrammarSpec::Lark(
        format.forced_call_grammar(&chosen, |s| special_id(info, s)),
    )))
}

/// Under `tool_choice: "auto"`, the tools with `strict: true` constrain a call's name and
/// arguments lazily: from the format's call marker on, once the model writes it. `None` when no
/// tool is strict, or the format has no marker (Llama 3's bare JSON).
pub fn lazy_strict_call(
    info: &ModelInfo,
    format: ToolFormat,
    tools: &[Value],
) -> Result<Option<Grammar>, ApiError> {
    let strict: Vec<Value> = tools
        .iter()
        .filter(|t| t["function"]["strict"] == Value::Bool(true))
        .map(|t| {
            let mut t = t.clone();
            close_objects(&mut t["function"]["parameters"]);
            t
        })
        .collect();
    let Some(trigger) = format.trigger().filter(|_| !strict.is_empty()) else {
        return Ok(None);
    };
    let refs: Vec<&Value> = strict.iter().collect();
    let src = format.after_trigger_grammar(&refs, |s| special_id(info, s));
    info.grammar_compiler()?
        .compile_lazy(&GrammarSpec::Lark(src), trigger, false)
        .map(Some)
        .map_err(|e| ApiError::bad_request(format!("invalid or unsupported tool schema: {e}")))
}

fn special_id(info: &ModelInfo, s: &str) -> Option<u32> {
    info.tokenizer.id_of(s).filter(|&id| {
        info.tokenizer
            .inner()
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special)
    })
}

/// What constrains an answer: its format (`response_format`, `text.format` at `format_field`)
/// or the call a forcing `tool_choice` demands — not both. `tools` are the tools offered (empty
/// when none are, or `tool_choice` is `none`).
pub fn answer_constraint(
    info: &ModelInfo,
    format: ToolFormat,
    tools: &[Value],
    choice: &ToolChoice,
    answer: Option<GrammarSpec>,
    format_field: &str,
) -> Result<Option<GrammarSpec>, ApiError> {
    if tools.is_empty() {
        if matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
            return Err(ApiError::bad_request(
                "tool_choice requires a tool call but no tools were given",
            ));
        }
        return Ok(answer);
    }
    match forced_call(info, format, tools, choice)? {
        Some(_) if answer.is_some() => Err(ApiError::bad_request(format!(
            "{format_field} cannot be combined with a tool_choice that forces a call"
        ))),
        Some(forced) => Ok(Some(forced)),
        None => Ok(answer),
    }
}

/// Compiles an answer's constraint once its prompt is known (see [`compile`]); without one,
/// strict tools under `tool_choice: "auto"` get the lazy call grammar.
pub fn compile_answer(
    info: &ModelInfo,
    spec: Option<GrammarSpec>,
    thinking_open: bool,
    format: ToolFormat,
    tools: &[Value],
    choice: &ToolChoice,
) -> Result<Option<Grammar>, ApiError> {
    match compile(info, spec, thinking_open)? {
        None if !tools.is_empty() && *choice == ToolChoice::Auto => {
            lazy_strict_call(info, format, tools)
        }
        g => Ok(g),
    }
}

/// Compiles `spec` for the served model; a schema it cannot follow is a 400 naming why. When
/// the prompt leaves the model inside `<think>` (`thinking_open`), the reasoning stays free and
/// the answer after `</think>` is constrained.
pub fn compile(
    info: &ModelInfo,
    spec: Option<GrammarSpec>,
    thinking_open: bool,
) -> Result<Option<Grammar>, ApiError> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let compiler = info.grammar_compiler()?;
    let compiled = if thinking_open {
        compiler.compile_lazy(&spec, "</think>", true)
    } else {
        compiler.compile(&spec)
    };
    compiled
        .map(Some)
        .map_err(|e| ApiError::bad_request(format!("invalid or unsupported schema: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_formats() {
        assert_eq!(chat_response_format(None).unwrap(), None);
        assert_eq!(
            chat_response_format(Some(&json!({"type": "text"}))).unwrap(),
            None
        );
        assert!(matches!(
            chat_response_format(Some(&json!({"type": "json_object"}))).unwrap(),
            Some(GrammarSpec::JsonSchema(_))
        ));
        let ok = json!({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}, "strict": true}});
        assert!(chat_response_format(Some(&ok)).unwrap().is_some());
        for bad in [
            json!({"type": "no_such_type"}),
            json!({}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"name": "p"}}),
            json!({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"schema": 3}}),
        ] {
            assert!(chat_response_format(Some(&bad)).is_err(), "{bad}");
        }
        let flat =
            json!({"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}});
        assert!(text_format(Some(&flat)).unwrap().is_some());
        assert!(text_format(Some(&json!({"format": {"type": "yaml"}}))).is_err());
    }

    #[test]
    fn strict_closes_every_object() {
        let mut s = json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "b": {"type": "array", "items": {"properties": {"y": {}}}},
            "c": {"type": "object", "additionalProperties": true},
            "e": {"type": "object", "anyOf": [{"properties": {"p": {}}}]}
        }, "$defs": {"d": {"type": ["object", "null"], "properties": {"z": {}}}}});
        close_objects(&mut s);
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["a"]["additionalProperties"], false);
        assert_eq!(s["properties"]["b"]["items"]["additionalProperties"], false);
        assert_eq!(s["properties"]["c"]["additionalProperties"], true);
        assert_eq!(s["$defs"]["d"]["additionalProperties"], false);
        assert!(s["properties"]["b"].get("additionalProperties").is_none());
        assert!(s["properties"]["e"].get("additionalProperties").is_none());
        assert_eq!(
            s["properties"]["e"]["anyOf"][0]["additionalProperties"],
            false
        );
    }

    #[test]
    fn tool_choices() {
        assert_eq!(openai_tool_choice(None).unwrap(), ToolChoice::Auto);
        assert_eq!(
            openai_tool_choice(Some(&json!("required"))).unwrap(),
            ToolChoice::Required
        );
        assert_eq!(
            openai_tool_choice(Some(
                &json!({"type": "function", "function": {"name": "f"}})
            ))
            .unwrap(),
            ToolChoice::Named("f".into())
        );
        assert_eq!(
            openai_tool_choice(Some(&json!({"type": "function", "name": "g"}))).unwrap(),
            ToolChoice::Named("g".into())
        );
        assert!(openai_tool_choice(Some(&json!("sometimes"))).is_err());
        assert!(openai_tool_choice(Some(&json!(3))).is_err());
    }
}
