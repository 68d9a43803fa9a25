//! The architecture-independent description of a transformer (decoder or encoder), read from a Hugging
//! Face `config.json` or from GGUF metadata.

mod from_gguf;
pub use from_gguf::config_from_gguf;
pub use from_hf::config_from_hf_json;
mod from_hf;
mod nomic;
mod rope;

pub use rope::{RopeConfig, RopeScaling};

/// Largest value any size or count in a config may have: far above any real model, small enough
/// that nothing sized by it (a per-layer table, a RoPE frequency table) is an absurd allocation.
const MAX_CONFIG_SIZE: usize = 1 << 24;

/// Refuses a zero or absurd size. Counts that size tables built while the config is read (the
/// layer count) must pass this before the table is built, not only in [`ModelConfig::validate`].
pub(crate) fn check_size(name: &str, v: usize) -> Result<(), String> {
    if v == 0 || v > MAX_CONFIG_SIZE {
        return Err(format!("{name} = {v} is out of range"));
    }
    Ok(())
}

/// The architectures kiln implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 1/2/3, SmolLM, Mistral-style models.
    Llama,
    /// Qwen2 / Qwen2.5: Llama with q/k/v biases.
    Qwen2,
    /// Qwen3: Llama with per-head q/k RMSNorm.
    Qwen3,
    /// Gemma 3 text: sandwich norms, interleaved sliding/global attention, scaled embeddings.
    Gemma3,
    /// BERT encoders (bge, e5, all-MiniLM): bidirectional attention, post-LayerNorm, GELU,
    /// learned absolute positions; embeddings only. RoBERTa and XLM-RoBERTa (bge-reranker) are
    /// this architecture with a position offset.
    Bert,
    /// nomic-bert (nomic-embed-text): BERT's post-norm encoder with rotary positions, a SwiGLU
    /// MLP and no biases; embeddings only.
    NomicBert,
}

impl Architecture {
    /// The name used in GGUF `general.architecture`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma3 => "gemma3",
            Self::Bert => "bert",
            Self::NomicBert => "nomic-bert",
        }
    }

    /// Whether this is a bidirectional encoder (embeddings and reranking only, no generation).
    pub fn is_encoder(self) -> bool {
        matches!(self, Self::Bert | Self::NomicBert)
    }
}

/// Which tokens a layer's attention may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerAttention {
    /// Every earlier position.
    Full,
    /// Only the last `window` positions, the query's own included.
    Sliding {
        /// Number of positions visible to a query.
        window: usize,
    },
}

/// The MLP's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (swish), as in Llama and Qwen.
    Silu,
    /// GELU with the tanh approximation, as in Gemma.
    GeluTanh,
}

/// Everything a forward pass needs to know about the model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Architecture family.
    pub arch: Architecture,
    /// Vocabulary size (rows of the embedding table).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's hidden layer.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Number of query heads.
    pub num_heads: usize,
    /// Number of key/value heads (grouped-query attention when smaller than `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Attention kind per layer.
    pub layer_attention: Vec<LayerAttention>,
    /// RoPE for full-attention layers.
    pub rope_global: RopeConfig,
    /// RoPE for sliding-window layers (equal to `rope_global` unless the model says otherwise).
    pub rope_local: RopeConfig,
    /// Longest context the model was trained for.
    pub max_position_embeddings: usize,
    /// Whether the output projection reuses the embedding table.
    pub tie_word_embeddings: bool,
    /// MLP activation.
    pub activation: Activation,
    /// Attention score scale (usually `head_dim^-0.5`).
    pub attention_scale: f32,
    /// Whether q/k/v projections carry biases (Qwen2).
    pub attention_bias: bool,
    /// Whether queries and keys get a per-head RMSNorm before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Added to RMSNorm weights before use: 1 for Gemma's `x * (1 + w)`, 0 otherwise.
    pub norm_weight_offset: f32,
    /// Multiplier for embeddings (Gemma: `sqrt(hidden_size)`), if any.
    pub embedding_scale: Option<f32>,
    /// Whether every position attends to every other of its input (encoders, EmbeddingGemma)
    /// instead of only to earlier ones.
    pub bidirectional: bool,
    /// Row of a learned position table that position 0 reads: 0, or RoBERTa's padding index + 1
    /// (its tables keep rows for the padding); 0 for models without such a table.
    pub position_offset: usize,
    /// Beginning-of-sequence token, if the model declares one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens declared by the model config.
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Width of all query heads together.
    pub fn q_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// (in, out) features of a layer matrix named as in `crate::arch::LAYER_MATRICES`
    /// (`self_attn.q_proj`, …, `mlp.down_proj`); `None` for any other name.
    pub fn layer_matrix_shape(&self, matrix: &str) -> Option<(usize, usize)> {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        Some(match matrix {
            "self_attn.q_proj" => (h, self.q_width()),
            "self_attn.k_proj" | "self_attn.v_proj" => (h, self.kv_width()),
            "self_attn.o_proj" => (self.q_width(), h),
            "mlp.gate_proj" | "mlp.up_proj" => (h, i),
            "mlp.down_proj" => (i, h),
            _ => return None,
        })
    }

    /// Checks the relations the forward pass relies on, so that a bad file fails at load.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ];
        for (name, v) in positive {
            check_size(name, v)?;
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.arch != Architecture::Bert && !self.head_dim.is_multiple_of(2) {
            return Err(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if self.layer_attention.len() != self.num_layers {
            return Err(format!(
                "layer_types has {} entries for {} layers",
                self.layer_attention.len(),
                self.num_layers
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(format!(
                "rms_norm_eps {} is not a finite non-negative number",
                self.rms_norm_eps
            ));
        }
        for r in [&self.rope_global, &self.rope_local] {
            r.validate()?;
        }
        Ok(())
    }
}
