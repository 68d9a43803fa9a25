//! Evaluations that compare two runs of the same model: teacher-forced logits of a KV scheme
//! against the dense cache (`kiln eval kv`).

use kiln_model::backend::{Backend, KvStore};
use serde::Serialize;

use crate::kv_scheme::KvScheme;
use crate::{Engine, EngineError};

/// How far one set of next-token distributions is from a reference, position by position.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LogitComparison {
    /// Positions compared.
    pub positions: usize,
    /// Mean `KL(reference ‖ test)` in nats.
    pub mean_kl: f64,
    /// Largest per-position KL.
    pub max_kl: f64,
    /// Fraction of positions whose most likely token is the same.
    pub top1_agreement: f64,
}

/// Compares `test` against `reference`, both `[positions × vocab]` logits, over the positions
/// in `range`. KL is computed in f64 from log-softmaxes.
pub fn compare_logits(
    reference: &[f32],
    test: &[f32],
    vocab: usize,
    range: std::ops::Range<usize>,
) -> LogitComparison {
    let (mut kl_sum, mut kl_max, mut agree) = (0f64, 0f64, 0usize);
    let positions = range.len();
    for p in range {
        let (r, t) = (
            &reference[p * vocab..(p + 1) * vocab],
            &test[p * vocab..(p + 1) * vocab],
        );
        let (lr, lt) = (log_softmax(r), log_softmax(t));
        let kl: f64 = lr.iter().zip(&lt).map(|(a, b)| a.exp() * (a - b)).sum();
        kl_sum += kl.max(0.0);
        kl_max = kl_max.max(kl);
        if argmax(r) == argmax(t) {
            agree += 1;
        }
    }
    let n = positions.max(1) as f64;
    LogitComparison {
        positions,
        mean_kl: kl_sum / n,
        max_kl: kl_max,
        top1_agreement: agree as f64 / n,
    }
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    x.iter().map(|&v| v as f64 - lse).collect()
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// `kiln eval kv`'s answer for one scheme.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvEvalReport {
    /// The scheme's cache key.
    pub kv_scheme: String,
    /// Its label.
    pub label: String,
    /// Tokens of the text.
    pub tokens: usize,
    /// Tokens per forward; the first chunk runs before any conversion, so it is left out.
    pub chunk: usize,
    /// Against the dense cache, over positions `chunk..tokens`.
    pub vs_dense: LogitComparison,
    /// KV bytes per token measured on the store after the run (all layers).
    pub bytes_per_token: f64,
    /// The same for the dense cache.
    pub dense_bytes_per_token: f64,
}

impl<B: Backend> Engine<B> {
    /// Teacher-forces `tokens` through the dense cache (`dense`) and through `scheme`, `chunk`
    /// tokens per forward, and compares the next-token distributions. The engine is left on
    /// `scheme`.
    pub fn eval_kv(
        &mut self,
        tokens: &[u32],
        dense: KvScheme,
        scheme: KvScheme,
        chunk: usize,
    ) -> Result<KvEvalReport, EngineError> {
        if tokens.len() <= chunk {
            return Err(EngineError::Request(format!(
                "the text has {} tokens; it needs more than one chunk of {chunk}",
                tokens.len()
            )));
        }
        let per_token = |e: &Self| e.kv().slot_bytes(0) as f64 / e.kv().seq_len(0).max(1) as f64;
        self.set_kv_scheme(dense)?;
        let reference = self.logits_all_chunked(tokens, chunk)?;
        let dense_bytes_per_token = per_token(self);
        self.set_kv_scheme(scheme.clone())?;
        let test = self.logits_all_chunked(tokens, chunk)?;
        let vocab = self.model().config.vocab_size;
        Ok(KvEvalReport {
            kv_scheme: scheme.cache_key(),
            label: scheme.label(),
            tokens: tokens.len(),
            chunk,
            vs_dense: compare_logits(&reference, &test, vocab, chunk..tokens.len()),
            bytes_per_token: per_token(self),
            dense_bytes_per_token,
        })
    }
}
