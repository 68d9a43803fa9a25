//! Loading a Hugging Face tokenizer folder: `tokenizer.json`, `tokenizer_config.json` and,
//! when present, `generation_config.json` (which often lists more EOS ids).

use std::path::Path;

use serde_json::Value;

use super::KilnTokenizer;
use crate::ModelError;

impl KilnTokenizer {
    /// Loads `dir/tokenizer.json` with the BOS/EOS tokens and `add_bos_token` of
    /// `dir/tokenizer_config.json`. Without `add_bos_token`, BOS is added exactly when the
    /// tokenizer's own post-processor adds it.
    pub fn from_hf_folder(dir: &Path) -> Result<Self, ModelError> {
        let tok_path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let generation = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);

        let token_id = |key: &str| -> Option<u32> {
            let text = special_token_text(config.get(key)?)?;
            inner.token_to_id(text)
        };
        let bos_id = token_id("bos_token").or_else(|| first_id(generation.get("bos_token_id")));
        let mut eos_ids: Vec<u32> = token_id("eos_token").into_iter().collect();
        if let Some(v) = generation.get("eos_token_id") {
            eos_ids.extend(all_ids(v));
        }
        // What the post-processor does decides the default; probing keeps the two in agreement.
        let adds_bos = inner
            .encode_fast("", true)
            .ok()
            .is_some_and(|e| bos_id.is_some() && e.get_ids().first() == bos_id.as_ref());
        let add_bos = config
            .get("add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(adds_bos);
        let vocab_size = inner.get_vocab_size(true);
        Ok(Self::new(inner, bos_id, eos_ids, add_bos, vocab_size))
    }
}

/// A JSON file, or `None` if it does not exist.
fn read_json(path: &Path) -> Result<Option<Value>, ModelError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ModelError::io(path, e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))
}

/// `"<s>"` or `{"content": "<s>", ...}` (older `AddedToken` form).
fn special_token_text(v: &Value) -> Option<&str> {
    v.as_str().or_else(|| v.get("content")?.as_str())
}

/// An id or the first of a list of ids.
fn first_id(v: Option<&Value>) -> Option<u32> {
    all_ids(v?).into_iter().next()
}

/// An id or a list of ids; anything else gives none.
fn all_ids(v: &Value) -> Vec<u32> {
    let one = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
    match v {
        Value::Array(a) => a.iter().filter_map(one).collect(),
        other => one(other).into_iter().collect(),
    }
}
