//! `tokenizer.ggml.model = bert`: WordPiece vocabularies as llama.cpp's converter stores them.
//!
//! The converter writes a "phantom space" vocabulary: a control token (`[CLS]`) as it is, a
//! continuation piece `##ing` as `ing`, any other piece `the` as `▁the`. Inverting that gives the
//! original WordPiece vocabulary back, which runs as Hugging Face's BERT tokenizer does: the BERT
//! normalizer (lowercasing and accent stripping as the file says), BERT's pre-tokenizer, greedy
//! longest-match WordPiece, and `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` with token types 0/1.

use std::collections::BTreeMap;

use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;

use super::gguf_meta::{GgufVocab, get_bool, token_id, token_type};
use super::{KilnTokenizer, special};
use crate::ModelError;
use crate::gguf::MetaValue;

/// The mark the converter puts before a word-initial piece.
const PHANTOM_SPACE: char = '\u{2581}';
/// Hugging Face's prefix for a piece that continues a word.
const CONTINUATION: &str = "##";
/// llama.cpp's default ids for BERT's `[CLS]` and `[SEP]` when a file names neither.
const DEFAULT_CLS: u32 = 101;
const DEFAULT_SEP: u32 = 102;

/// Builds the WordPiece tokenizer of a BERT GGUF.
pub(super) fn build(
    vocab: &GgufVocab,
    meta: &BTreeMap<String, MetaValue>,
) -> Result<KilnTokenizer, ModelError> {
    let pieces: Vec<String> = (vocab.tokens.iter().zip(&vocab.types))
        .map(|(t, ty)| original_piece(t, *ty))
        .collect();
    // Every id below is inside the vocabulary: `token_id` and `GgufVocab::read` check the
    // file's, the filter llama.cpp's defaults.
    let n = pieces.len();
    let default = |id: u32| Some(id).filter(|&id| (id as usize) < n);
    let cls = (vocab.bos_id)
        .or(token_id(meta, "tokenizer.ggml.cls_token_id", n)?)
        .or(default(DEFAULT_CLS))
        .ok_or_else(|| no_special("[CLS]", "tokenizer.ggml.bos_token_id"))?;
    let sep = token_id(meta, "tokenizer.ggml.seperator_token_id", n)?
        .or(vocab.eos_id)
        .or(default(DEFAULT_SEP))
        .ok_or_else(|| no_special("[SEP]", "tokenizer.ggml.seperator_token_id"))?;

    let mut builder = WordPiece::builder()
        .vocab(super::gguf_bpe::vocab_map(&pieces))
        .continuing_subword_prefix(CONTINUATION.into());
    if let Some(unk) = vocab.unk_id.and_then(|id| pieces.get(id as usize)) {
        builder = builder.unk_token(unk.clone());
    }
    let model = builder
        .build()
        .map_err(|e| ModelError::Tokenizer(format!("WordPiece model: {e}")))?;
    let mut tok = tokenizers::Tokenizer::new(model);

    // llama.cpp lowercases unless the file says otherwise, and strips accents exactly when it
    // lowercases unless the file says otherwise.
    let lowercase = get_bool(meta, "tokenizer.ggml.normalizer.lowercase").unwrap_or(true);
    let strip_accents =
        get_bool(meta, "tokenizer.ggml.normalizer.strip_accents").unwrap_or(lowercase);
    tok.with_normalizer(Some(BertNormalizer::new(
        true,
        true,
        Some(strip_accents),
        lowercase,
    )))
    .map_err(|e| ModelError::Tokenizer(format!("normalizer: {e}")))?;
    tok.with_pre_tokenizer(Some(BertPreTokenizer));
    tok.with_decoder(Some(WordPieceDecoder::new(CONTINUATION.into(), true)));
    special::add_special_tokens(&mut tok, &pieces, &vocab.types)?;
    tok.with_post_processor(Some(BertProcessing::new(
        (pieces[sep as usize].clone(), sep),
        (pieces[cls as usize].clone(), cls),
    )));
    Ok(KilnTokenizer::new(
        tok,
        Some(cls),
        vec![sep],
        true,
        vocab.tokens.len(),
    ))
}

/// The Hugging Face WordPiece string of one phantom-space vocabulary entry.
fn original_piece(stored: &str, ty: i64) -> String {
    if ty == token_type::CONTROL {
        return stored.to_string();
    }
    match stored.strip_prefix(PHANTOM_SPACE) {
        Some(word_start) => word_start.to_string(),
        None => format!("{CONTINUATION}{stored}"),
    }
}

fn no_special(token: &str, key: &str) -> ModelError {
    ModelError::Tokenizer(format!(
        "a bert vocabulary needs a {token} token: {key} is missing and the default id is outside the vocabulary"
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::gguf::MetaValue;
    use crate::tokenizer::tokenizer_from_metadata;

    /// A phantom-space vocabulary as llama.cpp's converter writes it: control tokens bare, word
    /// starts behind `▁`, continuations bare.
    fn meta(lowercase: Option<bool>) -> BTreeMap<String, MetaValue> {
        let tokens = [
            ("[PAD]", 3),
            ("[UNK]", 3),
            ("[CLS]", 3),
            ("[SEP]", 3),
            ("▁hello", 1),
            ("▁world", 1),
            ("▁play", 1),
            ("ing", 1),
            ("▁,", 1),
            ("▁cafe", 1),
        ];
        let s = |v: &str| MetaValue::String(v.to_string());
        let mut m = BTreeMap::new();
        m.insert("tokenizer.ggml.model".into(), s("bert"));
        m.insert(
            "tokenizer.ggml.tokens".into(),
            MetaValue::Array(tokens.iter().map(|t| s(t.0)).collect()),
        );
        m.insert(
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(tokens.iter().map(|t| MetaValue::I32(t.1)).collect()),
        );
        m.insert("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(2));
        m.insert(
            "tokenizer.ggml.seperator_token_id".into(),
            MetaValue::U32(3),
        );
        m.insert("tokenizer.ggml.unknown_token_id".into(), MetaValue::U32(1));
        if let Some(v) = lowercase {
            m.insert(
                "tokenizer.ggml.normalizer.lowercase".into(),
                MetaValue::Bool(v),
            );
        }
        m
    }

    #[test]
    fn the_phantom_space_vocabulary_tokenizes_as_wordpiece() {
        let tok = tokenizer_from_metadata(&meta(None)).unwrap();
        // Lowercased and accents stripped by default, as llama.cpp does; `ing` continues `play`.
        let ids = tok.encode("Hello, PLAYING Café world", true).unwrap();
        assert_eq!(ids, vec![2, 4, 8, 6, 7, 9, 5, 3]);
        assert_eq!(tok.decode(&ids, true).unwrap(), "hello, playing cafe world");
        let pair = tok.inner().encode(("hello", "world"), true).unwrap();
        assert_eq!(pair.get_ids(), &[2, 4, 3, 5, 3]);
        assert_eq!(pair.get_type_ids(), &[0, 0, 0, 1, 1]);
    }

    #[test]
    fn a_cased_vocabulary_keeps_case() {
        let tok = tokenizer_from_metadata(&meta(Some(false))).unwrap();
        assert_eq!(tok.encode("Hello world", true).unwrap(), vec![2, 1, 5, 3]);
    }

    #[test]
    fn special_ids_outside_the_vocabulary_are_refused() {
        let mut m = meta(None);
        m.insert(
            "tokenizer.ggml.seperator_token_id".into(),
            MetaValue::U32(99),
        );
        let err = tokenizer_from_metadata(&m).unwrap_err().to_string();
        assert!(err.contains("outside"), "{err}");
    }
}
