//! Attention loops for a block of query vectors at once (prefill): scores against a key tile
//! transposed to `[head_dim][positions]`, and weighted sums of a value tile, both in register
//! blocks, so each key or value element loaded serves several query vectors and no horizontal
//! sum is needed. A block is every query head of a GQA group for several query rows.
//!
//! Every output element is computed in the order of [`crate::attention::tile`]'s per-row loops,
//! with a fused multiply-add per step: a score as eight running sums over `d mod 8` added up
//! in order, a weighted sum sequentially over positions. The vector lanes run over positions
//! (scores) or over the head dimension (weighted sums), so each lane does exactly that scalar
//! arithmetic (`f32::mul_add`): results are bit-identical to the per-row loops (hence to
//! decode: a prompt-cache hit that recomputes one token gives the cold prefill's numbers) at
//! every instruction-set level and whatever the blocking.

use crate::attention::tile::Tile;
use crate::level::CpuLevel;

/// Positions per score strip at the widest level; transposed tiles are padded to a multiple.
const STRIP: usize = 32;

/// Copies `tile` (`len` rows of `head_dim`) into `out` as `[head_dim][ld]`, `ld = len`
/// rounded up to `STRIP`, and returns `ld`. Columns past `len` are zero. At AVX2 and above,
/// 8 × 8 blocks go through registers; the values are copied, so every level gives the same.
pub fn transpose_tile(level: CpuLevel, tile: Tile<'_>, out: &mut Vec<f32>) -> usize {
    let (hd, len) = (tile.head_dim, tile.len);
    let ld = len.next_multiple_of(STRIP);
    if len > 0 {
        assert!(tile.rows.len() >= (len - 1) * tile.stride + hd);
    }
    // Every element is written below: grow without clearing.
    if out.len() < hd * ld {
        out.resize(hd * ld, 0.0);
    }
    out.truncate(hd * ld);
    let mut done = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx2 {
        // SAFETY: AVX2 is present (the level is clamped to the hardware); the tile's length
        // was checked above and `out` holds `hd · ld` values.
        done = unsafe { transpose_blocks_avx2(tile, out, ld) };
    }
    let _ = level;
    let (hd8, len8) = done;
    for d in 0..hd {
        let col = &mut out[d * ld..(d + 1) * ld];
        let first = if d < hd8 { len8 } else { 0 };
        for (j, o) in col.iter_mut().enumerate().take(len).skip(first) {
            *o = tile.rows[j * tile.stride + d];
        }
        col[len..].fill(0.0);
    }
    ld
}

/// The whole 8 × 8 blocks of [`transpose_tile`]; returns how far they reach `(head_dim, len)`,
/// each rounded down to a multiple of 8.
///
/// # Safety
/// The CPU must support AVX2; the tile has its `len` rows of `head_dim` and `out` holds
/// `head_dim · ld` values with `ld ≥ len`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_blocks_avx2(tile: Tile<'_>, out: &mut [f32], ld: usize) -> (usize, usize) {
    use std::arch::x86_64::*;
    let (hd8, len8) = (tile.head_dim / 8 * 8, tile.len / 8 * 8);
    let (src, dst) = (tile.rows.as_ptr(), out.as_mut_ptr());
    for j0 in (0..len8).step_by(8) {
        for d0 in (0..hd8).step_by(8) {
            // SAFETY: rows j0..j0+8 < len, columns d0..d0+8 ≤ head_dim: inside the tile.
            let r: [__m256; 8] = std::array::from_fn(|i| unsafe {
                _mm256_loadu_ps(src.add((j0 + i) * tile.stride + d0))
            });
            let t = [
                _mm256_unpacklo_ps(r[0], r[1]),
                _mm256_unpackhi_ps(r[0], r[1]),
                _mm256_unpacklo_ps(r[2], r[3]),
                _mm256_unpackhi_ps(r[2], r[3]),
                _mm256_unpacklo_ps(r[4], r[5]),
                _mm256_unpackhi_ps(r[4], r[5]),
                _mm256_unpacklo_ps(r[6], r[7]),
                _mm256_unpackhi_ps(r[6], r[7]),
            ];
            // u[k]: columns k and k + 4 of four rows each (rows 0-3, then rows 4-7).
            let u = [
                _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
                _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
                _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
                _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
            ];
            for k in 0..4 {
                let low = _mm256_permute2f128_ps::<0x20>(u[k], u[k + 4]);
                let high = _mm256_permute2f128_ps::<0x31>(u[k], u[k + 4]);
                // SAFETY: columns d0 + k and d0 + k + 4 < head_dim, positions j0..j0+8 ≤ ld.
                unsafe {
                    _mm256_storeu_ps(dst.add((d0 + k) * ld + j0), low);
                    _mm256_storeu_ps(dst.add((d0 + k + 4) * ld + j0), high);
                }
            }
        }
    }
    (hd8, len8)
}

