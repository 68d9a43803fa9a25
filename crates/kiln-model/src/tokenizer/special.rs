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

/// What a GGUF says its tokenizer adds around every sequence: `tokenizer.ggml.add_bos_token`
/// and `add_eos_token` (llama.cpp adds both wherever it tokenizes with specials).
#[derive(Debug, Clone, Copy)]
pub(super) struct Edges {
    /// BOS before the text.
    pub bos: bool,
    /// EOS after it (EmbeddingGemma's GGUFs).
    pub eos: bool,
}

/// Installs a post-processor that puts BOS before and/or EOS after each sequence (a pair gets
/// them around each half), as `edges` says; nothing when neither is added.
pub(super) fn edge_post_processor(
    tok: &mut tokenizers::Tokenizer,
    vocab: &GgufVocab,
    edges: Edges,
) -> Result<(), ModelError> {
    let token = |wanted: bool,
                 id: Option<u32>,
                 what: &str|
     -> Result<Option<(String, u32)>, ModelError> {
        if !wanted {
            return Ok(None);
        }
        let id = id.ok_or_else(|| {
            ModelError::Tokenizer(format!(
                "tokenizer.ggml.add_{what}_token is true but there is no tokenizer.ggml.{what}_token_id"
            ))
        })?;
        let text = vocab.text(id).ok_or_else(|| {
            ModelError::Tokenizer(format!(
                "{} id {id} is not in the vocabulary",
                what.to_uppercase()
            ))
        })?;
        Ok(Some((text.to_string(), id)))
    };
    let bos = token(edges.bos, vocab.bos_id, "bos")?;
    let eos = token(edges.eos, vocab.eos_id, "eos")?;
    if bos.is_none() && eos.is_none() {
        return Ok(());
    }
    let around = |piece: &str| -> Vec<String> {
        (bos.iter().map(|(t, _)| t.clone()))
            .chain([piece.to_string()])
            .chain(eos.iter().map(|(t, _)| t.clone()))
            .collect()
    };
    let err = |e: String| ModelError::Tokenizer(format!("BOS/EOS post-processor: {e}"));
    let processor = TemplateProcessing::builder()
        .try_single(around("$A"))
        .map_err(err)?
        .try_pair([around("$A"), around("$B")].concat())
        .map_err(err)?
        .special_tokens(bos.into_iter().chain(eos).collect::<Vec<_>>())
        .build()
        .map_err(|e| err(e.to_string()))?;
    tok.with_post_processor(Some(processor));
    Ok(())
}
