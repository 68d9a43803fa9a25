//! GGUF metadata → [`ModelConfig`].

use std::path::Path;

use super::{Activation, Architecture, LayerAttention, ModelConfig, RopeConfig, RopeScaling};
use crate::ModelError;
use crate::gguf::GgufHeader;

/// llama.cpp hard-codes Gemma 3's local RoPE base and layer pattern rather than storing them.
const GEMMA3_LOCAL_ROPE_BASE: f32 = 10_000.0;
const GEMMA3_FULL_EVERY: usize = 6;

struct Meta<'a> {
    path: &'a Path,
    header: &'a GgufHeader,
    prefix: &'a str,
}

impl Meta<'_> {
    fn err(&self, key: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Config {
            path: self.path.to_path_buf(),
            field: key.into(),
            reason: reason.into(),
        }
    }

    fn opt_usize(&self, suffix: &str) -> Result<Option<usize>, ModelError> {
        let key = format!("{}.{suffix}", self.prefix);
        match self.header.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(&key, format!("expected an unsigned integer, found {v:?}"))
                }),
        }
    }

    fn usize(&self, suffix: &str) -> Result<usize, ModelError> {
        self.opt_usize(suffix)?
            .ok_or_else(|| self.err(&format!("{}.{suffix}", self.prefix), "missing"))
    }

    fn opt_f32(&self, suffix: &str) -> Result<Option<f32>, ModelError> {
        let key = format!("{}.{suffix}", self.prefix);
        match self.header.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| self.err(&key, format!("expected a number, found {v:?}"))),
        }
    }

    fn token_id(&self, key: &str) -> Option<u32> {
        self.header
            .get(key)
            .and_then(|v| v.as_u64())
            .and_then(|n| u32::try_from(n).ok())
    }
}

/// Reads the model configuration from a GGUF header.
pub fn config_from_gguf(path: &Path, header: &GgufHeader) -> Result<ModelConfig, ModelError> {
    let arch_name = header
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or_else(|| ModelError::Config {
            path: path.into(),
            field: "general.architecture".into(),
            reason: "missing".into(),
        })?;
    let arch = match arch_name {
        "llama" | "mistral" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "qwen3" => Architecture::Qwen3,
        "gemma3" | "gemma-embedding" => Architecture::Gemma3,
        "bert" => Architecture::Bert,
        "nomic-bert" => Architecture::NomicBert,
        other => {
            return Err(ModelError::UnsupportedArchitecture {
                path: path.into(),
                arch: other.into(),
            });
        }
    };
    let m = Meta {
        path,
        header,
        prefix: arch_name,
    };
    let hidden_size = m.usize("embedding_length")?;
    let num_heads = m.usize("attention.head_count")?;
    let num_layers = m.usize("block_count")?;
    // Checked now: it sizes the per-layer table below, before `validate` runs.
    super::check_size("num_hidden_layers", num_layers)
        .map_err(|reason| m.err(&format!("{arch_name}.block_count"), reason))?;
    let head_dim = match m.opt_usize("attention.key_length")? {
        Some(d) => d,
        None => hidden_size.checked_div(num_heads).unwrap_or(0),
    };
    let vocab_size = match m.opt_usize("vocab_size")? {
        Some(v) => v,
        None => header
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .map(|a| a.len())
            .unwrap_or(0),
    };
    let theta = m.opt_f32("rope.freq_base")?.unwrap_or(10_000.0);
    let scaling = match header
        .get(&format!("{arch_name}.rope.scaling.type"))
        .and_then(|v| v.as_str())
    {
        None | Some("none") => RopeScaling::None,
        Some("linear") => RopeScaling::Linear {
            factor: m
                .opt_f32("rope.scaling.factor")?
                .ok_or_else(|| m.err("rope.scaling.factor", "missing"))?,
        },
        Some(other) => {
            return Err(m.err(
                &format!("{arch_name}.rope.scaling.type"),
                format!("{other:?} is not supported"),
            ));
        }
    };
    let rope_global = RopeConfig { theta, scaling };
    let gemma = arch == Architecture::Gemma3;
    let bert = arch.is_encoder();
    let window = m.opt_usize("attention.sliding_window")?;
    let layer_attention = match (gemma, window) {
        (true, Some(window)) if window > 0 => (0..num_layers)
            .map(|i| {
                if (i + 1) % GEMMA3_FULL_EVERY == 0 {
                    LayerAttention::Full
                } else {
                    LayerAttention::Sliding { window }
                }
            })
            .collect(),
        (true, _) => {
            return Err(m.err(
                &format!("{arch_name}.attention.sliding_window"),
                "missing or zero",
            ));
        }
        _ => vec![LayerAttention::Full; num_layers],
    };
    let eos = m.token_id("tokenizer.ggml.eos_token_id");
    let eot = m.token_id("tokenizer.ggml.eot_token_id");
    let cfg = ModelConfig {
        arch,
        vocab_size,
        hidden_size,
        intermediate_size: m.usize("feed_forward_length")?,
        num_layers,
        num_heads,
        num_kv_heads: m.opt_usize("attention.head_count_kv")?.unwrap_or(num_heads),
        head_dim,
        rms_norm_eps: if bert {
            m.opt_f32("attention.layer_norm_epsilon")?.unwrap_or(1e-12)
        } else {
            m.opt_f32("attention.layer_norm_rms_epsilon")?
                .unwrap_or(1e-5)
        },
        layer_attention,
        rope_global,
        rope_local: if gemma {
            RopeConfig::plain(
                m.opt_f32("rope.freq_base_swa")?
                    .unwrap_or(GEMMA3_LOCAL_ROPE_BASE),
            )
        } else {
            rope_global
        },
        max_position_embeddings: m.opt_usize("context_length")?.unwrap_or(4096),
        tie_word_embeddings: bert || header.tensor("output.weight").is_none(),
        activation: if gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        attention_scale: 1.0 / (head_dim as f32).sqrt(),
        attention_bias: arch == Architecture::Bert || header.tensor("blk.0.attn_q.bias").is_some(),
        qk_norm: header.tensor("blk.0.attn_q_norm.weight").is_some(),
        // llama.cpp's converter stores Gemma norm weights with the +1 already added.
        norm_weight_offset: 0.0,
        embedding_scale: gemma.then(|| (hidden_size as f32).sqrt()),
        // llama.cpp's converter drops RoBERTa's padding rows from the position table.
        position_offset: 0,
        bidirectional: bert || arch_name == "gemma-embedding",
        bos_token_id: m.token_id("tokenizer.ggml.bos_token_id"),
        eos_token_ids: eos.into_iter().chain(eot).collect(),
    };
    cfg.validate().map_err(|reason| m.err(arch_name, reason))?;
    Ok(cfg)
}