/// `scores[i·n + offset + j] = (Σ_d q_i[d] · keys_t[d·ld + j]) · scale` for every query vector
/// `i` of `queries` (rows of `head_dim`) and `j < len`, the sum in order of `d`.
#[allow(clippy::too_many_arguments)]
pub fn block_scores(
    level: CpuLevel,
    queries: &[f32],
    head_dim: usize,
    (keys_t, ld, len): (&[f32], usize, usize),
    scale: f32,
    scores: &mut [f32],
    n: usize,
    offset: usize,
) {
    assert!(head_dim > 0 && queries.len().is_multiple_of(head_dim));
    assert!(len <= ld && ld.is_multiple_of(STRIP) && keys_t.len() >= head_dim * ld);
    assert!(offset + len <= n);
    assert!(scores.len() >= queries.len() / head_dim * n);
    let a = ScoreArgs {
        q: queries,
        hd: head_dim,
        kt: keys_t,
        ld,
        len,
        scale,
        n,
        off: offset,
    };
    #[cfg(target_arch = "x86_64")]
    match level.clamp_to_hardware() {
        CpuLevel::Avx512 => {
            // SAFETY: the level is clamped to the hardware, which therefore has the features.
            unsafe { scores_avx512(&a, scores) };
            return;
        }
        CpuLevel::Avx2 | CpuLevel::AvxVnni => {
            // SAFETY: as above.
            unsafe { scores_avx2(&a, scores) };
            return;
        }
        CpuLevel::Scalar => {}
    }
    let _ = level;
    scores_body::<Portable, 16, 1, 16>(&a, scores)
}

/// `out_i[d] += Σ_j weights[i·n + offset + j] · row_j[d]` for every query vector `i` (`out` has
/// rows of `tile.head_dim`) and every row `j` of `tile`, the sum in order of `j`.
pub fn block_weighted_sum(
    level: CpuLevel,
    weights: &[f32],
    n: usize,
    offset: usize,
    tile: Tile<'_>,
    out: &mut [f32],
) {
    let hd = tile.head_dim;
    assert!(hd > 0 && out.len().is_multiple_of(hd) && offset + tile.len <= n);
    assert!(weights.len() >= out.len() / hd * n);
    if tile.len > 0 {
        assert!(tile.rows.len() >= (tile.len - 1) * tile.stride + hd);
    }
    #[cfg(target_arch = "x86_64")]
    match level.clamp_to_hardware() {
        CpuLevel::Avx512 => {
            // SAFETY: the level is clamped to the hardware, which therefore has the features.
            unsafe { weighted_avx512(weights, n, offset, tile, out) };
            return;
        }
        CpuLevel::Avx2 | CpuLevel::AvxVnni => {
            // SAFETY: as above.
            unsafe { weighted_avx2(weights, n, offset, tile, out) };
            return;
        }
        CpuLevel::Scalar => {}
    }
    let _ = level;
    weighted_body::<Portable, 16, 1, 16, 4>(weights, n, offset, tile, out)
}

struct ScoreArgs<'a> {
    q: &'a [f32],
    hd: usize,
    kt: &'a [f32],
    ld: usize,
    len: usize,
    scale: f32,
    n: usize,
    off: usize,
}

