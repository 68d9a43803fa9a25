//! Rotate-half RoPE on every `head_dim` slice of each row. The rotation is linear in `x`, so
//! the backward is the inverse rotation of the incoming gradient and needs no saved input.

/// Rotates `x` in place by each row's angles (`cos`/`sin`: `[row][i]`, `freqs` per row).
pub fn forward(
    x: &mut [f32],
    width: usize,
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
    freqs: usize,
) {
    rotate(x, width, head_dim, cos, sin, freqs, 1.0);
}

/// Turns `∂L/∂y` into `∂L/∂x` in place (rotation by the negative angle).
pub fn backward(
    dy: &mut [f32],
    width: usize,
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
    freqs: usize,
) {
    rotate(dy, width, head_dim, cos, sin, freqs, -1.0);
}

fn rotate(
    x: &mut [f32],
    width: usize,
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
    freqs: usize,
    sign: f32,
) {
    let half = head_dim / 2;
    super::par_rows(x, width, |t, row| {
        let (c, s) = (
            &cos[t * freqs..(t + 1) * freqs],
            &sin[t * freqs..(t + 1) * freqs],
        );
        for head in row.chunks_exact_mut(head_dim) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half.min(freqs) {
                let (x1, x2, si) = (a[i], b[i], sign * s[i]);
                a[i] = x1 * c[i] - x2 * si;
                b[i] = x2 * c[i] + x1 * si;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fd;

    #[test]
    fn backward_matches_finite_differences() {
        let (rows, width, hd, freqs) = (3, 8, 4, 2);
        let cos: Vec<f32> = (0..rows * freqs).map(|i| (i as f32 * 0.3).cos()).collect();
        let sin: Vec<f32> = (0..rows * freqs).map(|i| (i as f32 * 0.3).sin()).collect();
        let x = fd::input(rows * width, 4);
        let mut dx = fd::input(rows * width, 5);
        let dy = dx.clone();
        backward(&mut dx, width, hd, &cos, &sin, freqs);
        fd::check(&x, &dy, &dx, |x| {
            let mut y = x.to_vec();
            forward(&mut y, width, hd, &cos, &sin, freqs);
            y
        });
    }
}
