//! `tokenizer.ggml.model = llama`: SentencePiece vocabularies (Llama 2, Mistral v1, Gemma…),
//! built as Hugging Face's `LlamaConverter` does: a BPE model whose merges come from the piece
//! scores, byte fallback to `<0xNN>` tokens, spaces as `▁`.

use std::collections::{BTreeMap, HashMap};

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Merges};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper};

use super::gguf_meta::{GgufVocab, get_bool, token_type};
use super::{KilnTokenizer, special};
use crate::ModelError;
use crate::gguf::MetaValue;

/// SentencePiece's word-boundary mark, which stands for a space.
const SPACE_MARK: &str = "\u{2581}";

/// Builds the SentencePiece-style tokenizer.
pub(super) fn build(
    vocab: &GgufVocab,
    meta: &BTreeMap<String, MetaValue>,
) -> Result<KilnTokenizer, ModelError> {
    let scores = vocab.scores.as_ref().ok_or_else(|| {
        ModelError::Tokenizer("llama tokenizer without tokenizer.ggml.scores".into())
    })?;
    // llama.cpp's defaults for SentencePiece vocabularies; the GGUF may override both.
    let add_space_prefix = get_bool(meta, "tokenizer.ggml.add_space_prefix").unwrap_or(true);
    let add_bos = get_bool(meta, "tokenizer.ggml.add_bos_token").unwrap_or(true);

    let has_bytes = vocab.types.contains(&token_type::BYTE);
    let merges = merges_from_scores(&vocab.tokens, scores);
    let mut builder = BPE::builder()
        .vocab_and_merges(super::gguf_bpe::vocab_map(&vocab.tokens), merges)
        .byte_fallback(has_bytes)
        .fuse_unk(true);
    if let Some(unk) = vocab.unk_id.and_then(|id| vocab.text(id)) {
        builder = builder.unk_token(unk.to_string());
    }
    let model = builder
        .build()
        .map_err(|e| ModelError::Tokenizer(format!("BPE model: {e}")))?;

    let mut tok = tokenizers::Tokenizer::new(model);
    let replace = |from: &str, to: &str| {
        Replace::new(from, to).map_err(|e| ModelError::Tokenizer(format!("replace {from:?}: {e}")))
    };
    // llama.cpp puts a space before every run of text that starts the input or follows a special
    // token; normalizers run on each piece between added tokens, so Prepend does the same.
    let mut norm: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        norm.push(Prepend::new(SPACE_MARK.to_string()).into());
    }
    norm.push(replace(" ", SPACE_MARK)?.into());
    tok.with_normalizer(Some(NormalizerSequence::new(norm)))
        .map_err(|e| ModelError::Tokenizer(format!("normalizer: {e}")))?;

    let mut dec: Vec<DecoderWrapper> = vec![
        replace(SPACE_MARK, " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        // The prefix space added on encoding is not part of the text.
        dec.push(Strip::new(' ', 1, 0).into());
    }
    tok.with_decoder(Some(DecoderSequence::new(dec)));

    special::add_special_tokens(&mut tok, &vocab.tokens, &vocab.types)?;
    let add_eos = get_bool(meta, "tokenizer.ggml.add_eos_token").unwrap_or(false);
    let edges = special::Edges {
        bos: add_bos,
        eos: add_eos,
    };
    special::edge_post_processor(&mut tok, vocab, edges)?;
    Ok(KilnTokenizer::new(
        tok,
        vocab.bos_id,
        vocab.eog_ids(),
        add_bos,
        vocab.tokens.len(),
    ))
}

/// Merges as Hugging Face's `SentencePieceExtractor` derives them: every split of a piece into
/// two pieces of the vocabulary is a merge, ranked by the merged piece's score (highest first),
/// ties kept in vocabulary order. Applying them lowest rank first reproduces SentencePiece's
/// "merge the best-scoring adjacent pair" loop.
pub(super) fn merges_from_scores(tokens: &[String], scores: &[f32]) -> Merges {
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        ids.entry(t.as_str()).or_insert(i);
    }
    let mut merges: Vec<(usize, usize, f32)> = Vec::new();
    for (i, piece) in tokens.iter().enumerate() {
        let mut local: Vec<(usize, usize)> = Vec::new();
        for (cut, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(cut);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                local.push((li, ri));
            }
        }
        local.sort_unstable();
        let score = scores.get(i).copied().unwrap_or(0.0);
        merges.extend(local.into_iter().map(|(l, r)| (l, r, score)));
    }
    // Stable: equal scores keep the order above.
    merges.sort_by(|a, b| b.2.total_cmp(&a.2));
    merges
        .into_iter()
        .map(|(l, r, _)| (tokens[l].clone(), tokens[r].clone()))
        .collect()
}
