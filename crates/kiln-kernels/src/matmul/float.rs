//! Float weights (f32, f16, bf16) × several f32 tokens, register-blocked: each step loads the
//! next lanes of [`ROWS`] weight rows and of up to `T` token rows and multiplies every pair into
//! its own accumulator, so a loaded vector feeds several FMAs instead of one (the one-row token
//! tile in [`crate::matmul::dense`] loads an activation vector per FMA, which bounds it by the
//! load ports, not by the FMA units).
//!
//! f16 and bf16 rows are widened to f32 once per block of rows (a task-local buffer) and then
//! reused by every token tile, instead of being converted again for every token.
//!
//! Every output is one f32 accumulator per lane over the whole row, the lanes summed at the
//! end, whatever the tile's shape: a token's result does not depend on which tokens share the
//! call or on how the rows are split.

use std::cell::RefCell;

use crate::format::types::GgmlType;
use crate::kv::half_conv::{bf16_to_f32_at, f16_to_f32_at};
use crate::level::CpuLevel;
use crate::matmul::OutPtr;

/// Weight rows per register block.
const ROWS: usize = 4;
/// Tokens per register block: AVX-512 has 32 vector registers (24 accumulators, 4 weight
/// vectors, 1 activation), AVX2 16 (8 accumulators, 4 weights, 1 activation).
const TOKENS_AVX512: usize = 6;
const TOKENS_AVX2: usize = 2;
/// f32 bytes of the weight rows a task widens and sweeps once per token tile: well inside L2.
const BLOCK_BYTES: usize = 128 << 10;

thread_local! {
    /// Widened f16/bf16 weight rows of the block a task is working on.
    static WIDENED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Whether [`matmul_float`] serves weights of type `ty` at `level`.
pub(crate) fn supported(level: CpuLevel, ty: GgmlType) -> bool {
    level >= CpuLevel::Avx2 && matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// `out[t * rows + r] = W row r · x row t` for float weights `data` (`rows` rows of
/// `row_bytes` bytes, `cols` elements each, type `ty`) and `x` of shape `[n_tokens, cols]`.
/// The caller has checked the lengths and that [`supported`] holds for `level` (clamped).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_float(
    level: CpuLevel,
    ty: GgmlType,
    data: &[u8],
    row_bytes: usize,
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) {
    if rows == 0 || n_tokens == 0 {
        return;
    }
    let pool = crate::pool::global();
    let per_task = rows
        .div_ceil(pool.threads() * 4)
        .next_multiple_of(ROWS)
        .max(ROWS);
    let n_tasks = rows.div_ceil(per_task);
    let block = (BLOCK_BYTES / (4 * cols.max(1)))
        .next_multiple_of(ROWS)
        .max(ROWS);
    let ptr = OutPtr(out.as_mut_ptr());
    let tokens = if level >= CpuLevel::Avx512 {
        TOKENS_AVX512
    } else {
        TOKENS_AVX2
    };
    pool.run_contiguous(n_tasks, &|c: usize| {
        let (r0, r1) = (c * per_task, ((c + 1) * per_task).min(rows));
        for b0 in (r0..r1).step_by(block) {
            let b1 = (b0 + block).min(r1);
            let bytes = &data[b0 * row_bytes..b1 * row_bytes];
            with_f32_rows(level, ty, bytes, (b1 - b0) * cols, |w| {
                for t0 in (0..n_tokens).step_by(tokens) {
                    let t1 = (t0 + tokens).min(n_tokens);
                    for q0 in (b0..b1).step_by(ROWS) {
                        let q1 = (q0 + ROWS).min(b1);
                        let ws = &w[(q0 - b0) * cols..(q1 - b0) * cols];
                        let xs = &x[t0 * cols..t1 * cols];
                        let mut acc = [[0f32; TOKENS_AVX512]; ROWS];
                        block_dispatch(level, ws, q1 - q0, xs, t1 - t0, cols, &mut acc);
                        for (k, t) in (t0..t1).enumerate() {
                            for (i, r) in (q0..q1).enumerate() {
                                // SAFETY: t < n_tokens and r < rows: in bounds of `out`
                                // (rows * n_tokens); tasks own disjoint row ranges.
                                unsafe { *ptr.get().add(t * rows + r) = acc[i][k] };
                            }
                        }
                    }
                }
            });
        }
    });
}

/// Calls `f` with the `n` f32 values of `bytes` (whole rows of float type `ty`): f32 rows in
/// place when aligned, anything else widened into the task-local buffer.
fn with_f32_rows(level: CpuLevel, ty: GgmlType, bytes: &[u8], n: usize, f: impl FnOnce(&[f32])) {
    if ty == GgmlType::F32 {
        // SAFETY: any 4 bytes are a valid f32; `align_to` only yields the aligned middle.
        let (head, mid, _) = unsafe { bytes.align_to::<f32>() };
        if head.is_empty() && mid.len() * 4 == bytes.len() {
            return f(mid);
        }
    }
    WIDENED.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < n {
            buf.resize(n, 0.0);
        }
        let dst = &mut buf[..n];
        // SAFETY: any 2 bytes are a valid u16; `align_to` only yields the aligned middle.
        let (head, halves, _) = unsafe { bytes.align_to::<u16>() };
        match ty {
            GgmlType::F16 if head.is_empty() && halves.len() == n => {
                f16_to_f32_at(level, halves, dst)
            }
            GgmlType::BF16 if head.is_empty() && halves.len() == n => {
                bf16_to_f32_at(level, halves, dst)
            }
            _ => crate::format::dequant::dequantize_unchecked(ty, bytes, dst),
        }
        f(dst)
    });
}

