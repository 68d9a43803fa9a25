//! MLX-convention affine quantization of KV rows: per group of `group` elements, codes
//! `c ∈ [0, 2^bits − 1]` decode to `scale·c + bias`, with `bias` the group minimum.
//!
//! Row layout: `dim·bits/8` packed code bytes ([`pack_bits`]), then for each
//! group its scale and bias as f16 little-endian (4 bytes per group).

use super::{check_param, codes_of, f16_saturating, pack_bits, read_f16};
use crate::error::Result;

const MAX_GROUP: usize = 128;

/// Affine (scale + bias per group) codec for rows of `dim` f32 values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffineCodec {
    dim: usize,
    bits: u8,
    group: usize,
}

impl AffineCodec {
    /// A codec for `dim`-element rows; `bits` ∈ {2, 3, 4, 5, 6, 8}, `group` ∈ {32, 64, 128},
    /// `dim` a positive multiple of `group`.
    pub fn new(dim: usize, bits: u8, group: usize) -> Result<Self> {
        check_param(matches!(bits, 2 | 3 | 4 | 5 | 6 | 8), || {
            format!("affine KV codec with {bits} bits (supported: 2, 3, 4, 5, 6, 8)")
        })?;
        check_param(matches!(group, 32 | 64 | 128), || {
            format!("affine KV codec group size {group} (supported: 32, 64, 128)")
        })?;
        check_param(dim > 0 && dim.is_multiple_of(group), || {
            format!("affine KV codec: dim {dim} is not a positive multiple of group {group}")
        })?;
        // Implied by the group sizes, kept so a future group size cannot break the layout.
        check_param(
            dim.checked_mul(usize::from(bits))
                .is_some_and(|b| b.is_multiple_of(8)),
            || format!("affine KV codec: dim {dim} × {bits} bits is not whole bytes"),
        )?;
        Ok(Self { dim, bits, group })
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bits per code.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Elements per scale/bias group.
    pub fn group(&self) -> usize {
        self.group
    }

    /// Bytes per encoded row: the packed codes, then 4 bytes (f16 scale, f16 bias) per group.
    pub fn row_bytes(&self) -> usize {
        self.code_bytes() + self.dim / self.group * 4
    }

    fn code_bytes(&self) -> usize {
        self.dim * usize::from(self.bits) / 8
    }

    fn group_code_bytes(&self) -> usize {
        self.group * usize::from(self.bits) / 8
    }

    /// Per group: the packed codes, the scale and the bias.
    fn groups<'a>(&self, row: &'a [u8]) -> impl Iterator<Item = (&'a [u8], f32, f32)> + 'a {
        debug_assert_eq!(row.len(), self.row_bytes());
        let (codes, params) = row[..self.row_bytes()].split_at(self.code_bytes());
        codes
            .chunks_exact(self.group_code_bytes())
            .zip(params.chunks_exact(4))
            .map(|(c, p)| (c, read_f16(&p[..2]), read_f16(&p[2..])))
    }

    /// Encodes `x` (`dim` values) into `out` (`row_bytes()` bytes). Non-finite inputs never
    /// panic; they only spoil the codes of their own group.
    pub fn quantize(&self, x: &[f32], out: &mut [u8]) {
        debug_assert_eq!(x.len(), self.dim);
        debug_assert_eq!(out.len(), self.row_bytes());
        let (codes_out, params) = out[..self.row_bytes()].split_at_mut(self.code_bytes());
        let levels = ((1u32 << self.bits) - 1) as f32;
        let mut buf = [0u8; MAX_GROUP];
        let codes = &mut buf[..self.group];
        let groups = x[..self.dim]
            .chunks_exact(self.group)
            .zip(codes_out.chunks_exact_mut(self.group_code_bytes()))
            .zip(params.chunks_exact_mut(4));
        for ((xs, packed), p) in groups {
            // f32::min/max skip NaN, so NaNs do not hide the real range.
            let (mn, mx) = xs
                .iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                    (lo.min(v), hi.max(v))
                });
            let scale = (mx - mn) / levels;
            // `!(scale > 0)` also catches NaN (∞ − ∞) and the empty-range fold of an all-NaN
            // group.
            let s = f16_saturating(if scale > 0.0 { scale } else { 0.0 });
            let b = f16_saturating(mn);
            // Codes come from the rounded scale and bias, which is what dequantization sees.
            let (sf, bf) = (s.to_f32(), b.to_f32());
            if sf > 0.0 {
                // Round to nearest with the 1.5·2^23 trick after clamping (equivalent for an
                // integer range, vectorises unlike `round`); NaN stays NaN and casts to 0.
                const MAGIC: f32 = 12_582_912.0;
                for (c, &v) in codes.iter_mut().zip(xs) {
                    let t = ((v - bf) / sf).clamp(0.0, levels);
                    *c = ((t + MAGIC) - MAGIC) as u8;
                }
            } else {
                codes.fill(0);
            }
            pack_bits(codes, self.bits, packed);
            p[..2].copy_from_slice(&s.to_le_bytes());
            p[2..].copy_from_slice(&b.to_le_bytes());
        }
    }

    /// Decodes `row` into `out` (`dim` values): `scale·c + bias` per element.
    pub fn dequantize(&self, row: &[u8], out: &mut [f32]) {
        debug_assert_eq!(out.len(), self.dim);
        let mut buf = [0u8; MAX_GROUP];
        for ((packed, s, b), o) in self.groups(row).zip(out.chunks_exact_mut(self.group)) {
            let codes = codes_of(packed, self.bits, self.group, &mut buf);
            for (o, &c) in o.iter_mut().zip(codes) {
                *o = s * f32::from(c) + b;
            }
        }
    }

    /// `q · dequantize(row)` without materialising the row: per group
    /// `scale·Σ q_i·c_i + bias·Σ q_i`.
    pub fn dot(&self, row: &[u8], q: &[f32]) -> f32 {
        debug_assert_eq!(q.len(), self.dim);
        let mut buf = [0u8; MAX_GROUP];
        let mut total = 0f32;
        for ((packed, s, b), qs) in self.groups(row).zip(q.chunks_exact(self.group)) {
            let codes = codes_of(packed, self.bits, self.group, &mut buf);
            let (qc, qsum) = group_sums(codes, qs);
            total += s * qc + b * qsum;
        }
        total
    }

    /// `acc += w · dequantize(row)`.
    pub fn axpy(&self, row: &[u8], w: f32, acc: &mut [f32]) {
        debug_assert_eq!(acc.len(), self.dim);
        let mut buf = [0u8; MAX_GROUP];
        for ((packed, s, b), a) in self.groups(row).zip(acc.chunks_exact_mut(self.group)) {
            let codes = codes_of(packed, self.bits, self.group, &mut buf);
            let (ws, wb) = (w * s, w * b);
            for (a, &c) in a.iter_mut().zip(codes) {
                *a += ws * f32::from(c) + wb;
            }
        }
    }
}

