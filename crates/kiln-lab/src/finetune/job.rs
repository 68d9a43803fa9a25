//! The `finetune` job kind: a child-process job under the execution lease, config as spec §8.3
//! (snake_case), stages `loading`, `data`, `training` (with `metric` events), `saving`; a stop
//! request saves the adapter so far and finishes as `done`.

use std::path::{Path, PathBuf};

use kiln_jobs::{ExecMode, JobContext, JobRunner, RunError, RunOutput};
use serde_json::{Map, Value};

use super::config::FinetuneConfig;
use super::run::finetune;
use crate::LabError;
use crate::quantize::job::Resolver;
use crate::report::JobReport;

/// Runs `finetune` jobs; adapters go under `adapters_dir` when the config names no
/// `adapter_path`.
#[derive(Clone)]
pub struct FinetuneRunner {
    adapters_dir: PathBuf,
    resolve: Resolver,
}

impl FinetuneRunner {
    /// A runner writing default adapters under `adapters_dir`, finding named models with
    /// `resolve`.
    pub fn new(adapters_dir: PathBuf, resolve: Resolver) -> Self {
        Self {
            adapters_dir,
            resolve,
        }
    }

    /// The model a config's `model_dir` names: a path, else a model name.
    pub fn model_path(&self, model_dir: &str) -> Result<PathBuf, LabError> {
        let p = Path::new(model_dir);
        if p.exists() {
            return Ok(p.to_path_buf());
        }
        (self.resolve)(model_dir).ok_or_else(|| {
            LabError::config(
                "model_dir",
                format!("{model_dir:?} is neither a path nor a model kiln knows"),
            )
        })
    }
}

/// `<dir>/adapter-<ms>`.
fn default_adapter(dir: &Path) -> PathBuf {
    dir.join(format!("adapter-{}", kiln_jobs::event::now_ms()))
}

impl JobRunner for FinetuneRunner {
    fn mode(&self) -> ExecMode {
        ExecMode::Child
    }

    fn prepare(
        &self,
        mut config: Map<String, Value>,
    ) -> Result<(Map<String, Value>, Option<String>), String> {
        if config.get("adapter_path").is_none_or(|v| v.is_null()) {
            let out = default_adapter(&self.adapters_dir).display().to_string();
            config.insert("adapter_path".into(), Value::String(out));
        }
        let cfg = FinetuneConfig::from_json(&config).map_err(|e| e.to_string())?;
        self.model_path(&cfg.model_dir).map_err(|e| e.to_string())?;
        if !cfg.data_dir.exists() {
            return Err(format!(
                "data_dir: {} does not exist",
                cfg.data_dir.display()
            ));
        }
        if cfg.adapter_path.join("adapter_config.json").exists() {
            return Err(format!(
                "adapter_path: {} already holds an adapter",
                cfg.adapter_path.display()
            ));
        }
        let out = cfg.adapter_path.display().to_string();
        Ok((config, Some(out)))
    }

    fn run(&self, ctx: &JobContext, config: &Map<String, Value>) -> Result<RunOutput, RunError> {
        let cfg = FinetuneConfig::from_json(config)?;
        let model = self.model_path(&cfg.model_dir)?;
        let report = finetune(&cfg, &model, &mut JobReport(ctx)).map_err(|e| match e {
            LabError::Cancelled => Box::new(kiln_jobs::Cancelled {
                reason: "cancelled".into(),
            }) as RunError,
            other => Box::new(other) as RunError,
        })?;
        Ok(RunOutput {
            output_path: Some(report.adapter_path.display().to_string()),
            summary: serde_json::to_value(&report).ok(),
        })
    }
}
