//! The output head on repacked Q8_0 weights with 16-bit activations.
//!
//! The head's logits feed the sampler directly, so its activations are not rounded to 8 bits
//! (on SmolLM2 that rounding is most of the Q4_1 path's KL against f32, see [`crate::head::f32_acts`]).
//! Sixteen bits per value with an f32 scale per 32 values keep the rounding below 2^-16 of each
//! block's largest value — far under the f32 path's own summation noise at these sizes — while
//! the integer `vpdpwssd` kernel reads the weights at memory speed; the f32 path converts every
//! weight to float and is compute-bound at one thread.

use crate::error::Result;
use crate::format::types::GgmlType;
use crate::level::CpuLevel;
use crate::matmul::check_len;
use crate::matmul::tile::TOKEN_TILE;
use crate::repack::{GROUP_ROWS, GroupOut, RepackedMatrix};
use std::ops::Range;

/// Activations as 16-bit codes with one f32 scale per 32 values, reused between calls.
#[derive(Debug, Default)]
pub struct Q16Activations {
    n_rows: usize,
    cols: usize,
    codes: Vec<i16>,
    scales: Vec<f32>,
}

impl Q16Activations {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes `n_rows` rows of `x` (row length a multiple of 32): per block of 32, scale
    /// `max|x| / 32767` and codes `round(x / scale)`. Non-finite values never panic; they only
    /// spoil their own block.
    pub fn quantize(&mut self, x: &[f32], n_rows: usize) -> Result<()> {
        let cols = x.len().checked_div(n_rows).unwrap_or(0);
        check_len("16-bit activation rows", n_rows, cols, x.len())?;
        check_len("16-bit activation blocks", cols / 32, 32, cols)?;
        self.codes.clear();
        self.scales.clear();
        for block in x.chunks_exact(32) {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 32767.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            // `as` saturates and maps NaN to 0.
            self.codes
                .extend(block.iter().map(|&v| (v * id).round() as i16));
            self.scales.push(d);
        }
        self.n_rows = n_rows;
        self.cols = cols;
        Ok(())
    }

    /// Row `t`: its codes and its block scales (empty past the last row).
    pub fn row(&self, t: usize) -> (&[i16], &[f32]) {
        if t >= self.n_rows {
            return (&[], &[]);
        }
        let nb = self.cols / 32;
        (
            &self.codes[t * self.cols..(t + 1) * self.cols],
            &self.scales[t * nb..(t + 1) * nb],
        )
    }
}

/// Whether a head matrix of type `ty` takes this path at `level`.
pub fn worthwhile(level: CpuLevel, ty: GgmlType) -> bool {
    ty == GgmlType::Q8_0 && RepackedMatrix::worthwhile(level, ty)
}

/// `out[t * rows + r] = dot(row r, x row t)` with `x` quantized to 16 bits into `scratch`.
pub fn matmul_repacked_q16(
    w: &RepackedMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut Q16Activations,
) -> Result<()> {
    matmul_repacked_q16_at(crate::cpu_level(), w, x, n_tokens, out, scratch)
}

/// [`matmul_repacked_q16`] at an explicit level (clamped to the hardware); below AVX2 it
/// runs the scalar reference on the rows unpacked to the file layout (tests only). Only Q8_0
/// weights are accepted.
pub fn matmul_repacked_q16_at(
    level: CpuLevel,
    w: &RepackedMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut Q16Activations,
) -> Result<()> {
    if w.ty() != GgmlType::Q8_0 {
        return Err(crate::KernelError::Unsupported {
            op: "16-bit activation matmul",
            ty: w.ty(),
        });
    }
    check_len("matmul input x", n_tokens, w.cols(), x.len())?;
    check_len("matmul output", n_tokens, w.rows(), out.len())?;
    scratch.quantize(x, n_tokens)?;
    let level = level.clamp_to_hardware();
    let acts = &*scratch;
    let rows = w.rows();
    // SAFETY (every `each_group` and `store` below): `par_groups` gives each call groups no
    // other call has.
    let run = |gs: Range<usize>, ts: Range<usize>, out: GroupOut| {
        #[cfg(target_arch = "x86_64")]
        if level >= CpuLevel::Avx2 {
            macro_rules! arms {
                ($($n:literal)*) => {
                    match ts.len() {
                        $($n => {
                            let x: [&[i16]; $n] = std::array::from_fn(|k| acts.row(ts.start + k).0);
                            let d: [&[f32]; $n] = std::array::from_fn(|k| acts.row(ts.start + k).1);
                            // SAFETY: the level is clamped to the hardware, which has this
                            // level's features; `each_group` as said above.
                            unsafe {
                                out.each_group::<{ crate::repack::Q8_0X16_BYTES }, $n>(w, gs, ts, |blocks, buf| {
                                    if level >= CpuLevel::Avx512 {
                                        crate::dot::avx512::q8_0x16_q16::<$n>(blocks, x, d, buf)
                                    } else {
                                        crate::dot::avx2::q8_0x16_q16::<$n>(blocks, x, d, buf)
                                    }
                                })
                            }
                        })*
                        _ => {}
                    }
                };
            }
            arms!(1 2 3 4 5 6 7 8);
            return;
        }
        let mut buf = [[0f32; GROUP_ROWS]; TOKEN_TILE];
        for g in gs {
            for i in 0..GROUP_ROWS.min(rows - g * GROUP_ROWS) {
                let row = w.file_row(g * GROUP_ROWS + i);
                for (o, t) in buf.iter_mut().zip(ts.clone()) {
                    let (xq, xd) = acts.row(t);
                    o[i] = q8_0_q16_reference(&row, xq, xd);
                }
            }
            // SAFETY: as said above.
            unsafe { out.store(g, ts.clone(), &buf) };
        }
    };
    crate::repack::par_groups(rows, n_tokens, out, &run);
    if n_tokens == 1 {
        crate::repack::one_token_matmul_done(&[w.bytes()]);
    }
    Ok(())
}

