//! AVX-512 forms of `attn_tile`'s loops, with the portable loops' arithmetic to the bit.
//! - Scores: per key row and query head, eight running sums over the head's 8-value chunks
//!   (fused multiply-adds), added up in lane order at the end. Sixteen key rows go at once: two
//!   rows share a vector (one in each 256-bit half), and the eight vectors of a block are
//!   transposed so that the final lane-order sum runs over all sixteen rows with seven adds.
//! - Weighted sums: `out_h += w_hj · row_j`, row after row, with the heads' outputs held in
//!   registers across the whole tile instead of loaded and stored for every row.

use crate::attention::tile::Tile;
use std::arch::x86_64::*;

/// Rows per block of the score loop.
const BLOCK: usize = 16;
/// The widest head the score loop keeps in registers (16 chunks of 8).
const MAX_HEAD_DIM: usize = 128;

/// Stands in for the rows past the end of a last, partial block; their lanes are not stored.
static ZERO_ROW: [f32; MAX_HEAD_DIM] = [0.0; MAX_HEAD_DIM];

/// Whether [`scores`] takes this head width (whole 8-value chunks, at most 128).
pub(crate) fn scores_fit(head_dim: usize) -> bool {
    head_dim.is_multiple_of(8) && head_dim > 0 && head_dim <= MAX_HEAD_DIM
}

/// `s[h·n + off + j] = (q_h · row_j) · scale` for every row `j` of the tile and head `h` of
/// `q`; a last block of fewer than 16 rows is filled with zero rows, whose lanes are not stored.
///
/// # Safety
/// The CPU must support AVX-512F; `scores_fit(t.head_dim)`; the caller has checked the sizes
/// (`tile::check`).
#[target_feature(enable = "avx512f,avx2")]
pub(crate) unsafe fn scores(
    q: &[f32],
    t: Tile<'_>,
    scale: f32,
    s: &mut [f32],
    n: usize,
    off: usize,
) {
    let hd = t.head_dim;
    let chunks = hd / 8;
    let idx = TransposeIndex::new();
    let row = |j: usize| match j < t.len {
        true => t.rows[j * t.stride..][..hd].as_ptr(),
        false => ZERO_ROW.as_ptr(),
    };
    let mut pairs = [_mm512_setzero_ps(); 8];
    let mut qv = [_mm512_setzero_ps(); MAX_HEAD_DIM / 8];
    for (h, qh) in q.chunks_exact(hd).enumerate() {
        for (c, v) in qv[..chunks].iter_mut().enumerate() {
            // SAFETY: chunk c of the head's hd values.
            let chunk = unsafe { _mm256_loadu_ps(qh.as_ptr().add(8 * c)) };
            *v = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(chunk)));
        }
        for j0 in (0..t.len).step_by(BLOCK) {
            for (p, pair) in pairs.iter_mut().enumerate() {
                let (a, b) = (row(j0 + 2 * p), row(j0 + 2 * p + 1));
                let mut acc = _mm512_setzero_ps();
                for (c, qc) in qv[..chunks].iter().enumerate() {
                    // SAFETY: chunk c of rows j0 + 2p and j0 + 2p + 1 (each hd values).
                    // (The 64-bit-lane forms of cast and insert are AVX-512F; the 32-bit ones
                    // need AVX-512DQ.)
                    let k = unsafe {
                        let lo = _mm512_castpd256_pd512(_mm256_loadu_pd(a.add(8 * c).cast()));
                        let hi = _mm256_loadu_pd(b.add(8 * c).cast());
                        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, hi))
                    };
                    acc = _mm512_fmadd_ps(*qc, k, acc);
                }
                *pair = acc;
            }
            let sums = _mm512_mul_ps(idx.lane_sums(&pairs), _mm512_set1_ps(scale));
            let live = BLOCK.min(t.len - j0);
            let dst = &mut s[h * n + off + j0..][..live];
            // SAFETY: the mask writes `live` floats, the length of `dst`.
            unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr(), ((1u32 << live) - 1) as u16, sums) };
        }
    }
}

/// `out_h += Σ_j w[h·n + off + j] · row_j` for every head `h` of `out`, as the portable loop;
/// `false` (nothing done) for a head width other than 64 or 128.
///
/// # Safety
/// The CPU must support AVX-512F; the caller has checked the sizes (`tile::check`).
#[target_feature(enable = "avx512f,avx2")]
pub(crate) unsafe fn weighted(
    w: &[f32],
    n: usize,
    off: usize,
    t: Tile<'_>,
    out: &mut [f32],
) -> bool {
    // Heads per pass: their outputs, `hd / 16` vectors each, take 16 registers at most.
    macro_rules! passes {
        ($v:literal; $($h:literal)*) => {{
            let hd = 16 * $v;
            let heads = out.len() / hd;
            let per_pass = 16 / $v;
            for h0 in (0..heads).step_by(per_pass) {
                let hs = per_pass.min(heads - h0);
                let o = &mut out[h0 * hd..(h0 + hs) * hd];
                let w = &w[h0 * n..];
                // SAFETY: as this function's (for every arm).
                #[allow(
                    clippy::undocumented_unsafe_blocks,
                    reason = "the arms are generated; the comment above covers them all"
                )]
                match hs {
                    $($h => unsafe { weighted_pass::<$v, $h>(w, n, off, t, o) },)*
                    _ => unreachable!("at most 16 / {} heads per pass", $v),
                }
            }
            true
        }};
    }
    match t.head_dim {
        64 => passes!(4; 1 2 3 4),
        128 => passes!(8; 1 2),
        _ => false,
    }
}

