//! The Hugging Face side files of a model that came from a GGUF file, so that an MLX folder made
//! from it loads in kiln and `mlx_lm` alike: `config.json` from kiln's config, `tokenizer.json`
//! from the GGUF vocabulary, `tokenizer_config.json` (BOS/EOS, chat template) and
//! `generation_config.json`.

use std::path::Path;

use kiln_model::config::{Architecture, LayerAttention, ModelConfig, RopeScaling};
use kiln_model::tokenizer::KilnTokenizer;
use serde_json::{Value, json};

use crate::LabError;

/// `config.json` for `cfg`. Gemma 3 (sliding windows, sandwich norms) and scaled RoPE are
/// refused: kiln cannot yet write them so that other tools read them back the same.
pub fn config_json(cfg: &ModelConfig) -> Result<Value, LabError> {
    let unsupported =
        |why: &str| LabError::config("format", format!("MLX output from a GGUF source: {why}"));
    let model_type = match cfg.arch {
        Architecture::Llama => "llama",
        Architecture::Qwen2 => "qwen2",
        Architecture::Qwen3 => "qwen3",
        Architecture::Gemma3 => return Err(unsupported("Gemma 3 is not supported yet")),
        Architecture::Bert | Architecture::NomicBert => {
            return Err(unsupported(
                "encoders (BERT, nomic-bert) are not supported yet",
            ));
        }
    };
    if cfg.rope_global.scaling != RopeScaling::None {
        return Err(unsupported("scaled RoPE is not supported yet"));
    }
    if cfg
        .layer_attention
        .iter()
        .any(|a| *a != LayerAttention::Full)
    {
        return Err(unsupported("sliding-window attention is not supported yet"));
    }
    let arch_class = match cfg.arch {
        Architecture::Llama => "LlamaForCausalLM",
        Architecture::Qwen2 => "Qwen2ForCausalLM",
        _ => "Qwen3ForCausalLM",
    };
    let eos: Value = match cfg.eos_token_ids.as_slice() {
        [one] => json!(one),
        many => json!(many),
    };
    Ok(json!({
        "architectures": [arch_class],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_global.theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias,
        "hidden_act": "silu",
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    }))
}

/// Writes `tokenizer.json`, `tokenizer_config.json` and `generation_config.json` into `dir`.
pub fn write_tokenizer(
    dir: &Path,
    tokenizer: &KilnTokenizer,
    chat_template: Option<&str>,
    cfg: &ModelConfig,
) -> Result<(), LabError> {
    let tok_path = dir.join("tokenizer.json");
    tokenizer
        .inner()
        .save(&tok_path, false)
        .map_err(|e| LabError::io(&tok_path, std::io::Error::other(e.to_string())))?;
    let mut config = json!({
        "add_bos_token": tokenizer.add_bos(),
        "bos_token": tokenizer.bos_token(),
        "eos_token": tokenizer.eos_token(),
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    if let Some(t) = chat_template {
        config["chat_template"] = json!(t);
    }
    write_json(&dir.join("tokenizer_config.json"), &config)?;
    let generation = json!({
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": tokenizer.eos_ids(),
    });
    write_json(&dir.join("generation_config.json"), &generation)
}

/// Writes pretty JSON, naming the file in errors.
pub fn write_json(path: &Path, value: &Value) -> Result<(), LabError> {
    let text = serde_json::to_vec_pretty(value).unwrap_or_default();
    std::fs::write(path, text).map_err(|e| LabError::io(path, e))
}
