//! Per-layer sensitivity: KL(reference ‖ model with one layer quantized) over calibration
//! chunks, with kiln's own forward on f32 weights (no quantized probe model is needed, unlike
//! mlx-bun's 8-bit baseline; this is optiq's bf16-reference path).

use std::collections::BTreeMap;

use kiln_model::arch::{Model, Resume};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::backend::{Backend, BatchLayout, HostAct, HostTensor, KvLayout, SeqSpan};
use kiln_model::config::ModelConfig;
use kiln_model::weights::TensorSource;

use super::allocate::LayerSensitivity;
use super::plan::Layout;
use crate::LabError;

/// The reference model and its next-token distributions over the calibration chunks.
pub struct Probe {
    backend: CpuBackend,
    model: Model<CpuBackend>,
    kv: <CpuBackend as Backend>::Kv,
    tokens: Vec<u32>,
    batch: BatchLayout,
    vocab: usize,
    /// Log-softmax of the reference logits, `[positions × vocab]`.
    reference: Vec<f32>,
    /// The reference's input to each layer, then the last layer's output.
    hidden: Vec<HostAct>,
}

impl Probe {
    /// Loads `src` as f32 and runs the reference forward over `chunks` (all of one length).
    pub fn new(
        src: &dyn TensorSource,
        config: &ModelConfig,
        chunks: &[Vec<u32>],
    ) -> Result<Self, LabError> {
        let backend = CpuBackend::new(CpuOptions { dense: true });
        let model = Model::load(&backend, src, config.clone())?;
        let seq = chunks.first().map_or(0, Vec::len);
        let kv = backend.new_kv(KvLayout::for_model(config, chunks.len(), seq))?;
        let batch = BatchLayout {
            spans: (0..chunks.len())
                .map(|slot| SeqSpan {
                    slot,
                    start_pos: 0,
                    n_tokens: seq,
                })
                .collect(),
        };
        let mut probe = Probe {
            backend,
            model,
            kv,
            tokens: chunks.concat(),
            batch,
            vocab: config.vocab_size,
            reference: Vec::new(),
            hidden: Vec::new(),
        };
        let mut hidden = Vec::new();
        let capture = Resume {
            from: 0,
            input: None,
            capture: Some(&mut hidden),
        };
        let mut logits = (probe.model).forward_from(
            &probe.backend,
            &mut probe.kv,
            &probe.tokens,
            &probe.batch,
            capture,
        )?;
        probe.hidden = hidden;
        for row in logits.chunks_exact_mut(probe.vocab) {
            log_softmax_in_place(row);
        }
        probe.reference = logits;
        Ok(probe)
    }

    /// Runs from the first layer `name` feeds (the embedding feeds the first layer and, when
    /// tied, the head; an untied head only the head), reusing the reference's hidden states
    /// before it.
    fn forward_changed(&mut self, name: &str) -> Result<Vec<f32>, LabError> {
        let layers = self.hidden.len().saturating_sub(1);
        let from = match name {
            "lm_head.weight" => layers,
            _ => name
                .strip_prefix("model.layers.")
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
                .unwrap_or(0),
        };
        let input = if from == 0 {
            None
        } else {
            self.hidden.get(from)
        };
        let resume = Resume {
            from,
            input,
            capture: None,
        };
        Ok((self.model).forward_from(
            &self.backend,
            &mut self.kv,
            &self.tokens,
            &self.batch,
            resume,
        )?)
    }

    /// Mean KL(reference ‖ model with matrix `name` replaced by `weights`); the original
    /// matrix is back in place afterwards, whether the forward worked or not.
    pub fn kl_with(&mut self, name: &str, weights: HostTensor) -> Result<f64, LabError> {
        let role = kiln_model::arch::matrix_role(name);
        let replacement = self.backend.matrix(name, role, weights)?;
        let original = self.model.replace_matrix(name, replacement)?;
        let logits = self.forward_changed(name);
        self.model.replace_matrix(name, original)?;
        Ok(mean_kl(&self.reference, &logits?, self.vocab))
    }
}

