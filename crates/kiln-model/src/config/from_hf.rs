//! `config.json` (Hugging Face) → [`ModelConfig`].

use std::path::Path;

use serde_json::Value;

use super::{Activation, Architecture, LayerAttention, ModelConfig, RopeConfig, RopeScaling};
use crate::ModelError;

struct Fields<'a> {
    path: &'a Path,
    json: &'a Value,
}

impl Fields<'_> {
    fn err(&self, field: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Config {
            path: self.path.to_path_buf(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    fn usize(&self, field: &str) -> Result<usize, ModelError> {
        self.opt_usize(field)?
            .ok_or_else(|| self.err(field, "missing"))
    }

    fn opt_usize(&self, field: &str) -> Result<Option<usize>, ModelError> {
        match self.json.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(field, format!("expected a non-negative integer, found {v}"))
                }),
        }
    }

    fn opt_f32(&self, field: &str) -> Result<Option<f32>, ModelError> {
        match self.json.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| self.err(field, format!("expected a number, found {v}"))),
        }
    }

    fn opt_bool(&self, field: &str) -> Result<Option<bool>, ModelError> {
        match self.json.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a bool, found {v}"))),
        }
    }

    fn token_ids(&self, field: &str) -> Result<Vec<u32>, ModelError> {
        let as_id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        match self.json.get(field) {
            None | Some(Value::Null) => Ok(vec![]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| as_id(v).ok_or_else(|| self.err(field, format!("bad token id {v}"))))
                .collect(),
            Some(v) => as_id(v)
                .map(|id| vec![id])
                .ok_or_else(|| self.err(field, format!("bad token id {v}"))),
        }
    }
}

