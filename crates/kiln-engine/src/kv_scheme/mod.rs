//! KV-cache schemes (spec §6, the seed's `kv-scheme.ts`): which scheme a model runs with, the
//! cache key and `/stats` label that name it, when a quantized cache may join a batch, and the
//! memory model `kiln fit` and admission bill.
//!
//! The logic lives here; the storage lives in the backend. [`KvScheme::plan`] turns a scheme
//! into the per-layer [`KvPlan`] a backend's store follows (`kiln_model::backend::cpu::CpuKv`
//! converts layers at the start and attends over quantized tiles).

mod batchable;
mod config_file;
pub mod memory;
mod resolve;
#[cfg(test)]
mod tests;

pub use batchable::{BatchCapabilities, KvLayerKind, KvModelShape};
pub use config_file::{KV_CONFIG_FILE, load_kv_config, parse_kv_config};
pub use resolve::{KvQuantOverride, KvSchemeRequest, MissingConfig, resolve_kv_scheme};

use kiln_model::backend::{KvPlan, KvQuantFormat};

/// Bits an affine (MLX-convention) KV quantization may use: the spec's `kvBits ∈ {4, 8}` and
/// optiq's knapsack candidates. Widening this set needs storage kernels for the new widths.
pub const AFFINE_KV_BITS: [u8; 2] = [4, 8];

/// Group sizes an affine KV quantization may use (one 16-bit scale and bias per group).
pub const KV_GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// The group size when none is given (mlx-lm's and optiq's default).
pub const DEFAULT_KV_GROUP_SIZE: usize = 64;

/// Bits TurboQuant keys and values may use: the Lloyd–Max tables of spec §6.5 exist for
/// {2, 3, 4, 5, 8}.
pub const TURBO_BITS: [u8; 5] = [2, 3, 4, 5, 8];

/// Head dims the fast Walsh–Hadamard rotation of TurboQuant serves (spec §6.5).
pub const TURBO_HEAD_DIMS: [usize; 4] = [64, 128, 256, 512];

/// The mlx-lm default delayed start of affine-uniform quantization when none is given.
pub const DEFAULT_UNIFORM_START: usize = 5000;

/// Why a KV scheme cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvSchemeError {
    /// `--quantized-kv-start` was negative or not a safe integer.
    #[error("quantized_kv_start must be a nonnegative integer (got {0})")]
    BadStart(i64),
    /// `--kv-quant config` for a model without `kv_config.json`.
    #[error("model has no kv_config.json (--kv-quant config)")]
    MissingConfig,
    /// Affine bits outside [`AFFINE_KV_BITS`].
    #[error("KV quantization bits must be one of 4 or 8, got {0}")]
    BadBits(u8),
    /// Group size outside [`KV_GROUP_SIZES`].
    #[error("KV group size must be one of 32, 64 or 128, got {0}")]
    BadGroupSize(usize),
    /// TurboQuant bits outside [`TURBO_BITS`].
    #[error("TurboQuant {which} bits must be one of 2, 3, 4, 5 or 8, got {bits}")]
    BadTurboBits {
        /// `k` or `v`.
        which: &'static str,
        /// What was asked.
        bits: u8,
    },
    /// An option that the chosen scheme does not use (kiln refuses rather than ignoring it).
    #[error("{option} applies only to {applies_to}")]
    Unused {
        /// The option, as a flag.
        option: &'static str,
        /// The schemes it applies to.
        applies_to: &'static str,
    },
    /// `kv_config.json` could not be read or is malformed.
    #[error("{path}: {reason}")]
    ConfigFile {
        /// The file.
        path: String,
        /// What is wrong, naming the entry.
        reason: String,
    },
    /// The scheme cannot apply to one layer of this model.
    #[error("layer {layer}: {reason}")]
    Layer {
        /// The layer index.
        layer: usize,
        /// Why.
        reason: String,
    },
}

/// The storage dtype of a dense cache (and of every layer before its conversion): the
/// backend's own type, so the scheme and the store cannot disagree about it.
pub use kiln_model::backend::DenseKv as DenseDtype;

/// The scheme kinds of spec §6.1; the seed's `bf16` is kiln's [`KvSchemeKind::Dense`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvSchemeKind {
    /// Unquantized, in [`KvSchemeOptions::dense`] storage.
    Dense,
    /// Every layer affine-quantized with one bits/group size.
    AffineUniform,
    /// Per-layer bits and group size from `kv_config.json`; unlisted layers stay dense.
    AffineConfig,
    /// TurboQuant: Walsh–Hadamard rotation, kept norm, Lloyd–Max codebooks.
    Turbo,
}

