//! `tokenizer.ggml.model = gpt2`: byte-level BPE from the GGUF vocabulary and merges.

use std::collections::BTreeMap;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Merges, Vocab};

use super::gguf_meta::{GgufVocab, get_bool, string_array};
use super::{KilnTokenizer, pretok};
use crate::ModelError;
use crate::gguf::MetaValue;

/// Builds the byte-level BPE tokenizer, its pre-tokenizer chosen by `tokenizer.ggml.pre`.
pub(super) fn build(
    vocab: &GgufVocab,
    meta: &BTreeMap<String, MetaValue>,
) -> Result<KilnTokenizer, ModelError> {
    let merges = string_array(meta, "tokenizer.ggml.merges")?.ok_or_else(|| {
        ModelError::Tokenizer("gpt2 tokenizer without tokenizer.ggml.merges".into())
    })?;
    let merges = parse_merges(&merges)?;
    let pre = meta
        .get("tokenizer.ggml.pre")
        .and_then(MetaValue::as_str)
        .unwrap_or("");
    let spec = pretok::spec_for(pre).unwrap_or_else(|| {
        tracing::warn!(
            pre,
            "unknown tokenizer.ggml.pre; using GPT-2's pre-tokenizer, tokenization may differ"
        );
        pretok::spec_for("gpt-2").unwrap_or(pretok::PreTokenizerSpec {
            regexes: Vec::new(),
            ignore_merges: false,
            add_bos_default: false,
        })
    });

    let model = BPE::builder()
        .vocab_and_merges(vocab_map(&vocab.tokens), merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| ModelError::Tokenizer(format!("BPE model: {e}")))?;
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(pretok::build(&spec)?));
    tok.with_decoder(Some(ByteLevelDecoder::default()));
    super::special::add_special_tokens(&mut tok, &vocab.tokens, &vocab.types)?;

    let add_bos = get_bool(meta, "tokenizer.ggml.add_bos_token").unwrap_or(spec.add_bos_default);
    let add_eos = get_bool(meta, "tokenizer.ggml.add_eos_token").unwrap_or(false);
    let edges = super::special::Edges {
        bos: add_bos,
        eos: add_eos,
    };
    super::special::edge_post_processor(&mut tok, vocab, edges)?;
    Ok(KilnTokenizer::new(
        tok,
        vocab.bos_id,
        vocab.eog_ids(),
        add_bos,
        vocab.tokens.len(),
    ))
}

/// Token → id, keeping the first id of a string that occurs twice (some GGUFs repeat padding
/// tokens; the later ids still exist as embedding rows but cannot be produced by encoding).
pub(super) fn vocab_map(tokens: &[String]) -> Vocab {
    let mut map = Vocab::default();
    let mut dups = 0usize;
    for (id, t) in tokens.iter().enumerate() {
        if map.contains_key(t) {
            dups += 1;
        } else {
            map.insert(t.clone(), id as u32);
        }
    }
    if dups > 0 {
        tracing::warn!(
            dups,
            "GGUF vocabulary repeats token strings; the first id of each is used"
        );
    }
    map
}

/// `"a b"` merge strings into pairs. The split is at the first space after the first char, as
/// llama.cpp does, so a left part may itself start with a space.
fn parse_merges(merges: &[String]) -> Result<Merges, ModelError> {
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let first_len = m.chars().next().map_or(0, char::len_utf8);
            let pos = m
                .get(first_len..)
                .and_then(|rest| rest.find(' '))
                .map(|p| p + first_len)
                .ok_or_else(|| {
                    ModelError::Tokenizer(format!(
                        "tokenizer.ggml.merges[{i}] = {m:?} has no space"
                    ))
                })?;
            Ok((m[..pos].to_string(), m[pos + 1..].to_string()))
        })
        .collect()
}
