//! LoRA adapters as files (spec §3.7, §8.4, §8.6): PEFT's layout (`adapter_model.safetensors`,
//! A `[r, in]` and B `[out, r]` under `base_model.model.`) and mlx-lm/optiq's
//! (`adapters.safetensors`, A `[in, r]` and B `[r, out]`), with their JSON configs.
//!
//! In memory every module is held in mlx's orientation with its scale resolved, so that serving
//! and training only ever compute `y += s·(x·A)·B`; which config field gave `s` is settled here,
//! at load. Loading is all-or-nothing: one bad tensor or field refuses the whole adapter, with an
//! error naming the file and the tensor or field.

mod config;
mod mlx;
mod peft;
mod served;
mod tensors;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ModelError;
use crate::arch::LAYER_MATRICES;
use crate::config::ModelConfig;

pub use served::{
    AdapterStack, LoraModule, NO_ADAPTER, STACK_SEPARATOR, ServedAdapter, check_adapter_id,
};

/// PEFT's weights file (A `[r, in]`, B `[out, r]`).
pub const PEFT_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// mlx-lm's and optiq's weights file (A `[in, r]`, B `[r, out]`).
pub const MLX_WEIGHTS_FILE: &str = "adapters.safetensors";
/// The PEFT / mlx-lm config (both tools read the same file name).
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// optiq's own config, whose scale wins over the others (spec §8.4).
pub const OPTIQ_CONFIG_FILE: &str = "optiq_lora_config.json";
/// The largest adapter accepted: bytes of A and B together, in f32.
pub const MAX_ADAPTER_BYTES: u64 = 4 << 30;

/// One adapted linear: y += s · (x·A)·B, with x [tokens, in].
#[derive(Debug, Clone, PartialEq)]
pub struct LoraWeights {
    /// Input width of the adapted linear.
    pub in_features: usize,
    /// Output width of the adapted linear.
    pub out_features: usize,
    /// Rank of this module (ranks may differ between modules, spec §8.5).
    pub rank: usize,
    /// A, `[in, rank]` row-major.
    pub a: Vec<f32>,
    /// B, `[rank, out]` row-major.
    pub b: Vec<f32>,
    /// The s multiplying (x·A)·B, rank scaling (rs-LoRA's `/√r`) folded in.
    pub scale: f32,
}

/// An adapter: modules keyed by their module path under the model, e.g.
/// "model.layers.3.self_attn.q_proj".
#[derive(Debug, Clone, PartialEq)]
pub struct LoraAdapter {
    /// The adapted modules.
    pub modules: BTreeMap<String, LoraWeights>,
    /// The model it was trained on (`base_model_name_or_path` / optiq's `source_model`).
    pub base_model: Option<String>,
    /// What the config files say besides the tensors.
    pub info: AdapterInfo,
}

/// What the config files say besides the tensors (written by save, read back by load).
///
/// The default is the trainer's (spec §8.3). At load, a field no file states falls back to the
/// default, except `rank` (the largest module rank), `rank_scaling` (`constant`: nothing says the
/// ranks were allocated), `target_modules` (the modules' last path components) and `num_layers`
/// (-1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdapterInfo {
    /// The base rank (modules may have others).
    pub rank: usize,
    /// The configured scale, before rs-LoRA's division by √r.
    pub scale: f32,
    /// Rank-stabilised LoRA: a module of rank r is served with `scale/√r`.
    pub rs_lora: bool,
    /// The training method (`sft`, `dpo`, `orpo`, `vision`).
    pub method: String,
    /// How ranks were allocated (`constant`, `by_bits`, `by_kl`; spec §8.5).
    pub rank_scaling: String,
    /// The target suffixes, e.g. `["q_proj", "v_proj"]`.
    pub target_modules: Vec<String>,
    /// The last `num_layers` blocks were adapted (-1: all).
    pub num_layers: i64,
    /// LoRA dropout used in training.
    pub dropout: f32,
}

