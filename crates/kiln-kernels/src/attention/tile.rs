//! The f32 loops of attention over one tile of cached rows — scores, weighted sums, the
//! softmax exponent — compiled once per instruction-set level. The arithmetic is the same at
//! every level (eight running sums in a fixed order, each step one fused multiply-add, as
//! `f32::mul_add` rounds it), so results are bit-identical across levels; only the vector
//! width the compiler may use changes. Without this, the loops run at the x86-64 baseline
//! (SSE2) whatever the CPU, where `mul_add` is a library call: the scalar level is a
//! reference, not a fast path.

use crate::level::CpuLevel;

/// The layout of one tile: `len` rows of `head_dim` values, `stride` apart in `rows`.
#[derive(Debug, Clone, Copy)]
pub struct Tile<'a> {
    /// The rows.
    pub rows: &'a [f32],
    /// Distance between consecutive rows.
    pub stride: usize,
    /// Rows in the tile.
    pub len: usize,
    /// Width of a row used.
    pub head_dim: usize,
}

/// Score rows of a GQA group: `scores[h·n + offset + j] = (q_h · row_j) · scale` for every query
/// head `h` of `queries` (`group × head_dim`) and row `j` of the tile.
pub fn tile_scores(
    level: CpuLevel,
    queries: &[f32],
    tile: Tile<'_>,
    scale: f32,
    scores: &mut [f32],
    n: usize,
    offset: usize,
) {
    check(&tile, queries.len(), scores.len(), n, offset);
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx512
        && crate::attention::avx512::scores_fit(tile.head_dim)
    {
        // SAFETY: AVX-512F is present (the level is clamped to the hardware); the head width
        // fits and `check` has checked the sizes.
        return unsafe {
            crate::attention::avx512::scores(queries, tile, scale, scores, n, offset)
        };
    }
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx2 {
        if crate::attention::avx2::fits(tile.head_dim) {
            // SAFETY: AVX2 is present (the level is clamped to the hardware); the head width
            // fits and `check` has checked the sizes.
            return unsafe {
                crate::attention::avx2::scores(queries, tile, scale, scores, n, offset)
            };
        }
        // SAFETY: AVX2 is present (the level is clamped to the hardware).
        return unsafe { scores_avx2(queries, tile, scale, scores, n, offset) };
    }
    let _ = level;
    scores_lanes(queries, tile, scale, scores, n, offset)
}

