//! RMSNorm over rows (or over every `width` slice of a row): `y = x · r · (w + offset)` with
//! `r = 1/√(mean(x²) + eps)`.

/// `1/√(mean(x²) + eps)` of a slice.
fn inv_rms(xs: &[f32], eps: f32) -> f32 {
    let mean_sq = xs.iter().map(|v| v * v).sum::<f32>() / xs.len() as f32;
    1.0 / (mean_sq + eps).sqrt()
}

/// The forward: `y` and each slice's `r` (kept for the backward).
pub fn forward(x: &[f32], w: &[f32], width: usize, eps: f32, offset: f32) -> (Vec<f32>, Vec<f32>) {
    let mut inv = vec![0f32; x.len() / width.max(1)];
    kiln_kernels::pool::for_each_chunk_mut(&mut inv, 1, 64, |i, r| {
        r[0] = inv_rms(&x[i * width..(i + 1) * width], eps);
    });
    let mut y = vec![0f32; x.len()];
    super::par_rows(&mut y, width, |i, ys| {
        let (xs, r) = (&x[i * width..(i + 1) * width], inv[i]);
        for ((yv, xv), wv) in ys.iter_mut().zip(xs).zip(w) {
            *yv = xv * r * (wv + offset);
        }
    });
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
    super::par_rows(&mut dx, width, |i, dxs| {
        let (xs, dys, r) = (
            &x[i * width..(i + 1) * width],
            &dy[i * width..(i + 1) * width],
            inv[i],
        );
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
    });
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
