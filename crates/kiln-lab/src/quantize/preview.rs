//! What a quantize config would produce, from the source's headers alone (no tensor is read):
//! the result's weight bytes and, through `fit`, its longest context in this machine's memory.

use std::path::PathBuf;

use kiln_engine::kv_scheme::memory::{self, FitParams};
use kiln_engine::kv_scheme::{DenseDtype, KvScheme};
use kiln_model::backend::cpu::CpuBackend;
use kiln_model::files::ModelFiles;
use serde::Serialize;
use serde_json::{Map, Value};

use super::config::{OutputFormat, QuantizeConfig};
use super::plan::{Layout, gguf_fallback, is_quantizable};
use crate::LabError;

/// The source as it is.
#[derive(Debug, Clone, Serialize)]
pub struct SourceInfo {
    /// The file or folder.
    pub path: PathBuf,
    /// Tensor bytes.
    pub size_bytes: u64,
    /// Parameters.
    pub params: u64,
}

/// The result, estimated.
#[derive(Debug, Clone, Serialize)]
pub struct ResultEstimate {
    /// Stored bits per parameter over the whole model.
    pub bits_per_weight: f64,
    /// Weight bytes.
    pub weights_bytes: u64,
    /// Longest context that fits `budget_bytes` with a dense f16 cache (0: none).
    pub max_context: usize,
    /// The memory budget (this process's room).
    pub budget_bytes: u64,
    /// Whether the model's default context (at most 4096) fits.
    pub fits: bool,
    /// The context `fits` is about.
    pub ctx: usize,
}

/// The preview of a config (the quantize job's keys; the output is not checked).
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    /// The source.
    pub source: SourceInfo,
    /// The estimate.
    pub result: ResultEstimate,
}

/// Estimates `config` against the budget (`None`: this process's room, when readable).
pub fn preview(
    config: &Map<String, Value>,
    resolve: &dyn Fn(&str) -> Option<PathBuf>,
    budget: Option<u64>,
) -> Result<Preview, LabError> {
    let cfg = QuantizeConfig::parse_json(config, resolve, |_, _, _| PathBuf::new())?;
    if !cfg.source.exists() {
        let msg = format!(
            "{} is neither a path nor a model kiln knows",
            cfg.source.display()
        );
        return Err(LabError::config("model_id", msg));
    }
    let files = ModelFiles::open(&cfg.source)?;
    super::assign::check_target_reachable(&cfg, &files.config)?;
    let (mut params, mut bits) = (0u64, 0f64);
    let float_bits = if cfg.format == OutputFormat::Mlx {
        16.0
    } else {
        32.0
    };
    for (name, shape) in files.tensors().tensor_shapes() {
        let n: u64 = shape.iter().map(|&d| d as u64).product();
        params += n;
        let (rows, cols) = match shape[..] {
            [r, c] => (r, c),
            _ => (1, n as usize),
        };
        bits += n as f64 * stored_bits(&cfg, &name, rows, cols).unwrap_or(float_bits);
    }
    let weights_bytes = (bits / 8.0).ceil() as u64;
    let budget_bytes = budget
        .or_else(|| memory::default_memory_budget().map(|b| b.bytes))
        .unwrap_or(0);
    let ctx = files.config.max_position_embeddings.min(4096);
    let report = memory::fit(
        &CpuBackend::new(Default::default()),
        &files.config,
        &KvScheme::dense(DenseDtype::F16),
        FitParams {
            weight_bytes: weights_bytes,
            largest_tensor_bytes: files.tensors().largest_tensor_bytes(),
            ctx,
            chunk: memory::DEFAULT_PREFILL_CHUNK,
            budget_bytes,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        },
    );
    Ok(Preview {
        source: SourceInfo {
            path: cfg.source.clone(),
            size_bytes: files.tensors().total_tensor_bytes(),
            params,
        },
        result: ResultEstimate {
            bits_per_weight: if params > 0 {
                bits / params as f64
            } else {
                0.0
            },
            weights_bytes,
            max_context: report.max_safe_context,
            budget_bytes,
            fits: report.fits,
            ctx,
        },
    })
}

/// Bits per value a quantized weight takes (`None`: kept as floats). A mixed run's average
/// is its target.
fn stored_bits(cfg: &QuantizeConfig, name: &str, rows: usize, cols: usize) -> Option<f64> {
    let group = if cfg.format == OutputFormat::Mlx {
        cfg.group_size
    } else {
        32
    };
    if !is_quantizable(name, rows, cols, group) {
        return None;
    }
    if let Some(t) = cfg.target_bpw {
        return Some(t);
    }
    let layout = match cfg.format {
        OutputFormat::Gguf => {
            let ty = gguf_fallback(cfg.uniform_gguf_type(), cols);
            (!ty.is_float()).then_some(Layout::Gguf(ty))?
        }
        OutputFormat::Mlx => Layout::Affine {
            bits: cfg.bits,
            group: cfg.group_size,
        },
    };
    Some(layout.bits_per_weight())
}
