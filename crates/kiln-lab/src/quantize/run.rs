//! One quantize run, start to finish: open the source, measure and allocate when mixed, write
//! into a temporary name beside the output, rename at the end. Shared by `kiln quantize` and the
//! `quantize` job; both report through [`Report`](crate::Report).

use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_model::files::{ModelFiles, WeightFiles};
use serde::Serialize;

use super::config::{OutputFormat, QuantizeConfig};
use super::hf_export;
use crate::{LabError, Report};

use super::assign::{allocate_to_size, check_target_reachable};
use super::measure::{load_sensitivity, sensitivities};
use super::write::{write_gguf, write_mlx};

/// What a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct QuantizeReport {
    /// The file or folder written.
    pub output: PathBuf,
    /// `gguf` or `mlx`.
    pub format: &'static str,
    /// Stored bits per weight over the quantized tensors (scales included).
    pub achieved_bpw: f64,
    /// Bytes of tensor data written.
    pub tensor_bytes: u64,
    /// Bytes of the output on disk.
    pub file_bytes: u64,
    /// Each tensor's layout, in file order.
    pub tensors: Vec<(String, String)>,
    /// Mixed runs: the width each measured module got.
    pub allocation: Option<Vec<(String, u32)>>,
    /// Mixed runs: the KL each module measured at each width.
    pub sensitivity: Option<Vec<SensitivityRow>>,
    /// Seconds measuring sensitivity.
    pub sensitivity_secs: f64,
    /// Seconds in all.
    pub total_secs: f64,
}

/// One module's measured sensitivity, as reported.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SensitivityRow {
    /// Module path.
    pub module: String,
    /// Parameters.
    pub params: u64,
    /// KL(reference ‖ module at that width), by width.
    pub kl: std::collections::BTreeMap<u32, f64>,
}

/// Runs `cfg` to completion. On any error (cancellation included) the temporary output is
/// removed and nothing exists under the final name.
pub fn quantize(cfg: &QuantizeConfig, rep: &mut dyn Report) -> Result<QuantizeReport, LabError> {
    cfg.validate()?;
    let started = Instant::now();
    rep.stage(
        "starting",
        0.01,
        &format!("reading {}", cfg.source.display()),
    )?;
    let files = ModelFiles::open(&cfg.source)?;
    if let Some(ty) = quantized_source_type(&files) {
        rep.warn(&format!(
            "the source holds {} weights: they are dequantized first, and the new quantization error adds to theirs",
            ty
        ));
    }
    check_format(cfg, &files)?;
    let tmp = temp_path(&cfg.out);
    let result = run_into(cfg, &files, &tmp, rep, started);
    match result {
        Ok(mut report) => {
            if cfg.out.exists() {
                remove(&tmp);
                return Err(LabError::config(
                    "out_dir",
                    format!("{} appeared while quantizing", cfg.out.display()),
                ));
            }
            std::fs::rename(&tmp, &cfg.out).map_err(|e| {
                remove(&tmp);
                LabError::io(&cfg.out, e)
            })?;
            report.output = cfg.out.clone();
            report.file_bytes = disk_bytes(&cfg.out);
            report.total_secs = started.elapsed().as_secs_f64();
            Ok(report)
        }
        Err(e) => {
            remove(&tmp);
            Err(e)
        }
    }
}

/// Refuses a source the chosen format cannot be written from, before anything is measured.
fn check_format(cfg: &QuantizeConfig, files: &ModelFiles) -> Result<(), LabError> {
    match (cfg.format, &files.source) {
        (OutputFormat::Gguf, WeightFiles::Safetensors(_)) => Err(LabError::config(
            "format",
            "GGUF output needs a GGUF source for now (the tokenizer is carried from its metadata); use format mlx for a Hugging Face folder",
        )),
        (OutputFormat::Mlx, WeightFiles::Gguf(_)) => {
            hf_export::config_json(&files.config).map(|_| ())
        }
        _ => Ok(()),
    }
}

/// The run proper, into `tmp`: the allocation (mixed runs) and the writing.
fn run_into(
    cfg: &QuantizeConfig,
    files: &ModelFiles,
    tmp: &Path,
    rep: &mut dyn Report,
    started: Instant,
) -> Result<QuantizeReport, LabError> {
    let mut report = QuantizeReport {
        output: tmp.into(),
        format: cfg.format.name(),
        achieved_bpw: 0.0,
        tensor_bytes: 0,
        file_bytes: 0,
        tensors: vec![],
        allocation: None,
        sensitivity: None,
        sensitivity_secs: 0.0,
        total_secs: 0.0,
    };
    check_target_reachable(cfg, &files.config)?;
    let allocation = match cfg.target_bpw {
        Some(target) => {
            let sens = match &cfg.sensitivity_from {
                Some(path) => load_sensitivity(cfg, path, &files.config)?,
                None => sensitivities(cfg, files, rep)?,
            };
            report.sensitivity_secs = started.elapsed().as_secs_f64();
            rep.stage(
                "allocating",
                0.92,
                &format!("{} modules, target {target} bpw", sens.len()),
            )?;
            let bits = allocate_to_size(cfg, &files.config, &sens, target)?;
            report.sensitivity = Some(
                sens.into_iter()
                    .map(|s| SensitivityRow {
                        module: s.name,
                        params: s.param_count,
                        kl: s.kl,
                    })
                    .collect(),
            );
            Some(bits)
        }
        None => None,
    };
    if let Some(a) = &allocation {
        let high = a.iter().filter(|(_, b)| *b > cfg.candidates()[0]).count();
        rep.stage(
            "allocating",
            0.95,
            &format!("{high} of {} modules above the lowest width", a.len()),
        )?;
    }
    let written = match cfg.format {
        OutputFormat::Gguf => write_gguf(cfg, files, tmp, allocation.as_deref(), rep)?,
        OutputFormat::Mlx => write_mlx(
            cfg,
            files,
            tmp,
            allocation.as_deref(),
            report.sensitivity.as_deref(),
            rep,
        )?,
    };
    report.achieved_bpw = written.achieved_bpw();
    report.tensor_bytes = written.data_bytes;
    report.tensors = written.tensors;
    report.allocation = allocation;
    Ok(report)
}

/// The quantized type of a source's matrices, if they are quantized.
fn quantized_source_type(files: &ModelFiles) -> Option<String> {
    if let WeightFiles::Safetensors(st) = &files.source {
        let widths = st.mlx_widths()?;
        let bits: Vec<String> = widths.keys().map(|b| format!("{b}-bit")).collect();
        return Some(format!("MLX affine {}", bits.join("/")));
    }
    let gguf = files.gguf()?;
    gguf.header()
        .tensors
        .iter()
        .find(|t| t.dims.len() == 2 && !t.ty.is_float())
        .map(|t| t.ty.name().to_string())
}

/// `.<name>.kiln-partial-<pid>` beside `out`: never mistaken for a finished output.
fn temp_path(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    out.with_file_name(format!(".{name}.kiln-partial-{}", std::process::id()))
}

/// Removes a partial output, file or folder; what cannot be removed is left.
fn remove(path: &Path) {
    let _ = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
}

/// Bytes of a file, or of every file in a folder.
fn disk_bytes(path: &Path) -> u64 {
    if path.is_file() {
        return path.metadata().map(|m| m.len()).unwrap_or(0);
    }
    std::fs::read_dir(path)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