/// The register-block kernels of one level: score strips `S` positions wide for `RS` query
/// vectors at once, weighted-sum chunks `W` head elements wide.
trait Kernels<const S: usize, const RS: usize, const W: usize> {
    /// `out[r][l]` = score of query `qs[r]` (a `head_dim` row) against column `j0 + l` of `kt`
    /// (`l < S`), unscaled, in [`crate::attention::tile`]'s order: eight running sums over
    /// `d mod 8` by fused multiply-adds, added up in order, then the `head_dim mod 8` tail.
    fn strip(qs: [&[f32]; RS], kt: &[f32], ld: usize, j0: usize) -> [[f32; S]; RS];
    /// `out_r[d0 + l] += Σ_j ws[r][j] · row_j[d0 + l]` for `l < W`, one fused multiply-add per
    /// `j` in order of `j`, for the `RR` rows of `out` (rows of `head_dim`); every `ws[r]` has
    /// `t.len` weights.
    fn chunk<const RR: usize>(ws: [&[f32]; RR], t: Tile<'_>, d0: usize, out: &mut [f32]);
}

/// Portable Rust: the scalar level and the reference the SIMD kernels reproduce.
struct Portable;

impl Kernels<16, 1, 16> for Portable {
    fn strip(qs: [&[f32]; 1], kt: &[f32], ld: usize, j0: usize) -> [[f32; 16]; 1] {
        let q = qs[0];
        let hd8 = q.len() / 8 * 8;
        let mut acc = [[0f32; 16]; 8];
        for c in (0..hd8).step_by(8) {
            for (l, acc) in acc.iter_mut().enumerate() {
                let k: &[f32; 16] = kt[(c + l) * ld + j0..].first_chunk().expect("S columns");
                for (a, &kv) in acc.iter_mut().zip(k) {
                    *a = q[c + l].mul_add(kv, *a);
                }
            }
        }
        let mut s = acc[0];
        for part in &acc[1..] {
            s.iter_mut().zip(part).for_each(|(s, p)| *s += p);
        }
        for d in hd8..q.len() {
            let k: &[f32; 16] = kt[d * ld + j0..].first_chunk().expect("S columns");
            s.iter_mut()
                .zip(k)
                .for_each(|(s, &kv)| *s = q[d].mul_add(kv, *s));
        }
        [s]
    }