/// One entry of `kv_config.json` (spec §6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KvQuantSpec {
    /// Index into the model's cache list (the layer index for flat models).
    pub layer_idx: usize,
    /// Affine bits.
    pub bits: u8,
    /// Affine group size.
    pub group_size: usize,
}

/// TurboQuant bit widths for keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TurboQuant {
    /// Key bits.
    pub k_bits: u8,
    /// Value bits.
    pub v_bits: u8,
}

impl TurboQuant {
    /// The seed's defaults: int8 keys (`q8_0`), 3-bit Lloyd–Max values (`q3_0`).
    pub const DEFAULT: Self = Self {
        k_bits: 8,
        v_bits: 3,
    };

    /// Refuses widths without a codebook.
    pub fn validate(self) -> Result<Self, KvSchemeError> {
        for (which, bits) in [("k", self.k_bits), ("v", self.v_bits)] {
            if !TURBO_BITS.contains(&bits) {
                return Err(KvSchemeError::BadTurboBits { which, bits });
            }
        }
        Ok(self)
    }
}

/// The options of a resolved scheme (the seed's `ResolvedKvSchemeOptions`).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct KvSchemeOptions {
    /// Storage of the dense scheme, and of the layers and positions a quantized scheme keeps
    /// dense (unlisted config layers, positions before the delayed start).
    pub dense: DenseDtype,
    /// Affine-uniform bits.
    pub kv_bits: Option<u8>,
    /// Affine-uniform group size; `None` means [`DEFAULT_KV_GROUP_SIZE`].
    pub kv_group_size: Option<usize>,
    /// Affine-config entries.
    pub kv_config: Option<Vec<KvQuantSpec>>,
    /// Length at which a sequence's cache is converted; `None` means the kind's default
    /// (affine-uniform 5000, others 0).
    pub quantized_kv_start: Option<usize>,
    /// TurboQuant widths.
    pub turbo: Option<TurboQuant>,
}

/// A resolved KV scheme.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KvScheme {
    /// Which kind.
    pub kind: KvSchemeKind,
    /// Its parameters.
    pub options: KvSchemeOptions,
}

impl KvScheme {
    /// The dense scheme in `dtype` storage.
    pub fn dense(dtype: DenseDtype) -> Self {
        Self {
            kind: KvSchemeKind::Dense,
            options: KvSchemeOptions {
                dense: dtype,
                ..KvSchemeOptions::default()
            },
        }
    }

    /// The delayed start in effect: the given one, else 5000 for affine-uniform (mlx-lm) and 0
    /// for the others (spec §6.3 `start`).
    pub fn effective_start(&self) -> usize {
        let default = match self.kind {
            KvSchemeKind::AffineUniform => DEFAULT_UNIFORM_START,
            _ => 0,
        };
        self.options.quantized_kv_start.unwrap_or(default)
    }

    /// Affine-uniform group size in effect.
    pub fn group_size(&self) -> usize {
        self.options.kv_group_size.unwrap_or(DEFAULT_KV_GROUP_SIZE)
    }

    /// The cache key (seed 0.4.0 `cacheKey`): names what a cached KV holds, so entries of
    /// different schemes never mix. Dense keys are the storage dtype — `bf16` exactly as the
    /// seed for bf16 storage, `f32` for what kiln's CPU cache stores today — because an f32
    /// snapshot is not a bf16 one.
    pub fn cache_key(&self) -> String {
        let start = self.effective_start();
        let start_suffix = if start > 0 {
            format!("-start{start}")
        } else {
            String::new()
        };
        match self.kind {
            KvSchemeKind::Dense => self.options.dense.name().to_string(),
            KvSchemeKind::AffineUniform => {
                let group = self.group_size();
                let group_suffix = if group != DEFAULT_KV_GROUP_SIZE {
                    format!("-g{group}")
                } else {
                    String::new()
                };
                format!(
                    "kv{}{group_suffix}{start_suffix}",
                    self.options.kv_bits.unwrap_or(0)
                )
            }
            KvSchemeKind::AffineConfig => format!("config{start_suffix}"),
            KvSchemeKind::Turbo => {
                let t = self.options.turbo.unwrap_or(TurboQuant::DEFAULT);
                format!("turbo-k{}v{}{start_suffix}", t.k_bits, t.v_bits)
            }
        }
    }

