//! AVX2 forms of [`crate::attention::tile`]'s loops, with the portable loops' arithmetic to the bit (the
//! AVX-512 forms' plan at half the width).
//! - Scores: per key row and query head, eight running sums over the head's 8-value chunks
//!   (fused multiply-adds), added up in lane order at the end. Eight key rows go at once; their
//!   eight vectors of running sums are transposed so that the final lane-order sum runs over
//!   all eight rows with seven adds instead of seven scalar adds per row.
//! - Weighted sums: `out_h += w_hj · row_j`, row after row, with up to 64 outputs of a head
//!   held in registers across the whole tile instead of loaded and stored for every row.

use crate::attention::tile::Tile;
use std::arch::x86_64::*;

/// Rows per block of the score loop.
const BLOCK: usize = 8;
/// The widest head the score loop takes (the query's chunks are reloaded per row, from L1).
const MAX_HEAD_DIM: usize = 256;
/// Output values of one head a weighted-sum pass holds in registers (eight `ymm`).
const PASS: usize = 64;

/// Stands in for the rows past the end of a last, partial block; their lanes are not stored.
static ZERO_ROW: [f32; MAX_HEAD_DIM] = [0.0; MAX_HEAD_DIM];

/// Whether [`scores`] and [`weighted`] take this head width (whole 8-value chunks).
pub(crate) fn fits(head_dim: usize) -> bool {
    head_dim.is_multiple_of(8) && head_dim > 0 && head_dim <= MAX_HEAD_DIM
}

/// `s[h·n + off + j] = (q_h · row_j) · scale` for every row `j` of the tile and head `h` of
/// `q`; a last block of fewer than 8 rows is filled with zero rows, whose lanes are not stored.
///
/// # Safety
/// The CPU must support AVX2; `fits(t.head_dim)`; the caller has checked the sizes
/// (`tile::check`).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scores(
    q: &[f32],
    t: Tile<'_>,
    scale: f32,
    s: &mut [f32],
    n: usize,
    off: usize,
) {
    let hd = t.head_dim;
    let row = |j: usize| match j < t.len {
        true => t.rows[j * t.stride..][..hd].as_ptr(),
        false => ZERO_ROW.as_ptr(),
    };
    let scale = _mm256_set1_ps(scale);
    for (h, qh) in q.chunks_exact(hd).enumerate() {
        let qp = qh.as_ptr();
        for j0 in (0..t.len).step_by(BLOCK) {
            let mut rows = [_mm256_setzero_ps(); BLOCK];
            for (r, acc) in rows.iter_mut().enumerate() {
                let k = row(j0 + r);
                for c in (0..hd).step_by(8) {
                    // SAFETY: chunk c of the head's hd query values and of a row (hd values,
                    // or the zero row, which is longer than any head `fits` takes).
                    let (qc, kc) =
                        unsafe { (_mm256_loadu_ps(qp.add(c)), _mm256_loadu_ps(k.add(c))) };
                    *acc = _mm256_fmadd_ps(qc, kc, *acc);
                }
            }
            let sums = _mm256_mul_ps(lane_sums(&rows), scale);
            let live = BLOCK.min(t.len - j0);
            let dst = &mut s[h * n + off + j0..][..live];
            if live == BLOCK {
                // SAFETY: `dst` is 8 floats.
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), sums) };
            } else {
                let mut all = [0f32; BLOCK];
                // SAFETY: `all` is 8 floats.
                unsafe { _mm256_storeu_ps(all.as_mut_ptr(), sums) };
                dst.copy_from_slice(&all[..live]);
            }
        }
    }
}