    fn chunk<const RR: usize>(ws: [&[f32]; RR], t: Tile<'_>, d0: usize, out: &mut [f32]) {
        let hd = t.head_dim;
        for r in 0..RR {
            let o: &mut [f32; 16] = out[r * hd + d0..].first_chunk_mut().expect("W");
            for (j, &x) in ws[r][..t.len].iter().enumerate() {
                let v = &t.rows[j * t.stride + d0..j * t.stride + d0 + 16];
                o.iter_mut()
                    .zip(v)
                    .for_each(|(o, &v)| *o = x.mul_add(v, *o));
            }
        }
    }
}

/// Generates a level's kernels from its intrinsics: `$L` lanes per vector, score strips of one
/// vector for `$RS` query vectors, weighted-sum chunks of two vectors, fused multiply-adds
/// (whose one rounding per step is the portable `mul_add`'s, so every lane computes what
/// [`Portable`] does).
#[cfg(target_arch = "x86_64")]
macro_rules! simd_kernels {
    ($name:ident, $feat:literal, $L:literal, $RS:literal, $zero:ident, $load:ident,
     $store:ident, $set1:ident, $add:ident, $fmadd:ident) => {
        pub(super) struct $name;

        impl Kernels<$L, $RS, { 2 * $L }> for $name {
            fn strip(qs: [&[f32]; $RS], kt: &[f32], ld: usize, j0: usize) -> [[f32; $L]; $RS] {
                let hd = qs[0].len();
                assert!(hd > 0 && qs.iter().all(|q| q.len() == hd));
                assert!(kt.len() >= (hd - 1) * ld + j0 + $L);
                let mut out = [[0f32; $L]; $RS];
                // SAFETY: only built by `block_scores` at a level the hardware has; every
                // read is within the lengths asserted above.
                unsafe { strip(qs, kt.as_ptr().add(j0), ld, &mut out) };
                out
            }

            fn chunk<const RR: usize>(ws: [&[f32]; RR], t: Tile<'_>, d0: usize, out: &mut [f32]) {
                let hd = t.head_dim;
                assert!(ws.iter().all(|w| w.len() >= t.len));
                assert!(d0 + 2 * $L <= hd && out.len() >= RR * hd);
                assert!(t.len == 0 || t.rows.len() >= (t.len - 1) * t.stride + hd);
                // SAFETY: as for `strip`.
                unsafe { chunk::<RR>(ws, t, d0, out.as_mut_ptr()) };
            }
        }

        #[target_feature(enable = $feat)]
        #[allow(
            clippy::undocumented_unsafe_blocks,
            reason = "one SAFETY comment above the loops covers every load and store in them"
        )]
        unsafe fn strip(qs: [&[f32]; $RS], kt: *const f32, ld: usize, out: &mut [[f32; $L]; $RS]) {
            use std::arch::x86_64::*;
            let hd = qs[0].len();
            let hd8 = hd / 8 * 8;
            let mut acc = [[$zero(); 8]; $RS];
            // SAFETY (all blocks): the caller checked `kt` for `L` columns on every row, and
            // `d < head_dim`, the length of every query row.
            for c in (0..hd8).step_by(8) {
                for l in 0..8 {
                    let k = unsafe { $load(kt.add((c + l) * ld)) };
                    for r in 0..$RS {
                        let x = $set1(unsafe { *qs[r].get_unchecked(c + l) });
                        acc[r][l] = $fmadd(x, k, acc[r][l]);
                    }
                }
            }
            for r in 0..$RS {
                let mut s = acc[r][0];
                for l in 1..8 {
                    s = $add(s, acc[r][l]);
                }
                for d in hd8..hd {
                    let k = unsafe { $load(kt.add(d * ld)) };
                    s = $fmadd($set1(unsafe { *qs[r].get_unchecked(d) }), k, s);
                }
                // SAFETY: `out[r]` has `L` floats.
                unsafe { $store(out[r].as_mut_ptr(), s) };
            }
        }

        #[target_feature(enable = $feat)]
        #[allow(
            clippy::undocumented_unsafe_blocks,
            reason = "one SAFETY comment above the loops covers every load and store in them"
        )]
        unsafe fn chunk<const RR: usize>(ws: [&[f32]; RR], t: Tile<'_>, d0: usize, out: *mut f32) {
            use std::arch::x86_64::*;
            let hd = t.head_dim;
            let mut acc = [[$zero(); 2]; RR];
            // SAFETY (all blocks): the caller checked `out` for `RR` rows, the tile for
            // `t.len` rows and the weights for `t.len` entries; `d0 + 2L ≤ head_dim`.
            for r in 0..RR {
                unsafe {
                    let o = out.add(r * hd + d0);
                    acc[r] = [$load(o), $load(o.add($L))];
                }
            }
            for j in 0..t.len {
                let (v0, v1) = unsafe {
                    let p = t.rows.as_ptr().add(j * t.stride + d0);
                    ($load(p), $load(p.add($L)))
                };
                for r in 0..RR {
                    let x = $set1(unsafe { *ws[r].get_unchecked(j) });
                    acc[r][0] = $fmadd(x, v0, acc[r][0]);
                    acc[r][1] = $fmadd(x, v1, acc[r][1]);
                }
            }
            for r in 0..RR {
                unsafe {
                    let o = out.add(r * hd + d0);
                    $store(o, acc[r][0]);
                    $store(o.add($L), acc[r][1]);
                }
            }
        }
    };
}

/// AVX-512: strips of 16 positions × 2 query vectors (16 of the 32 registers accumulate).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Kernels, Tile};
    simd_kernels!(
        Avx512,
        "avx512f",
        16,
        2,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        _mm512_add_ps,
        _mm512_fmadd_ps
    );
    pub(super) use Avx512 as K;
}

/// AVX2: the weighted sums (the scores are `avx2_strip`'s).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Kernels, Tile};
    simd_kernels!(
        Avx2,
        "avx2,fma",
        8,
        1,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        _mm256_add_ps,
        _mm256_fmadd_ps
    );
    pub(super) use Avx2 as K;
}

