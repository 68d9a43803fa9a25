//! Logits processors: bias and the three history penalties (spec §10 "Logits processors").
//!
//! Each works in place on the raw logits. Token ids outside the vocabulary (in the bias list or
//! in the history) are skipped rather than trusted, because both come from the request.

/// The last `context_size` tokens of `history`; 0 means all of it (Python's `tokens[-0:]`).
pub fn window(history: &[u32], context_size: usize) -> &[u32] {
    if context_size == 0 || context_size >= history.len() {
        history
    } else {
        &history[history.len() - context_size..]
    }
}

/// `logits[id] += bias` for every entry; repeated ids accumulate.
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(l) = logits.get_mut(id as usize) {
            *l += b;
        }
    }
}

/// Calls `f(token, count)` once per distinct in-vocabulary token of `tokens`.
///
/// `counts` must be all zeros and as long as the vocabulary; it is all zeros again on return,
/// which lets the caller reuse it without clearing the whole vocabulary each step.
fn for_each_distinct(tokens: &[u32], counts: &mut [u32], mut f: impl FnMut(usize, u32)) {
    for &t in tokens {
        if let Some(c) = counts.get_mut(t as usize) {
            *c += 1;
        }
    }
    for &t in tokens {
        let t = t as usize;
        if let Some(c) = counts.get_mut(t)
            && *c > 0
        {
            f(t, *c);
            *c = 0;
        }
    }
}

/// Repetition penalty: for each distinct token in the window, `l < 0 ? l·p : l/p`.
///
/// Applied once per distinct token because the reference writes the same value for duplicates.
pub fn apply_repetition_penalty(
    logits: &mut [f32],
    tokens: &[u32],
    penalty: f32,
    counts: &mut [u32],
) {
    for_each_distinct(tokens, counts, |t, _| {
        let l = logits[t];
        logits[t] = if l < 0.0 { l * penalty } else { l / penalty };
    });
}

/// Presence penalty: `l -= p` once for each distinct token in the window.
pub fn apply_presence_penalty(
    logits: &mut [f32],
    tokens: &[u32],
    penalty: f32,
    counts: &mut [u32],
) {
    for_each_distinct(tokens, counts, |t, _| logits[t] -= penalty);
}

/// Frequency penalty: `l -= p·count(token in window)`.
pub fn apply_frequency_penalty(
    logits: &mut [f32],
    tokens: &[u32],
    penalty: f32,
    counts: &mut [u32],
) {
    for_each_distinct(tokens, counts, |t, c| logits[t] -= penalty * c as f32);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_semantics() {
        let h = [1, 2, 3, 4, 5];
        assert_eq!(window(&h, 0), &h[..]);
        assert_eq!(window(&h, 2), &[4, 5]);
        assert_eq!(window(&h, 9), &h[..]);
        assert_eq!(window(&[], 3), &[] as &[u32]);
    }

    #[test]
    fn logit_bias_adds_and_skips_out_of_range() {
        let mut l = [0.0, 1.0, 2.0];
        apply_logit_bias(&mut l, &[(0, 1.5), (2, -2.0), (2, -1.0), (99, 5.0)]);
        assert_eq!(l, [1.5, 1.0, -1.0]);
    }

    #[test]
    fn repetition_penalty_hand_computed() {
        let mut l = [2.0, -2.0, 4.0, 1.0];
        let mut counts = vec![0; 4];
        // Token 0 appears twice but is divided only once; token 3 is not in the window.
        apply_repetition_penalty(&mut l, &[0, 1, 0, 2, 7], 2.0, &mut counts);
        assert_eq!(l, [1.0, -4.0, 2.0, 1.0]);
        assert!(counts.iter().all(|&c| c == 0));
    }

    #[test]
    fn presence_penalty_hand_computed() {
        let mut l = [1.0, 1.0, 1.0];
        let mut counts = vec![0; 3];
        apply_presence_penalty(&mut l, &[2, 2, 2, 0], 0.5, &mut counts);
        assert_eq!(l, [0.5, 1.0, 0.5]);
        assert!(counts.iter().all(|&c| c == 0));
    }

    #[test]
    fn frequency_penalty_hand_computed() {
        let mut l = [1.0, 1.0, 1.0];
        let mut counts = vec![0; 3];
        apply_frequency_penalty(&mut l, &[2, 2, 2, 0], 0.5, &mut counts);
        assert_eq!(l, [0.5, 1.0, -0.5]);
        assert!(counts.iter().all(|&c| c == 0));
    }
}
