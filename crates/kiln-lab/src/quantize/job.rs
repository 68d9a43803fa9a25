//! The `quantize` job kind: a child-process job under the execution lease, config as spec §7.6
//! (snake_case), stages `starting`, `sensitivity` (one per module), `allocating`, `writing`,
//! then `done` with `output_dir` and the report.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_jobs::{ExecMode, JobContext, JobRunner, RunError, RunOutput};
use serde_json::{Map, Value};

use super::config::{OutputFormat, QuantizeConfig};
use super::run::quantize;
use crate::LabError;
use crate::report::JobReport;

/// Looks a model name up without downloading anything.
pub type Resolver = Arc<dyn Fn(&str) -> Option<PathBuf> + Send + Sync>;

/// Runs `quantize` jobs. `models_dir` is where outputs go when the config names no `out_dir`.
#[derive(Clone)]
pub struct QuantizeRunner {
    models_dir: PathBuf,
    resolve: Resolver,
}

impl QuantizeRunner {
    /// A runner writing default outputs under `models_dir`, finding named models with
    /// `resolve`.
    pub fn new(models_dir: PathBuf, resolve: Resolver) -> Self {
        QuantizeRunner {
            models_dir,
            resolve,
        }
    }

    fn parse(&self, config: &Map<String, Value>) -> Result<QuantizeConfig, LabError> {
        QuantizeConfig::from_json(config, &*self.resolve, |src, format, suffix| {
            default_output(&self.models_dir, src, format, suffix)
        })
    }
}

/// `<models_dir>/<source name>-kiln-<suffix>[.gguf]`.
fn default_output(dir: &Path, source: &Path, format: OutputFormat, suffix: &str) -> PathBuf {
    // A folder's whole name (`Qwen2.5-0.5B` has dots); a file's without its extension.
    let stem = if source.is_dir() {
        source.file_name()
    } else {
        source.file_stem()
    }
    .map(|s| s.to_string_lossy().to_string())
    .unwrap_or_else(|| "model".into());
    let clean: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = format!("{clean}-kiln-{suffix}");
    match format {
        OutputFormat::Gguf => dir.join(format!("{name}.gguf")),
        OutputFormat::Mlx => dir.join(name),
    }
}

/// The `evaluating` stage: the result's KL/top-1 against the source, as a `metric{kind:"eval"}`
/// event and the summary's `eval`.
fn evaluate(ctx: &JobContext, cfg: &QuantizeConfig, output: &Path) -> Result<Value, RunError> {
    ctx.stage(
        "evaluating",
        Some(0.99),
        Some("KL and top-1 against the source"),
    )?;
    let r = super::evaluate::evaluate(&cfg.source, output)?;
    let eval = serde_json::json!({
        "mean_kl": r.mean_kl, "p99_kl": r.p99_kl, "max_kl": r.max_kl,
        "top1_agreement": r.top1_agreement, "positions": r.positions,
        "perplexity": r.perplexity, "reference_perplexity": r.reference_perplexity,
    });
    let mut metric = eval.clone();
    metric["type"] = "metric".into();
    metric["kind"] = "eval".into();
    metric["ts"] = kiln_jobs::event::now_ms().into();
    ctx.emit(metric)?;
    Ok(eval)
}

impl JobRunner for QuantizeRunner {
    fn mode(&self) -> ExecMode {
        ExecMode::Child
    }

    fn prepare(
        &self,
        mut config: Map<String, Value>,
    ) -> Result<(Map<String, Value>, Option<String>), String> {
        std::fs::create_dir_all(&self.models_dir)
            .map_err(|e| format!("{}: {e}", self.models_dir.display()))?;
        let cfg = self.parse(&config).map_err(|e| e.to_string())?;
        // Headers only: a target the candidates cannot reach is refused before a row exists.
        let files = kiln_model::files::ModelFiles::open(&cfg.source).map_err(|e| e.to_string())?;
        super::assign::check_target_reachable(&cfg, &files.config).map_err(|e| e.to_string())?;
        let out = cfg.out.display().to_string();
        config.insert("out_dir".into(), Value::String(out.clone()));
        Ok((config, Some(out)))
    }

    fn run(&self, ctx: &JobContext, config: &Map<String, Value>) -> Result<RunOutput, RunError> {
        let cfg = self.parse(config)?;
        let report = quantize(&cfg, &mut JobReport(ctx)).map_err(|e| match e {
            LabError::Cancelled => Box::new(kiln_jobs::Cancelled {
                reason: "cancelled".into(),
            }) as RunError,
            other => Box::new(other) as RunError,
        })?;
        let mut summary = serde_json::to_value(&report).unwrap_or(Value::Null);
        if let Some(o) = summary.as_object_mut() {
            o.remove("sensitivity");
        }
        // The model is written by now: a failed evaluation is a warning, not a failed job.
        if cfg.evaluate {
            match evaluate(ctx, &cfg, &report.output) {
                Ok(eval) => summary["eval"] = eval,
                Err(e) if ctx.check().is_err() => return Err(e),
                Err(e) => {
                    let line = format!("warning: evaluation skipped: {e}");
                    let _ = ctx.emit(kiln_jobs::event::log(&line));
                }
            }
        }
        Ok(RunOutput {
            output_path: Some(report.output.display().to_string()),
            summary: Some(summary),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_keep_a_folder_whole_and_drop_a_file_extension() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("Qwen2.5-0.5B");
        std::fs::create_dir(&folder).unwrap();
        let out = default_output(dir.path(), &folder, OutputFormat::Gguf, "Q4_K");
        assert_eq!(out, dir.path().join("Qwen2.5-0.5B-kiln-Q4_K.gguf"));
        let file = dir.path().join("smol.Q4_1.gguf");
        let out = default_output(dir.path(), &file, OutputFormat::Mlx, "4bit");
        assert_eq!(out, dir.path().join("smol.Q4_1-kiln-4bit"));
    }
}