/// AVX2 score strips of 16 positions × 3 query vectors, so each key vector loaded serves three
/// queries. The eight running sums over `d mod 8` of the reference are formed one after the
/// other (each over its `d` in order, as the reference forms it) and added to the total as
/// each is finished, in the reference's order: 2 registers per query and 8 positions, where
/// holding all eight at once would take 8 and leave room for one query only.
#[cfg(target_arch = "x86_64")]
mod avx2_strip {
    use super::{Kernels, Tile, avx2};
    use std::arch::x86_64::*;

    /// Query vectors per strip.
    pub(super) const RS: usize = 3;

    pub(super) struct K;

    impl Kernels<16, RS, 16> for K {
        fn strip(qs: [&[f32]; RS], kt: &[f32], ld: usize, j0: usize) -> [[f32; 16]; RS] {
            let hd = qs[0].len();
            assert!(hd > 0 && qs.iter().all(|q| q.len() == hd));
            assert!(kt.len() >= (hd - 1) * ld + j0 + 16);
            let mut out = [[0f32; 16]; RS];
            // SAFETY: only built by `block_scores` at a level the hardware has (AVX2 or
            // above); every read is within the lengths asserted above.
            unsafe { strip(qs, kt.as_ptr().add(j0), ld, &mut out) };
            out
        }

        fn chunk<const RR: usize>(ws: [&[f32]; RR], t: Tile<'_>, d0: usize, out: &mut [f32]) {
            <avx2::K as Kernels<8, 1, 16>>::chunk(ws, t, d0, out)
        }
    }

