//! TurboQuant (MSE variant, no QJL residual) for KV rows.
//!
//! A row `x` is stored as its norm `n` and the Lloyd–Max codes of `z = √dim · R·x/n`, where
//! `R = H·D/√dim` (D a fixed random ±1 diagonal, H the Walsh–Hadamard matrix) is orthogonal.
//! After the rotation every coordinate of `z` is close to N(0, 1) whatever `x` looked like, so
//! one scalar codebook serves every coordinate and outlier channels get spread out.
//!
//! Row layout: `dim·bits/8` packed code bytes ([`pack_bits`]), then `n` as f16
//! little-endian. Decoding happens in the rotated space (`*_rotated`): attention computes
//! `(R·q)·(R·k) = q·k` and un-rotates the weighted sum of values once per head, so the
//! per-position work never applies the inverse rotation.

use std::fmt;

use super::{check_param, codes_of, f16_saturating, lloyd_max, pack_bits, read_f16};
use crate::error::Result;

/// Row dimensions the codec accepts (powers of two, for the fast Walsh–Hadamard transform).
pub const TURBO_DIMS: [usize; 4] = [64, 128, 256, 512];

pub(super) const MAX_DIM: usize = 512;

/// TurboQuant codec for rows of `dim` f32 values with a seeded random rotation.
#[derive(Clone)]
pub struct TurboCodec {
    dim: usize,
    bits: u8,
    seed: u64,
    signs: Vec<f32>,
    /// Boundaries padded to 256 entries (see `code_of`).
    boundaries: Box<[f32; 256]>,
    /// Codebook padded to 256 entries so a `u8` code indexes it without a bounds check.
    lut: Box<[f32; 256]>,
    inv_sqrt_dim: f32,
}

impl fmt::Debug for TurboCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurboCodec")
            .field("dim", &self.dim)
            .field("bits", &self.bits)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

/// The next output of the splitmix64 stream (Steele, Lea & Flood 2014); advances `state`.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// In-place unnormalised fast Walsh–Hadamard transform; `x.len()` a power of two ≥ 8.
fn fwht(x: &mut [f32]) {
    // The first three stages stay inside 8-element blocks; done as one straight-line 8-point
    // transform they vectorise, where the generic loop's 1- and 2-element halves do not.
    for b in x.chunks_exact_mut(8) {
        let mut v = [0f32; 8];
        v.copy_from_slice(b);
        for h in [1, 2, 4] {
            let mut w = [0f32; 8];
            for i in 0..8 {
                w[i] = if i & h == 0 {
                    v[i] + v[i + h]
                } else {
                    v[i - h] - v[i]
                };
            }
            v = w;
        }
        b.copy_from_slice(&v);
    }
    let mut h = 8;
    while h < x.len() {
        for block in x.chunks_exact_mut(2 * h) {
            let (a, b) = block.split_at_mut(h);
            for (a, b) in a.iter_mut().zip(b) {
                let (u, v) = (*a, *b);
                *a = u + v;
                *b = u - v;
            }
        }
        h *= 2;
    }
}