/// `acc[i][k] = w row i · x row k` for `nr` ≤ [`ROWS`] rows and `nt` tokens (at most the
/// level's token block), through the level's kernel of that exact shape.
fn block_dispatch(
    level: CpuLevel,
    w: &[f32],
    nr: usize,
    x: &[f32],
    nt: usize,
    cols: usize,
    acc: &mut [[f32; TOKENS_AVX512]; ROWS],
) {
    macro_rules! shapes {
        ($kernel:ident; $($r:literal)*; $($t:literal)*) => {
            shapes!(@rows $kernel; [$($t)*]; $($r)*)
        };
        (@rows $kernel:ident; $ts:tt; $($r:literal)*) => {
            match nr {
                $($r => shapes!(@tokens $kernel; $r; $ts),)*
                _ => unreachable!("at most ROWS rows"),
            }
        };
        (@tokens $kernel:ident; $r:literal; [$($t:literal)*]) => {
            match nt {
                $($t => {
                    let ws: [*const f32; $r] = std::array::from_fn(|i| w[i * cols..].as_ptr());
                    let xs: [*const f32; $t] = std::array::from_fn(|k| x[k * cols..].as_ptr());
                    let mut o = [[0f32; $t]; $r];
                    // SAFETY: the level is clamped to the hardware and only reaches a kernel
                    // whose features it includes; every pointer starts a row of `cols` values.
                    unsafe { x86::$kernel::<$r, $t>(ws, xs, cols, &mut o) };
                    for (a, o) in acc.iter_mut().zip(o) {
                        a[..$t].copy_from_slice(&o);
                    }
                })*
                _ => unreachable!("at most the level's token block"),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if level >= CpuLevel::Avx512 {
        shapes!(block_avx512; 1 2 3 4; 1 2 3 4 5 6)
    } else {
        shapes!(block_avx2; 1 2 3 4; 1 2)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("supported() is false off x86-64: {level:?} {w:p} {nr} {x:p} {nt} {cols} {acc:p}")
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::dot::avx2::hsum_ps;

    /// `out[i][k] = Σ w[i][c] · x[k][c]` over `c < cols`, sixteen lanes a step, the last
    /// `cols % 16` through masked loads.
    ///
    /// # Safety
    /// The CPU must support the [`crate::CpuLevel::Avx512`] feature set; every pointer must
    /// start `cols` readable f32 values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn block_avx512<const R: usize, const T: usize>(
        w: [*const f32; R],
        x: [*const f32; T],
        cols: usize,
        out: &mut [[f32; T]; R],
    ) {
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        let mut c = 0;
        while c + 16 <= cols {
            // SAFETY: c + 16 <= cols, and every row holds `cols` values.
            let wv: [__m512; R] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(w[i].add(c)) });
            for k in 0..T {
                // SAFETY: as above.
                let xv = unsafe { _mm512_loadu_ps(x[k].add(c)) };
                for i in 0..R {
                    acc[i][k] = _mm512_fmadd_ps(wv[i], xv, acc[i][k]);
                }
            }
            c += 16;
        }
        if c < cols {
            let m: __mmask16 = (1u16 << (cols - c)) - 1;
            // SAFETY: the mask only reads the `cols - c` values left in each row.
            let wv: [__m512; R] =
                std::array::from_fn(|i| unsafe { _mm512_maskz_loadu_ps(m, w[i].add(c)) });
            for k in 0..T {
                // SAFETY: as above.
                let xv = unsafe { _mm512_maskz_loadu_ps(m, x[k].add(c)) };
                for i in 0..R {
                    acc[i][k] = _mm512_fmadd_ps(wv[i], xv, acc[i][k]);
                }
            }
        }
        for i in 0..R {
            for k in 0..T {
                out[i][k] = _mm512_reduce_add_ps(acc[i][k]);
            }
        }
    }

    /// [`block_avx512`] with eight lanes a step, the last `cols % 8` through masked loads.
    ///
    /// # Safety
    /// The CPU must support avx2, fma and f16c; every pointer must start `cols` readable f32
    /// values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn block_avx2<const R: usize, const T: usize>(
        w: [*const f32; R],
        x: [*const f32; T],
        cols: usize,
        out: &mut [[f32; T]; R],
    ) {
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let mut c = 0;
        while c + 8 <= cols {
            // SAFETY: c + 8 <= cols, and every row holds `cols` values.
            let wv: [__m256; R] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(w[i].add(c)) });
            for k in 0..T {
                // SAFETY: as above.
                let xv = unsafe { _mm256_loadu_ps(x[k].add(c)) };
                for i in 0..R {
                    acc[i][k] = _mm256_fmadd_ps(wv[i], xv, acc[i][k]);
                }
            }
            c += 8;
        }
        if c < cols {
            let lanes: [i32; 8] = std::array::from_fn(|l| if c + l < cols { -1 } else { 0 });
            // SAFETY: reading 8 i32 from an array of 8.
            let m = unsafe { _mm256_loadu_si256(lanes.as_ptr().cast()) };
            // SAFETY: the mask only reads the `cols - c` values left in each row.
            let wv: [__m256; R] =
                std::array::from_fn(|i| unsafe { _mm256_maskload_ps(w[i].add(c), m) });
            for k in 0..T {
                // SAFETY: as above.
                let xv = unsafe { _mm256_maskload_ps(x[k].add(c), m) };
                for i in 0..R {
                    acc[i][k] = _mm256_fmadd_ps(wv[i], xv, acc[i][k]);
                }
            }
        }
        for i in 0..R {
            for k in 0..T {
                out[i][k] = hsum_ps(acc[i][k]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())
            .collect()
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761);
                (h >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Every level's kernels, rows and tokens that leave ragged blocks and columns that leave a
    /// masked tail: within 1e-5 of Σ|w·x| of the exact f64 dot, and a token's result is the
    /// same bits whether it is alone or in a batch.
    #[test]
    fn float_blocks_match_the_exact_dot_and_do_not_depend_on_the_batch() {
        for level in [CpuLevel::Avx2, CpuLevel::Avx512] {
            if level.clamp_to_hardware() != level {
                continue;
            }
            for (rows, cols, n) in [(13, 37, 11), (8, 16, 6), (70, 771, 9), (5, 3, 2)] {
                let w = values(rows * cols, 1);
                let w = f16_bytes(&w);
                let wf: Vec<f32> = w
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect();
                let x = values(n * cols, 2);
                let mut out = vec![f32::NAN; rows * n];
                matmul_float(
                    level,
                    GgmlType::F16,
                    &w,
                    2 * cols,
                    rows,
                    cols,
                    &x,
                    n,
                    &mut out,
                );
                let mut solo = vec![f32::NAN; rows * 2];
                let last = &x[(n - 2) * cols..];
                matmul_float(
                    level,
                    GgmlType::F16,
                    &w,
                    2 * cols,
                    rows,
                    cols,
                    last,
                    2,
                    &mut solo,
                );
                for t in 0..n {
                    for r in 0..rows {
                        let (wr, xt) = (&wf[r * cols..][..cols], &x[t * cols..][..cols]);
                        let exact: f64 =
                            wr.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let mag: f64 = wr
                            .iter()
                            .zip(xt)
                            .map(|(a, b)| (*a as f64 * *b as f64).abs())
                            .sum();
                        let got = out[t * rows + r];
                        assert!(
                            (got as f64 - exact).abs() <= 1e-5 * mag + 1e-30,
                            "{level:?} {rows}x{cols} t={t} r={r}"
                        );
                    }
                }
                for k in 0..2 {
                    for r in 0..rows {
                        assert_eq!(
                            solo[k * rows + r].to_bits(),
                            out[(n - 2 + k) * rows + r].to_bits(),
                            "{level:?}: batch changed token {k} row {r}"
                        );
                    }
                }
            }
        }
    }
}