    #[target_feature(enable = "avx2,fma")]
    #[allow(
        clippy::undocumented_unsafe_blocks,
        reason = "one SAFETY comment above the loops covers every load and store in them"
    )]
    unsafe fn strip(qs: [&[f32]; RS], kt: *const f32, ld: usize, out: &mut [[f32; 16]; RS]) {
        let hd = qs[0].len();
        let hd8 = hd / 8 * 8;
        let mut total = [[_mm256_setzero_ps(); 2]; RS];
        // SAFETY (all blocks): the caller checked `kt` for 16 columns on every row, and
        // `d < head_dim`, the length of every query row.
        for l in 0..8 {
            let mut sum = [[_mm256_setzero_ps(); 2]; RS];
            for c in (0..hd8).step_by(8) {
                let (k0, k1) = unsafe {
                    let p = kt.add((c + l) * ld);
                    (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
                };
                for r in 0..RS {
                    let x = _mm256_set1_ps(unsafe { *qs[r].get_unchecked(c + l) });
                    sum[r][0] = _mm256_fmadd_ps(x, k0, sum[r][0]);
                    sum[r][1] = _mm256_fmadd_ps(x, k1, sum[r][1]);
                }
            }
            for (total, sum) in total.iter_mut().zip(sum) {
                for (t, s) in total.iter_mut().zip(sum) {
                    *t = if l == 0 { s } else { _mm256_add_ps(*t, s) };
                }
            }
        }
        for r in 0..RS {
            for d in hd8..hd {
                let x = _mm256_set1_ps(unsafe { *qs[r].get_unchecked(d) });
                let p = unsafe { kt.add(d * ld) };
                let k = unsafe { [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))] };
                for (t, k) in total[r].iter_mut().zip(k) {
                    *t = _mm256_fmadd_ps(x, k, *t);
                }
            }
            // SAFETY: `out[r]` has 16 floats.
            unsafe {
                _mm256_storeu_ps(out[r].as_mut_ptr(), total[r][0]);
                _mm256_storeu_ps(out[r].as_mut_ptr().add(8), total[r][1]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scores_avx512(a: &ScoreArgs<'_>, s: &mut [f32]) {
    scores_body::<avx512::K, 16, 2, 32>(a, s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_avx2(a: &ScoreArgs<'_>, s: &mut [f32]) {
    scores_body::<avx2_strip::K, 16, { avx2_strip::RS }, 16>(a, s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_avx512(w: &[f32], n: usize, off: usize, t: Tile<'_>, out: &mut [f32]) {
    weighted_body::<avx512::K, 16, 2, 32, 8>(w, n, off, t, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_avx2(w: &[f32], n: usize, off: usize, t: Tile<'_>, out: &mut [f32]) {
    weighted_body::<avx2::K, 8, 1, 16, 6>(w, n, off, t, out)
}

/// Scores in strips of `S` positions × `RS` query vectors.
#[inline(always)]
fn scores_body<K: Kernels<S, RS, W>, const S: usize, const RS: usize, const W: usize>(
    a: &ScoreArgs<'_>,
    s: &mut [f32],
) {
    let nq = a.q.len() / a.hd;
    let q_row = |i: usize| &a.q[i * a.hd..(i + 1) * a.hd];
    for j0 in (0..a.len).step_by(S) {
        let width = (a.len - j0).min(S);
        for i in (0..nq).step_by(RS) {
            // A last ragged block repeats its final query; the copies' scores are dropped.
            // A loop rather than `std::array::from_fn`, which is not inlined here.
            let mut qs: [&[f32]; RS] = [&[]; RS];
            for (r, q) in qs.iter_mut().enumerate() {
                *q = q_row((i + r).min(nq - 1));
            }
            let acc = K::strip(qs, a.kt, a.ld, j0);
            for (r, acc) in acc.iter().enumerate().take(nq - i) {
                let out = &mut s[(i + r) * a.n + a.off + j0..][..width];
                for (o, v) in out.iter_mut().zip(acc) {
                    *o = v * a.scale;
                }
            }
        }
    }
}

/// Weighted sums in chunks of `W` head elements × `RW` query vectors (the last block of query
/// vectors as many as are left); the head elements past the last whole chunk one at a time.
#[inline(always)]
fn weighted_body<
    K: Kernels<S, RS, W>,
    const S: usize,
    const RS: usize,
    const W: usize,
    const RW: usize,
>(
    w: &[f32],
    n: usize,
    off: usize,
    t: Tile<'_>,
    out: &mut [f32],
) {
    let hd = t.head_dim;
    let nq = out.len() / hd;
    let full = hd / W * W;
    let w_row = |i: usize| &w[i * n + off..i * n + off + t.len];
    for i in (0..nq).step_by(RW) {
        let rows = RW.min(nq - i);
        let out = &mut out[i * hd..(i + rows) * hd];
        for d0 in (0..full).step_by(W) {
            chunk_rows::<K, S, RS, W>(rows, i, &w_row, t, d0, out);
        }
        for (r, o) in out.chunks_exact_mut(hd).enumerate() {
            let wr = w_row(i + r);
            for (d, o) in o.iter_mut().enumerate().skip(full) {
                for (j, &wj) in wr.iter().enumerate() {
                    *o = wj.mul_add(t.rows[j * t.stride + d], *o);
                }
            }
        }
    }
}

/// One chunk for the `rows` (1 to 8) query vectors from `i`: a kernel instance per count, so a
/// short last block keeps its rows in registers.
#[inline(always)]
fn chunk_rows<'w, K: Kernels<S, RS, W>, const S: usize, const RS: usize, const W: usize>(
    rows: usize,
    i: usize,
    w_row: &dyn Fn(usize) -> &'w [f32],
    t: Tile<'_>,
    d0: usize,
    out: &mut [f32],
) {
    macro_rules! rows {
        ($($n:literal)*) => {
            match rows {
                $($n => {
                    let mut ws: [&[f32]; $n] = [&[]; $n];
                    for (r, w) in ws.iter_mut().enumerate() {
                        *w = w_row(i + r);
                    }
                    K::chunk::<$n>(ws, t, d0, out)
                })*
                _ => unreachable!("at most 8 query vectors per block"),
            }
        };
    }
    rows!(1 2 3 4 5 6 7 8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::tile::{tile_scores, tile_weighted_sum};
    use crate::level::supported_levels;
    use crate::testutil::noise;

    /// The shapes the tests run: (head width, query vectors, tile rows, row stride). Head widths
    /// below 8 and past a multiple of 8; query counts below, at and past each level's blocks
    /// (3 and 6 at AVX2, 2 and 8 at AVX-512); tiles shorter than a strip and ragged ones.
    const SHAPES: [(usize, usize, usize, usize); 9] = [
        (64, 12, 64, 192),
        (64, 48, 64, 64),
        (64, 3, 64, 64),
        (80, 7, 37, 80),
        (7, 5, 5, 9),
        (128, 9, 17, 256),
        (64, 1, 1, 64),
        (20, 4, 19, 24),
        (40, 17, 33, 40),
    ];

    /// Every level, on every shape, gives the exact bits of the per-row loops of
    /// `attention/tile.rs` (the decode path's).
    #[test]
    fn every_level_is_bit_identical_to_the_per_row_loops() {
        for (hd, nq, len, stride) in SHAPES {
            let (n, off) = (len + 11, 6);
            let q = noise(nq * hd, 1);
            let rows = noise((len - 1) * stride + hd, 2);
            let tile = Tile {
                rows: &rows,
                stride,
                len,
                head_dim: hd,
            };
            let weights = noise(nq * n, 3);
            let mut want_s = vec![0f32; nq * n];
            tile_scores(CpuLevel::Scalar, &q, tile, 0.125, &mut want_s, n, off);
            let mut want_o = noise(nq * hd, 4);
            tile_weighted_sum(CpuLevel::Scalar, &weights, n, off, tile, &mut want_o);
            for level in supported_levels() {
                let mut kt = Vec::new();
                let ld = transpose_tile(level, tile, &mut kt);
                let mut s = vec![0f32; nq * n];
                block_scores(level, &q, hd, (&kt, ld, len), 0.125, &mut s, n, off);
                assert_eq!(s, want_s, "scores at {level:?}, hd {hd} nq {nq} len {len}");
                let mut o = noise(nq * hd, 4);
                block_weighted_sum(level, &weights, n, off, tile, &mut o);
                assert_eq!(o, want_o, "weighted sum at {level:?}, hd {hd} nq {nq}");
            }
        }
    }

    /// The per-row loops' steps are fused: a score differs from the same order with a separate
    /// multiply and add (so a mutation to unfused steps in any kernel fails the test above).
    #[test]
    fn the_reference_steps_are_fused() {
        let (hd, nq, len) = (64, 4, 32);
        let (q, rows) = (noise(nq * hd, 9), noise(len * hd, 10));
        let tile = Tile {
            rows: &rows,
            stride: hd,
            len,
            head_dim: hd,
        };
        let mut s = vec![0f32; nq * len];
        tile_scores(CpuLevel::Scalar, &q, tile, 1.0, &mut s, len, 0);
        let unfused = |i: usize, j: usize| {
            let mut acc = [0f32; 8];
            for c in (0..hd).step_by(8) {
                for l in 0..8 {
                    acc[l] += q[i * hd + c + l] * rows[j * hd + c + l];
                }
            }
            acc.iter().sum::<f32>()
        };
        let differ = (0..nq)
            .flat_map(|i| (0..len).map(move |j| (i, j)))
            .filter(|&(i, j)| s[i * len + j] != unfused(i, j))
            .count();
        assert!(differ > 0, "fused and unfused steps agree everywhere");
    }

    /// The transposed tile is the tile's values, columns past its rows zero, at every level and
    /// whatever the buffer held before.
    #[test]
    fn the_transpose_copies_every_value_at_every_level() {
        for (hd, _, len, stride) in SHAPES {
            let rows = noise((len - 1) * stride + hd, 8);
            let tile = Tile {
                rows: &rows,
                stride,
                len,
                head_dim: hd,
            };
            for level in supported_levels() {
                let mut kt = vec![f32::NAN; 5000];
                let ld = transpose_tile(level, tile, &mut kt);
                assert_eq!((ld % STRIP, kt.len()), (0, hd * ld));
                for d in 0..hd {
                    for j in 0..ld {
                        let want = if j < len { rows[j * stride + d] } else { 0.0 };
                        assert_eq!(
                            kt[d * ld + j].to_bits(),
                            want.to_bits(),
                            "{level:?} {d} {j}"
                        );
                    }
                }
            }
        }
    }
}
