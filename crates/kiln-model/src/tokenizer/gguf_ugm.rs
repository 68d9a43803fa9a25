//! `tokenizer.ggml.model = t5`: SentencePiece Unigram vocabularies (XLM-RoBERTa and the
//! bge-reranker/bge-m3 family), as llama.cpp's converter stores them: pieces with their scores,
//! the SentencePiece normalizer's `precompiled_charsmap`, `add_space_prefix` and
//! `remove_extra_whitespaces`. They run as Hugging Face's converted XLM-RoBERTa tokenizer does:
//! the charsmap, runs of spaces folded, Metaspace (`▁`) splitting, Viterbi over the pieces, and
//! `<s> A </s>` / `<s> A </s></s> B </s>` (every token type 0).

use std::collections::BTreeMap;

use tokenizers::decoders::metaspace::Metaspace as MetaspaceDecoder;
use tokenizers::models::unigram::Unigram;
use tokenizers::normalizers::replace::{Replace, ReplacePattern};
use tokenizers::normalizers::{NormalizerWrapper, Precompiled, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::processors::template::TemplateProcessing;

use super::gguf_meta::{GgufVocab, get_bool, token_id};
use super::{KilnTokenizer, charsmap, special};
use crate::ModelError;
use crate::gguf::MetaValue;

/// SentencePiece's whitespace mark.
const SPACE_MARK: char = '\u{2581}';

fn err(what: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(format!("{what}: {e}"))
}

/// Builds the Unigram tokenizer of a `t5`-model GGUF.
pub(super) fn build(
    vocab: &GgufVocab,
    meta: &BTreeMap<String, MetaValue>,
) -> Result<KilnTokenizer, ModelError> {
    let scores = vocab.scores.as_ref().ok_or_else(|| {
        ModelError::Tokenizer("a t5 (Unigram) tokenizer without tokenizer.ggml.scores".into())
    })?;
    let pieces: Vec<(String, f64)> = (vocab.tokens.iter().zip(scores))
        .map(|(t, s)| (t.clone(), f64::from(*s)))
        .collect();
    let unk = vocab.unk_id.map(|id| id as usize);
    let model = Unigram::from(pieces, unk, false).map_err(|e| err("Unigram model", e))?;
    let mut tok = tokenizers::Tokenizer::new(model);

    let mut norm: Vec<NormalizerWrapper> = Vec::new();
    if let Some(map) = charsmap_bytes(meta)? {
        charsmap::check(&map)?;
        norm.push(
            Precompiled::from(&map)
                .map_err(|e| err("precompiled_charsmap", e))?
                .into(),
        );
    }
    if get_bool(meta, "tokenizer.ggml.remove_extra_whitespaces").unwrap_or(true) {
        let runs = Replace::new(ReplacePattern::Regex(" {2,}".into()), " ")
            .map_err(|e| err("whitespace rule", e))?;
        norm.push(runs.into());
    }
    tok.with_normalizer(Some(NormalizerSequence::new(norm)))
        .map_err(|e| err("normalizer", e))?;
    let prepend = match get_bool(meta, "tokenizer.ggml.add_space_prefix").unwrap_or(true) {
        true => PrependScheme::Always,
        false => PrependScheme::Never,
    };
    tok.with_pre_tokenizer(Some(Metaspace::new(SPACE_MARK, prepend, true)));
    tok.with_decoder(Some(MetaspaceDecoder::new(SPACE_MARK, prepend, true)));
    special::add_special_tokens(&mut tok, &vocab.tokens, &vocab.types)?;
    tok.with_post_processor(Some(pair_template(vocab, meta)?));
    Ok(KilnTokenizer::new(
        tok,
        vocab.bos_id,
        vocab.eog_ids(),
        false,
        vocab.tokens.len(),
    ))
}

/// `tokenizer.ggml.precompiled_charsmap` as bytes (an array of u8 or i8), if present.
fn charsmap_bytes(meta: &BTreeMap<String, MetaValue>) -> Result<Option<Vec<u8>>, ModelError> {
    let Some(v) = meta.get("tokenizer.ggml.precompiled_charsmap") else {
        return Ok(None);
    };
    let not_bytes = || {
        ModelError::Tokenizer("tokenizer.ggml.precompiled_charsmap is not an array of bytes".into())
    };
    let items = v.as_array().ok_or_else(not_bytes)?;
    items
        .iter()
        .map(|b| match b {
            MetaValue::U8(b) => Ok(*b),
            MetaValue::I8(b) => Ok(*b as u8),
            _ => Err(not_bytes()),
        })
        .collect::<Result<Vec<u8>, _>>()
        .map(Some)
}

/// `[BOS] A [EOS]` and `[BOS] A [EOS] [SEP] B [EOS]`, each piece where the file adds it
/// (llama.cpp's defaults for this vocabulary: BOS and EOS yes, SEP only when asked), as
/// llama.cpp puts a reranker's query and document together.
fn pair_template(
    vocab: &GgufVocab,
    meta: &BTreeMap<String, MetaValue>,
) -> Result<TemplateProcessing, ModelError> {
    let n = vocab.tokens.len();
    let sep_id = token_id(meta, "tokenizer.ggml.seperator_token_id", n)?.or(vocab.eos_id);
    let piece = |add: bool, id: Option<u32>| -> Option<(String, u32)> {
        let id = id.filter(|_| add)?;
        Some((vocab.text(id)?.to_string(), id))
    };
    let bos = piece(
        get_bool(meta, "tokenizer.ggml.add_bos_token").unwrap_or(true),
        vocab.bos_id,
    );
    let eos = piece(
        get_bool(meta, "tokenizer.ggml.add_eos_token").unwrap_or(true),
        vocab.eos_id,
    );
    let sep = piece(
        get_bool(meta, "tokenizer.ggml.add_sep_token").unwrap_or(false),
        sep_id,
    );
    let text = |p: &Option<(String, u32)>| p.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>();
    let seq = |s: &str| vec![s.to_string()];
    let single = [text(&bos), seq("$A"), text(&eos)].concat();
    let pair = [single.clone(), text(&sep), seq("$B"), text(&eos)].concat();
    let mut specials: Vec<(String, u32)> = [bos, eos, sep].into_iter().flatten().collect();
    specials.sort();
    specials.dedup();
    TemplateProcessing::builder()
        .try_single(single)
        .map_err(|e| err("pair template", e))?
        .try_pair(pair)
        .map_err(|e| err("pair template", e))?
        .special_tokens(specials)
        .build()
        .map_err(|e| err("pair template", e))
}