/// Weighted sums of a GQA group: `out_h += Σ_j weights[h·n + offset + j] · row_j` for every
/// query head `h` (`out` is `group × head_dim`).
pub fn tile_weighted_sum(
    level: CpuLevel,
    weights: &[f32],
    n: usize,
    offset: usize,
    tile: Tile<'_>,
    out: &mut [f32],
) {
    check(&tile, out.len(), weights.len(), n, offset);
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx512 {
        // SAFETY: AVX-512F is present (the level is clamped to the hardware), and `check`
        // has checked the sizes.
        if unsafe { crate::attention::avx512::weighted(weights, n, offset, tile, out) } {
            return;
        }
        // SAFETY: as above.
        return unsafe { weighted_avx512(weights, n, offset, tile, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx2 {
        if crate::attention::avx2::fits(tile.head_dim) {
            // SAFETY: AVX2 is present (the level is clamped to the hardware); the head width
            // fits and `check` has checked the sizes.
            return unsafe { crate::attention::avx2::weighted(weights, n, offset, tile, out) };
        }
        // SAFETY: AVX2 is present (the level is clamped to the hardware).
        return unsafe { weighted_avx2(weights, n, offset, tile, out) };
    }
    let _ = level;
    weighted_lanes(weights, n, offset, tile, out)
}

/// [`crate::attention::softmax::exp_shifted_in_place`] at `level`; bit-identical at every level (the
/// wider level only widens the element-wise part; the eight running sums stay eight).
pub fn exp_shifted_in_place_at(level: CpuLevel, s: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx512 {
        // SAFETY: AVX-512F is present (the level is clamped to the hardware).
        return unsafe { exp_avx512(s, max) };
    }
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx2 {
        // SAFETY: AVX2 is present (the level is clamped to the hardware).
        return unsafe { exp_avx2(s, max) };
    }
    let _ = level;
    crate::attention::softmax::exp_shifted_in_place(s, max)
}

/// Sizes are the caller's contract; a mismatch is a bug, caught before any unchecked width.
fn check(tile: &Tile<'_>, group_len: usize, scores_len: usize, n: usize, offset: usize) {
    let hd = tile.head_dim;
    assert!(
        hd > 0 && group_len.is_multiple_of(hd),
        "query heads must be whole rows"
    );
    assert!(scores_len >= (group_len / hd) * n && offset + tile.len <= n);
    if tile.len > 0 {
        assert!(tile.rows.len() >= (tile.len - 1) * tile.stride + hd);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_avx2(q: &[f32], t: Tile<'_>, scale: f32, s: &mut [f32], n: usize, off: usize) {
    scores_lanes(q, t, scale, s, n, off)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_avx2(w: &[f32], n: usize, off: usize, t: Tile<'_>, out: &mut [f32]) {
    weighted_lanes(w, n, off, t, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn weighted_avx512(w: &[f32], n: usize, off: usize, t: Tile<'_>, out: &mut [f32]) {
    weighted_lanes(w, n, off, t, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn exp_avx512(s: &mut [f32], max: f32) -> f32 {
    crate::attention::softmax::exp_shifted_lanes(s, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_avx2(s: &mut [f32], max: f32) -> f32 {
    crate::attention::softmax::exp_shifted_lanes(s, max)
}

#[inline(always)]
fn scores_lanes(q: &[f32], t: Tile<'_>, scale: f32, s: &mut [f32], n: usize, off: usize) {
    let hd = t.head_dim;
    for j in 0..t.len {
        let row = &t.rows[j * t.stride..j * t.stride + hd];
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            s[h * n + off + j] = dot_lanes(qh, row) * scale;
        }
    }
}

#[inline(always)]
fn weighted_lanes(w: &[f32], n: usize, off: usize, t: Tile<'_>, out: &mut [f32]) {
    let hd = t.head_dim;
    for j in 0..t.len {
        let row = &t.rows[j * t.stride..j * t.stride + hd];
        for (h, out_h) in out.chunks_exact_mut(hd).enumerate() {
            let wj = w[h * n + off + j];
            out_h
                .iter_mut()
                .zip(row)
                .for_each(|(o, &x)| *o = wj.mul_add(x, *o));
        }
    }
}

#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8 * 8;
    for (ca, cb) in a[..chunks].chunks_exact(8).zip(b[..chunks].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] = ca[i].mul_add(cb[i], acc[i]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks..a.len() {
        s = a[i].mul_add(b[i], s);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::level::supported_levels;
    use crate::testutil::noise;

    /// Every level gives the portable loops' exact bits, on a ragged head width and tile.
    #[test]
    fn every_level_is_bit_identical_to_the_portable_loops() {
        let shapes = [
            (64, 3, 64, 192),
            (80, 2, 37, 80),
            (7, 4, 5, 9),
            (128, 3, 50, 130),
            (136, 2, 17, 136),
            (64, 9, 20, 64),
            (256, 1, 5, 256),
            (24, 2, 3, 40),
        ];
        for (hd, group, len, stride) in shapes {
            let (n, off) = (len + 11, 6);
            let q = noise(group * hd, 1);
            let rows = noise((len - 1) * stride + hd, 2);
            let tile = Tile {
                rows: &rows,
                stride,
                len,
                head_dim: hd,
            };
            let weights = noise(group * n, 3);
            let mut want_s = vec![0f32; group * n];
            scores_lanes(&q, tile, 0.125, &mut want_s, n, off);
            let mut want_o = noise(group * hd, 4);
            weighted_lanes(&weights, n, off, tile, &mut want_o);
            let mut want_e = noise(n, 5);
            let want_sum = crate::attention::softmax::exp_shifted_in_place(&mut want_e, 10.0);
            for level in supported_levels() {
                let mut s = vec![0f32; group * n];
                tile_scores(level, &q, tile, 0.125, &mut s, n, off);
                assert_eq!(s, want_s, "scores at {level:?}");
                let mut o = noise(group * hd, 4);
                tile_weighted_sum(level, &weights, n, off, tile, &mut o);
                assert_eq!(o, want_o, "weighted sum at {level:?}");
                let mut e = noise(n, 5);
                let sum = exp_shifted_in_place_at(level, &mut e, 10.0);
                assert_eq!((e, sum), (want_e.clone(), want_sum), "exp at {level:?}");
            }
        }
    }
}