/// `(Σ q_i·c_i, Σ q_i)` over one group, each in 8 independent lanes so the loops vectorise
/// (groups are multiples of 32 elements). Two separate loops: fused, LLVM pairs the two sums
/// into one vector and falls back to scalar conversions.
#[inline]
fn group_sums(codes: &[u8], q: &[f32]) -> (f32, f32) {
    debug_assert!(codes.len() == q.len() && codes.len().is_multiple_of(8));
    let mut qc = [0f32; 8];
    for (c, x) in codes.chunks_exact(8).zip(q.chunks_exact(8)) {
        for i in 0..8 {
            qc[i] += x[i] * f32::from(c[i]);
        }
    }
    let mut qs = [0f32; 8];
    for x in q.chunks_exact(8) {
        for i in 0..8 {
            qs[i] += x[i];
        }
    }
    (qc.iter().sum(), qs.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::TestRng;

    fn random_row(rng: &mut TestRng, dim: usize) -> Vec<f32> {
        // Per-element offsets and spreads that differ between groups, like real K/V heads.
        (0..dim)
            .map(|i| rng.gaussian() * (1.0 + (i / 32) as f32) + (i % 7) as f32 * 0.3 - 1.0)
            .collect()
    }

    #[test]
    fn row_bytes_values() {
        let rb = |bits, group| AffineCodec::new(64, bits, group).unwrap().row_bytes();
        assert_eq!(rb(4, 64), 36);
        assert_eq!(rb(8, 64), 68);
        assert_eq!(rb(4, 32), 40);
        assert_eq!(rb(2, 32), 16 + 8);
        assert_eq!(AffineCodec::new(128, 3, 128).unwrap().row_bytes(), 48 + 4);
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(AffineCodec::new(64, 7, 64).is_err());
        assert!(AffineCodec::new(64, 1, 64).is_err());
        assert!(AffineCodec::new(64, 4, 48).is_err());
        assert!(AffineCodec::new(96, 4, 64).is_err());
        assert!(AffineCodec::new(0, 4, 32).is_err());
        assert!(AffineCodec::new(96, 4, 32).is_ok());
    }

    #[test]
    fn ramp_gives_exact_codes() {
        let codec = AffineCodec::new(32, 4, 32).unwrap();
        let x: Vec<f32> = (0..32).map(|i| (i % 16) as f32).collect();
        let mut row = vec![0u8; codec.row_bytes()];
        codec.quantize(&x, &mut row);
        let mut codes = [0u8; 32];
        super::super::unpack_bits(&row, 4, 32, &mut codes);
        assert!(
            codes
                .iter()
                .enumerate()
                .all(|(i, &c)| usize::from(c) == i % 16)
        );
        assert_eq!(read_f16(&row[16..]), 1.0);
        assert_eq!(read_f16(&row[18..]), 0.0);
        let mut back = vec![0f32; 32];
        codec.dequantize(&row, &mut back);
        assert_eq!(back, x);
    }

    #[test]
    fn round_trip_error_within_half_a_step() {
        let mut rng = TestRng::new(1);
        for bits in [2, 3, 4, 5, 6, 8] {
            for group in [32, 64, 128] {
                let dim = 256;
                let codec = AffineCodec::new(dim, bits, group).unwrap();
                let levels = ((1u32 << bits) - 1) as f32;
                let mut row = vec![0u8; codec.row_bytes()];
                let mut back = vec![0f32; dim];
                for _ in 0..20 {
                    let x = random_row(&mut rng, dim);
                    codec.quantize(&x, &mut row);
                    codec.dequantize(&row, &mut back);
                    for (g, (xs, bs)) in x.chunks(group).zip(back.chunks(group)).enumerate() {
                        let mn = xs.iter().copied().fold(f32::INFINITY, f32::min);
                        let mx = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let s = read_f16(&row[dim * usize::from(bits) / 8 + 4 * g..]);
                        // Half a step, plus what rounding scale and bias to f16 can push the
                        // extremes outside the representable range.
                        let f16_err = 2f32.powi(-11) * (mn.abs() + (mx - mn)) * 1.01;
                        let f32_err = 4.0 * f32::EPSILON * (1.0 + mn.abs().max(mx.abs()));
                        let tol = s / 2.0 + f16_err + f32_err;
                        for (a, b) in xs.iter().zip(bs) {
                            assert!((a - b).abs() <= tol, "bits {bits} g {group}: {a} vs {b}");
                        }
                        assert!(s <= (mx - mn) / levels * 1.001 + 1e-7);
                    }
                }
            }
        }
    }

    #[test]
    fn constant_groups_round_trip() {
        let codec = AffineCodec::new(64, 4, 32).unwrap();
        let mut x = vec![0.75f32; 32];
        x.extend(vec![-3.0f32; 32]);
        let mut row = vec![0u8; codec.row_bytes()];
        codec.quantize(&x, &mut row);
        assert!(row[..32].iter().all(|&b| b == 0));
        let mut back = vec![0f32; 64];
        codec.dequantize(&row, &mut back);
        assert_eq!(back, x);
    }

    #[test]
    fn dot_and_axpy_match_dequantized() {
        let mut rng = TestRng::new(2);
        for bits in [2, 3, 4, 5, 6, 8] {
            for group in [32, 64, 128] {
                for dim in [128, 256] {
                    let codec = AffineCodec::new(dim, bits, group).unwrap();
                    let mut row = vec![0u8; codec.row_bytes()];
                    codec.quantize(&random_row(&mut rng, dim), &mut row);
                    let mut deq = vec![0f32; dim];
                    codec.dequantize(&row, &mut deq);
                    let q: Vec<f32> = (0..dim).map(|_| rng.gaussian()).collect();
                    let want: f64 = q.iter().zip(&deq).map(|(a, b)| f64::from(a * b)).sum();
                    let mag: f64 = q
                        .iter()
                        .zip(&deq)
                        .map(|(a, b)| f64::from(a * b).abs())
                        .sum();
                    let got = f64::from(codec.dot(&row, &q));
                    assert!((got - want).abs() <= 1e-5 * mag, "dot {got} vs {want}");

                    let w = rng.gaussian();
                    let mut acc = q.clone();
                    codec.axpy(&row, w, &mut acc);
                    // |bias| and |scale·c| are both at most 2·max|deq| (code 0 decodes to bias).
                    let big = deq.iter().fold(0f32, |m, v| m.max(v.abs()));
                    for i in 0..dim {
                        let want = q[i] + w * deq[i];
                        let mag = q[i].abs() + 3.0 * w.abs() * big;
                        assert!((acc[i] - want).abs() <= 1e-5 * mag, "axpy {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn hostile_inputs_do_not_panic() {
        let codec = AffineCodec::new(64, 4, 32).unwrap();
        let mut row = vec![0u8; codec.row_bytes()];
        let mut back = vec![0f32; 64];
        let cases: [&dyn Fn(usize) -> f32; 5] = [
            &|_| f32::NAN,
            &|i| if i == 3 { f32::INFINITY } else { 1.0 },
            &|i| {
                if i % 2 == 0 {
                    f32::NEG_INFINITY
                } else {
                    f32::INFINITY
                }
            },
            &|i| (i as f32 - 30.0) * 1e30,
            &|i| if i == 5 { f32::NAN } else { i as f32 },
        ];
        for f in cases {
            let x: Vec<f32> = (0..64).map(f).collect();
            codec.quantize(&x, &mut row);
            codec.dequantize(&row, &mut back);
            assert!(back.iter().all(|v| v.is_finite()));
            assert!(codec.dot(&row, &[1.0; 64]).is_finite());
        }
        // A NaN among ordinary values spoils nothing else in its group.
        let x: Vec<f32> = (0..64)
            .map(|i| if i == 5 { f32::NAN } else { i as f32 })
            .collect();
        codec.quantize(&x, &mut row);
        codec.dequantize(&row, &mut back);
        assert!((back[6] - 6.0).abs() <= 31.0 / 15.0 / 2.0 + 1e-3);
    }
}
