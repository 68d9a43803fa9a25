//! The measured half of a mixed run: each module's sensitivity, measured on calibration text
//! with kiln's own forward (after a check that the probe fits in memory) or read back from an
//! earlier report.

use std::path::Path;

use kiln_model::config::ModelConfig;
use kiln_model::files::ModelFiles;

use super::allocate::LayerSensitivity;
use super::assign::{all_matrices, module_for};
use super::calibration;
use super::config::QuantizeConfig;
use super::run::SensitivityRow;
use super::sensitivity::{Module, Probe, measure};
use super::write::source_tokenizer;
use crate::{LabError, Report};

/// Reads the `sensitivity` rows of an earlier report (or `optiq_metadata.json`); each module
/// must be a matrix of this model.
pub(super) fn load_sensitivity(
    cfg: &QuantizeConfig,
    path: &Path,
    config: &ModelConfig,
) -> Result<Vec<LayerSensitivity>, LabError> {
    let field = "sensitivity_from";
    let text = std::fs::read_to_string(path).map_err(|e| LabError::io(path, e))?;
    let rows = parse_sensitivity(&text)
        .map_err(|e| LabError::config(field, format!("{}: {e}", path.display())))?;
    let candidates = cfg.candidates();
    let mut out = Vec::new();
    for r in rows {
        let name = format!("{}.weight", r.module);
        let Some(module) = module_for(cfg, config, name) else {
            continue; // the embedding, a head, or a row the format cannot group: uniform
        };
        if (module.rows * module.cols) as u64 != r.params {
            return Err(LabError::config(
                field,
                format!("{} is not a matrix of this model", r.module),
            ));
        }
        if let Some(b) = candidates.iter().find(|b| !r.kl.contains_key(b)) {
            return Err(LabError::config(
                field,
                format!("{} has no KL at {b} bits", r.module),
            ));
        }
        out.push(LayerSensitivity {
            name: r.module,
            param_count: r.params,
            kl: r.kl,
        });
    }
    if out.is_empty() {
        return Err(LabError::config(
            field,
            "no row names a projection of this model",
        ));
    }
    Ok(out)
}

/// The `sensitivity` rows of a report's JSON text (the fuzz target's entry point).
pub fn parse_sensitivity(text: &str) -> Result<Vec<SensitivityRow>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let rows: Vec<SensitivityRow> =
        serde_json::from_value(v.get("sensitivity").cloned().unwrap_or_default())
            .map_err(|e| format!("`sensitivity` rows: {e}"))?;
    if rows.is_empty() {
        return Err("no sensitivity rows".into());
    }
    Ok(rows)
}

/// Measures every eligible matrix at every candidate width.
pub(super) fn sensitivities(
    cfg: &QuantizeConfig,
    files: &ModelFiles,
    rep: &mut dyn Report,
) -> Result<Vec<LayerSensitivity>, LabError> {
    let tokenizer = source_tokenizer(files)?;
    let text = match &cfg.calibration {
        Some(p) => calibration::read_text(p)?,
        None => calibration::BUILTIN.to_string(),
    };
    let chunks = calibration::chunks(&tokenizer, &text, cfg.n_calibration, cfg.seq_len)?;
    rep.stage(
        "sensitivity",
        0.02,
        &format!(
            "reference forward over {} chunks of {}",
            chunks.len(),
            cfg.seq_len
        ),
    )?;
    check_probe_memory(&files.config, chunks.len() * cfg.seq_len)?;
    let mut probe = Probe::new(files.tensors(), &files.config, &chunks)?;
    let modules: Vec<Module> = all_matrices(&files.config)
        .into_iter()
        .filter_map(|(module, _, _)| module_for(cfg, &files.config, format!("{module}.weight")))
        .collect();
    rep.stage(
        "sensitivity",
        0.05,
        &format!("{} modules × {:?} bits", modules.len(), cfg.candidates()),
    )?;
    measure(
        &mut probe,
        files.tensors(),
        &modules,
        &mut |done, total, measured| {
            rep.metric(serde_json::json!({
                "type": "metric",
                "kind": "sensitivity",
                "module": measured.name,
                "params": measured.param_count,
                "index": done,
                "total": total,
                "kl": measured.kl,
            }))?;
            let p = 0.05 + 0.85 * done as f64 / total as f64;
            rep.stage(
                "sensitivity",
                p,
                &format!("{done}/{total} {}", measured.name),
            )
        },
    )
}

/// Refuses a calibration size whose measurement would not fit in memory: the f32 model, the
/// reference log-probabilities and one test forward's logits (`tokens × vocab` each), and the
/// recorded hidden states, against the machine's available memory.
fn check_probe_memory(c: &ModelConfig, tokens: usize) -> Result<(), LabError> {
    let params = all_matrices(c).iter().map(|(_, r, k)| r * k).sum::<usize>() as f64;
    let logits = (tokens * c.vocab_size) as f64 * 4.0 * 2.0;
    let hidden = ((c.num_layers + 1) * tokens * c.hidden_size) as f64 * 4.0;
    let need = params * 4.0 + logits + hidden;
    let Some(available) = available_bytes() else {
        return Ok(());
    };
    if need > available as f64 {
        return Err(LabError::config(
            "n_calibration",
            format!(
                "measuring {tokens} calibration tokens needs about {:.1} GB, {:.1} GB is available; lower n_calibration or seq_len",
                need / 1e9,
                available as f64 / 1e9
            ),
        ));
    }
    Ok(())
}

/// `MemAvailable` from /proc/meminfo, when the platform has it.
fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
