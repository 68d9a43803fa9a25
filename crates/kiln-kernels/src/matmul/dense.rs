//! f32 weights × f32 activations (`--dense` models, and the reference side of the accuracy
//! tests). Several tokens go through token tiles: each 8 (AVX2) or 16 (AVX-512) weights are
//! loaded once and multiplied into one FMA accumulator per token, instead of one full dot
//! product per (row, token) that reads the weight row again for every token.
//!
//! Tile results are f32 sums in a different order than the row dot (one accumulator per token
//! instead of four); both are within 1e-5 of Σ|w·x| of the exact value on the tests' data. So
//! that a token's result does not depend on how many tokens share the call (a decoding
//! sequence alone or in a batch), one token also goes through the tiles wherever tiles exist.

use crate::dot::dot_f32_at;
use crate::error::Result;
use crate::level::{CpuLevel, cpu_level};
use crate::matmul::tile::TOKEN_TILE;
use crate::matmul::{check_len, par_drive, par_drive_tiles};

/// Plain f32 matmul: `w` is `[rows, cols]`, `x` is `[n_tokens, cols]`, `out[t * rows + r]`.
pub fn matmul_f32(
    w: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) -> Result<()> {
    matmul_f32_at(cpu_level(), w, rows, cols, x, n_tokens, out)
}

/// [`matmul_f32`] at an explicit level (clamped to what the CPU supports).
pub fn matmul_f32_at(
    level: CpuLevel,
    w: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) -> Result<()> {
    check_len("matmul_f32 weights", rows, cols, w.len())?;
    check_len("matmul_f32 input x", n_tokens, cols, x.len())?;
    check_len("matmul_f32 output", n_tokens, rows, out.len())?;
    let level = level.clamp_to_hardware();
    if level < CpuLevel::Avx2 {
        par_drive(rows, n_tokens, out, |r, t| {
            let xt = &x[t * cols..(t + 1) * cols];
            dot_f32_at(level, &w[r * cols..(r + 1) * cols], xt)
        });
        return Ok(());
    }
    par_drive_tiles(rows, n_tokens, 4 * cols, out, |rs, ts, buf| {
        for (r, o) in rs.zip(buf.iter_mut()) {
            let wr = &w[r * cols..(r + 1) * cols];
            tile(
                level,
                wr,
                |k| &x[(ts.start + k) * cols..(ts.start + k + 1) * cols],
                ts.len(),
                o,
            );
        }
    });
    Ok(())
}

/// `o[k] = w · x(k)` for `k < n` (at most [`TOKEN_TILE`]), through the level's tile kernel.
fn tile<'a>(
    level: CpuLevel,
    w: &[f32],
    x: impl Fn(usize) -> &'a [f32],
    n: usize,
    o: &mut [f32; TOKEN_TILE],
) {
    macro_rules! width {
        ($($n:literal)*) => {
            match n {
                $($n => {
                    let xs: [&[f32]; $n] = std::array::from_fn(&x);
                    let o = o.first_chunk_mut::<$n>().expect("tile width <= TOKEN_TILE");
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `level` is clamped to the hardware, and each kernel is only
                    // called at a level that includes the features it enables.
                    unsafe {
                        if level >= CpuLevel::Avx512 {
                            x86::tile_avx512::<$n>(w, xs, o);
                        } else {
                            x86::tile_avx2::<$n>(w, xs, o);
                        }
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    for (v, xk) in o.iter_mut().zip(xs) {
                        *v = dot_f32_at(level, w, xk);
                    }
                })*
                _ => {}
            }
        };
    }
    width!(1 2 3 4 5 6 7 8);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::dot::avx2::hsum_ps;
    use std::arch::x86_64::*;

    /// `out[t] = w · x[t]` (rows cut to the shortest), eight weights per step.
    ///
    /// # Safety
    /// The CPU must support avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn tile_avx2<const N: usize>(w: &[f32], x: [&[f32]; N], out: &mut [f32; N]) {
        let n = x.iter().fold(w.len(), |n, r| n.min(r.len()));
        let mut acc = [_mm256_setzero_ps(); N];
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n <= the length of `w` and of every `x[t]`.
            let wv = unsafe { _mm256_loadu_ps(w.as_ptr().add(i)) };
            for t in 0..N {
                // SAFETY: as above.
                let xv = unsafe { _mm256_loadu_ps(x[t].as_ptr().add(i)) };
                acc[t] = _mm256_fmadd_ps(wv, xv, acc[t]);
            }
            i += 8;
        }
        for t in 0..N {
            out[t] = hsum_ps(acc[t]) + tail(&w[i..n], &x[t][i..n]);
        }
    }

    /// [`tile_avx2`] with sixteen weights per step.
    ///
    /// # Safety
    /// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) fn tile_avx512<const N: usize>(w: &[f32], x: [&[f32]; N], out: &mut [f32; N]) {
        let n = x.iter().fold(w.len(), |n, r| n.min(r.len()));
        let mut acc = [_mm512_setzero_ps(); N];
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n <= the length of `w` and of every `x[t]`.
            let wv = unsafe { _mm512_loadu_ps(w.as_ptr().add(i)) };
            for t in 0..N {
                // SAFETY: as above.
                let xv = unsafe { _mm512_loadu_ps(x[t].as_ptr().add(i)) };
                acc[t] = _mm512_fmadd_ps(wv, xv, acc[t]);
            }
            i += 16;
        }
        for t in 0..N {
            out[t] = _mm512_reduce_add_ps(acc[t]) + tail(&w[i..n], &x[t][i..n]);
        }
    }

    /// The last `cols % lanes` products.
    #[inline(always)]
    fn tail(w: &[f32], x: &[f32]) -> f32 {
        w.iter().zip(x).map(|(a, b)| a * b).sum()
    }
}