/// [`weighted`] for `H` heads of `16·V` values.
///
/// # Safety
/// As [`weighted`]; `out` is `H` heads, `w` starts at the first of them.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn weighted_pass<const V: usize, const H: usize>(
    w: &[f32],
    n: usize,
    off: usize,
    t: Tile<'_>,
    out: &mut [f32],
) {
    let hd = 16 * V;
    let mut acc = [[_mm512_setzero_ps(); V]; H];
    for (h, a) in acc.iter_mut().enumerate() {
        for (v, a) in a.iter_mut().enumerate() {
            // SAFETY: values 16v..16v + 16 of head h, inside `out`.
            *a = unsafe { _mm512_loadu_ps(out[h * hd + 16 * v..][..16].as_ptr()) };
        }
    }
    for j in 0..t.len {
        let row = t.rows[j * t.stride..][..hd].as_ptr();
        let mut r = [_mm512_setzero_ps(); V];
        for (v, r) in r.iter_mut().enumerate() {
            // SAFETY: values 16v..16v + 16 of the row's hd.
            *r = unsafe { _mm512_loadu_ps(row.add(16 * v)) };
        }
        for (h, a) in acc.iter_mut().enumerate() {
            let wj = _mm512_set1_ps(w[h * n + off + j]);
            for (a, r) in a.iter_mut().zip(r) {
                *a = _mm512_fmadd_ps(wj, r, *a);
            }
        }
    }
    for (h, a) in acc.iter().enumerate() {
        for (v, a) in a.iter().enumerate() {
            // SAFETY: as the loads.
            unsafe { _mm512_storeu_ps(out[h * hd + 16 * v..][..16].as_mut_ptr(), *a) };
        }
    }
}

/// The `vpermt2ps` indices of a 16 × 8 transpose in three rounds.
struct TransposeIndex {
    round1: [__m512i; 2],
    round2: [__m512i; 2],
    round3: [__m512i; 2],
}

/// Index vectors (lane `l` takes `f(l)`: 0..16 from the first source, 16..32 the second) of
/// the three rounds, for their two halves. Round 1: two vectors of 2 rows × 8 values →
/// values `4h..4h + 4` of 4 rows, lane `4e + r`. Round 2: two of those (rows 0..4, 4..8) →
/// values `2g..2g + 2` of them of 8 rows, lane `8e + r`. Round 3: rows 0..8 and 8..16 → value
/// `e` of 16 rows, lane `r`.
const ROUNDS: [[[i32; 16]; 2]; 3] = {
    let mut t = [[[0i32; 16]; 2]; 3];
    let mut half = 0;
    while half < 2 {
        let mut l = 0;
        while l < 16 {
            let (h, i) = (half as i32, l as i32);
            t[0][half][l] = (i % 4 / 2) * 16 + (i % 2) * 8 + 4 * h + i / 4;
            t[1][half][l] = (i % 8 / 4) * 16 + 4 * (2 * h + i / 8) + i % 4;
            t[2][half][l] = (i / 8) * 16 + 8 * h + i % 8;
            l += 1;
        }
        half += 1;
    }
    t
};

impl TransposeIndex {
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    fn new() -> Self {
        let load = |a: &[i32; 16]| {
            // SAFETY: 16 i32 are 64 bytes.
            unsafe { _mm512_loadu_si512(a.as_ptr().cast()) }
        };
        let [r1, r2, r3] = &ROUNDS;
        Self {
            round1: [load(&r1[0]), load(&r1[1])],
            round2: [load(&r2[0]), load(&r2[1])],
            round3: [load(&r3[0]), load(&r3[1])],
        }
    }

    /// Vector `p` of `pairs` holds the eight running sums of row `2p` (lanes 0..8) and row
    /// `2p + 1` (lanes 8..16); lane `r` of the result is row `r`'s sums added in lane order.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    fn lane_sums(&self, pairs: &[__m512; 8]) -> __m512 {
        let t2 = |a: __m512, i: __m512i, b: __m512| _mm512_permutex2var_ps(a, i, b);
        // b[m][h]: rows 4m..4m + 4, elements 4h..4h + 4.
        let mut b = [[_mm512_setzero_ps(); 2]; 4];
        for (m, bm) in b.iter_mut().enumerate() {
            for (h, v) in bm.iter_mut().enumerate() {
                *v = t2(pairs[2 * m], self.round1[h], pairs[2 * m + 1]);
            }
        }
        // c[n][h][g]: rows 8n..8n + 8, elements 4h + 2g..4h + 2g + 2.
        let mut c = [[[_mm512_setzero_ps(); 2]; 2]; 2];
        for (n, cn) in c.iter_mut().enumerate() {
            for (h, ch) in cn.iter_mut().enumerate() {
                for (g, v) in ch.iter_mut().enumerate() {
                    *v = t2(b[2 * n][h], self.round2[g], b[2 * n + 1][h]);
                }
            }
        }
        let mut sum = _mm512_setzero_ps();
        for e in 0..8 {
            let (h, g, k) = (e / 4, e % 4 / 2, e % 2);
            let column = t2(c[0][h][g], self.round3[k], c[1][h][g]);
            sum = if e == 0 {
                column
            } else {
                _mm512_add_ps(sum, column)
            };
        }
        sum
    }
}
