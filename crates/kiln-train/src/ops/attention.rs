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

/// Query rows per block: a block's products stop at its last row's keys, so the causal
/// triangle costs about half the square.
const QUERY_BLOCK: usize = 64;

/// The blocks `[i0, i1)` of `n` query rows.
fn blocks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n.div_ceil(QUERY_BLOCK)).map(move |b| (b * QUERY_BLOCK, ((b + 1) * QUERY_BLOCK).min(n)))
}

/// One head's views into the batch: `(q, k, v)` rows of a span.
struct HeadViews<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    qw: usize,
    kw: usize,
    hd: usize,
}

impl<'a> HeadViews<'a> {
    fn new(q: &'a [f32], k: &'a [f32], v: &'a [f32], start: usize, h: usize, s: &Shape) -> Self {
        let (qw, kw, hd) = (s.q_width(), s.kv_width(), s.head_dim);
        let g = h / s.group();
        Self {
            q: &q[start * qw + h * hd..],
            k: &k[start * kw + g * hd..],
            v: &v[start * kw + g * hd..],
            qw,
            kw,
            hd,
        }
    }
    fn q(&self, i0: usize, i1: usize) -> View<'a> {
        View::strided(&self.q[i0 * self.qw..], i1 - i0, self.hd, self.qw)
    }
    fn k(&self, rows: usize) -> View<'a> {
        View::strided(self.k, rows, self.hd, self.kw)
    }
    fn v(&self, rows: usize) -> View<'a> {
        View::strided(self.v, rows, self.hd, self.kw)
    }
}

/// The attention output `[rows, q_width]` and each (span, head)'s probabilities `[n, n]`
/// (zero above the diagonal).
pub fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    spans: &[Span],
    s: &Shape,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (qw, hd) = (s.q_width(), s.head_dim);
    let results = per_head(spans, s.n_heads, |si, h| {
        let (start, n) = spans[si];
        let hv = HeadViews::new(q, k, v, start, h, s);
        let mut p = vec![0f32; n * n];
        let mut o = vec![0f32; n * hd];
        for (i0, i1) in blocks(n) {
            matmul_into_serial(
                &mut p[i0 * n..],
                n,
                hv.q(i0, i1),
                hv.k(i1).t(),
                s.scale,
                false,
            );
            softmax_causal(&mut p[i0 * n..i1 * n], n, i0, i1, s);
            let pb = View::strided(&p[i0 * n..], i1 - i0, i1, n);
            matmul_into_serial(&mut o[i0 * hd..], hd, pb, hv.v(i1), 1.0, false);
        }
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

/// Softmax of rows `i0..i1` (held in `rows`, `n` wide) over their visible keys, which all lie
/// before `i1`; the rest of each row is set to zero.
fn softmax_causal(rows: &mut [f32], n: usize, i0: usize, i1: usize, s: &Shape) {
    for (r, row) in rows.chunks_exact_mut(n).enumerate() {
        let i = i0 + r;
        let mut max = f32::NEG_INFINITY;
        for (j, x) in row[..i1].iter().enumerate() {
            if s.visible(i, j) {
                max = max.max(*x);
            }
        }
        let mut sum = 0f32;
        for (j, x) in row.iter_mut().enumerate() {
            *x = if j < i1 && s.visible(i, j) {
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
        let (start, n) = spans[si];
        let hv = HeadViews::new(q, k, v, start, h, s);
        let p = &probs[si * s.n_heads + h];
        let dout_h = &dout[start * qw + h * hd..];
        let (mut dq, mut dk, mut dv) = (vec![0f32; n * hd], vec![0f32; n * hd], vec![0f32; n * hd]);
        let mut ds = vec![0f32; QUERY_BLOCK * n];
        for (i0, i1) in blocks(n) {
            let bi = i1 - i0;
            let doh = View::strided(&dout_h[i0 * qw..], bi, hd, qw);
            let pb = View::strided(&p[i0 * n..], bi, i1, n);
            matmul_into_serial(&mut dv, hd, pb.t(), doh, 1.0, true);
            matmul_into_serial(&mut ds, i1, doh, hv.v(i1).t(), 1.0, false);
            for (r, drow) in ds[..bi * i1].chunks_exact_mut(i1).enumerate() {
                let prow = &p[(i0 + r) * n..(i0 + r) * n + i1];
                let dot: f32 = drow.iter().zip(prow).map(|(d, pp)| d * pp).sum();
                drow.iter_mut()
                    .zip(prow)
                    .for_each(|(d, pp)| *d = pp * (*d - dot));
            }
            let dsv = View::rows(&ds[..bi * i1], bi, i1);
            matmul_into_serial(&mut dq[i0 * hd..], hd, dsv, hv.k(i1), s.scale, false);
            matmul_into_serial(&mut dk, hd, dsv.t(), hv.q(i0, i1), s.scale, true);
        }
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
    fn blocks_of_a_long_sequence_match_finite_differences() {
        let s = Shape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 2,
            scale: 0.5,
            window: Some(100),
        };
        let rows = 150;
        let spans = [(0, rows)];
        let q = fd::input(rows * 4, 21);
        let k = fd::input(rows * 2, 22);
        let v = fd::input(rows * 2, 23);
        let dout = fd::input(rows * 4, 24);
        let (_, probs) = forward(&q, &k, &v, &spans, &s);
        let (dq, dk, dv) = backward(&q, &k, &v, &probs, &dout, &spans, &s);
        // A sample of elements across the three blocks (the full check is slow at this size).
        let pick = |g: &[f32], x: &[f32], which: usize| {
            for i in [0, 1, 63, 64, 65, 127, 128, 149].map(|r| r * x.len() / rows) {
                let h = 1e-2f32;
                let f = |d: f32| -> f64 {
                    let mut y = x.to_vec();
                    y[i] += d;
                    let (qq, kk, vv) = match which {
                        0 => (&y, &k, &v),
                        1 => (&q, &y, &v),
                        _ => (&q, &k, &y),
                    };
                    forward(qq, kk, vv, &spans, &s)
                        .0
                        .iter()
                        .zip(&dout)
                        .map(|(a, b)| (*a as f64) * (*b as f64))
                        .sum()
                };
                let numeric = (f(h) - f(-h)) / (2.0 * h as f64);
                assert!(
                    (g[i] as f64 - numeric).abs() < 2e-3 * (1.0 + numeric.abs()),
                    "input {which} [{i}]: {} vs {numeric}",
                    g[i]
                );
            }
        };
        pick(&dq, &q, 0);
        pick(&dk, &k, 1);
        pick(&dv, &v, 2);
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
