//! The `dataset` job kind: in-process (spec §5.4), config `{template_id, inputs, output_dir,
//! model_name, max_tokens, temperature}`. The loopback templates call the server this job
//! runs in, with its API key; the key is never written into the job's row.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use kiln_jobs::{ExecMode, JobContext, JobRunner, RunError, RunOutput};
use serde_json::{Map, Value};

use super::{HttpChat, Loopback};
use crate::LabError;
use crate::report::JobReport;

/// Where the server listens, set once it is bound (a port of 0 is only known then).
pub type LoopbackCell = Arc<OnceLock<Loopback>>;

/// Runs `dataset` jobs, writing default outputs under `datasets_dir`.
#[derive(Clone)]
pub struct DatasetRunner {
    datasets_dir: PathBuf,
    loopback: LoopbackCell,
}

/// The config keys a dataset job takes.
const KEYS: [&str; 6] = [
    "template_id",
    "inputs",
    "output_dir",
    "model_name",
    "max_tokens",
    "temperature",
];

impl DatasetRunner {
    /// A runner writing under `datasets_dir` whose LLM templates call `loopback` once set.
    pub fn new(datasets_dir: PathBuf, loopback: LoopbackCell) -> Self {
        DatasetRunner {
            datasets_dir,
            loopback,
        }
    }

    /// The checked job: template, inputs, output folder and model client settings.
    fn parse(&self, config: &Map<String, Value>) -> Result<Parsed, LabError> {
        if let Some(k) = config.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(LabError::config(
                k,
                format!("unknown field (fields: {})", KEYS.join(", ")),
            ));
        }
        let template_id = match config.get("template_id") {
            Some(Value::String(s)) => s.as_str(),
            _ => {
                return Err(LabError::config(
                    "template_id",
                    "is required: a template's id (GET /api/dataset/templates)",
                ));
            }
        };
        let empty = Map::new();
        let inputs = match config.get("inputs") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(m)) => m,
            Some(_) => return Err(LabError::config("inputs", "must be a JSON object")),
        };
        let (def, inputs) = super::check(template_id, inputs)?;
        let output_dir = match config.get("output_dir") {
            None | Some(Value::Null) => default_output(&self.datasets_dir, template_id),
            Some(Value::String(s)) if !s.trim().is_empty() => crate::expand_home(s),
            Some(_) => return Err(LabError::config("output_dir", "must be a folder path")),
        };
        let model = match config.get("model_name") {
            None | Some(Value::Null) => "local".to_string(),
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            Some(_) => return Err(LabError::config("model_name", "must be a non-empty string")),
        };
        let max_tokens = match config.get("max_tokens") {
            None | Some(Value::Null) => 512,
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=32768).contains(n))
                .ok_or_else(|| LabError::config("max_tokens", "must be an integer in 1..=32768"))?
                as u32,
        };
        let temperature = match config.get("temperature") {
            None | Some(Value::Null) => 0.7,
            Some(v) => v
                .as_f64()
                .filter(|t| (0.0..=2.0).contains(t))
                .ok_or_else(|| LabError::config("temperature", "must be a number in [0, 2]"))?,
        };
        Ok(Parsed {
            def,
            inputs,
            output_dir,
            model,
            max_tokens,
            temperature,
        })
    }
}

struct Parsed {
    def: super::TemplateDef,
    inputs: super::Inputs,
    output_dir: PathBuf,
    model: String,
    max_tokens: u32,
    temperature: f64,
}

/// `<dir>/dataset-<template id>-<ms>`.
fn default_output(dir: &Path, template_id: &str) -> PathBuf {
    let clean: String = template_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("dataset-{clean}-{}", kiln_jobs::event::now_ms()))
}

/// Refuses a folder that already holds a dataset: a new one would overwrite it.
fn check_output(dir: &Path) -> Result<(), LabError> {
    for name in ["train.jsonl", "valid.jsonl"] {
        if dir.join(name).exists() {
            return Err(LabError::config(
                "output_dir",
                format!(
                    "{} already holds {name}; choose another folder",
                    dir.display()
                ),
            ));
        }
    }
    if dir.exists() && !dir.is_dir() {
        return Err(LabError::config(
            "output_dir",
            format!("{} is not a folder", dir.display()),
        ));
    }
    Ok(())
}

impl JobRunner for DatasetRunner {
    fn mode(&self) -> ExecMode {
        ExecMode::InProcess
    }

    fn prepare(
        &self,
        mut config: Map<String, Value>,
    ) -> Result<(Map<String, Value>, Option<String>), String> {
        let p = self.parse(&config).map_err(|e| e.to_string())?;
        super::precheck(&p.def, &p.inputs).map_err(|e| e.to_string())?;
        if p.def.llm && self.loopback.get().is_none() {
            return Err(format!(
                "{} needs the served model, and this job host has none",
                p.def.id
            ));
        }
        check_output(&p.output_dir).map_err(|e| e.to_string())?;
        let out = p.output_dir.display().to_string();
        config.insert("output_dir".into(), Value::String(out.clone()));
        config.insert("inputs".into(), Value::Object(p.inputs.to_json()));
        Ok((config, Some(out)))
    }

    fn run(&self, ctx: &JobContext, config: &Map<String, Value>) -> Result<RunOutput, RunError> {
        let p = self.parse(config)?;
        ctx.stage("starting", Some(0.01), Some(p.def.label))?;
        let client = self.loopback.get().map(|l| {
            let mut c = HttpChat::new(l.clone());
            c.model = p.model.clone();
            c.max_tokens = p.max_tokens;
            c.temperature = p.temperature;
            c
        });
        let llm = client.as_ref().map(|c| c as &dyn super::ChatClient);
        let result = super::build(&p.def, &p.inputs, &p.output_dir, llm, &mut JobReport(ctx));
        let written = match result {
            Err(LabError::Cancelled) => {
                return Err(Box::new(ctx.check().err().unwrap_or(
                    kiln_jobs::Cancelled {
                        reason: "cancelled".into(),
                    },
                )));
            }
            other => other?,
        };
        let msg = format!("Wrote {} rows.", written.rows);
        ctx.stage("done", Some(1.0), Some(&msg))?;
        Ok(RunOutput {
            output_path: Some(written.output_dir.display().to_string()),
            summary: serde_json::to_value(&written).ok(),
        })
    }
}
