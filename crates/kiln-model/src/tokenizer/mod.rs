//! Tokenizers: built from GGUF metadata (`gpt2` byte-level BPE, `llama` SentencePiece, `bert`
//! WordPiece, `t5` SentencePiece Unigram) or loaded from a Hugging Face folder, all as a [`tokenizers::Tokenizer`] behind one [`KilnTokenizer`].
//!
//! BOS rule: [`KilnTokenizer::encode`] with `add_special = true` adds BOS when the model asks for
//! it (`add_bos`), exactly once. Chat prompts go through
//! [`crate::chat_template::prompt_ids`], which turns `add_special` off when the rendered text
//! already begins with the BOS string, so a template that writes `{{ bos_token }}` never gets a
//! second one.

mod charsmap;
mod gguf_bpe;
mod gguf_meta;
mod gguf_spm;
mod gguf_ugm;
mod gguf_wpm;
mod hf;
mod pretok;
mod special;

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::BTreeMap;

use tokenizers::DecoderWrapper;

use crate::ModelError;
use crate::gguf::{GgufHeader, MetaValue};

/// Builds the tokenizer described by a GGUF header's `tokenizer.ggml.*` metadata.
pub fn tokenizer_from_gguf(header: &GgufHeader) -> Result<KilnTokenizer, ModelError> {
    tokenizer_from_metadata(&header.metadata)
}

/// As [`tokenizer_from_gguf`], from the metadata map alone (tests build one by hand).
pub(crate) fn tokenizer_from_metadata(
    meta: &BTreeMap<String, MetaValue>,
) -> Result<KilnTokenizer, ModelError> {
    let vocab = gguf_meta::GgufVocab::read(meta)?;
    match vocab.model.as_str() {
        "gpt2" => gguf_bpe::build(&vocab, meta),
        "llama" => gguf_spm::build(&vocab, meta),
        "bert" => gguf_wpm::build(&vocab, meta),
        "t5" => gguf_ugm::build(&vocab, meta),
        other => Err(ModelError::Tokenizer(format!(
            "tokenizer.ggml.model = {other:?} is not supported (supported: gpt2, llama, bert, t5)"
        ))),
    }
}

/// How a vocabulary string maps to the bytes it stands for; used by [`KilnTokenizer::token_bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PieceEncoding {
    /// GPT-2 byte-level: every char of the token is one byte through the byte-to-unicode table.
    ByteLevel,
    /// SentencePiece: `▁` is a space and `<0xNN>` is one raw byte.
    SentencePiece,
    /// Anything else: ask the decoder for the single token.
    Decoder,
}

/// A tokenizer plus the special-token facts an engine needs (BOS, the end-of-generation ids).
#[derive(Debug, Clone)]
pub struct KilnTokenizer {
    inner: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    vocab_size: usize,
    pieces: PieceEncoding,
}

impl KilnTokenizer {
    /// Wraps a built tokenizer. `eos_ids` lists the primary EOS first; duplicates are dropped.
    fn new(
        inner: tokenizers::Tokenizer,
        bos_id: Option<u32>,
        eos_ids: Vec<u32>,
        add_bos: bool,
        vocab_size: usize,
    ) -> Self {
        let mut unique = Vec::with_capacity(eos_ids.len());
        for id in eos_ids {
            if !unique.contains(&id) {
                unique.push(id);
            }
        }
        let pieces = piece_encoding(inner.get_decoder());
        // A folder's vocabulary may be larger than its tokenizer (padding rows); never report less.
        let vocab_size = vocab_size.max(inner.get_vocab_size(true));
        Self {
            inner,
            bos_id,
            eos_ids: unique,
            add_bos,
            vocab_size,
            pieces,
        }
    }

