//! The training losses of spec §8.1 on a forward's logits. Every loss here is a function of
//! the log-probabilities of the target tokens, so each computes `L` and `∂L/∂logp` per target,
//! and one routine turns those into `∂L/∂logits = w·(onehot − softmax)`.
//!
//! Sequences sit one after another in the logits (one forward, one span each). A sequence of
//! `n` tokens with prompt length `p` has *response* targets `tokens[j]` for `j ≥ max(p, 1)`,
//! predicted at row `j − 1`.

use crate::TrainError;

/// One sequence of a forward.
#[derive(Debug, Clone, Copy)]
pub struct Sequence<'a> {
    /// Its tokens.
    pub tokens: &'a [u32],
    /// Tokens before the response (0: every token after the first is a target).
    pub prompt_len: usize,
}

impl Sequence<'_> {
    fn first_target(&self, full: bool) -> usize {
        if full { 1 } else { self.prompt_len.max(1) }
    }
}

/// A loss and its gradient with respect to the logits.
#[derive(Debug, Clone)]
pub struct LossOut {
    /// The loss.
    pub loss: f64,
    /// `∂L/∂logits`, the logits' shape.
    pub grad: Vec<f32>,
    /// Target tokens the loss covered.
    pub tokens: usize,
    /// Preference accuracy over the batch's pairs (DPO, ORPO), in [0, 1].
    pub accuracy: Option<f64>,
    /// Mean chosen-minus-rejected margin (DPO: of the implicit rewards; ORPO: of ℓ).
    pub margin: Option<f64>,
}

/// `(row, target, ∂L/∂logp)` of one target token.
type TargetWeight = (usize, u32, f64);

struct Logits<'a> {
    data: &'a [f32],
    vocab: usize,
    /// Each row's `(max, log Σ exp(x − max))`, computed once on the kernel pool.
    stats: Vec<(f32, f64)>,
}

impl<'a> Logits<'a> {
    fn new(data: &'a [f32], vocab: usize) -> Self {
        let rows = data.len() / vocab.max(1);
        let mut stats = vec![(0f32, 0f64); rows];
        kiln_kernels::pool::for_each_chunk_mut(&mut stats, 1, 8, |r, s| {
            s[0] = Self::lse(&data[r * vocab..(r + 1) * vocab]);
        });
        Self { data, vocab, stats }
    }

    fn row(&self, r: usize) -> Result<&[f32], TrainError> {
        self.data
            .get(r * self.vocab..(r + 1) * self.vocab)
            .ok_or_else(|| TrainError::Loss(format!("row {r} is outside the logits")))
    }

    /// `(max, log Σ exp(x − max))` of a row.
    fn lse(row: &[f32]) -> (f32, f64) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
        (max, sum.ln())
    }

    fn logp(&self, r: usize, target: u32) -> Result<f64, TrainError> {
        let row = self.row(r)?;
        let x = *row.get(target as usize).ok_or_else(|| {
            TrainError::Loss(format!("target {target} is outside the vocabulary"))
        })?;
        let (max, lse) = self.stats[r];
        Ok((x - max) as f64 - lse)
    }
}