/// Reads a RoPE block (`rope_parameters` or legacy `rope_scaling`) plus a fallback theta.
fn rope_from(
    f: &Fields<'_>,
    block: Option<&Value>,
    fallback_theta: Option<f32>,
    field: &str,
) -> Result<RopeConfig, ModelError> {
    let get = |k: &str| {
        block
            .and_then(|b| b.get(k))
            .and_then(Value::as_f64)
            .map(|v| v as f32)
    };
    let theta = get("rope_theta").or(fallback_theta).unwrap_or(10_000.0);
    let rope_type = block
        .and_then(|b| b.get("rope_type").or_else(|| b.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let need = |k: &str| get(k).ok_or_else(|| f.err(&format!("{field}.{k}"), "missing"));
    let scaling = match rope_type {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: need("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: need("original_max_position_embeddings")?,
        },
        other => {
            return Err(f.err(
                &format!("{field}.rope_type"),
                format!("rope type {other:?} is not supported"),
            ));
        }
    };
    Ok(RopeConfig { theta, scaling })
}

/// Parses a Hugging Face `config.json` document.
pub fn config_from_hf_json(path: &Path, json: &Value) -> Result<ModelConfig, ModelError> {
    let f = Fields { path, json };
    let model_type = json.get("model_type").and_then(Value::as_str).unwrap_or("");
    let arch = match model_type {
        "llama" | "mistral" | "smollm" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "qwen3" => Architecture::Qwen3,
        "gemma3_text" | "gemma3" => Architecture::Gemma3,
        "bert" | "roberta" | "xlm-roberta" => Architecture::Bert,
        "nomic_bert" if super::nomic::has_nomic_keys(json) => {
            return config_from_hf_json(path, &super::nomic::standard_keys(path, json)?);
        }
        "nomic_bert" => Architecture::NomicBert,
        other => {
            return Err(ModelError::UnsupportedArchitecture {
                path: path.into(),
                arch: other.into(),
            });
        }
    };
    // Gemma 3 multimodal configs nest the language model.
    if model_type == "gemma3"
        && let Some(text) = json.get("text_config")
    {
        let mut cfg = config_from_hf_json(path, &merge_model_type(text, "gemma3_text"))?;
        cfg.eos_token_ids.extend(f.token_ids("eos_token_id")?);
        return Ok(cfg);
    }
    let hidden_size = f.usize("hidden_size")?;
    let num_heads = f.usize("num_attention_heads")?;
    let num_layers = f.usize("num_hidden_layers")?;
    // Checked now: it sizes the per-layer table below, before `validate` runs.
    super::check_size("num_hidden_layers", num_layers)
        .map_err(|reason| f.err("num_hidden_layers", reason))?;
    let head_dim = match f.opt_usize("head_dim")? {
        Some(d) => d,
        None if num_heads > 0 => hidden_size / num_heads,
        None => 0,
    };
    let sliding_window = f.opt_usize("sliding_window")?;
    let layer_attention = layer_kinds(&f, num_layers, sliding_window, arch)?;

    let params = json.get("rope_parameters");
    let legacy_theta = f.opt_f32("rope_theta")?;
    let (rope_global, rope_local) = match params {
        Some(p) if p.get("full_attention").is_some() => {
            let global = rope_from(
                &f,
                p.get("full_attention"),
                legacy_theta,
                "rope_parameters.full_attention",
            )?;
            let local_theta = f.opt_f32("rope_local_base_freq")?;
            let local = rope_from(
                &f,
                p.get("sliding_attention"),
                local_theta,
                "rope_parameters.sliding_attention",
            )?;
            (global, local)
        }
        Some(p) => {
            let r = rope_from(&f, Some(p), legacy_theta, "rope_parameters")?;
            (r, r)
        }
        None => {
            let global = rope_from(&f, json.get("rope_scaling"), legacy_theta, "rope_scaling")?;
            let local = match f.opt_f32("rope_local_base_freq")? {
                Some(theta) => RopeConfig::plain(theta),
                None => global,
            };
            (global, local)
        }
    };

    let gemma = arch == Architecture::Gemma3;
    let act_name = json
        .get("hidden_activation")
        .or_else(|| json.get("hidden_act"))
        .and_then(Value::as_str)
        .unwrap_or(if gemma { "gelu_pytorch_tanh" } else { "silu" });
    let encoder_act = match arch {
        Architecture::Bert => Some("gelu"),
        Architecture::NomicBert => Some("silu"),
        _ => None,
    };
    if let Some(want) = encoder_act.filter(|want| *want != act_name) {
        return Err(f.err(
            "hidden_act",
            format!(
                "a {} encoder with {act_name:?} is not supported ({want:?} is)",
                arch.name()
            ),
        ));
    }
    let activation = match act_name {
        "silu" | "swish" => Activation::Silu,
        "gelu_pytorch_tanh" | "gelu_tanh" | "gelu" => Activation::GeluTanh,
        other => {
            return Err(f.err(
                "hidden_act",
                format!("activation {other:?} is not supported"),
            ));
        }
    };
    let query_scale = f
        .opt_f32("query_pre_attn_scalar")?
        .filter(|_| gemma)
        .unwrap_or(head_dim as f32);
    let table_positions = f.opt_usize("max_position_embeddings")?.unwrap_or(4096);
    let position_offset = roberta_offset(&f, model_type, table_positions)?;
    let cfg = ModelConfig {
        arch,
        vocab_size: f.usize("vocab_size")?,
        hidden_size,
        intermediate_size: f.usize("intermediate_size")?,
        num_layers,
        num_heads,
        num_kv_heads: f.opt_usize("num_key_value_heads")?.unwrap_or(num_heads),
        head_dim,
        rms_norm_eps: match arch {
            Architecture::Bert | Architecture::NomicBert => {
                f.opt_f32("layer_norm_eps")?.unwrap_or(1e-12)
            }
            _ => f.opt_f32("rms_norm_eps")?.unwrap_or(1e-6),
        },
        layer_attention,
        rope_global,
        rope_local,
        max_position_embeddings: table_positions - position_offset,
        tie_word_embeddings: arch.is_encoder()
            || f.opt_bool("tie_word_embeddings")?.unwrap_or(gemma),
        activation,
        attention_scale: 1.0 / query_scale.sqrt(),
        attention_bias: matches!(arch, Architecture::Qwen2 | Architecture::Bert)
            || f.opt_bool("attention_bias")?.unwrap_or(false),
        qk_norm: matches!(arch, Architecture::Qwen3 | Architecture::Gemma3),
        norm_weight_offset: if gemma { 1.0 } else { 0.0 },
        embedding_scale: gemma.then(|| (hidden_size as f32).sqrt()),
        position_offset,
        bidirectional: arch.is_encoder()
            || f.opt_bool("use_bidirectional_attention")?.unwrap_or(false),
        bos_token_id: f.token_ids("bos_token_id")?.first().copied(),
        eos_token_ids: f.token_ids("eos_token_id")?,
    };
    cfg.validate().map_err(|reason| f.err("config", reason))?;
    Ok(cfg)
}

/// RoBERTa numbers positions from its padding index + 1 (the table's first rows are never
/// read); 0 for every other model.
fn roberta_offset(f: &Fields<'_>, model_type: &str, table: usize) -> Result<usize, ModelError> {
    if !matches!(model_type, "roberta" | "xlm-roberta") {
        return Ok(0);
    }
    let pad = f.opt_usize("pad_token_id")?.unwrap_or(1);
    match pad.checked_add(1).filter(|offset| *offset < table) {
        Some(offset) => Ok(offset),
        None => Err(f.err(
            "pad_token_id",
            format!("{pad} leaves no positions in a table of {table}"),
        )),
    }
}

fn merge_model_type(text: &Value, model_type: &str) -> Value {
    let mut v = text.clone();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("model_type".into(), Value::String(model_type.into()));
    }
    v
}

fn layer_kinds(
    f: &Fields<'_>,
    num_layers: usize,
    window: Option<usize>,
    arch: Architecture,
) -> Result<Vec<LayerAttention>, ModelError> {
    let sliding = |w: Option<usize>| match w {
        Some(window) if window > 0 => Ok(LayerAttention::Sliding { window }),
        _ => Err(f.err(
            "sliding_window",
            "sliding layers need a positive sliding_window",
        )),
    };
    if let Some(types) = f.json.get("layer_types").and_then(Value::as_array) {
        // `layer_types` is authoritative where present (Gemma 3 writes a stale pattern beside it).
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(LayerAttention::Full),
                Some("sliding_attention") => sliding(window),
                _ => Err(f.err("layer_types", format!("unknown layer type {t}"))),
            })
            .collect();
    }
    if arch == Architecture::Gemma3 {
        let pattern = f
            .opt_usize("sliding_window_pattern")?
            .or(f.opt_usize("_sliding_window_pattern")?)
            .unwrap_or(6);
        return (0..num_layers)
            .map(|i| {
                if pattern > 0 && (i + 1) % pattern == 0 {
                    Ok(LayerAttention::Full)
                } else {
                    sliding(window)
                }
            })
            .collect();
    }
    let use_sliding = f
        .opt_bool("use_sliding_window")?
        .unwrap_or(arch == Architecture::Llama);
    match window {
        // Mistral-style configs apply the window to every layer; Qwen gates it behind a flag.
        Some(w)
            if use_sliding
                && w > 0
                && w < f
                    .opt_usize("max_position_embeddings")?
                    .unwrap_or(usize::MAX) =>
        {
            Ok(vec![LayerAttention::Sliding { window: w }; num_layers])
        }
        _ => Ok(vec![LayerAttention::Full; num_layers]),
    }
}