impl TurboCodec {
    /// A codec for `dim` ∈ [`TURBO_DIMS`] and `bits` ∈ {2, 3, 4, 5, 8}. Coordinate `i` of the
    /// sign diagonal is −1 when the top bit of the `i`-th splitmix64 output from `seed` is set;
    /// this must never change, or caches written earlier decode to garbage.
    pub fn new(dim: usize, bits: u8, seed: u64) -> Result<Self> {
        check_param(TURBO_DIMS.contains(&dim), || {
            format!("TurboQuant KV codec dim {dim} (supported: {TURBO_DIMS:?})")
        })?;
        check_param(matches!(bits, 2 | 3 | 4 | 5 | 8), || {
            format!("TurboQuant KV codec with {bits} bits (supported: 2, 3, 4, 5, 8)")
        })?;
        let centroids = lloyd_max::codebook(bits)?;
        let mut lut = Box::new([0f32; 256]);
        lut[..centroids.len()].copy_from_slice(centroids);
        let bounds = lloyd_max::boundaries(bits)?;
        let mut boundaries = Box::new([f32::INFINITY; 256]);
        boundaries[..bounds.len()].copy_from_slice(bounds);
        let mut state = seed;
        let signs = (0..dim)
            .map(|_| {
                if splitmix64(&mut state) >> 63 == 1 {
                    -1.0
                } else {
                    1.0
                }
            })
            .collect();
        Ok(Self {
            dim,
            bits,
            seed,
            signs,
            boundaries,
            lut,
            inv_sqrt_dim: 1.0 / (dim as f32).sqrt(),
        })
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bits per code.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// The seed of the rotation's sign diagonal.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Bytes per encoded row: the packed codes, then the norm as f16 (2 bytes).
    pub fn row_bytes(&self) -> usize {
        self.code_bytes() + 2
    }

    fn code_bytes(&self) -> usize {
        self.dim * usize::from(self.bits) / 8
    }

    /// The centroid table and `1/√dim`, for the tile decoder (`turbo_tile.rs`).
    pub(super) fn decode_parts(&self) -> (&[f32; 256], f32) {
        (&self.lut, self.inv_sqrt_dim)
    }

    /// `x ← R·x`, `R = H·D/√dim` (orthogonal).
    pub fn rotate(&self, x: &mut [f32]) {
        debug_assert_eq!(x.len(), self.dim);
        let x = &mut x[..self.dim];
        for (v, &s) in x.iter_mut().zip(&self.signs) {
            *v *= s;
        }
        fwht(x);
        for v in x {
            *v *= self.inv_sqrt_dim;
        }
    }

    /// `y ← Rᵀ·y = D·H·y/√dim`, the inverse of [`rotate`](Self::rotate).
    pub fn unrotate(&self, y: &mut [f32]) {
        debug_assert_eq!(y.len(), self.dim);
        let y = &mut y[..self.dim];
        fwht(y);
        for (v, &s) in y.iter_mut().zip(&self.signs) {
            *v *= s * self.inv_sqrt_dim;
        }
    }

    /// Encodes `x` (`dim` values, unrotated) into `out` (`row_bytes()` bytes). Non-finite
    /// inputs never panic; the row decodes to something finite.
    pub fn quantize(&self, x: &[f32], out: &mut [u8]) {
        debug_assert_eq!(x.len(), self.dim);
        debug_assert_eq!(out.len(), self.row_bytes());
        // Eight lanes: a single running sum is one serial add chain.
        let mut lanes = [0f32; 8];
        for c in x[..self.dim].chunks_exact(8) {
            for i in 0..8 {
                lanes[i] += c[i] * c[i];
            }
        }
        let norm = lanes.iter().sum::<f32>().sqrt();
        // NaN.max(1e-8) is 1e-8, so a NaN norm still gives a finite divisor.
        let inv = 1.0 / norm.max(1e-8);
        let mut z = [0f32; MAX_DIM];
        let z = &mut z[..self.dim];
        for ((z, &v), &s) in z.iter_mut().zip(x).zip(&self.signs) {
            *z = v * s * inv;
        }
        // √dim·R·u = H·D·u: the two √dim factors cancel, so skip both.
        fwht(z);
        let mut idx = [0u8; MAX_DIM];
        let idx_row = &mut idx[..self.dim];
        if self.bits <= 5 {
            // At most 31 boundaries: counting them one by one over the whole row vectorises
            // and beats a per-element search.
            for &b in &self.boundaries[..(1 << self.bits) - 1] {
                for (i, &v) in idx_row.iter_mut().zip(z.iter()) {
                    *i += u8::from(v > b);
                }
            }
        } else {
            for (i, &v) in idx_row.iter_mut().zip(z.iter()) {
                *i = self.code_of(v);
            }
        }
        let (codes, tail) = out[..self.row_bytes()].split_at_mut(self.code_bytes());
        pack_bits(&idx[..self.dim], self.bits, codes);
        tail.copy_from_slice(&f16_saturating(norm).to_le_bytes());
    }

    /// The number of boundaries below `v` (NaN counts none). A branchless binary search over
    /// the `2^bits − 1` ascending boundaries: `partition_point` branches on every probe and
    /// mispredicts about half of them on random data.
    #[inline]
    fn code_of(&self, v: f32) -> u8 {
        let mut idx = 0usize;
        let mut step = 1usize << (self.bits - 1);
        while step > 0 {
            // idx + step − 1 ≤ 2^bits − 2 < 255: the mask only drops the bounds check.
            idx += step * usize::from(v > self.boundaries[(idx + step - 1) & 0xff]);
            step >>= 1;
        }
        idx as u8
    }

    /// Codes and the per-row factor `n/√dim` that turns a centroid into a rotated coordinate.
    fn decode<'a>(&self, row: &'a [u8], buf: &'a mut [u8; MAX_DIM]) -> (&'a [u8], f32) {
        debug_assert_eq!(row.len(), self.row_bytes());
        let cb = self.code_bytes();
        let norm = read_f16(&row[cb..cb + 2]);
        (
            codes_of(&row[..cb], self.bits, self.dim, buf),
            norm * self.inv_sqrt_dim,
        )
    }

