//! Incremental detokenisation for streaming (spec §3.1 "Multi-byte UTF-8 is held back until it
//! decodes cleanly").
//!
//! Decoding token by token is wrong in two ways: byte-level BPE tokens can end in the middle of
//! a multi-byte character, and SentencePiece-style decoders treat the first token of a sequence
//! differently (they strip its leading space), so `decode(a) + decode(b) != decode(a ++ b)`.
//! The prefix/read-offset technique fixes both: decode a short window that starts a few tokens
//! back (`prefix`), compare it with the same window without the new tokens (`prefix..read`), and
//! emit the difference only once it no longer ends in an incomplete character.

use std::sync::Arc;

use thiserror::Error;
use tokenizers::Tokenizer;

/// How many already-emitted tokens to keep as decoding context when seeding from a prompt;
/// enough for the leading-space and byte-fallback rules, which look back one token.
const CONTEXT_TOKENS: usize = 5;

/// Emitted tokens before `prefix` are dropped once this many accumulate, bounding memory.
const COMPACT_AT: usize = 1024;

/// Errors from [`IncrementalDecoder`].
#[derive(Debug, Error)]
pub enum DetokError {
    /// The tokenizer's decoder failed.
    #[error("detokenization failed: {0}")]
    Decode(String),
}

/// Turns a stream of token ids into a stream of text chunks whose concatenation equals the
/// tokenizer's decode of the whole sequence.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    skip_special: bool,
    tokens: Vec<u32>,
    /// Start of the decode window; text before it has been emitted and is never re-decoded.
    prefix: usize,
    /// End of the already-emitted part of the window.
    read: usize,
}

impl IncrementalDecoder {
    /// A decoder with no context: the first token decodes as the start of a sequence.
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special: bool) -> Self {
        Self::with_context(tokenizer, skip_special, &[])
    }

    /// A decoder that treats the tail of `context` (normally the prompt) as already emitted,
    /// so the first generated token decodes as a continuation (e.g. keeps its leading space
    /// under SentencePiece) rather than as the start of a text.
    pub fn with_context(tokenizer: Arc<Tokenizer>, skip_special: bool, context: &[u32]) -> Self {
        let tail = &context[context.len().saturating_sub(CONTEXT_TOKENS)..];
        Self {
            tokenizer,
            skip_special,
            tokens: tail.to_vec(),
            prefix: 0,
            read: tail.len(),
        }
    }

    fn decode(&self, ids: &[u32]) -> Result<String, DetokError> {
        self.tokenizer
            .decode(ids, self.skip_special)
            .map_err(|e| DetokError::Decode(e.to_string()))
    }

    /// Adds one token and returns the text it completes; empty while a character (or a
    /// decoder rule) is still waiting for later tokens.
    pub fn push(&mut self, token_id: u32) -> Result<String, DetokError> {
        self.tokens.push(token_id);
        let prefix_text = self.decode(&self.tokens[self.prefix..self.read])?;
        let new_text = self.decode(&self.tokens[self.prefix..])?;
        // Byte-level decoders render an incomplete UTF-8 tail as U+FFFD; wait for the rest.
        if new_text.len() <= prefix_text.len() || new_text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let delta = suffix_after(&new_text, &prefix_text);
        self.prefix = self.read;
        self.read = self.tokens.len();
        self.compact();
        Ok(delta)
    }

    /// Ends the stream: returns whatever is still held, even an incomplete character (which
    /// then appears as U+FFFD, as in a full decode).
    pub fn flush(&mut self) -> Result<String, DetokError> {
        if self.read == self.tokens.len() {
            return Ok(String::new());
        }
        let prefix_text = self.decode(&self.tokens[self.prefix..self.read])?;
        let new_text = self.decode(&self.tokens[self.prefix..])?;
        let delta = suffix_after(&new_text, &prefix_text);
        self.prefix = self.read;
        self.read = self.tokens.len();
        Ok(delta)
    }

    /// Token ids pushed but not yet turned into text.
    pub fn pending_tokens(&self) -> &[u32] {
        &self.tokens[self.read..]
    }

    fn compact(&mut self) {
        if self.prefix >= COMPACT_AT {
            self.tokens.drain(..self.prefix);
            self.read -= self.prefix;
            self.prefix = 0;
        }
    }
}

