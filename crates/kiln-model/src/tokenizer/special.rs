//! Special tokens and the BOS post-processor, shared by the GGUF builders.

use tokenizers::AddedToken;
use tokenizers::processors::template::TemplateProcessing;

use super::gguf_meta::{GgufVocab, token_type};
use crate::ModelError;

/// Registers control tokens (and the unknown token) as special and user-defined tokens as plain
/// added tokens: both are then matched as whole strings before pre-tokenization, as llama.cpp's
/// `tokenizer_st_partition` does; only the special ones are dropped by `skip_special` decoding.
pub(super) fn add_special_tokens(
    tok: &mut tokenizers::Tokenizer,
    tokens: &[String],
    types: &[i64],
) -> Result<(), ModelError> {
    let mut added = Vec::new();
    for (text, ty) in tokens.iter().zip(types) {
        // An empty string cannot be matched; some vocabularies have empty padding entries.
        if text.is_empty() {
            continue;
        }
        match *ty {
            token_type::CONTROL | token_type::UNKNOWN => {
                added.push(AddedToken::from(text.clone(), true))
            }
            token_type::USER_DEFINED => {
                added.push(AddedToken::from(text.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    tok.add_special_tokens(added)
        .map_err(|e| ModelError::Tokenizer(format!("adding special tokens: {e}")))?;
    Ok(())
}

/// A post-processor that starts every sequence with BOS, so that a saved `tokenizer.json` adds it
/// the way the GGUF says (`tokenizer.ggml.add_bos_token`).
pub(super) fn bos_post_processor(
    tok: &mut tokenizers::Tokenizer,
    vocab: &GgufVocab,
) -> Result<(), ModelError> {
    let Some(bos) = vocab.bos_id else {
        return Err(ModelError::Tokenizer(
            "tokenizer.ggml.add_bos_token is true but there is no tokenizer.ggml.bos_token_id"
                .into(),
        ));
    };
    let Some(text) = vocab.text(bos) else {
        return Err(ModelError::Tokenizer(format!(
            "BOS id {bos} is not in the vocabulary"
        )));
    };
    let err = |e: String| ModelError::Tokenizer(format!("BOS post-processor: {e}"));
    let processor = TemplateProcessing::builder()
        .try_single(vec![text.to_string(), "$A".to_string()])
        .map_err(err)?
        .try_pair(vec![
            text.to_string(),
            "$A".to_string(),
            text.to_string(),
            "$B".to_string(),
        ])
        .map_err(err)?
        .special_tokens(vec![(text.to_string(), bos)])
        .build()
        .map_err(|e| err(e.to_string()))?;
    tok.with_post_processor(Some(processor));
    Ok(())
}