    /// Token ids of `text`. Special-token strings in the text (e.g. `<|im_start|>`) are always
    /// matched whole. `add_special` adds what the model adds to a sequence (BOS when `add_bos`).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .inner
            .encode_fast(text, add_special)
            .map_err(|e| ModelError::Tokenizer(format!("encode: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        // A folder may say add_bos_token without a post-processor that adds it; add it here then,
        // but never twice.
        if add_special
            && self.add_bos
            && let Some(bos) = self.bos_id
            && ids.first() != Some(&bos)
        {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// The text of `ids`. `skip_special` leaves out special tokens (BOS, EOS, control tokens).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, ModelError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Tokenizer(format!("decode: {e}")))
    }

    /// The vocabulary string of one token as stored (e.g. `Ġworld`, `▁the`, `<0x0A>`).
    pub fn token_to_piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The raw bytes one token stands for, for streaming detokenization: a byte-level or
    /// byte-fallback token may be part of a UTF-8 character, so text must be cut on bytes.
    /// Special tokens give their text. SentencePiece's leading-space stripping is not applied.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let piece = self.inner.id_to_token(id)?;
        let special = self
            .inner
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special);
        if special {
            return Some(piece.into_bytes());
        }
        match self.pieces {
            PieceEncoding::ByteLevel => Some(byte_level_bytes(&piece)),
            PieceEncoding::SentencePiece => Some(spm_bytes(&piece)),
            PieceEncoding::Decoder => self.inner.decode(&[id], false).ok().map(String::into_bytes),
        }
    }

    /// The id of a vocabulary or added-token string, if it has one.
    pub fn id_of(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of token ids (the model's embedding rows for a GGUF vocabulary).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The BOS id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The BOS token's string, if the model has one.
    pub fn bos_token(&self) -> Option<String> {
        self.bos_id.and_then(|id| self.inner.id_to_token(id))
    }

    /// The ids that end generation: the primary EOS first, then EOT/EOM-style tokens.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The primary EOS token's string, if the model has one.
    pub fn eos_token(&self) -> Option<String> {
        self.eos_ids
            .first()
            .and_then(|&id| self.inner.id_to_token(id))
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    /// Whether `encode(.., add_special = true)` starts the sequence with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The underlying Hugging Face tokenizer (e.g. to save it as `tokenizer.json`).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Picks how to turn one vocabulary string into bytes from the decoder the tokenizer uses.
fn piece_encoding(decoder: Option<&DecoderWrapper>) -> PieceEncoding {
    match decoder {
        Some(DecoderWrapper::ByteLevel(_)) => PieceEncoding::ByteLevel,
        Some(DecoderWrapper::Sequence(seq))
            if seq
                .get_decoders()
                .iter()
                .any(|d| matches!(d, DecoderWrapper::ByteFallback(_))) =>
        {
            PieceEncoding::SentencePiece
        }
        Some(DecoderWrapper::Metaspace(_)) => PieceEncoding::SentencePiece,
        _ => PieceEncoding::Decoder,
    }
}

/// GPT-2's byte-to-unicode table, inverted: printable bytes stand for themselves, the other 68
/// bytes were shifted to U+0100.. in byte order.
fn byte_level_bytes(piece: &str) -> Vec<u8> {
    let mut table = [0u32; 256];
    let mut shifted = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            b as u32
        } else {
            shifted += 1;
            255 + shifted
        };
    }
    let mut out = Vec::with_capacity(piece.len());
    for c in piece.chars() {
        match table.iter().position(|&cp| cp == c as u32) {
            Some(b) => out.push(b as u8),
            // Not a byte-level char (an added token's plain text): keep its UTF-8.
            None => out.extend_from_slice(c.to_string().as_bytes()),
        }
    }
    out
}

/// `<0xNN>` is one byte; otherwise `▁` becomes a space.
fn spm_bytes(piece: &str) -> Vec<u8> {
    if let Some(b) = parse_byte_token(piece) {
        return vec![b];
    }
    piece.replace('\u{2581}', " ").into_bytes()
}

/// The byte of a SentencePiece byte token `<0xNN>`.
pub(crate) fn parse_byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