/// The scalar reference: per block `d_w·d_x·Σ w·x` (exact integer sum), added in block order.
pub fn q8_0_q16_reference(row: &[u8], x: &[i16], d: &[f32]) -> f32 {
    let mut total = 0f32;
    for ((blk, xs), &dx) in row.chunks_exact(34).zip(x.chunks_exact(32)).zip(d) {
        let dw = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let isum: i32 = blk[2..]
            .iter()
            .zip(xs)
            .map(|(&w, &v)| i32::from(w as i8) * i32::from(v))
            .sum();
        total += dw * dx * isum as f32;
    }
    total
}

const _: () = assert!(TOKEN_TILE == 8);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::level::supported_levels;
    use crate::matmul::QMatrix;

    fn q8_0_matrix(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let mut s = seed;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        let mut data = Vec::new();
        for _ in 0..rows * cols / 32 {
            let d = half::f16::from_f32((next() % 1000) as f32 / 20_000.0);
            data.extend_from_slice(&d.to_le_bytes());
            data.extend((0..32).map(|_| next() as u8));
        }
        data
    }

    /// Every level and tile width agrees with the scalar reference within float rounding and
    /// with the f32-activation path within the 16-bit rounding; decode equals prefill.
    #[test]
    fn matches_the_reference_and_the_f32_path() {
        for (rows, cols, tokens) in [(48, 576, 9), (21, 64, 3), (16, 32, 1)] {
            let data = q8_0_matrix(rows, cols, rows as u32);
            let q = QMatrix::new(GgmlType::Q8_0, rows, cols, &data).unwrap();
            let w = RepackedMatrix::new(&q).unwrap();
            let mut s = 11u32;
            let x: Vec<f32> = (0..tokens * cols)
                .map(|_| {
                    s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    ((s >> 8) % 2001) as f32 / 100.0 - 10.0
                })
                .collect();
            let mut exact = vec![0f32; tokens * rows];
            crate::head::f32_acts::matmul_f32_activations(&q, &x, tokens, &mut exact).unwrap();
            let mut scratch = Q16Activations::new();
            let mut reference = vec![0f32; tokens * rows];
            matmul_repacked_q16_at(
                CpuLevel::Scalar,
                &w,
                &x,
                tokens,
                &mut reference,
                &mut scratch,
            )
            .unwrap();
            // Σ|terms| ≤ cols · 128 · 0.05 · 10.
            let mag = cols as f32 * 64.0;
            let mut simd: Option<Vec<f32>> = None;
            for level in supported_levels() {
                let mut got = vec![0f32; tokens * rows];
                matmul_repacked_q16_at(level, &w, &x, tokens, &mut got, &mut scratch).unwrap();
                if level >= CpuLevel::Avx2 {
                    let first = simd.get_or_insert_with(|| got.clone());
                    assert_eq!(first.as_slice(), got.as_slice(), "{level:?} vs AVX2");
                }
                for (i, ((g, r), e)) in got.iter().zip(&reference).zip(&exact).enumerate() {
                    assert!((g - r).abs() <= 1e-5 * mag, "{level:?} {i}: {g} vs {r}");
                    // 16-bit rounding: half a step of max|x|/32767 per value.
                    assert!((g - e).abs() <= 3e-5 * mag, "{level:?} {i}: {g} vs f32 {e}");
                }
                let mut one = vec![0f32; rows];
                let last = &x[(tokens - 1) * cols..];
                matmul_repacked_q16_at(level, &w, last, 1, &mut one, &mut scratch).unwrap();
                assert_eq!(one, got[(tokens - 1) * rows..], "{level:?}: decode");
            }
        }
    }

    #[test]
    fn hostile_activations_do_not_panic() {
        let data = q8_0_matrix(16, 64, 3);
        let w = RepackedMatrix::new(&QMatrix::new(GgmlType::Q8_0, 16, 64, &data).unwrap()).unwrap();
        let mut x = vec![1.0f32; 64];
        x[3] = f32::NAN;
        x[40] = f32::INFINITY;
        let mut out = vec![0f32; 16];
        let mut scratch = Q16Activations::new();
        for level in supported_levels() {
            matmul_repacked_q16_at(level, &w, &x, 1, &mut out, &mut scratch).unwrap();
        }
        assert!(matmul_repacked_q16(&w, &x[..63], 1, &mut out, &mut scratch).is_err());
    }
}