/// The part of `full` after `prefix`. If a decoder rewrote the overlap (so `full` does not
/// start with `prefix`), fall back to the text after their longest common prefix, cut on a
/// char boundary: a slightly off chunk is better than a panic or a stalled stream.
fn suffix_after(full: &str, prefix: &str) -> String {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest.to_string();
    }
    let common = full
        .char_indices()
        .zip(prefix.chars())
        .find(|((_, a), b)| a != b)
        .map_or(prefix.len().min(full.len()), |((i, _), _)| i);
    let mut cut = common;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    full[cut..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// GPT-2's byte → printable-char table used by ByteLevel vocabularies.
    fn bytes_to_unicode() -> Vec<char> {
        let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
            .chain(0xA1..=0xAC)
            .chain(0xAE..=0xFF)
            .collect();
        let mut cs = bs.clone();
        let mut n = 0;
        for b in 0..256u32 {
            if !bs.contains(&b) {
                bs.push(b);
                cs.push(256 + n);
                n += 1;
            }
        }
        let mut table = vec!['\0'; 256];
        for (b, c) in bs.into_iter().zip(cs) {
            table[b as usize] = char::from_u32(c).expect("valid code point");
        }
        table
    }

    /// A byte-level BPE tokenizer whose vocabulary is the 256 byte symbols plus a few merges,
    /// so multi-byte characters are split across tokens.
    fn byte_level_tokenizer() -> Arc<Tokenizer> {
        let table = bytes_to_unicode();
        let mut vocab = serde_json::Map::new();
        for (i, c) in table.iter().enumerate() {
            vocab.insert(c.to_string(), json!(i));
        }
        let sym = |b: u8| table[b as usize].to_string();
        // "he", "ll", "Ġw" merges keep ASCII words multi-char; "é" = C3 A9 gets merged,
        // but the emoji's four bytes stay four tokens.
        let merges = vec![
            format!("{} {}", sym(b'h'), sym(b'e')),
            format!("{} {}", sym(b'l'), sym(b'l')),
            format!("{} {}", sym(b' '), sym(b'w')),
            format!("{} {}", sym(0xC3), sym(0xA9)),
        ];
        for (i, m) in merges.iter().enumerate() {
            vocab.insert(m.replace(' ', ""), json!(256 + i));
        }
        vocab.insert("<eos>".into(), json!(260));
        let spec = json!({
            "version": "1.0",
            "added_tokens": [{"id": 260, "content": "<eos>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                              "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                        "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": merges}
        });
        Arc::new(Tokenizer::from_bytes(spec.to_string()).expect("tokenizer json"))
    }

    /// A Llama-style SentencePiece tokenizer: Metaspace pre-tokenizer, byte-fallback tokens,
    /// and a decoder that strips the leading space of the first token.
    fn sentencepiece_tokenizer() -> Arc<Tokenizer> {
        let mut vocab = serde_json::Map::new();
        vocab.insert("<unk>".into(), json!(0));
        for b in 0..256 {
            vocab.insert(format!("<0x{b:02X}>"), json!(1 + b));
        }
        // Merge each word left to right so every intermediate piece is in the vocabulary.
        let mut merges: Vec<String> = Vec::new();
        let add = |piece: &str, vocab: &mut serde_json::Map<String, serde_json::Value>| {
            if !vocab.contains_key(piece) {
                let id = vocab.len();
                vocab.insert(piece.into(), json!(id));
            }
        };
        for w in ["▁Hello", "▁world", "▁caf", "!"] {
            let mut chars = w.chars();
            let mut cur = chars.next().expect("non-empty").to_string();
            add(&cur, &mut vocab);
            for c in chars {
                add(&c.to_string(), &mut vocab);
                merges.push(format!("{cur} {c}"));
                cur.push(c);
                add(&cur, &mut vocab);
            }
        }
        let spec = json!({
            "version": "1.0",
            "added_tokens": [],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
            "pre_tokenizer": null,
            "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                      "vocab": vocab, "merges": merges}
        });
        Arc::new(Tokenizer::from_bytes(spec.to_string()).expect("tokenizer json"))
    }

    /// Streams `ids` and checks the chunks against the full decode.
    fn stream(tok: &Arc<Tokenizer>, ids: &[u32], skip_special: bool) -> Vec<String> {
        let mut d = IncrementalDecoder::new(tok.clone(), skip_special);
        let mut chunks: Vec<String> = ids.iter().map(|&t| d.push(t).expect("decode")).collect();
        chunks.push(d.flush().expect("flush"));
        let full = tok.decode(ids, skip_special).expect("decode");
        assert_eq!(chunks.concat(), full, "chunks {chunks:?}");
        chunks
    }

    #[test]
    fn byte_level_splits_multibyte_chars_without_replacement_chars() {
        let tok = byte_level_tokenizer();
        let text = "hello wörld café 😀 done";
        let ids = tok.encode(text, false).expect("encode").get_ids().to_vec();
        // The emoji (4 bytes) and ö (C3 B6, unmerged) must be split across tokens.
        assert!(ids.len() > text.chars().count() / 2);
        let chunks = stream(&tok, &ids, false);
        assert_eq!(chunks.concat(), text);
        assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')), "{chunks:?}");
        // Held-back bytes show up as empty chunks (3 for the emoji's first three bytes).
        assert!(chunks.iter().filter(|c| c.is_empty()).count() >= 3);
    }

    #[test]
    fn byte_level_skips_special_tokens() {
        let tok = byte_level_tokenizer();
        let mut ids = tok
            .encode("hello", false)
            .expect("encode")
            .get_ids()
            .to_vec();
        ids.push(260);
        let chunks = stream(&tok, &ids, true);
        assert_eq!(chunks.concat(), "hello");
        let chunks = stream(&tok, &ids, false);
        assert_eq!(chunks.concat(), "hello<eos>");
    }

    #[test]
    fn incomplete_tail_is_flushed_as_replacement() {
        let tok = byte_level_tokenizer();
        // First three bytes of 😀 only: nothing is emitted until flush.
        let ids = tok.encode("😀", false).expect("encode").get_ids().to_vec();
        assert_eq!(ids.len(), 4);
        let mut d = IncrementalDecoder::new(tok.clone(), false);
        for &t in &ids[..3] {
            assert_eq!(d.push(t).expect("decode"), "");
        }
        assert_eq!(d.pending_tokens().len(), 3);
        assert_eq!(
            d.flush().expect("flush"),
            tok.decode(&ids[..3], false).expect("decode")
        );
    }

    #[test]
    fn sentencepiece_leading_space_and_byte_fallback() {
        let tok = sentencepiece_tokenizer();
        let text = "Hello world é! café";
        let ids = tok.encode(text, false).expect("encode").get_ids().to_vec();
        // é has no piece, so it must go through two <0x..> byte-fallback tokens.
        assert!(
            ids.contains(&(1 + 0xC3)) && ids.contains(&(1 + 0xA9)),
            "{ids:?}"
        );
        let chunks = stream(&tok, &ids, false);
        assert_eq!(chunks.concat(), text);
        assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')), "{chunks:?}");
        // Per-token decoding would have lost the space before "world".
        let naive: String = ids
            .iter()
            .map(|&t| tok.decode(&[t], false).expect("decode"))
            .collect();
        assert_ne!(naive, text);
    }

    #[test]
    fn context_keeps_leading_space_of_first_generated_token() {
        let tok = sentencepiece_tokenizer();
        let prompt = tok
            .encode("Hello", false)
            .expect("encode")
            .get_ids()
            .to_vec();
        let generated = tok
            .encode(" world", false)
            .expect("encode")
            .get_ids()
            .to_vec();
        // " world" encodes with a prepended ▁, giving "▁▁world"-like pieces; use the plain piece.
        let world = *generated.last().expect("non-empty");
        let mut d = IncrementalDecoder::with_context(tok.clone(), false, &prompt);
        assert_eq!(d.push(world).expect("decode"), " world");
        let mut d = IncrementalDecoder::new(tok, false);
        assert_eq!(d.push(world).expect("decode"), "world");
    }

    #[test]
    fn long_streams_compact() {
        let tok = byte_level_tokenizer();
        let ids = tok
            .encode("hello wörld ", false)
            .expect("encode")
            .get_ids()
            .to_vec();
        let mut d = IncrementalDecoder::new(tok.clone(), false);
        let mut out = String::new();
        let mut all = Vec::new();
        for _ in 0..300 {
            for &t in &ids {
                out.push_str(&d.push(t).expect("decode"));
                all.push(t);
            }
        }
        out.push_str(&d.flush().expect("flush"));
        assert_eq!(out, tok.decode(&all, false).expect("decode"));
        assert!(d.tokens.len() < COMPACT_AT + 10);
    }

    #[test]
    fn suffix_after_fallback_is_char_safe() {
        assert_eq!(suffix_after("abcdef", "abc"), "def");
        assert_eq!(suffix_after("aéz", "aêy"), "éz");
        assert_eq!(suffix_after("ab", "abc"), "");
    }
}
