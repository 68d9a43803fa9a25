//! How a KV store keeps each layer: the dense storage every sequence starts in, the quantized
//! format a layer converts to, and the length at which it converts. The engine derives a plan
//! from its KV scheme (`kiln_engine::kv_scheme`); backends only see this.

use crate::ModelError;

/// Storage of a dense layer. Its name is also the dense KV scheme's cache key and label.
/// The default is f16, as in llama.cpp and Ollama: half the bytes of f32 at no measured speed
/// cost, and lossless on the f32 path within the tolerance of `docs/testing.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseKv {
    /// 4 bytes per element: exactly the activations.
    F32,
    /// IEEE half precision.
    #[default]
    F16,
    /// bfloat16.
    Bf16,
}

impl DenseKv {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }

    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        }
    }

    /// Parses `f32`, `f16` or `bf16`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" => Some(Self::F32),
            "f16" => Some(Self::F16),
            "bf16" => Some(Self::Bf16),
            _ => None,
        }
    }
}

/// The quantized form of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvQuantFormat {
    /// Affine (MLX convention): packed codes plus an f16 scale and bias per group.
    Affine {
        /// Bits per element.
        bits: u8,
        /// Elements per scale/bias pair.
        group_size: usize,
    },
    /// TurboQuant: sign-randomised Walsh–Hadamard rotation, kept norm, Lloyd–Max codebooks.
    Turbo {
        /// Key bits.
        k_bits: u8,
        /// Value bits.
        v_bits: u8,
    },
}

impl KvQuantFormat {
    /// Bytes one head vector of `head_dim` elements takes, keys and values together.
    pub fn kv_row_bytes(self, head_dim: usize) -> usize {
        match self {
            Self::Affine { bits, group_size } => {
                2 * (head_dim * bits as usize / 8 + head_dim.div_ceil(group_size) * 4)
            }
            Self::Turbo { k_bits, v_bits } => {
                head_dim * k_bits as usize / 8 + 2 + head_dim * v_bits as usize / 8 + 2
            }
        }
    }

    /// Short name: `affine4-g64`, `turbo-k8v3`.
    pub fn name(self) -> String {
        match self {
            Self::Affine { bits, group_size } => format!("affine{bits}-g{group_size}"),
            Self::Turbo { k_bits, v_bits } => format!("turbo-k{k_bits}v{v_bits}"),
        }
    }
}

/// What a layer of a sequence currently holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayerState {
    /// Dense, in this storage.
    Dense(DenseKv),
    /// Converted.
    Quantized(KvQuantFormat),
}

impl KvLayerState {
    /// Short name (`f32`, `affine4-g64`…).
    pub fn name(self) -> String {
        match self {
            Self::Dense(d) => d.name().to_string(),
            Self::Quantized(q) => q.name(),
        }
    }
}

/// The per-layer storage plan of a KV store.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KvPlan {
    /// Storage of dense layers and of every layer before conversion.
    pub dense: DenseKv,
    /// Per layer: the format it converts to, `None` to stay dense.
    pub quantized: Vec<Option<KvQuantFormat>>,
    /// A sequence converts once it holds at least this many positions (and at least one).
    pub start: usize,
}

impl KvPlan {
    /// Every layer dense in `dense` storage.
    pub fn dense(dense: DenseKv, n_layers: usize) -> Self {
        Self {
            dense,
            quantized: vec![None; n_layers],
            start: 0,
        }
    }

    /// True when nothing is quantized and storage is f32 (what every backend supports).
    pub fn is_dense_f32(&self) -> bool {
        self.dense == DenseKv::F32 && self.quantized.iter().all(Option::is_none)
    }

    /// Checks the plan against a store's shape: one entry per layer, and every format usable at
    /// `head_dim` — an error names the layer, never a silent fallback.
    pub fn validate(&self, n_layers: usize, head_dim: usize) -> Result<(), ModelError> {
        if self.quantized.len() != n_layers {
            return Err(ModelError::Forward(format!(
                "KV plan has {} layers but the model has {n_layers}",
                self.quantized.len()
            )));
        }
        for (layer, q) in self.quantized.iter().enumerate() {
            let reason = match *q {
                Some(KvQuantFormat::Affine { bits, group_size }) => {
                    kiln_kernels::kv::affine::AffineCodec::new(head_dim, bits, group_size).err()
                }
                Some(KvQuantFormat::Turbo { k_bits, v_bits }) => {
                    kiln_kernels::kv::turbo::TurboCodec::new(head_dim, k_bits, 0)
                        .and_then(|_| kiln_kernels::kv::turbo::TurboCodec::new(head_dim, v_bits, 0))
                        .err()
                }
                None => None,
            };
            if let Some(e) = reason {
                return Err(ModelError::Forward(format!("KV cache layer {layer}: {e}")));
            }
        }
        Ok(())
    }
}
