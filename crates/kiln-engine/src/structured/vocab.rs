//! The model's vocabulary as llguidance sees it: every token's bytes in a trie (special tokens
//! behind the 0xFF marker, so grammars never produce them by accident) and a tokenizer for the
//! grammar's literal strings.

use std::sync::Arc;

use kiln_model::tokenizer::KilnTokenizer;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use super::GrammarError;

/// The trie and tokenizer llguidance computes masks with.
struct VocabEnv {
    trie: TokTrie,
    tokenizer: KilnTokenizer,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Grammar literals are text; invalid UTF-8 falls back to the trie's greedy split.
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Builds the environment for `tokenizer` over `vocab_size` ids (the model's logits row, which
/// may be longer than the tokenizer's vocabulary: padding ids get no bytes and are never allowed).
pub(super) fn tok_env(
    tokenizer: &KilnTokenizer,
    vocab_size: usize,
) -> Result<TokEnv, GrammarError> {
    let eos = *tokenizer
        .eos_ids()
        .first()
        .ok_or_else(|| GrammarError::Vocabulary("the model has no end-of-sequence token".into()))?;
    let n = vocab_size.max(tokenizer.vocab_size());
    let n32 = u32::try_from(n)
        .map_err(|_| GrammarError::Vocabulary(format!("vocabulary of {n} ids is too large")))?;
    let special = tokenizer.inner().get_added_tokens_decoder();
    let words: Vec<Vec<u8>> = (0..n32)
        .map(|id| match special.get(&id) {
            Some(t) if t.special => {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(t.content.as_bytes());
                w
            }
            _ => tokenizer.token_bytes(id).unwrap_or_default(),
        })
        .collect();
    let mut info = TokRxInfo::new(n32, eos);
    info.tok_bos = tokenizer.bos_id();
    let trie = TokTrie::from(&info, &words).with_eos_tokens(tokenizer.eos_ids());
    Ok(Arc::new(VocabEnv {
        trie,
        tokenizer: tokenizer.clone(),
    }))
}
