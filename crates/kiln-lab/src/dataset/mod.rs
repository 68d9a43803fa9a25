//! The dataset builder (spec §9): 13 templates that turn inputs into training rows, some by
//! asking the served model, written as `train.jsonl`/`valid.jsonl` split 90/10. The job kind
//! `dataset` ([`job`]) and `kiln dataset` run the same [`build`].

mod hub;
pub mod job;
pub mod llm;
mod local;
pub mod output;
mod synth;
pub mod templates;
mod traces;

use std::path::Path;

use serde_json::{Map, Value};

pub use llm::{ChatClient, HttpChat, Loopback};
pub use output::{Row, Written};
pub use templates::{Inputs, TemplateDef};

use crate::LabError;

/// What a template runs with.
pub struct Gen<'a> {
    /// The checked inputs.
    pub inputs: &'a Inputs,
    /// The model, for the LLM templates.
    pub llm: &'a dyn ChatClient,
    /// Where progress goes.
    pub progress: &'a mut dyn crate::Report,
}

/// Checks `inputs` against the template `template_id`.
pub fn check(
    template_id: &str,
    inputs: &Map<String, Value>,
) -> Result<(TemplateDef, Inputs), LabError> {
    let def = templates::find(template_id).ok_or_else(|| {
        let ids: Vec<&str> = templates::all().iter().map(|t| t.id).collect();
        LabError::config(
            "template_id",
            format!(
                "unknown template {template_id:?} (one of: {})",
                ids.join(", ")
            ),
        )
    })?;
    let inputs = Inputs::check(&def, inputs)?;
    Ok((def, inputs))
}

/// The input errors that can be found without running the template (so a submit is refused
/// with a 400 instead of starting a job that fails): the templates that only parse their
/// inputs are run and their rows dropped; tool definitions and mocks are parsed.
pub fn precheck(def: &TemplateDef, inputs: &Inputs) -> Result<(), LabError> {
    match def.id {
        "sft_qa_pairs" | "dpo_pref_pairs" | "format_conversion" => {
            match generate(def, inputs, None, &mut crate::report::Silent) {
                Err(e @ LabError::Config { .. }) => Err(e),
                _ => Ok(()),
            }
        }
        "tool_use_traces" => traces::check_inputs(inputs),
        "hf_dataset_import" => hub::check_inputs(inputs),
        _ => Ok(()),
    }
}

/// Runs `def` on `inputs`; `llm` must be given for a template with `llm: true`.
pub fn generate(
    def: &TemplateDef,
    inputs: &Inputs,
    llm: Option<&dyn ChatClient>,
    progress: &mut dyn crate::Report,
) -> Result<Vec<Row>, LabError> {
    let rows = match def.id {
        "sft_qa_pairs" => local::qa_pairs(inputs),
        "dpo_pref_pairs" => local::pref_pairs(inputs)?,
        "code_completion" => local::code_pairs(inputs)?,
        "format_conversion" => local::convert_jsonl(inputs)?,
        _ => {
            let none = NoModel;
            let llm = match (llm, def.llm) {
                (Some(l), _) => l,
                (None, false) => &none,
                (None, true) => {
                    return Err(LabError::Generate(format!(
                        "{} needs a served chat model (it calls /v1/chat/completions)",
                        def.id
                    )));
                }
            };
            let mut g = Gen {
                inputs,
                llm,
                progress,
            };
            match def.id {
                "hf_dataset_import" => hub::import(&mut g)?,
                "style_transfer" => synth::style_transfer(&mut g)?,
                "self_instruct" => synth::self_instruct(&mut g)?,
                "prompt_reconstruction" => synth::prompt_reconstruction(&mut g)?,
                "multi_turn_chat" => synth::multi_turn_chat(&mut g)?,
                "rag_qa" => synth::rag_qa(&mut g)?,
                "cot_synthesis" => synth::cot_synthesis(&mut g)?,
                "tool_use_traces" => traces::tool_use_traces(&mut g)?,
                "verified_code" => traces::verified_code(&mut g)?,
                other => {
                    return Err(LabError::Generate(format!(
                        "template {other} has no generator"
                    )));
                }
            }
        }
    };
    Ok(rows)
}

/// [`generate`], then the split into `out_dir`.
pub fn build(
    def: &TemplateDef,
    inputs: &Inputs,
    out_dir: &Path,
    llm: Option<&dyn ChatClient>,
    progress: &mut dyn crate::Report,
) -> Result<Written, LabError> {
    let rows = generate(def, inputs, llm, progress)?;
    output::write_split(out_dir, &rows)
}

/// The client of templates that never call a model.
struct NoModel;

impl ChatClient for NoModel {
    fn chat(&self, _: &llm::ChatRequest) -> Result<llm::ChatReply, LabError> {
        Err(LabError::Generate(
            "this template has no model to call".into(),
        ))
    }
}

/// Non-empty trimmed lines.
pub(crate) fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Blocks separated by blank lines, each trimmed.
pub(crate) fn paragraphs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Vec<&str> = Vec::new();
    for line in text.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if !cur.is_empty() {
                out.push(cur.join("\n").trim().to_string());
                cur.clear();
            }
        } else {
            cur.push(line);
        }
    }
    out
}

/// Parts separated by lines of `---` (three or more dashes), each trimmed, empty ones dropped.
pub(crate) fn sections(text: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    for line in text.lines() {
        let t = line.trim();
        if t.len() >= 3 && t.chars().all(|c| c == '-') {
            out.push(String::new());
        } else if let Some(cur) = out.last_mut() {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}
