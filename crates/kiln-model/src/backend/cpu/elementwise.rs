//! Row-wise steps of the forward pass: RMSNorm, RoPE, gated activations.

use crate::config::Activation;

/// `row / rms(row) * (w + offset)`, accumulating the mean square in f64 only where it pays:
/// f32 matches transformers' float32 reference within its own noise.
pub(crate) fn rms_norm_in_place(row: &mut [f32], w: &[f32], eps: f32, offset: f32) {
    let mean_sq = row.iter().map(|x| x * x).sum::<f32>() / row.len() as f32;
    let inv = 1.0 / (mean_sq + eps).sqrt();
    row.iter_mut()
        .zip(w)
        .for_each(|(x, wi)| *x = *x * inv * (wi + offset));
}

/// Rotate-half RoPE on every `head_dim` slice of a row, with the token's precomputed angles.
pub(crate) fn rope_row(row: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for head in row.chunks_exact_mut(head_dim) {
        let (a, b) = head.split_at_mut(half);
        for i in 0..half.min(cos.len()) {
            let (x, y) = (a[i], b[i]);
            a[i] = x * cos[i] - y * sin[i];
            b[i] = y * cos[i] + x * sin[i];
        }
    }
}

/// `gate = act(gate) * up`.
pub(crate) fn glu_in_place(gate: &mut [f32], up: &[f32], act: Activation) {
    match act {
        Activation::Silu => gate
            .iter_mut()
            .zip(up)
            .for_each(|(g, u)| *g = *g / (1.0 + (-*g).exp()) * u),
        Activation::GeluTanh => gate
            .iter_mut()
            .zip(up)
            .for_each(|(g, u)| *g = gelu_tanh(*g) * u),
    }
}

/// GELU, tanh approximation (PyTorch's `gelu(approximate="tanh")`).
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}
