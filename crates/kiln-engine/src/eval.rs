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

fn argmax<T: PartialOrd>(x: &[T]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
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

/// `kiln eval kl`'s answer: a model against a reference model over one text, teacher-forced.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KlEvalReport {
    /// Tokens of the text.
    pub tokens: usize,
    /// Tokens per window; each window starts from an empty cache.
    pub window: usize,
    /// Positions scored (the second half of each window, as llama-perplexity scores).
    pub positions: usize,
    /// Mean `KL(reference ‖ model)` in nats.
    pub mean_kl: f64,
    /// 99th percentile of the per-position KL.
    pub p99_kl: f64,
    /// Largest per-position KL.
    pub max_kl: f64,
    /// Fraction of positions where both put the same token first.
    pub top1_agreement: f64,
    /// Perplexity of the model on the text's next tokens.
    pub perplexity: f64,
    /// Perplexity of the reference.
    pub reference_perplexity: f64,
}

/// Scores `test` against `reference` on `tokens` in windows of `window` tokens: each window is
/// one forward from an empty cache, and its second half is scored (each position then has at
/// least half a window of context), like llama-perplexity's `--kl-divergence`.
pub fn eval_kl<B: Backend, C: Backend>(
    reference: &mut Engine<B>,
    test: &mut Engine<C>,
    tokens: &[u32],
    window: usize,
) -> Result<KlEvalReport, EngineError> {
    let vocab = reference.model().config.vocab_size;
    if test.model().config.vocab_size != vocab {
        return Err(EngineError::Request(format!(
            "the vocabularies differ: {vocab} against {}",
            test.model().config.vocab_size
        )));
    }
    if window < 4 || tokens.len() < window {
        return Err(EngineError::Request(format!(
            "the text has {} tokens; one window needs {window} (at least 4)",
            tokens.len()
        )));
    }
    let (mut kls, mut agree, mut nll, mut ref_nll) = (Vec::new(), 0usize, 0f64, 0f64);
    for part in tokens.chunks_exact(window) {
        let r = reference.logits_all_chunked(part, window)?;
        let t = test.logits_all_chunked(part, window)?;
        for p in window / 2..window - 1 {
            let (lr, lt) = (
                log_softmax(&r[p * vocab..(p + 1) * vocab]),
                log_softmax(&t[p * vocab..(p + 1) * vocab]),
            );
            let kl: f64 = lr.iter().zip(&lt).map(|(a, b)| a.exp() * (a - b)).sum();
            kls.push(kl.max(0.0));
            agree += usize::from(argmax(&lr) == argmax(&lt));
            let next = part[p + 1] as usize;
            nll -= lt.get(next).copied().unwrap_or(f64::NEG_INFINITY);
            ref_nll -= lr.get(next).copied().unwrap_or(f64::NEG_INFINITY);
        }
    }
    let n = kls.len().max(1) as f64;
    let mean_kl = kls.iter().sum::<f64>() / n;
    let mut sorted = kls.clone();
    sorted.sort_by(f64::total_cmp);
    let p99 = sorted
        .get(((sorted.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    Ok(KlEvalReport {
        tokens: tokens.len(),
        window,
        positions: kls.len(),
        mean_kl,
        p99_kl: p99,
        max_kl: sorted.last().copied().unwrap_or(0.0),
        top1_agreement: agree as f64 / n,
        perplexity: (nll / n).exp(),
        reference_perplexity: (ref_nll / n).exp(),
    })
}