impl Default for AdapterInfo {
    fn default() -> Self {
        Self {
            rank: 8,
            scale: 1.0,
            rs_lora: false,
            method: "sft".into(),
            rank_scaling: "by_bits".into(),
            target_modules: LAYER_MATRICES
                .iter()
                .map(|m| short_name(m).to_string())
                .collect(),
            num_layers: -1,
            dropout: 0.0,
        }
    }
}

impl LoraAdapter {
    /// Loads a PEFT or mlx-lm/optiq folder, detected from the files: `adapters.safetensors`
    /// when present (the file mlx-lm and optiq serve), else `adapter_model.safetensors`.
    /// Tensors may be f32, f16, bf16 or f64; they are held as f32.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let layout = tensors::Layout::detect(dir)?;
        let configs = config::Configs::read(dir)?;
        let mut modules = tensors::read(&dir.join(layout.file_name()), layout)?;
        let rule = configs.scale_rule(dir, layout)?;
        for (name, w) in &mut modules {
            w.scale = rule.scale_for(name, w.rank)?;
        }
        let info = configs.info(&rule, &modules);
        Ok(Self {
            base_model: configs.base_model(),
            modules,
            info,
        })
    }

    /// Writes `adapter_model.safetensors`, `adapters.safetensors`, `adapter_config.json` and
    /// `optiq_lora_config.json` into `dir` (created if missing), each through a temporary name
    /// and a rename, so that a reader never sees a half-written file.
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        self.validate()?;
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        tensors::write(&dir.join(PEFT_WEIGHTS_FILE), peft::tensors(self), "pt")?;
        tensors::write(&dir.join(MLX_WEIGHTS_FILE), mlx::tensors(self)?, "mlx")?;
        tensors::write_json(&dir.join(ADAPTER_CONFIG_FILE), &peft::adapter_config(self))?;
        tensors::write_json(&dir.join(OPTIQ_CONFIG_FILE), &mlx::optiq_config(self))?;
        tensors::sync_dir(dir);
        Ok(())
    }

    /// Bytes of A and B data in f32.
    pub fn size_bytes(&self) -> u64 {
        self.modules
            .values()
            .map(|w| (w.a.len() as u64 + w.b.len() as u64) * 4)
            .sum()
    }

    /// The largest module rank (0 without modules).
    pub fn max_rank(&self) -> usize {
        self.modules.values().map(|w| w.rank).max().unwrap_or(0)
    }

    /// Checks every module against a model: the path is `model.layers.{i}.{m}` with `m` one of
    /// [`LAYER_MATRICES`] and `i < cfg.num_layers`, and its in/out widths are that matrix's.
    pub fn check_against(&self, cfg: &ModelConfig) -> Result<(), ModelError> {
        for (path, w) in &self.modules {
            let bad = |reason: String| ModelError::Adapter {
                module: path.clone(),
                reason,
            };
            let (layer, matrix) = parse_layer_path(path).ok_or_else(|| {
                bad(format!(
                    "not a layer matrix (expected model.layers.<i>.<one of {}>)",
                    LAYER_MATRICES.join(", ")
                ))
            })?;
            if layer >= cfg.num_layers {
                return Err(bad(format!(
                    "layer {layer} does not exist (the model has {} layers)",
                    cfg.num_layers
                )));
            }
            // `parse_layer_path` only yields LAYER_MATRICES, which all have a shape.
            let (want_in, want_out) = cfg.layer_matrix_shape(matrix).unwrap_or((0, 0));
            if (w.in_features, w.out_features) != (want_in, want_out) {
                return Err(bad(format!(
                    "adapts in={} out={}, the model's {matrix} has in={want_in} out={want_out}",
                    w.in_features, w.out_features
                )));
            }
        }
        Ok(())
    }

    /// Checks that a model with `cfg` can serve it: every module consistent and finite, at
    /// least one, each of the model's shape. What a mount checks before laying it out.
    pub fn check_servable(&self, cfg: &ModelConfig) -> Result<(), ModelError> {
        self.validate()?;
        self.check_against(cfg)
    }

    /// Checks the in-memory adapter before writing it: a file kiln writes must load again.
    fn validate(&self) -> Result<(), ModelError> {
        let whole = |reason: String| ModelError::Adapter {
            module: "adapter".into(),
            reason,
        };
        if self.modules.is_empty() {
            return Err(whole("has no modules".into()));
        }
        if self.info.rank == 0 {
            return Err(whole("info.rank is 0".into()));
        }
        if !self.info.scale.is_finite() {
            return Err(whole(format!("info.scale is {}", self.info.scale)));
        }
        if self.size_bytes() > MAX_ADAPTER_BYTES {
            return Err(whole(format!(
                "{} bytes is over the {MAX_ADAPTER_BYTES}-byte limit",
                self.size_bytes()
            )));
        }
        for (path, w) in &self.modules {
            w.validate().map_err(|reason| ModelError::Adapter {
                module: path.clone(),
                reason,
            })?;
        }
        Ok(())
    }
}