/// Each sequence's first row in the logits.
fn starts(seqs: &[Sequence<'_>]) -> Vec<usize> {
    let mut at = 0;
    seqs.iter()
        .map(|s| {
            let start = at;
            at += s.tokens.len();
            start
        })
        .collect()
}

/// The log-probabilities of sequence `s`'s targets (response only unless `full`), with rows.
fn target_logps(
    l: &Logits<'_>,
    start: usize,
    s: &Sequence<'_>,
    full: bool,
) -> Result<Vec<(usize, u32, f64)>, TrainError> {
    (s.first_target(full)..s.tokens.len())
        .map(|j| {
            let (row, t) = (start + j - 1, s.tokens[j]);
            Ok((row, t, l.logp(row, t)?))
        })
        .collect()
}

/// `∂L/∂logits` from the per-target weights (a row's weights summed: every weight of a row
/// is for the same target), rows on the kernel pool.
fn logits_grad(l: &Logits<'_>, weights: &[TargetWeight]) -> Result<Vec<f32>, TrainError> {
    let rows = l.stats.len();
    let mut per_row: Vec<Option<(u32, f64)>> = vec![None; rows];
    for &(r, target, w) in weights {
        l.row(r)?;
        if target as usize >= l.vocab {
            return Err(TrainError::Loss(format!(
                "target {target} is outside the vocabulary"
            )));
        }
        let slot = &mut per_row[r];
        *slot = Some((target, slot.map_or(0.0, |s| s.1) + w));
    }
    let mut grad = vec![0f32; l.data.len()];
    kiln_kernels::pool::for_each_chunk_mut(&mut grad, l.vocab, 4, |r, dst| {
        let Some((target, w)) = per_row[r] else {
            return;
        };
        let (max, lse) = l.stats[r];
        let row = &l.data[r * l.vocab..(r + 1) * l.vocab];
        for (d, &x) in dst.iter_mut().zip(row) {
            *d = -(w * ((x - max) as f64 - lse).exp()) as f32;
        }
        dst[target as usize] += w as f32;
    });
    Ok(grad)
}

/// Supervised fine-tuning: the token mean of `−logp` over every response target of the batch.
pub fn sft(logits: &[f32], vocab: usize, seqs: &[Sequence<'_>]) -> Result<LossOut, TrainError> {
    let l = Logits::new(logits, vocab);
    let mut targets = Vec::new();
    for (s, start) in seqs.iter().zip(starts(seqs)) {
        targets.extend(target_logps(&l, start, s, false)?);
    }
    if targets.is_empty() {
        return Err(TrainError::Loss("the batch has no response tokens".into()));
    }
    let n = targets.len() as f64;
    let loss = -targets.iter().map(|t| t.2).sum::<f64>() / n;
    let weights: Vec<TargetWeight> = targets.iter().map(|&(r, t, _)| (r, t, -1.0 / n)).collect();
    Ok(LossOut {
        loss,
        grad: logits_grad(&l, &weights)?,
        tokens: targets.len(),
        accuracy: None,
        margin: None,
    })
}

/// The summed response log-probability of each sequence (DPO's reference and policy terms).
pub fn sequence_logps(
    logits: &[f32],
    vocab: usize,
    seqs: &[Sequence<'_>],
) -> Result<Vec<f64>, TrainError> {
    let l = Logits::new(logits, vocab);
    seqs.iter()
        .zip(starts(seqs))
        .map(|(s, start)| Ok(target_logps(&l, start, s, false)?.iter().map(|t| t.2).sum()))
        .collect()
}

/// Which DPO objective.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DpoKind {
    /// `−[(1−ε)·logσ(h) + ε·logσ(−h)]` (ε = label smoothing, 0 by default).
    Sigmoid {
        /// ε.
        label_smoothing: f64,
    },
    /// `(h − 1/(2β))²`.
    Ipo,
}

fn log_sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        -(-x).exp().ln_1p()
    } else {
        x - x.exp().ln_1p()
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// DPO over pairs laid out `[chosen₀, rejected₀, chosen₁, …]`; `reference[i]` holds pair i's
/// reference `(logπ_c, logπ_r)` (the same model at LoRA scale 0). The mean over pairs.
pub fn dpo(
    logits: &[f32],
    vocab: usize,
    seqs: &[Sequence<'_>],
    reference: &[(f64, f64)],
    beta: f64,
    kind: DpoKind,
) -> Result<LossOut, TrainError> {
    let l = Logits::new(logits, vocab);
    check_pairs(seqs, reference.len())?;
    let st = starts(seqs);
    let pairs = reference.len() as f64;
    let (mut loss, mut correct, mut margin, mut weights) = (0.0, 0usize, 0.0, Vec::new());
    for (i, &(ref_c, ref_r)) in reference.iter().enumerate() {
        let c = target_logps(&l, st[2 * i], &seqs[2 * i], false)?;
        let r = target_logps(&l, st[2 * i + 1], &seqs[2 * i + 1], false)?;
        let (pc, pr): (f64, f64) = (c.iter().map(|t| t.2).sum(), r.iter().map(|t| t.2).sum());
        let h = beta * ((pc - ref_c) - (pr - ref_r));
        let (li, dh) = match kind {
            DpoKind::Sigmoid { label_smoothing: e } => (
                -(1.0 - e) * log_sigmoid(h) - e * log_sigmoid(-h),
                -(1.0 - e) * (1.0 - sigmoid(h)) + e * sigmoid(h),
            ),
            DpoKind::Ipo => {
                let d = h - 1.0 / (2.0 * beta);
                (d * d, 2.0 * d)
            }
        };
        loss += li / pairs;
        correct += usize::from(h > 0.0);
        margin += h / beta / pairs;
        let w = dh * beta / pairs;
        weights.extend(c.iter().map(|&(row, t, _)| (row, t, w)));
        weights.extend(r.iter().map(|&(row, t, _)| (row, t, -w)));
    }
    Ok(LossOut {
        loss,
        tokens: weights.len(),
        grad: logits_grad(&l, &weights)?,
        accuracy: Some(correct as f64 / pairs),
        margin: Some(margin),
    })
}

fn check_pairs(seqs: &[Sequence<'_>], pairs: usize) -> Result<(), TrainError> {
    if pairs == 0 || seqs.len() != 2 * pairs {
        return Err(TrainError::Loss(format!(
            "{} sequences for {pairs} preference pairs",
            seqs.len()
        )));
    }
    Ok(())
}

/// ORPO's NLL term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SftScope {
    /// Token-mean cross-entropy over the chosen sequence's prompt and response (TRL's).
    Full,
    /// `−ℓ_w`: the chosen response's mean log-probability.
    Response,
}

/// `log(1 − eˣ)` for `x < 0`, stable at both ends.
fn log1mexp(x: f64) -> f64 {
    if x > -std::f64::consts::LN_2 {
        (-x.exp_m1()).ln()
    } else {
        (-x.exp()).ln_1p()
    }
}

/// ORPO over pairs laid out as for [`dpo`]: `L_NLL + λ·(−logσ(log_odds))`, the mean over pairs.
pub fn orpo(
    logits: &[f32],
    vocab: usize,
    seqs: &[Sequence<'_>],
    lambda: f64,
    scope: SftScope,
) -> Result<LossOut, TrainError> {
    let l = Logits::new(logits, vocab);
    check_pairs(seqs, seqs.len() / 2)?;
    let st = starts(seqs);
    let pairs = (seqs.len() / 2) as f64;
    let (mut loss, mut correct, mut margin, mut weights) = (0.0, 0usize, 0.0, Vec::new());
    for i in 0..seqs.len() / 2 {
        let c = target_logps(&l, st[2 * i], &seqs[2 * i], false)?;
        let r = target_logps(&l, st[2 * i + 1], &seqs[2 * i + 1], false)?;
        if c.is_empty() || r.is_empty() {
            return Err(TrainError::Loss(format!("pair {i} has an empty response")));
        }
        let mean = |v: &[(usize, u32, f64)]| v.iter().map(|t| t.2).sum::<f64>() / v.len() as f64;
        let (lw, lr) = (mean(&c), mean(&r));
        let log_odds = (lw - lr) - (log1mexp(lw) - log1mexp(lr));
        let d_or = sigmoid(log_odds) - 1.0;
        let (dw, dr) = (d_or / (1.0 - lw.exp()), -d_or / (1.0 - lr.exp()));
        loss += lambda * -log_sigmoid(log_odds) / pairs;
        correct += usize::from(log_odds > 0.0);
        margin += (lw - lr) / pairs;
        let wc = lambda * dw / c.len() as f64 / pairs;
        let wr = lambda * dr / r.len() as f64 / pairs;
        weights.extend(c.iter().map(|&(row, t, _)| (row, t, wc)));
        weights.extend(r.iter().map(|&(row, t, _)| (row, t, wr)));
        match scope {
            SftScope::Response => {
                loss += -lw / pairs;
                let w = -1.0 / c.len() as f64 / pairs;
                weights.extend(c.iter().map(|&(row, t, _)| (row, t, w)));
            }
            SftScope::Full => {
                let full = target_logps(&l, st[2 * i], &seqs[2 * i], true)?;
                let n = full.len() as f64;
                loss += -full.iter().map(|t| t.2).sum::<f64>() / n / pairs;
                weights.extend(full.iter().map(|&(row, t, _)| (row, t, -1.0 / n / pairs)));
            }
        }
    }
    Ok(LossOut {
        loss,
        tokens: weights.len(),
        grad: logits_grad(&l, &weights)?,
        accuracy: Some(correct as f64 / pairs),
        margin: Some(margin),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(rows: usize, vocab: usize) -> Vec<f32> {
        (0..rows * vocab)
            .map(|i| ((i as f32) * 0.61).sin() * 2.0)
            .collect()
    }

    /// Central differences of `f` against `grad`, logit by logit.
    fn check(x: &[f32], grad: &[f32], f: impl Fn(&[f32]) -> f64) {
        let h = 1e-3f32;
        for i in 0..x.len() {
            let (mut p, mut m) = (x.to_vec(), x.to_vec());
            p[i] += h;
            m[i] -= h;
            let numeric = (f(&p) - f(&m)) / (2.0 * h as f64);
            assert!(
                (numeric - grad[i] as f64).abs() < 1e-3 * (1.0 + numeric.abs()),
                "[{i}] {numeric} vs {}",
                grad[i]
            );
        }
    }

    #[test]
    fn every_loss_gradient_matches_finite_differences() {
        let vocab = 5;
        let (c, r) = ([1u32, 2, 3, 4, 0], [1u32, 2, 4, 4]);
        let seqs = [
            Sequence {
                tokens: &c,
                prompt_len: 2,
            },
            Sequence {
                tokens: &r,
                prompt_len: 2,
            },
        ];
        let x = logits(9, vocab);
        let out = sft(&x, vocab, &seqs).unwrap();
        assert_eq!(out.tokens, 5);
        check(&x, &out.grad, |x| sft(x, vocab, &seqs).unwrap().loss);
        let reference = [(-3.0, -2.5)];
        for kind in [
            DpoKind::Sigmoid {
                label_smoothing: 0.0,
            },
            DpoKind::Sigmoid {
                label_smoothing: 0.1,
            },
            DpoKind::Ipo,
        ] {
            let out = dpo(&x, vocab, &seqs, &reference, 0.1, kind).unwrap();
            check(&x, &out.grad, |x| {
                dpo(x, vocab, &seqs, &reference, 0.1, kind).unwrap().loss
            });
        }
        for scope in [SftScope::Full, SftScope::Response] {
            let out = orpo(&x, vocab, &seqs, 0.1, scope).unwrap();
            check(&x, &out.grad, |x| {
                orpo(x, vocab, &seqs, 0.1, scope).unwrap().loss
            });
        }
    }

    #[test]
    fn bad_targets_are_errors_not_panics() {
        let x = logits(2, 3);
        let seqs = [Sequence {
            tokens: &[0, 7],
            prompt_len: 0,
        }];
        assert!(sft(&x, 3, &seqs).is_err());
        let none = [Sequence {
            tokens: &[0, 1],
            prompt_len: 2,
        }];
        assert!(sft(&x, 3, &none).is_err());
        assert!(dpo(&x, 3, &none, &[(0.0, 0.0)], 0.1, DpoKind::Ipo).is_err());
    }
}
