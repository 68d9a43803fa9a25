//! Which tool-call markup a model writes, read once from its chat template (as llama.cpp's
//! `common_chat_format` does): the stream filter watches only that format's markers, and a forced
//! call is constrained to that format's shape.

use serde_json::{Value, json};

/// A model's tool-call markup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes / Qwen 2.5: `<tool_call>{"name":…, "arguments":…}</tool_call>`.
    Hermes,
    /// Qwen 3 Coder: `<tool_call><function=NAME><parameter=K>V</parameter></function>`.
    QwenXml,
    /// Llama 3.x: a bare `{"name":…, "parameters":…}` object, optionally after `<|python_tag|>`.
    Llama3,
    /// Mistral: `[TOOL_CALLS][{"name":…, "arguments":…}]`.
    Mistral,
    /// The template names no markup: every known format is accepted, Hermes is written.
    Generic,
}

impl ToolFormat {
    /// The format a chat template's source implies.
    pub fn detect(template: &str) -> Self {
        if template.contains("<function=") && template.contains("<parameter=") {
            Self::QwenXml
        } else if template.contains("<tool_call>") {
            Self::Hermes
        } else if template.contains("[TOOL_CALLS]") {
            Self::Mistral
        } else if template.contains("<|python_tag|>")
            || (template.contains("<|eot_id|>") && template.contains("\"parameters\""))
        {
            Self::Llama3
        } else {
            Self::Generic
        }
    }

    /// Strings that start this format's markup (content is withheld once one appears).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            Self::Hermes => &["<tool_call>"],
            Self::QwenXml => &["<tool_call>", "<function="],
            Self::Llama3 => &["<|python_tag|>"],
            Self::Mistral => &["[TOOL_CALLS]"],
            Self::Generic => &super::MARKERS,
        }
    }

    /// Whether an answer that opens with a bare JSON object may be a call.
    pub fn bare_json(self) -> bool {
        matches!(self, Self::Llama3 | Self::Generic)
    }

    /// The marker that opens a call, which a lazy constraint waits for (`None`: Llama 3's bare
    /// JSON has none).
    pub fn trigger(self) -> Option<&'static str> {
        match self {
            Self::Hermes | Self::QwenXml | Self::Generic => Some("<tool_call>"),
            Self::Mistral => Some("[TOOL_CALLS]"),
            Self::Llama3 => None,
        }
    }

    /// A Lark grammar (llguidance) for exactly one call to one of `tools` in this format: the
    /// name one of theirs, the arguments valid against that tool's `parameters` schema.
    /// `special_id` gives the id of a marker that is a special token (written as that token).
    pub fn forced_call_grammar(
        self,
        tools: &[&Value],
        special_id: impl Fn(&str) -> Option<u32>,
    ) -> String {
        self.call_grammar(tools, special_id, true)
    }

    /// The grammar of what follows [`ToolFormat::trigger`] in a call (a lazy constraint's).
    pub fn after_trigger_grammar(
        self,
        tools: &[&Value],
        special_id: impl Fn(&str) -> Option<u32>,
    ) -> String {
        self.call_grammar(tools, special_id, false)
    }

    fn call_grammar(
        self,
        tools: &[&Value],
        special_id: impl Fn(&str) -> Option<u32>,
        with_trigger: bool,
    ) -> String {
        let args_key = if self == Self::Llama3 {
            "parameters"
        } else {
            "arguments"
        };
        // One `%json` rule per tool, so each tool's `$defs` can sit at the root its `$ref`s
        // point at.
        let rules: Vec<String> = tools
            .iter()
            .enumerate()
            .map(|(i, t)| format!("c{i}: %json {}", call_schema(&t["function"], args_key)))
            .collect();
        let names: Vec<String> = (0..tools.len()).map(|i| format!("c{i}")).collect();
        let call = format!("call: {}\n{}", names.join(" | "), rules.join("\n"));
        let lit = |s: &str| match special_id(s) {
            Some(id) => format!("<[{id}]>"),
            None => Value::from(s).to_string(),
        };
        let open = |s: &str| if with_trigger { lit(s) } else { String::new() };
        match self {
            Self::Hermes | Self::QwenXml | Self::Generic => format!(
                "start: {} \"\\n\" call \"\\n\" {}\n{call}\n",
                open("<tool_call>"),
                lit("</tool_call>")
            ),
            Self::Mistral => format!("start: {} \"[\" call \"]\"\n{call}\n", open("[TOOL_CALLS]")),
            Self::Llama3 => format!("start: call\n{call}\n"),
        }
    }
}

/// The JSON schema of one call to `function`: its name, and its `parameters` under `args_key`,
/// with the parameters' `$defs` / `definitions` lifted to the root.
fn call_schema(function: &Value, args_key: &str) -> Value {
    let mut params = match function.get("parameters") {
        Some(p) if p.is_object() => p.clone(),
        _ => json!({"type": "object"}),
    };
    let mut schema = json!({
        "type": "object",
        "required": ["name", args_key],
        "additionalProperties": false,
        "x-guidance": {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false},
    });
    for defs in ["$defs", "definitions"] {
        if let Some(d) = params.as_object_mut().and_then(|p| p.remove(defs)) {
            schema[defs] = d;
        }
    }
    schema["properties"] = json!({"name": {"const": function["name"]}, args_key: params});
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_formats_from_templates() {
        assert_eq!(
            ToolFormat::detect("{{ '<tool_call>\\n' }}"),
            ToolFormat::Hermes
        );
        assert_eq!(
            ToolFormat::detect("<tool_call>\n<function={{ name }}>\n<parameter=x>"),
            ToolFormat::QwenXml
        );
        assert_eq!(ToolFormat::detect("[TOOL_CALLS]"), ToolFormat::Mistral);
        assert_eq!(ToolFormat::detect("<|python_tag|>"), ToolFormat::Llama3);
        assert_eq!(ToolFormat::detect("<|im_start|>"), ToolFormat::Generic);
    }

    #[test]
    fn forced_grammar_names_each_tool() {
        let t = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}});
        let g = ToolFormat::Hermes.forced_call_grammar(&[&t], |_| None);
        assert!(g.starts_with("start: \"<tool_call>\" \"\\n\" call"), "{g}");
        assert!(g.contains(r#""const":"f""#), "{g}");
        let two = ToolFormat::Hermes.forced_call_grammar(&[&t, &t], |_| None);
        assert!(two.contains("call: c0 | c1\nc0: %json {"), "{two}");
        let with_defs = json!({"function": {"name": "g", "parameters": {"type": "object",
            "$defs": {"p": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/p"}}}}});
        let s = call_schema(&with_defs["function"], "arguments");
        assert_eq!(s["$defs"]["p"]["type"], "integer");
        assert!(s["properties"]["arguments"].get("$defs").is_none());
        let g = ToolFormat::Mistral.forced_call_grammar(&[&t], |_| Some(5));
        assert!(g.starts_with("start: <[5]> \"[\" call"), "{g}");
        let g = ToolFormat::Hermes.after_trigger_grammar(&[&t], |_| None);
        assert!(
            g.starts_with("start:  \"\\n\" call \"\\n\" \"</tool_call>\""),
            "{g}"
        );
        let g = ToolFormat::Llama3.forced_call_grammar(&[&t], |_| None);
        assert!(g.contains("\"parameters\""), "{g}");
    }
}
