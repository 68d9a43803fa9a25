//! The sampler chain: distribution helpers and the filters of spec §10 "Sampler".
//!
//! Every filter takes log-probabilities with no NaN (the caller sanitises them) and removes
//! tokens by writing `-inf`. Filters that need an order use `idx`, a caller-owned scratch
//! buffer, so a step allocates nothing once the buffer has grown to the vocabulary size.
//! Ties in probability are broken towards the lower token id everywhere, which keeps the result
//! a pure function of the input (MLX's argsort/argpartition leave tie order unspecified).

/// Maps a finite `f32` to a `u32` with the same order, so ordering keys are plain integers.
fn ordered_bits(v: f32) -> u32 {
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Sort key: ascending key = descending log-probability, then ascending id. Sorting packed
/// integers avoids an indirect lookup per comparison, which dominates on 150k-token vocabularies.
fn key(lp: f32, id: usize) -> u64 {
    (u64::from(!ordered_bits(lp)) << 32) | id as u64
}

/// The token id packed in a [`key`].
fn key_id(k: u64) -> usize {
    (k & 0xffff_ffff) as usize
}

/// Refills `keys` with the ordering keys of tokens that are still candidates (finite lp).
fn fill_candidates(lp: &[f32], keys: &mut Vec<u64>) {
    keys.clear();
    keys.extend(
        lp.iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, &v)| key(v, i)),
    );
}

/// Largest finite value, if any.
fn finite_max(lp: &[f32]) -> Option<f32> {
    lp.iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(None, |m, v| Some(m.map_or(v, |m: f32| m.max(v))))
}

/// Writes `log_softmax(logits)` into `lp`, treating NaN as `-inf`.
///
/// `+inf` logits share all the mass equally (the limit of the softmax) rather than turning
/// every entry into NaN. If no logit is above `-inf`, every entry is `-inf`.
pub fn log_softmax(logits: &[f32], lp: &mut [f32]) {
    debug_assert_eq!(logits.len(), lp.len());
    let mut max = f32::NEG_INFINITY;
    let mut n_pos_inf = 0usize;
    for &l in logits {
        if l == f32::INFINITY {
            n_pos_inf += 1;
        }
        if l > max {
            max = l;
        }
    }
    if n_pos_inf > 0 {
        let share = -(n_pos_inf as f32).ln();
        for (o, &l) in lp.iter_mut().zip(logits) {
            *o = if l == f32::INFINITY {
                share
            } else {
                f32::NEG_INFINITY
            };
        }
        return;
    }
    if max == f32::NEG_INFINITY {
        lp.fill(f32::NEG_INFINITY);
        return;
    }
    let sum: f64 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| f64::from((l - max).exp()))
        .sum();
    let ln_sum = sum.ln() as f32;
    for (o, &l) in lp.iter_mut().zip(logits) {
        *o = if l.is_nan() {
            f32::NEG_INFINITY
        } else {
            (l - max) - ln_sum
        };
    }
}