impl LoraWeights {
    /// Shapes agree with the lengths, ranks and widths are in range, every value is finite.
    fn validate(&self) -> Result<(), String> {
        tensors::check_dims(self.in_features, self.rank, self.out_features)?;
        let want_a = self.in_features * self.rank;
        let want_b = self.rank * self.out_features;
        if self.a.len() != want_a || self.b.len() != want_b {
            return Err(format!(
                "A has {} values and B {}, in={} rank={} out={} needs {want_a} and {want_b}",
                self.a.len(),
                self.b.len(),
                self.in_features,
                self.rank,
                self.out_features
            ));
        }
        if !self.scale.is_finite() {
            return Err(format!("scale is {}", self.scale));
        }
        if let Some(i) = self.a.iter().position(|v| !v.is_finite()) {
            return Err(format!("A[{i}] is {}", self.a[i]));
        }
        if let Some(i) = self.b.iter().position(|v| !v.is_finite()) {
            return Err(format!("B[{i}] is {}", self.b[i]));
        }
        Ok(())
    }
}

/// The last component of a module path: the name PEFT's `target_modules` uses (`q_proj`).
fn short_name(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

/// `model.layers.{i}.{matrix}` → (i, matrix), `matrix` one of [`LAYER_MATRICES`].
fn parse_layer_path(path: &str) -> Option<(usize, &'static str)> {
    let rest = path.strip_prefix("model.layers.")?;
    let (index, matrix) = rest.split_once('.')?;
    // `usize::from_str` takes a leading '+', which no module path has.
    if !index.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let layer = index.parse().ok()?;
    let matrix = LAYER_MATRICES.iter().find(|m| **m == matrix)?;
    Some((layer, matrix))
}

/// The block index of a module path (`….layers.{i}.…`), as spec §8.5 reads it.
fn layer_index(path: &str) -> Option<usize> {
    let mut parts = path.split('.');
    while let Some(p) = parts.next() {
        if p == "layers" {
            let index = parts.next()?;
            if index.bytes().all(|c| c.is_ascii_digit()) {
                return index.parse().ok();
            }
        }
    }
    None
}

/// An f32 as JSON by its shortest decimal (`0.1`, not `0.10000000149011612`), when that reads
/// back as the same f32; else exactly.
fn json_f32(x: f32) -> serde_json::Value {
    let short = format!("{x}").parse::<f64>().ok();
    match short {
        Some(d) if d as f32 == x => serde_json::Value::from(d),
        _ => serde_json::Value::from(f64::from(x)),
    }
}

/// `{module path: rank}`, as optiq writes `applied_ranks`.
fn applied_ranks(adapter: &LoraAdapter) -> serde_json::Value {
    let ranks: serde_json::Map<String, serde_json::Value> = adapter
        .modules
        .iter()
        .map(|(p, w)| (p.clone(), w.rank.into()))
        .collect();
    serde_json::Value::Object(ranks)
}