    /// The label `/stats` shows (spec §6.1 "label").
    pub fn label(&self) -> String {
        match self.kind {
            KvSchemeKind::Dense => self.options.dense.name().to_string(),
            KvSchemeKind::AffineUniform => {
                format!("uniform-kv{}", self.options.kv_bits.unwrap_or(0))
            }
            KvSchemeKind::AffineConfig => "mixed (kv_config.json)".to_string(),
            KvSchemeKind::Turbo => {
                let t = self.options.turbo.unwrap_or(TurboQuant::DEFAULT);
                format!("turbo k{}v{}", t.k_bits, t.v_bits)
            }
        }
    }

    /// How layer `layer` is stored once converted: `None` for dense.
    pub fn layer_quant(&self, layer: usize) -> Option<LayerQuant> {
        match self.kind {
            KvSchemeKind::Dense => None,
            KvSchemeKind::AffineUniform => Some(LayerQuant::Affine {
                bits: self.options.kv_bits.unwrap_or(8),
                group_size: self.group_size(),
            }),
            KvSchemeKind::AffineConfig => self
                .options
                .kv_config
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|e| e.layer_idx == layer)
                .map(|e| LayerQuant::Affine {
                    bits: e.bits,
                    group_size: e.group_size,
                }),
            KvSchemeKind::Turbo => Some(LayerQuant::Turbo(
                self.options.turbo.unwrap_or(TurboQuant::DEFAULT),
            )),
        }
    }

    /// The per-layer plan a backend store follows for a model of `n_layers` layers: linear
    /// layers (none in kiln's architectures yet) would stay dense.
    pub fn plan(&self, shape: &KvModelShape) -> KvPlan {
        let quantized = (0..shape.num_hidden_layers)
            .map(|l| {
                if shape.layer_type(l) == KvLayerKind::Linear {
                    return None;
                }
                self.layer_quant(l).map(|q| match q {
                    LayerQuant::Affine { bits, group_size } => {
                        KvQuantFormat::Affine { bits, group_size }
                    }
                    LayerQuant::Turbo(t) => KvQuantFormat::Turbo {
                        k_bits: t.k_bits,
                        v_bits: t.v_bits,
                    },
                })
            })
            .collect();
        KvPlan {
            dense: self.options.dense,
            quantized,
            start: match self.kind {
                KvSchemeKind::Dense => 0,
                _ => self.effective_start(),
            },
        }
    }

    /// Checks that the scheme can apply to every layer of a model with `head_dim`-wide heads:
    /// an error names the first layer it cannot, never a silent fallback to dense.
    pub fn check_model(&self, shape: &KvModelShape, head_dim: usize) -> Result<(), KvSchemeError> {
        for layer in 0..shape.num_hidden_layers {
            if shape.layer_type(layer) == KvLayerKind::Linear {
                continue;
            }
            let reason = match self.layer_quant(layer) {
                Some(LayerQuant::Affine { group_size, .. })
                    if !head_dim.is_multiple_of(group_size) =>
                {
                    format!(
                        "head dim {head_dim} is not a multiple of the KV group size {group_size}"
                    )
                }
                Some(LayerQuant::Turbo(_)) if !TURBO_HEAD_DIMS.contains(&head_dim) => format!(
                    "TurboQuant's Walsh–Hadamard rotation supports head dims 64, 128, 256 and 512, not {head_dim}"
                ),
                _ => continue,
            };
            return Err(KvSchemeError::Layer { layer, reason });
        }
        if let Some(entries) = &self.options.kv_config {
            for e in entries {
                if e.layer_idx >= shape.num_hidden_layers {
                    return Err(KvSchemeError::Layer {
                        layer: e.layer_idx,
                        reason: format!(
                            "kv_config.json lists it but the model has {} layers",
                            shape.num_hidden_layers
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

/// How one layer's cache is quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerQuant {
    /// Affine (MLX convention): packed codes plus a 16-bit scale and bias per group.
    Affine {
        /// Bits per element.
        bits: u8,
        /// Elements per scale/bias pair.
        group_size: usize,
    },
    /// TurboQuant.
    Turbo(TurboQuant),
}
