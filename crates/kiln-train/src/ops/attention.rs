//! Causal self-attention within each sequence of a training batch (every sequence starts at
//! position 0), with grouped KV heads and an optional sliding window. The forward keeps each
//! head's probabilities for the backward.

use kiln_kernels::pool;
use std::sync::Mutex;

use crate::gemm::{View, matmul_into_serial};

/// The shape of one layer's attention.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Score multiplier.
    pub scale: f32,
    /// Positions visible to a query, its own included.
    pub window: Option<usize>,
}

impl Shape {
    fn q_width(&self) -> usize {
        self.n_heads * self.head_dim
    }
    fn kv_width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads.max(1)
    }
    fn visible(&self, i: usize, j: usize) -> bool {
        j <= i && self.window.is_none_or(|w| i - j < w)
    }
}

/// One sequence's rows in the batch: the first row and the count.
pub type Span = (usize, usize);

/// Runs `task(span, head)` for every pair on the kernel pool and collects the results in order.
fn per_head<T: Send>(
    spans: &[Span],
    heads: usize,
    task: impl Fn(usize, usize) -> T + Sync,
) -> Vec<T> {
    let n = spans.len() * heads;
    let slots: Vec<Mutex<Option<T>>> = (0..n).map(|_| Mutex::new(None)).collect();
    pool::parallel_for(n, |i| {
        let value = task(i / heads, i % heads);
        if let Ok(mut slot) = slots[i].lock() {
            *slot = Some(value);
        }
    });
    slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .ok()
                .flatten()
                .expect("every attention task ran")
        })
        .collect()
}

/// The attention output `[rows, q_width]` and each (span, head)'s probabilities `[n, n]`.
pub fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    spans: &[Span],
    s: &Shape,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (qw, kw, hd) = (s.q_width(), s.kv_width(), s.head_dim);
    let results = per_head(spans, s.n_heads, |si, h| {
        let ((start, n), g) = (spans[si], h / s.group());
        let qh = View::strided(&q[start * qw + h * hd..], n, hd, qw);
        let kh = View::strided(&k[start * kw + g * hd..], n, hd, kw);
        let vh = View::strided(&v[start * kw + g * hd..], n, hd, kw);
        let mut p = vec![0f32; n * n];
        matmul_into_serial(&mut p, n, qh, kh.t(), s.scale, false);
        softmax_causal(&mut p, n, s);
        let mut o = vec![0f32; n * hd];
        matmul_into_serial(&mut o, hd, View::rows(&p, n, n), vh, 1.0, false);
        (p, o)
    });
    let rows: usize = spans.iter().map(|sp| sp.1).sum();
    let mut out = vec![0f32; rows * qw];
    let mut probs = Vec::with_capacity(results.len());
    for (i, (p, o)) in results.into_iter().enumerate() {
        let ((start, n), h) = (spans[i / s.n_heads], i % s.n_heads);
        for r in 0..n {
            let dst = (start + r) * qw + h * hd;
            out[dst..dst + hd].copy_from_slice(&o[r * hd..(r + 1) * hd]);
        }
        probs.push(p);
    }
    (out, probs)
}

fn softmax_causal(p: &mut [f32], n: usize, s: &Shape) {
    for (i, row) in p.chunks_exact_mut(n).enumerate() {
        let mut max = f32::NEG_INFINITY;
        for (j, x) in row.iter().enumerate() {
            if s.visible(i, j) {
                max = max.max(*x);
            }
        }
        let mut sum = 0f32;
        for (j, x) in row.iter_mut().enumerate() {
            *x = if s.visible(i, j) {
                (*x - max).exp()
            } else {
                0.0
            };
            sum += *x;
        }
        row.iter_mut().for_each(|x| *x /= sum);
    }
}