/// Mean over positions of Σ p_ref·(log p_ref − log p_test), `reference` already log-softmaxed.
pub fn mean_kl(reference: &[f32], test: &[f32], vocab: usize) -> f64 {
    let mut total = 0f64;
    let mut rows = 0usize;
    let mut buf = vec![0f32; vocab];
    for (r, t) in reference.chunks_exact(vocab).zip(test.chunks_exact(vocab)) {
        buf.copy_from_slice(t);
        log_softmax_in_place(&mut buf);
        let kl: f64 = r
            .iter()
            .zip(&buf)
            .map(|(&lr, &lt)| (lr.exp() * (lr - lt)) as f64)
            .sum();
        if kl.is_nan() {
            // A layout that breaks the forward must not score as lossless.
            return f64::NAN;
        }
        total += kl.max(0.0);
        rows += 1;
    }
    total / rows.max(1) as f64
}

fn log_softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&v| ((v - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    for v in row.iter_mut() {
        *v -= lse;
    }
}

/// `data` (`rows × cols` f32) stored in `layout` and read back, as an f32 tensor the dense
/// backend takes: the weights the output file will hold, in the form the probe runs.
pub fn simulate(
    layout: Layout,
    data: &[f32],
    rows: usize,
    cols: usize,
) -> Result<HostTensor, LabError> {
    let values = match layout {
        Layout::Gguf(ty) => {
            let bytes = kiln_kernels::encode::encode_rows(ty, data, rows, cols)?.into();
            HostTensor {
                ty,
                rows,
                cols,
                bytes,
            }
            .to_f32()?
        }
        Layout::Affine { bits, group } => {
            let rounded = round_to_bf16(data);
            let m = kiln_model::mlx::affine::affine_quantize(&rounded, rows, cols, bits, group)?;
            kiln_model::mlx::affine::affine_dequantize(&m)
        }
    };
    Ok(HostTensor {
        ty: kiln_kernels::GgmlType::F32,
        rows,
        cols,
        bytes: values
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
    })
}

/// MLX quantizes bf16 weights; rounding first gives its exact codes.
pub fn round_to_bf16(data: &[f32]) -> Vec<f32> {
    data.iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect()
}

/// One module to measure: its weight name, shape and the layout of each candidate width.
pub struct Module {
    /// Weight name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// The layout each candidate width stores this module in.
    pub layouts: Vec<(u32, Layout)>,
}

/// Measures every module at every candidate width. Widths that share a layout are measured
/// once. `on_module(done, total, name)` runs after each module and may stop the run (its error
/// is returned), which is how cancellation reaches layer boundaries.
pub fn measure(
    probe: &mut Probe,
    src: &dyn TensorSource,
    modules: &[Module],
    on_module: &mut dyn FnMut(usize, usize, &LayerSensitivity) -> Result<(), LabError>,
) -> Result<Vec<LayerSensitivity>, LabError> {
    let mut out = Vec::with_capacity(modules.len());
    for (i, m) in modules.iter().enumerate() {
        let data = src
            .tensor(&m.name)?
            .ok_or_else(|| kiln_model::ModelError::Tensor {
                path: src.path().into(),
                name: m.name.clone(),
                reason: "missing".into(),
            })?
            .to_f32()?;
        let mut by_layout: Vec<(Layout, f64)> = Vec::new();
        let mut kl = BTreeMap::new();
        for &(bits, layout) in &m.layouts {
            let value = match by_layout.iter().find(|(l, _)| *l == layout) {
                Some(&(_, v)) => v,
                None => {
                    let v = probe.kl_with(&m.name, simulate(layout, &data, m.rows, m.cols)?)?;
                    by_layout.push((layout, v));
                    v
                }
            };
            kl.insert(bits, value);
        }
        let measured = LayerSensitivity {
            name: super::plan::module_of(&m.name).to_string(),
            param_count: (m.rows * m.cols) as u64,
            kl,
        };
        on_module(i + 1, modules.len(), &measured)?;
        out.push(measured);
    }
    Ok(out)
}