/// Index of the largest value, NaN counting as `-inf`; ties (and an input with nothing above
/// `-inf`) go to the lowest id.
pub fn argmax(lp: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in lp.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// The `k` most likely finite entries, descending, ties to the lower id.
///
/// `-inf` entries are left out: they carry no probability and JSON cannot encode them.
pub fn top_entries(lp: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut out: Vec<(u32, f32)> = Vec::with_capacity(k);
    if k == 0 {
        return out;
    }
    for (i, &v) in lp.iter().enumerate() {
        if !v.is_finite() || (out.len() == k && out.last().is_some_and(|&(_, w)| v <= w)) {
            continue;
        }
        // Insert after equal values so that, scanning ids upward, lower ids stay first.
        let pos = out.partition_point(|&(_, w)| w >= v);
        out.insert(pos, (i as u32, v));
        out.truncate(k);
    }
    out
}

/// Nucleus filter: keeps tokens whose ascending cumulative probability is `> 1 − p`.
///
/// Equivalently (and cheaper than sorting the whole vocabulary) a token is kept when the total
/// mass minus the mass strictly more likely than it exceeds `1 − p`; we grow a sorted top-m
/// prefix until the cut is found. The most likely token is always kept, so float rounding with a
/// tiny `p` cannot empty the distribution.
pub fn top_p(lp: &mut [f32], idx: &mut Vec<u64>, p: f32) {
    fill_candidates(lp, idx);
    let n = idx.len();
    if n == 0 {
        return;
    }
    let total: f64 = idx.iter().map(|&k| f64::from(lp[key_id(k)].exp())).sum();
    let target = 1.0 - p as f64;
    let mut m = n.min(64);
    loop {
        if m < n {
            idx.select_nth_unstable(m - 1);
        }
        idx[..m].sort_unstable();
        let mut above = 0.0f64;
        let mut cut = None;
        for (j, &t) in idx[..m].iter().enumerate() {
            if j > 0 && total - above <= target {
                cut = Some(j);
                break;
            }
            above += f64::from(lp[key_id(t)].exp());
        }
        match cut {
            Some(j) => {
                for &t in &idx[j..] {
                    lp[key_id(t)] = f32::NEG_INFINITY;
                }
                return;
            }
            None if m == n => return,
            None => m = n.min(m.saturating_mul(4)),
        }
    }
}

/// Min-p filter: removes tokens with `lp < max(lp) + ln(min_p)`, except the `keep` most likely.
///
/// Protected tokens are only exempt from removal; one already removed by an earlier filter
/// stays removed, as in the reference.
pub fn min_p(lp: &mut [f32], idx: &mut Vec<u64>, min_p: f32, keep: usize) {
    let Some(max) = finite_max(lp) else { return };
    let threshold = max + min_p.ln();
    if keep <= 1 {
        // The maximum is never below its own threshold, so nothing needs protecting and the
        // ordering pass can be skipped.
        for v in lp.iter_mut() {
            if *v < threshold {
                *v = f32::NEG_INFINITY;
            }
        }
        return;
    }
    fill_candidates(lp, idx);
    let n = idx.len();
    if keep >= n {
        return;
    }
    idx.select_nth_unstable(keep - 1);
    for &t in &idx[keep..] {
        if lp[key_id(t)] < threshold {
            lp[key_id(t)] = f32::NEG_INFINITY;
        }
    }
}

/// XTC ("exclude top choices"): with chance `probability`, removes every token whose
/// probability exceeds `threshold` except the least likely of them; `special` ids are exempt.
///
/// `u` is the step's XTC uniform; the cut happens when `u <= probability`, matching the
/// reference's `where(u > p, logits, masked)`. Probabilities are renormalised over the surviving
/// tokens (earlier filters may have removed mass) and compared in log space, which is the same
/// order as comparing `softmax` values but needs one pass of `exp` instead of three.
pub fn xtc(lp: &mut [f32], u: f64, probability: f32, threshold: f32, special: &[u32]) {
    if u > probability as f64 {
        return;
    }
    let Some(max) = finite_max(lp) else { return };
    let sum: f64 = lp.iter().map(|&v| f64::from((v - max).exp())).sum();
    // log(prob) = v - max - ln(sum); prob > threshold ⇔ v > max + ln(sum) + ln(threshold).
    let cut = f64::from(max) + sum.ln() + f64::from(threshold).ln();
    let min_above = lp
        .iter()
        .copied()
        .filter(|&v| f64::from(v) > cut)
        .fold(f32::INFINITY, f32::min);
    if min_above == f32::INFINITY {
        return;
    }
    for (i, v) in lp.iter_mut().enumerate() {
        if *v > min_above && !special.contains(&(i as u32)) {
            *v = f32::NEG_INFINITY;
        }
    }
}

/// Top-k filter: keeps exactly the `k` most likely candidates (ties to the lower id).
pub fn top_k(lp: &mut [f32], idx: &mut Vec<u64>, k: usize) {
    fill_candidates(lp, idx);
    let n = idx.len();
    if k == 0 || k >= n {
        return;
    }
    idx.select_nth_unstable(k - 1);
    for &t in &idx[k..] {
        lp[key_id(t)] = f32::NEG_INFINITY;
    }
}

/// Draws from `softmax(lp / temperature)` by inverting the CDF at `u ∈ [0, 1)`.
///
/// `lp` is consumed: it is overwritten with the unnormalised weights so the CDF scan does not
/// repeat the `exp` pass. Returns `None` when no token has a finite log-probability.
pub fn categorical(lp: &mut [f32], temperature: f32, u: f64) -> Option<u32> {
    let max = finite_max(lp)?;
    let inv_t = 1.0 / temperature;
    let mut total = 0.0f64;
    for v in lp.iter_mut() {
        // -inf maps to exactly 0, so removed tokens can never be drawn.
        *v = ((*v - max) * inv_t).exp();
        total += f64::from(*v);
    }
    let target = u * total;
    let mut cum = 0.0f64;
    let mut last = None;
    for (i, &w) in lp.iter().enumerate() {
        if w > 0.0 {
            cum += f64::from(w);
            last = Some(i as u32);
            if cum > target {
                return last;
            }
        }
    }
    // Only reachable through rounding in the running sum; the last live token is the limit.
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    const NI: f32 = f32::NEG_INFINITY;

    /// Log-probabilities of the given probabilities (which sum to 1).
    fn lp_of(p: &[f64]) -> Vec<f32> {
        p.iter()
            .map(|&x| if x == 0.0 { NI } else { x.ln() as f32 })
            .collect()
    }

    fn kept(lp: &[f32]) -> Vec<usize> {
        (0..lp.len()).filter(|&i| lp[i].is_finite()).collect()
    }

    /// Probabilities after renormalising the surviving tokens.
    fn renorm(lp: &[f32]) -> Vec<f64> {
        let s: f64 = lp.iter().map(|&v| (v as f64).exp()).sum();
        lp.iter().map(|&v| (v as f64).exp() / s).collect()
    }

    fn assert_close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn log_softmax_basic_and_degenerate() {
        let mut lp = vec![0.0; 3];
        log_softmax(&[0.0, 0.0, (2.0f32).ln()], &mut lp);
        assert_close(
            &lp.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            &[0.25f64.ln(), 0.25f64.ln(), 0.5f64.ln()],
        );

        log_softmax(&[1.0, f32::NAN, 2.0], &mut lp);
        assert_eq!(lp[1], NI);
        assert!((renorm(&lp)[0] - 1.0 / (1.0 + 1f64.exp())).abs() < 1e-6);

        log_softmax(&[f32::INFINITY, 1.0, f32::INFINITY], &mut lp);
        assert_eq!(lp, vec![-(2f32.ln()), NI, -(2f32.ln())]);

        log_softmax(&[NI, f32::NAN, NI], &mut lp);
        assert!(lp.iter().all(|&v| v == NI));
    }

    #[test]
    fn argmax_ties_to_lowest_id() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[NI, NI]), 0);
        assert_eq!(argmax(&[NI, -5.0, -5.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -5.0, f32::NAN, 1.0]), 3);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    }

    #[test]
    fn top_entries_sorted_with_ties() {
        let lp = [-1.0, -0.5, -1.0, NI, -3.0];
        assert_eq!(top_entries(&lp, 3), vec![(1, -0.5), (0, -1.0), (2, -1.0)]);
        assert_eq!(top_entries(&lp, 10).len(), 4);
        assert!(top_entries(&lp, 0).is_empty());
    }

    #[test]
    fn top_p_hand_computed() {
        // probs 0.05 0.4 0.1 0.3 0.15; p = 0.8 → ascending cumsum
        // 0.05, 0.15(id2), 0.30(id4), 0.60(id3), 1.0(id1); keep cum > 0.2 → ids 1, 3, 4.
        let mut lp = lp_of(&[0.05, 0.4, 0.1, 0.3, 0.15]);
        let mut idx = Vec::new();
        top_p(&mut lp, &mut idx, 0.8);
        assert_eq!(kept(&lp), vec![1, 3, 4]);
        assert_close(
            &renorm(&lp),
            &[0.0, 0.4 / 0.85, 0.0, 0.3 / 0.85, 0.15 / 0.85],
        );
    }

    #[test]
    fn top_p_small_p_keeps_top_and_large_vocab_grows() {
        let mut lp = lp_of(&[0.2, 0.5, 0.3]);
        let mut idx = Vec::new();
        top_p(&mut lp, &mut idx, 1e-9);
        assert_eq!(kept(&lp), vec![1]);

        // 1000 equal tokens, p = 0.5: keep exactly the 500 lowest ids (ties go to lower ids);
        // needs more than the initial 64-token prefix.
        let mut lp = vec![-(1000f32).ln(); 1000];
        top_p(&mut lp, &mut idx, 0.5);
        let k = kept(&lp);
        assert!(k.len() == 500 || k.len() == 501, "{}", k.len());
        assert_eq!(k, (0..k.len()).collect::<Vec<_>>());
    }

    #[test]
    fn min_p_hand_computed() {
        // max prob 0.5, min_p 0.25 → threshold prob 0.125: keep 0.5, 0.2, 0.15 (drop 0.1, 0.05).
        let mut lp = lp_of(&[0.1, 0.5, 0.2, 0.05, 0.15]);
        let mut idx = Vec::new();
        min_p(&mut lp, &mut idx, 0.25, 1);
        assert_eq!(kept(&lp), vec![1, 2, 4]);
        assert_close(
            &renorm(&lp),
            &[0.0, 0.5 / 0.85, 0.2 / 0.85, 0.0, 0.15 / 0.85],
        );

        // Keeping 4 protects the 0.1 token even though it is under the threshold.
        let mut lp = lp_of(&[0.1, 0.5, 0.2, 0.05, 0.15]);
        min_p(&mut lp, &mut idx, 0.25, 4);
        assert_eq!(kept(&lp), vec![0, 1, 2, 4]);

        // min_p = 1 keeps only the maximum (and its exact ties).
        let mut lp = lp_of(&[0.4, 0.4, 0.2]);
        min_p(&mut lp, &mut idx, 1.0, 1);
        assert_eq!(kept(&lp), vec![0, 1]);
    }

    #[test]
    fn min_p_does_not_resurrect_removed_tokens() {
        let mut lp = vec![NI, (0.9f32).ln(), NI, (0.1f32).ln()];
        let mut idx = Vec::new();
        min_p(&mut lp, &mut idx, 0.5, 3);
        assert_eq!(kept(&lp), vec![1, 3]);
    }

    #[test]
    fn xtc_hand_computed() {
        // threshold 0.1: above are 0.4, 0.3, 0.15 → min_above 0.15; remove 0.4 and 0.3.
        let probs = [0.05, 0.4, 0.1, 0.3, 0.15];
        let mut lp = lp_of(&probs);
        xtc(&mut lp, 0.2, 0.5, 0.1, &[]);
        assert_eq!(kept(&lp), vec![0, 2, 4]);
        assert_close(&renorm(&lp), &[1.0 / 6.0, 0.0, 2.0 / 6.0, 0.0, 3.0 / 6.0]);

        // Special token 1 is exempt.
        let mut lp = lp_of(&probs);
        xtc(&mut lp, 0.2, 0.5, 0.1, &[1]);
        assert_eq!(kept(&lp), vec![0, 1, 2, 4]);

        // Coin flip above the probability: unchanged.
        let mut lp = lp_of(&probs);
        let before = lp.clone();
        xtc(&mut lp, 0.6, 0.5, 0.1, &[]);
        assert_eq!(lp, before);

        // Only one token above the threshold: it is the least likely of them, so nothing goes.
        let mut lp = lp_of(&[0.7, 0.1, 0.1, 0.1]);
        xtc(&mut lp, 0.0, 1.0, 0.3, &[]);
        assert_eq!(kept(&lp), vec![0, 1, 2, 3]);
    }

    #[test]
    fn xtc_renormalises_after_earlier_filters() {
        // Surviving 0.2 and 0.1 renormalise to 2/3 and 1/3; threshold 0.3 → both above, the
        // 1/3 one is least likely, so only id 0 is removed.
        let mut lp = vec![(0.2f32).ln(), (0.1f32).ln(), NI];
        xtc(&mut lp, 0.0, 1.0, 0.3, &[]);
        assert_eq!(kept(&lp), vec![1]);
    }

    #[test]
    fn top_k_hand_computed() {
        let mut lp = lp_of(&[0.05, 0.4, 0.1, 0.3, 0.15]);
        let mut idx = Vec::new();
        top_k(&mut lp, &mut idx, 2);
        assert_eq!(kept(&lp), vec![1, 3]);
        assert_close(&renorm(&lp), &[0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7, 0.0]);

        // Ties at the cut go to the lower id; exactly k survive.
        let mut lp = lp_of(&[0.25, 0.25, 0.25, 0.25]);
        top_k(&mut lp, &mut idx, 3);
        assert_eq!(kept(&lp), vec![0, 1, 2]);

        // k >= vocab is a no-op.
        let mut lp = lp_of(&[0.5, 0.5]);
        top_k(&mut lp, &mut idx, 5);
        assert_eq!(kept(&lp), vec![0, 1]);
    }

    #[test]
    fn categorical_inverts_cdf() {
        let lp = lp_of(&[0.1, 0.0, 0.6, 0.3]);
        assert_eq!(categorical(&mut lp.clone(), 1.0, 0.0), Some(0));
        assert_eq!(categorical(&mut lp.clone(), 1.0, 0.09), Some(0));
        assert_eq!(categorical(&mut lp.clone(), 1.0, 0.11), Some(2));
        assert_eq!(categorical(&mut lp.clone(), 1.0, 0.69), Some(2));
        assert_eq!(categorical(&mut lp.clone(), 1.0, 0.71), Some(3));
        assert_eq!(categorical(&mut lp.clone(), 1.0, 0.999_999), Some(3));
        assert_eq!(categorical(&mut [NI, NI], 1.0, 0.5), None);
        // Temperature 0.5 squares the odds: 0.1², 0.6², 0.3² → 0.01/0.46, 0.36/0.46, 0.09/0.46.
        assert_eq!(categorical(&mut lp.clone(), 0.5, 0.02), Some(0));
        assert_eq!(categorical(&mut lp.clone(), 0.5, 0.03), Some(2));
        assert_eq!(categorical(&mut lp.clone(), 0.5, 0.80), Some(2));
        assert_eq!(categorical(&mut lp.clone(), 0.5, 0.81), Some(3));
    }
}
