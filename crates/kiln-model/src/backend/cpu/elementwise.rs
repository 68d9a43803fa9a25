//! Row-wise steps of the forward pass: RMSNorm, RoPE, gated activations.

use crate::config::Activation;

/// `row / rms(row) * (w + offset)`, the mean square in f32 (transformers' float32 reference
/// within its own noise) over eight running sums: one sequential sum is a chain of dependent
/// adds, ~1% of a decoded token on the calling thread.
pub(crate) fn rms_norm_in_place(row: &mut [f32], w: &[f32], eps: f32, offset: f32) {
    let mut lanes = [0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for (l, x) in lanes.iter_mut().zip(c) {
            *l += x * x;
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|x| x * x).sum();
    let mean_sq = (lanes.iter().sum::<f32>() + tail) / row.len() as f32;
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
        Activation::Silu => kiln_kernels::act::silu_mul_in_place(gate, up),
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

/// BERT's LayerNorm of one row in place: mean and variance in f64, then `w` and `b`.
pub(crate) fn layer_norm_in_place(row: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = row.len().max(1) as f64;
    let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = row
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let inv = 1.0 / (var + f64::from(eps)).sqrt();
    for ((v, w), b) in row.iter_mut().zip(w).zip(b) {
        *v = ((f64::from(*v) - mean) * inv) as f32 * w + b;
    }
}

/// The exact GELU, `x/2 · (1 + erf(x/√2))`, as BERT's `gelu` is.
pub(crate) fn gelu_erf(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))) as f32
}