/// `(∂L/∂q, ∂L/∂k, ∂L/∂v)` from `∂L/∂out` and the forward's probabilities.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    probs: &[Vec<f32>],
    dout: &[f32],
    spans: &[Span],
    s: &Shape,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (qw, kw, hd) = (s.q_width(), s.kv_width(), s.head_dim);
    let results = per_head(spans, s.n_heads, |si, h| {
        let ((start, n), g) = (spans[si], h / s.group());
        let p = &probs[si * s.n_heads + h];
        let qh = View::strided(&q[start * qw + h * hd..], n, hd, qw);
        let kh = View::strided(&k[start * kw + g * hd..], n, hd, kw);
        let vh = View::strided(&v[start * kw + g * hd..], n, hd, kw);
        let doh = View::strided(&dout[start * qw + h * hd..], n, hd, qw);
        let pv = View::rows(p, n, n);
        let mut dv = vec![0f32; n * hd];
        matmul_into_serial(&mut dv, hd, pv.t(), doh, 1.0, false);
        let mut ds = vec![0f32; n * n];
        matmul_into_serial(&mut ds, n, doh, vh.t(), 1.0, false);
        for (drow, prow) in ds.chunks_exact_mut(n).zip(p.chunks_exact(n)) {
            let dot: f32 = drow.iter().zip(prow).map(|(d, pp)| d * pp).sum();
            drow.iter_mut()
                .zip(prow)
                .for_each(|(d, pp)| *d = pp * (*d - dot));
        }
        let dsv = View::rows(&ds, n, n);
        let mut dq = vec![0f32; n * hd];
        matmul_into_serial(&mut dq, hd, dsv, kh, s.scale, false);
        let mut dk = vec![0f32; n * hd];
        matmul_into_serial(&mut dk, hd, dsv.t(), qh, s.scale, false);
        (dq, dk, dv)
    });
    let rows: usize = spans.iter().map(|sp| sp.1).sum();
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; rows * qw],
        vec![0f32; rows * kw],
        vec![0f32; rows * kw],
    );
    for (i, (hq, hk, hv)) in results.into_iter().enumerate() {
        let ((start, n), h) = (spans[i / s.n_heads], i % s.n_heads);
        let g = h / s.group();
        for r in 0..n {
            let qd = (start + r) * qw + h * hd;
            dq[qd..qd + hd].copy_from_slice(&hq[r * hd..(r + 1) * hd]);
            let kd = (start + r) * kw + g * hd;
            for c in 0..hd {
                dk[kd + c] += hk[r * hd + c];
                dv[kd + c] += hv[r * hd + c];
            }
        }
    }
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fd;

    fn shape(window: Option<usize>) -> Shape {
        Shape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 2,
            scale: 0.7,
            window,
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let spans = [(0, 3), (3, 4)];
        for window in [None, Some(2)] {
            let s = shape(window);
            let rows = 7;
            let q = fd::input(rows * 8, 9);
            let k = fd::input(rows * 4, 10);
            let v = fd::input(rows * 4, 11);
            let dout = fd::input(rows * 8, 12);
            let (_, probs) = forward(&q, &k, &v, &spans, &s);
            let (dq, dk, dv) = backward(&q, &k, &v, &probs, &dout, &spans, &s);
            fd::check(&q, &dout, &dq, |q| forward(q, &k, &v, &spans, &s).0);
            fd::check(&k, &dout, &dk, |k| forward(&q, k, &v, &spans, &s).0);
            fd::check(&v, &dout, &dv, |v| forward(&q, &k, v, &spans, &s).0);
        }
    }

    #[test]
    fn a_sequence_does_not_see_the_next_one() {
        let s = shape(None);
        let q = fd::input(7 * 8, 1);
        let k = fd::input(7 * 4, 2);
        let v = fd::input(7 * 4, 3);
        let (both, _) = forward(&q, &k, &v, &[(0, 3), (3, 4)], &s);
        let (first, _) = forward(&q[..24], &k[..12], &v[..12], &[(0, 3)], &s);
        assert_eq!(&both[..24], &first[..]);
    }
}
