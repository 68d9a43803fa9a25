//! RMSNorm over rows (or over every `width` slice of a row): `y = x · r · (w + offset)` with
//! `r = 1/√(mean(x²) + eps)`.

/// The forward: `y` and each slice's `r` (kept for the backward).
pub fn forward(x: &[f32], w: &[f32], width: usize, eps: f32, offset: f32) -> (Vec<f32>, Vec<f32>) {
    let mut y = vec![0f32; x.len()];
    let mut inv = Vec::with_capacity(x.len() / width.max(1));
    for (xs, ys) in x.chunks_exact(width).zip(y.chunks_exact_mut(width)) {
        let mean_sq = xs.iter().map(|v| v * v).sum::<f32>() / width as f32;
        let r = 1.0 / (mean_sq + eps).sqrt();
        inv.push(r);
        for ((yv, xv), wv) in ys.iter_mut().zip(xs).zip(w) {
            *yv = xv * r * (wv + offset);
        }
    }
    (y, inv)
}

/// `∂L/∂x` from `∂L/∂y`: `r·g·dy − x · r³/n · Σ(dy·g·x)`, `g = w + offset`.
pub fn backward(
    x: &[f32],
    w: &[f32],
    inv: &[f32],
    dy: &[f32],
    width: usize,
    offset: f32,
) -> Vec<f32> {
    let mut dx = vec![0f32; x.len()];
    let slices = x.chunks_exact(width).zip(dy.chunks_exact(width));
    for (((xs, dys), dxs), &r) in slices.zip(dx.chunks_exact_mut(width)).zip(inv) {
        let dot: f32 = xs
            .iter()
            .zip(dys)
            .zip(w)
            .map(|((xv, d), wv)| xv * d * (wv + offset))
            .sum();
        let k = r * r * r * dot / width as f32;
        for (((o, xv), d), wv) in dxs.iter_mut().zip(xs).zip(dys).zip(w) {
            *o = r * d * (wv + offset) - xv * k;
        }
    }
    dx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fd;

    #[test]
    fn backward_matches_finite_differences() {
        for (width, offset) in [(8, 0.0), (4, 1.0)] {
            let x = fd::input(16, 1);
            let w = fd::input(width, 2);
            let dy = fd::input(16, 3);
            let (_, inv) = forward(&x, &w, width, 1e-5, offset);
            let dx = backward(&x, &w, &inv, &dy, width, offset);
            fd::check(&x, &dy, &dx, |x| forward(x, &w, width, 1e-5, offset).0);
        }
    }
}
