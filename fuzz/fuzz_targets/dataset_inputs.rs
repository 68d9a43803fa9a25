//! A selector byte, then text: the dataset templates' parsers on hostile input. Byte 0 picks a
//! template; the text is its main input and, for the LLM templates, also every reply of the
//! model (so the list, Q/A, code-fence and tool-call readers see hostile output). Generation
//! must give rows or a config/generate error, never panic; every row must be in the template's
//! format. A second pass reads the text as a JSON inputs object against every template.

#![no_main]

use kiln_lab::LabError;
use kiln_lab::dataset::llm::{ChatClient, ChatReply, ChatRequest};
use kiln_lab::dataset::templates::{self, OutputFormat};
use kiln_lab::dataset::{self, Progress};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};

/// Answers every request with the fuzz text; as tool calls when it parses as a JSON array.
struct Echo(String);

impl ChatClient for Echo {
    fn chat(&self, _: &ChatRequest) -> Result<ChatReply, LabError> {
        let tool_calls = match serde_json::from_str::<Value>(&self.0) {
            Ok(Value::Array(calls)) => calls.into_iter().take(4).collect(),
            _ => vec![],
        };
        Ok(ChatReply { content: self.0.clone(), tool_calls })
    }
}

struct Quiet;

impl Progress for Quiet {
    fn step(&mut self, _: usize, _: usize, _: &str) -> Result<(), LabError> {
        Ok(())
    }
    fn warn(&mut self, _: &str) {}
}

/// The templates that touch neither the file system nor the network, and their main input.
const TEXT_TEMPLATES: [(&str, &str); 11] = [
    ("sft_qa_pairs", "pairs_text"),
    ("dpo_pref_pairs", "csv_text"),
    ("format_conversion", "input_jsonl"),
    ("style_transfer", "raw_text"),
    ("self_instruct", "seeds"),
    ("prompt_reconstruction", "target_text"),
    ("multi_turn_chat", "seeds"),
    ("tool_use_traces", "scenarios"),
    ("rag_qa", "documents"),
    ("cot_synthesis", "questions"),
    ("verified_code", "specs"),
];

fn extra_inputs(template: &str, text: &str) -> Map<String, Value> {
    let mut m = Map::new();
    match template {
        "style_transfer" => m.insert("reference_samples".into(), text.into()),
        "tool_use_traces" => m.insert("tools_json".into(), json!([{"type": "function", "function": {"name": "t"}}]).to_string().into()),
        "self_instruct" => m.insert("variants_per_seed".into(), 2.into()),
        "multi_turn_chat" => m.insert("turns".into(), 2.into()),
        "rag_qa" => m.insert("min_chunk_chars".into(), 16.into()),
        // Generated code is never run here: the language is not python.
        "verified_code" => m.insert("language".into(), "fuzz".into()),
        _ => None,
    };
    m
}

fn well_formed(row: &Value, format: OutputFormat) -> bool {
    let s = |k: &str| row[k].is_string();
    match format {
        OutputFormat::Messages => row["messages"].as_array().is_some_and(|m| m.iter().all(|t| t["role"].is_string() && t["content"].is_string())),
        OutputFormat::PromptCompletion => s("prompt") && s("completion"),
        OutputFormat::Dpo => s("prompt") && s("chosen") && s("rejected"),
        OutputFormat::Text => s("text"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    // Bounded: every line may become a model call.
    let text: String = String::from_utf8_lossy(rest).chars().take(2000).collect();
    let (template, field) = TEXT_TEMPLATES[selector as usize % TEXT_TEMPLATES.len()];
    let mut given = extra_inputs(template, &text);
    given.insert(field.into(), text.clone().into());
    let def = templates::find(template).expect("a listed template");
    if let Ok(inputs) = templates::Inputs::check(&def, &given) {
        let echo = Echo(text.clone());
        match dataset::generate(&def, &inputs, Some(&echo), &mut Quiet) {
            Ok(rows) => assert!(rows.iter().all(|r| well_formed(&r.0, def.output_format)), "{template}: {rows:?}"),
            Err(LabError::Config { field, .. }) => assert!(field.starts_with("inputs.")),
            Err(LabError::Generate(_)) => {}
            Err(other) => panic!("{template}: unexpected error {other}"),
        }
    }
    if let Ok(Value::Object(inputs)) = serde_json::from_str::<Value>(&text) {
        for t in templates::all() {
            match dataset::check(t.id, &inputs) {
                Ok((_, checked)) => assert!(checked.to_json().keys().all(|k| t.fields.iter().any(|f| f.name == k))),
                Err(LabError::Config { field, .. }) => assert!(field.starts_with("inputs.")),
                Err(other) => panic!("{}: unexpected error {other}", t.id),
            }
        }
    }
});