/// Lane `r` of the result is the eight lanes of `rows[r]` added in lane order (the first lane,
/// then each next one), as the portable loop's `iter().sum()` adds them.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn lane_sums(rows: &[__m256; BLOCK]) -> __m256 {
    // Pairs of rows interleaved: t[2m] = (r2m.0, r2m+1.0, r2m.1, r2m+1.1 | the same of 4..8),
    // t[2m + 1] the values 2, 3 (and 6, 7).
    let mut t = [_mm256_setzero_ps(); BLOCK];
    for m in 0..4 {
        t[2 * m] = _mm256_unpacklo_ps(rows[2 * m], rows[2 * m + 1]);
        t[2 * m + 1] = _mm256_unpackhi_ps(rows[2 * m], rows[2 * m + 1]);
    }
    // u[4g + e]: value e (and e + 4 in the upper half) of rows 4g..4g + 4.
    let mut u = [_mm256_setzero_ps(); BLOCK];
    for g in 0..2 {
        let (a, b) = (4 * g, 4 * g + 2);
        u[4 * g] = _mm256_shuffle_ps::<0x44>(t[a], t[b]);
        u[4 * g + 1] = _mm256_shuffle_ps::<0xEE>(t[a], t[b]);
        u[4 * g + 2] = _mm256_shuffle_ps::<0x44>(t[a + 1], t[b + 1]);
        u[4 * g + 3] = _mm256_shuffle_ps::<0xEE>(t[a + 1], t[b + 1]);
    }
    // column(e): value e of all eight rows, lane r = row r.
    let column = |e: usize| {
        let (lo, hi) = (u[e % 4], u[4 + e % 4]);
        match e < 4 {
            true => _mm256_permute2f128_ps::<0x20>(lo, hi),
            false => _mm256_permute2f128_ps::<0x31>(lo, hi),
        }
    };
    let mut sum = column(0);
    for e in 1..8 {
        sum = _mm256_add_ps(sum, column(e));
    }
    sum
}

/// `out_h += Σ_j w[h·n + off + j] · row_j` for every head `h` of `out`, as the portable loop,
/// in passes of up to [`PASS`] values of one head.
///
/// # Safety
/// The CPU must support AVX2; `fits(t.head_dim)`; the caller has checked the sizes
/// (`tile::check`).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn weighted(w: &[f32], n: usize, off: usize, t: Tile<'_>, out: &mut [f32]) {
    let hd = t.head_dim;
    for (h, out_h) in out.chunks_exact_mut(hd).enumerate() {
        let wh = &w[h * n + off..][..t.len];
        for d0 in (0..hd).step_by(PASS) {
            let o = &mut out_h[d0..(d0 + PASS).min(hd)];
            // SAFETY (every arm): this function's contract; `o` is `8·V` values of the head,
            // starting at `d0`.
            #[allow(
                clippy::undocumented_unsafe_blocks,
                reason = "the arms are alike; the comment above covers them all"
            )]
            match o.len() / 8 {
                1 => unsafe { weighted_pass::<1>(wh, t, d0, o) },
                2 => unsafe { weighted_pass::<2>(wh, t, d0, o) },
                3 => unsafe { weighted_pass::<3>(wh, t, d0, o) },
                4 => unsafe { weighted_pass::<4>(wh, t, d0, o) },
                5 => unsafe { weighted_pass::<5>(wh, t, d0, o) },
                6 => unsafe { weighted_pass::<6>(wh, t, d0, o) },
                7 => unsafe { weighted_pass::<7>(wh, t, d0, o) },
                8 => unsafe { weighted_pass::<8>(wh, t, d0, o) },
                _ => unreachable!("a pass is 1 to 8 vectors"),
            }
        }
    }
}

/// [`weighted`] for `8·V` output values (`o`) of one head at offset `d0` of each row, with
/// the head's weights `w` (one per row of the tile).
///
/// # Safety
/// As [`weighted`]; `o.len() == 8·V` and `d0 + 8·V ≤ t.head_dim`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_pass<const V: usize>(w: &[f32], t: Tile<'_>, d0: usize, o: &mut [f32]) {
    let mut acc = [_mm256_setzero_ps(); V];
    for (v, a) in acc.iter_mut().enumerate() {
        // SAFETY: values 8v..8v + 8 of `o` (8·V values).
        *a = unsafe { _mm256_loadu_ps(o.as_ptr().add(8 * v)) };
    }
    for (j, &wj) in w.iter().enumerate() {
        let row = t.rows[j * t.stride + d0..][..8 * V].as_ptr();
        let wj = _mm256_set1_ps(wj);
        for (v, a) in acc.iter_mut().enumerate() {
            // SAFETY: values 8v..8v + 8 of the row's 8·V from `d0`.
            let r = unsafe { _mm256_loadu_ps(row.add(8 * v)) };
            *a = _mm256_fmadd_ps(wj, r, *a);
        }
    }
    for (v, a) in acc.iter().enumerate() {
        // SAFETY: as the loads.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(8 * v), *a) };
    }
}
