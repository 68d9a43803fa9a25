//! Reading the `tokenizer.ggml.*` keys of a GGUF header into plain vectors.

use std::collections::BTreeMap;

use crate::ModelError;
use crate::gguf::MetaValue;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
pub(crate) mod token_type {
    /// An ordinary vocabulary entry.
    pub const NORMAL: i64 = 1;
    /// The unknown token.
    pub const UNKNOWN: i64 = 2;
    /// A control token (BOS, EOS, `<|im_start|>`): special, matched whole, skipped on decode.
    pub const CONTROL: i64 = 3;
    /// A user-defined token: matched whole but decoded as text.
    pub const USER_DEFINED: i64 = 4;
    /// A SentencePiece byte-fallback token `<0xNN>`.
    pub const BYTE: i64 = 6;
}

/// The vocabulary part of a GGUF header.
pub(crate) struct GgufVocab {
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// `tokenizer.ggml.tokens`.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, or all [`token_type::NORMAL`] when absent.
    pub types: Vec<i64>,
    /// `tokenizer.ggml.scores`, if present.
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// EOT/EOM ids, which also end generation.
    pub extra_eog: Vec<u32>,
}

impl GgufVocab {
    /// Reads and checks the vocabulary keys.
    pub fn read(meta: &BTreeMap<String, MetaValue>) -> Result<Self, ModelError> {
        let model = meta
            .get("tokenizer.ggml.model")
            .and_then(MetaValue::as_str)
            .ok_or_else(|| missing("tokenizer.ggml.model"))?
            .to_string();
        let tokens = string_array(meta, "tokenizer.ggml.tokens")?
            .ok_or_else(|| missing("tokenizer.ggml.tokens"))?;
        let n = tokens.len();
        let types = match meta.get("tokenizer.ggml.token_type") {
            None => vec![token_type::NORMAL; n],
            Some(v) => {
                let arr = v
                    .as_array()
                    .ok_or_else(|| bad("tokenizer.ggml.token_type", "not an array"))?;
                arr.iter()
                    .map(|t| {
                        t.as_i64()
                            .ok_or_else(|| bad("tokenizer.ggml.token_type", "not integers"))
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        if types.len() != n {
            return Err(bad(
                "tokenizer.ggml.token_type",
                &format!("{} entries for {n} tokens", types.len()),
            ));
        }
        let scores = match meta.get("tokenizer.ggml.scores") {
            None => None,
            Some(v) => {
                let arr = v
                    .as_array()
                    .ok_or_else(|| bad("tokenizer.ggml.scores", "not an array"))?;
                let s = arr
                    .iter()
                    .map(|x| {
                        x.as_f64()
                            .map(|f| f as f32)
                            .ok_or_else(|| bad("tokenizer.ggml.scores", "not numbers"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if s.len() != n {
                    return Err(bad(
                        "tokenizer.ggml.scores",
                        &format!("{} entries for {n} tokens", s.len()),
                    ));
                }
                Some(s)
            }
        };
        let id = |key: &str| token_id(meta, key, n);
        let mut extra_eog = Vec::new();
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(t) = id(key)? {
                extra_eog.push(t);
            }
        }
        Ok(Self {
            model,
            tokens,
            types,
            scores,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            unk_id: id("tokenizer.ggml.unknown_token_id")?,
            extra_eog,
        })
    }

    /// The end-of-generation ids: EOS, EOT/EOM, then control tokens whose text is a well-known
    /// end-of-turn marker (llama.cpp does the same, since many GGUFs only record one EOS).
    pub fn eog_ids(&self) -> Vec<u32> {
        const KNOWN_EOG: &[&str] = &[
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "<|eom_id|>",
            "<EOT>",
            "_<EOT>",
            "<|end_of_text|>",
            "<｜end▁of▁sentence｜>",
        ];
        let mut ids: Vec<u32> = self
            .eos_id
            .into_iter()
            .chain(self.extra_eog.iter().copied())
            .collect();
        for (i, (tok, ty)) in self.tokens.iter().zip(&self.types).enumerate() {
            if *ty == token_type::CONTROL && KNOWN_EOG.contains(&tok.as_str()) {
                ids.push(i as u32);
            }
        }
        ids
    }

    /// The text of token `id`, if in range.
    pub fn text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }
}

/// A `bool` key, if present.
pub(crate) fn get_bool(meta: &BTreeMap<String, MetaValue>, key: &str) -> Option<bool> {
    meta.get(key).and_then(MetaValue::as_bool)
}

/// A string-array key, if present.
pub(crate) fn string_array(
    meta: &BTreeMap<String, MetaValue>,
    key: &str,
) -> Result<Option<Vec<String>>, ModelError> {
    let Some(v) = meta.get(key) else {
        return Ok(None);
    };
    let arr = v.as_array().ok_or_else(|| bad(key, "not an array"))?;
    arr.iter()
        .map(|s| {
            s.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(key, "not strings"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A token-id key, checked against the vocabulary size. Negative ids mean "none" (some
/// converters write -1).
pub(crate) fn token_id(
    meta: &BTreeMap<String, MetaValue>,
    key: &str,
    n: usize,
) -> Result<Option<u32>, ModelError> {
    let Some(v) = meta.get(key) else {
        return Ok(None);
    };
    let Some(i) = v.as_i64() else {
        return Err(bad(key, "not an integer"));
    };
    if i < 0 {
        return Ok(None);
    }
    if i as u64 >= n as u64 {
        return Err(bad(
            key,
            &format!("id {i} is outside the {n}-token vocabulary"),
        ));
    }
    Ok(Some(i as u32))
}

fn missing(key: &str) -> ModelError {
    ModelError::Tokenizer(format!("GGUF metadata has no {key}"))
}

fn bad(key: &str, why: &str) -> ModelError {
    ModelError::Tokenizer(format!("GGUF metadata {key}: {why}"))
}