    /// Decodes `row` into `out` in the rotated space: `centroid[idx]/√dim · n`.
    pub fn dequantize_rotated(&self, row: &[u8], out: &mut [f32]) {
        debug_assert_eq!(out.len(), self.dim);
        let mut buf = [0u8; MAX_DIM];
        let (codes, scale) = self.decode(row, &mut buf);
        for (o, &c) in out.iter_mut().zip(codes) {
            *o = self.lut[usize::from(c)] * scale;
        }
    }

    /// `q_rot · dequantize_rotated(row)` without materialising the row.
    pub fn dot_rotated(&self, row: &[u8], q_rot: &[f32]) -> f32 {
        debug_assert_eq!(q_rot.len(), self.dim);
        let mut buf = [0u8; MAX_DIM];
        let (codes, scale) = self.decode(row, &mut buf);
        let lut = &*self.lut;
        // Eight lanes so the multiply-adds pipeline; dims are multiples of 64.
        let mut lanes = [0f32; 8];
        for (c, q) in codes.chunks_exact(8).zip(q_rot.chunks_exact(8)) {
            for i in 0..8 {
                lanes[i] += q[i] * lut[usize::from(c[i])];
            }
        }
        lanes.iter().sum::<f32>() * scale
    }

    /// `acc += w · dequantize_rotated(row)`.
    pub fn axpy_rotated(&self, row: &[u8], w: f32, acc: &mut [f32]) {
        debug_assert_eq!(acc.len(), self.dim);
        let mut buf = [0u8; MAX_DIM];
        let (codes, scale) = self.decode(row, &mut buf);
        let ws = w * scale;
        for (a, &c) in acc.iter_mut().zip(codes) {
            *a += ws * self.lut[usize::from(c)];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::TestRng;

    const ALL_BITS: [u8; 5] = [2, 3, 4, 5, 8];

    fn gaussian(rng: &mut TestRng, dim: usize) -> Vec<f32> {
        (0..dim).map(|_| rng.gaussian()).collect()
    }

    fn dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum()
    }

    /// quantize → dequantize_rotated → unrotate.
    fn round_trip(codec: &TurboCodec, x: &[f32]) -> Vec<f32> {
        let mut row = vec![0u8; codec.row_bytes()];
        codec.quantize(x, &mut row);
        let mut back = vec![0f32; codec.dim()];
        codec.dequantize_rotated(&row, &mut back);
        codec.unrotate(&mut back);
        back
    }

    #[test]
    fn splitmix_and_signs_are_pinned() {
        // Reference value of splitmix64 and the sign stream, computed independently (Python).
        assert_eq!(splitmix64(&mut 0), 0xE220_A839_7B1D_CDAF);
        let codec = TurboCodec::new(64, 4, 42).unwrap();
        let signs: String = codec.signs[..16]
            .iter()
            .map(|&s| if s < 0.0 { '-' } else { '+' })
            .collect();
        assert_eq!(signs, "-++++-+-+-++---+");
        let other = TurboCodec::new(64, 4, 43).unwrap();
        assert_ne!(codec.signs, other.signs);
    }

    #[test]
    fn codes_count_the_boundaries_below() {
        let mut rng = TestRng::new(8);
        for bits in ALL_BITS {
            let codec = TurboCodec::new(64, bits, 0).unwrap();
            let b = lloyd_max::boundaries(bits).unwrap();
            let mut probes: Vec<f32> = (0..2000).map(|_| rng.gaussian() * 1.5).collect();
            probes.extend(b.iter().copied());
            probes.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e30]);
            for v in probes {
                let want = b.partition_point(|&x| v > x);
                assert_eq!(usize::from(codec.code_of(v)), want, "bits {bits} v {v}");
            }
        }
    }

    #[test]
    fn row_bytes_and_bad_parameters() {
        assert_eq!(TurboCodec::new(128, 4, 0).unwrap().row_bytes(), 66);
        assert_eq!(TurboCodec::new(64, 3, 0).unwrap().row_bytes(), 26);
        assert_eq!(TurboCodec::new(512, 8, 0).unwrap().row_bytes(), 514);
        for (dim, bits) in [
            (96, 4),
            (32, 4),
            (1024, 4),
            (0, 4),
            (64, 1),
            (64, 6),
            (64, 7),
        ] {
            assert!(
                TurboCodec::new(dim, bits, 0).is_err(),
                "dim {dim} bits {bits}"
            );
        }
    }

    #[test]
    fn rotation_is_orthogonal() {
        let mut rng = TestRng::new(3);
        for dim in TURBO_DIMS {
            let codec = TurboCodec::new(dim, 4, 42).unwrap();
            let (x, y) = (gaussian(&mut rng, dim), gaussian(&mut rng, dim));
            let (mut rx, mut ry) = (x.clone(), y.clone());
            codec.rotate(&mut rx);
            codec.rotate(&mut ry);
            let nx = dot(&x, &x);
            assert!((dot(&rx, &rx) - nx).abs() <= 1e-5 * nx);
            assert!((dot(&rx, &ry) - dot(&x, &y)).abs() <= 1e-5 * nx.max(dot(&y, &y)));
            codec.unrotate(&mut rx);
            for (a, b) in rx.iter().zip(&x) {
                assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "dim {dim}");
            }
            // A basis vector spreads evenly over every coordinate.
            let mut e = vec![0f32; dim];
            e[5] = 1.0;
            codec.rotate(&mut e);
            let flat = 1.0 / (dim as f32).sqrt();
            assert!(e.iter().all(|v| (v.abs() - flat).abs() < 1e-6));
        }
    }

    #[test]
    fn reconstruction_error_shrinks_with_bits() {
        // Relative MSE ≈ the Lloyd–Max distortion of N(0, 1) at each width.
        let bounds = [(2, 0.105, 0.125), (3, 0.031, 0.037), (4, 0.0085, 0.0102)];
        let bounds = bounds
            .into_iter()
            .chain([(5, 0.0022, 0.0027), (8, 3.5e-5, 5e-5)]);
        let mut rng = TestRng::new(4);
        for dim in [64, 128, 512] {
            let mut prev = f64::INFINITY;
            for (bits, lo, hi) in bounds.clone() {
                let codec = TurboCodec::new(dim, bits, 7).unwrap();
                let (mut err, mut total) = (0f64, 0f64);
                for _ in 0..4096 / dim * 16 {
                    let x = gaussian(&mut rng, dim);
                    let back = round_trip(&codec, &x);
                    err += x
                        .iter()
                        .zip(&back)
                        .map(|(a, b)| f64::from(a - b).powi(2))
                        .sum::<f64>();
                    total += dot(&x, &x);
                }
                let rel = err / total;
                assert!(lo < rel && rel < hi, "dim {dim} bits {bits}: {rel}");
                assert!(rel < prev);
                prev = rel;
            }
        }
    }

    #[test]
    fn norm_is_kept() {
        let mut rng = TestRng::new(5);
        for bits in ALL_BITS {
            let codec = TurboCodec::new(128, bits, 9).unwrap();
            // Conditional-mean centroids shrink a reconstruction by √(1 − distortion) on average
            // (0.94 at 2 bits, 0.983 at 3) and a single 128-vector scatters around that by a
            // few %; the stored norm itself is exact up to f16.
            let (distortion, spread) = match bits {
                2 => (0.1175, 0.08),
                3 => (0.03455, 0.08),
                4 => (0.0095, 0.05),
                5 => (0.0025, 0.03),
                _ => (4.1e-5, 0.005),
            };
            let expect: f64 = (1.0f64 - distortion).sqrt();
            let mut worst = 0f64;
            let mut mean = 0f64;
            for scale in [1e-3f32, 1.0, 300.0] {
                for _ in 0..32 {
                    let x: Vec<f32> = gaussian(&mut rng, 128).iter().map(|v| v * scale).collect();
                    let back = round_trip(&codec, &x);
                    let ratio = (dot(&back, &back) / dot(&x, &x)).sqrt();
                    worst = worst.max((ratio - expect).abs());
                    mean += ratio / 96.0;
                }
            }
            assert!(
                (mean - expect).abs() < 0.01,
                "bits {bits}: mean ratio {mean}"
            );
            assert!(worst < spread, "bits {bits}: worst {worst}");
        }
    }

    #[test]
    fn dot_and_axpy_match_dequantized() {
        let mut rng = TestRng::new(6);
        for dim in TURBO_DIMS {
            for bits in ALL_BITS {
                let codec = TurboCodec::new(dim, bits, 11).unwrap();
                let mut row = vec![0u8; codec.row_bytes()];
                codec.quantize(&gaussian(&mut rng, dim), &mut row);
                let mut deq = vec![0f32; dim];
                codec.dequantize_rotated(&row, &mut deq);
                let q = gaussian(&mut rng, dim);
                let want = dot(&q, &deq);
                let mag: f64 = q
                    .iter()
                    .zip(&deq)
                    .map(|(a, b)| f64::from(a * b).abs())
                    .sum();
                let got = f64::from(codec.dot_rotated(&row, &q));
                assert!((got - want).abs() <= 1e-5 * mag, "dim {dim} bits {bits}");

                let w = rng.gaussian();
                let mut acc = q.clone();
                codec.axpy_rotated(&row, w, &mut acc);
                for i in 0..dim {
                    let want = q[i] + w * deq[i];
                    assert!((acc[i] - want).abs() <= 1e-5 * (q[i].abs() + (w * deq[i]).abs()));
                }
            }
        }
    }

    #[test]
    fn zero_and_hostile_inputs_do_not_panic() {
        let codec = TurboCodec::new(64, 4, 1).unwrap();
        let mut row = vec![0u8; codec.row_bytes()];
        let mut back = vec![0f32; 64];
        codec.quantize(&[0.0; 64], &mut row);
        codec.dequantize_rotated(&row, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        let cases: [&dyn Fn(usize) -> f32; 4] = [
            &|_| f32::NAN,
            &|i| if i == 3 { f32::INFINITY } else { 1.0 },
            &|i| (i as f32 - 30.0) * 1e30,
            &|i| if i == 5 { f32::NAN } else { i as f32 },
        ];
        for f in cases {
            let x: Vec<f32> = (0..64).map(f).collect();
            codec.quantize(&x, &mut row);
            codec.dequantize_rotated(&row, &mut back);
            assert!(back.iter().all(|v| v.is_finite()));
            assert!(codec.dot_rotated(&row, &[1.0; 64]).is_finite());
        }
    }
}
