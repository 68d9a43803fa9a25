//! nomic-bert's own `config.json` keys, as nomic's hub checkpoints write them (`n_embd`,
//! `n_layer`, `rotary_emb_base`, …), rewritten to the standard keys the rest of the reader uses.

use std::path::Path;

use serde_json::{Map, Value};

use crate::ModelError;

/// Whether `json` is written with nomic's keys.
pub(super) fn has_nomic_keys(json: &Value) -> bool {
    json.get("n_embd").is_some()
}

/// The same configuration under standard keys; refuses the variants kiln does not implement
/// (pre-norm, partial or interleaved rotary, biases, a causal mask, MoE layers, scaled RoPE).
pub(super) fn standard_keys(path: &Path, json: &Value) -> Result<Value, ModelError> {
    let err = |field: &str, reason: String| ModelError::Config {
        path: path.into(),
        field: field.into(),
        reason,
    };
    let expect = |field: &str, want: Value, default: Value| -> Result<(), ModelError> {
        let got = json.get(field).cloned().unwrap_or(default);
        let same = match (got.as_f64(), want.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => got == want,
        };
        if same {
            return Ok(());
        }
        Err(err(
            field,
            format!("{got} is not supported (a nomic-bert encoder needs {want})"),
        ))
    };
    expect("activation_function", "swiglu".into(), "swiglu".into())?;
    expect("rotary_emb_fraction", 1.0.into(), 1.0.into())?;
    expect("rotary_emb_interleaved", false.into(), false.into())?;
    expect("rotary_emb_scale_base", Value::Null, Value::Null)?;
    expect("rotary_scaling_factor", Value::Null, Value::Null)?;
    expect("prenorm", false.into(), false.into())?;
    expect("causal", false.into(), false.into())?;
    for bias in ["qkv_proj_bias", "mlp_fc1_bias", "mlp_fc2_bias"] {
        expect(bias, false.into(), true.into())?;
    }
    expect("moe_every_n_layers", Value::Null, Value::Null)?;
    let mut out = Map::new();
    out.insert("model_type".into(), "nomic_bert".into());
    out.insert("hidden_act".into(), "silu".into());
    let renames = [
        ("n_embd", "hidden_size"),
        ("n_head", "num_attention_heads"),
        ("n_layer", "num_hidden_layers"),
        ("n_inner", "intermediate_size"),
        ("layer_norm_epsilon", "layer_norm_eps"),
        ("rotary_emb_base", "rope_theta"),
        // Trained for this many positions (2048 for v1/v1.5, beside `n_positions` 8192), as
        // llama.cpp reads it.
        ("max_trained_positions", "max_position_embeddings"),
        ("vocab_size", "vocab_size"),
        ("type_vocab_size", "type_vocab_size"),
        ("pad_token_id", "pad_token_id"),
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
    ];
    for (from, to) in renames {
        if let Some(v) = json.get(from) {
            out.insert(to.into(), v.clone());
        }
    }
    out.entry("max_position_embeddings")
        .or_insert_with(|| 2048.into());
    out.entry("intermediate_size").or_insert_with(|| {
        // nomic's default MLP width: 4 × the hidden size.
        json.get("n_embd")
            .and_then(Value::as_u64)
            .map_or(Value::Null, |h| (4 * h).into())
    });
    Ok(Value::Object(out))
}
