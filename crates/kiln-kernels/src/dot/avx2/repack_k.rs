//! AVX2 kernels for Q4_K, Q5_K and Q6_K weights repacked 16 rows at a time
//! ([`crate::repack::kquant`]), on the AVX-512 kernels' layout, one 8-row half per `ymm` (see
//! `repack.rs` beside this file). A sub-block's 16-bit pair sums are multiplied by the rows'
//! scales in the same `vpmaddwd` that widens them (each row's scale in both 16-bit halves of
//! its lane), so the integer sums per super-block are the AVX-512 kernels' and the float steps
//! are theirs too: the same bits.

// The half index `h` addresses the weights' bytes as well as the accumulators.
#![allow(clippy::needless_range_loop)]

use super::bits_to_bytes;
use super::repack::{block_pairs, block_pairs_halves, nibble_codes, prefetch, store};
use crate::format::blocks::BlockQ8K;
use crate::repack::kquant::{
    Q4_K_CODES_AT, Q4_KX16_BYTES, Q5_K_PIECE_BYTES, Q5_KX16_BYTES, Q6_K_CODES_AT, Q6_K_PIECE_BYTES,
    Q6_K_SCALES_AT, Q6_KX16_BYTES,
};
use std::arch::x86_64::*;

/// Q4_K weights of one 16-row group (`w`, one entry per super-block along the row) × `N` Q8_K
/// activation rows: `out[t][k] = dot(row k, a[t])`. Per super-block and row,
/// `d_a·(d·Σ_j sc_j·Σ q·y − dmin·Σ_j m_j·Σ y)`, the sums over sub-block `j` exact integers.
/// Blocks past the shortest of `w` and the activation rows are ignored.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_kx16_q8_k<const N: usize>(
    w: &[[u8; Q4_KX16_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [[f32; 16]; N],
) {
    // |pair| ≤ 2·15·127: the eight pair sums fit in 16 bits.
    k4_x16::<_, N, false>(w, a, out, 256, |v, y, _, pair| {
        _mm256_madd_epi16(block_pairs(v, y), pair)
    });
}

/// Q5_K weights of one 16-row group × `N` Q8_K activation rows, as [`q4_kx16_q8_k`] with each
/// code's fifth bit from the piece's masks. (No AVX-512 kernel exists for Q5_K; this one runs
/// at that level too.)
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_kx16_q8_k<const N: usize>(
    w: &[[u8; Q5_KX16_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [[f32; 16]; N],
) {
    k4_x16::<_, N, true>(w, a, out, Q5_K_PIECE_BYTES, |v, y, _, pair| {
        // |pair| ≤ 2·31·127: four pair sums fit in 16 bits, so two halves.
        let (lo, hi) = block_pairs_halves(v, y);
        _mm256_add_epi32(_mm256_madd_epi16(lo, pair), _mm256_madd_epi16(hi, pair))
    });
}

/// Shared body of the Q4_K and Q5_K kernels: the 256-byte header of [`crate::repack::kquant`],
/// then pieces of `piece_bytes` from byte 256, each four nibble vectors and, with `FIFTH`, the
/// eight 64-bit masks of the codes' fifth bits after them. `dot(codes, y, sc, pair)` is the
/// level's exact `sc·Σ code·y` per row (32-bit lane) of one piece, given the rows' sub-block
/// scales as 32-bit lanes (`sc`) and copied into both 16-bit halves ([`pair_of`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn k4_x16<const B: usize, const N: usize, const FIFTH: bool>(
    w: &[[u8; B]],
    a: [&[BlockQ8K]; N],
    out: &mut [[f32; 16]; N],
    piece_bytes: usize,
    dot: impl Fn(&[__m256i; 8], &[i8; 32], __m256i, __m256i) -> __m256i,
) {
    let nb = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let m4 = _mm256_set1_epi8(0x0F);
    let sixteen = _mm256_set1_epi8(16);
    let low6 = _mm256_set1_epi32(63);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    let stream = super::repack::streamed(N);
    let mut isum = [[_mm256_setzero_si256(); 2]; N];
    debug_assert!(B >= Q4_K_CODES_AT + 8 * piece_bytes);
    for i in 0..nb * 8 {
        let (b, p) = (i / 8, i % 8);
        let base = w[b].as_ptr();
        for h in 0..2 {
            // SAFETY: the half's scale bytes at 64 + 16p + 8h (inside 64..192); the piece's
            // code vectors (and masks) at 256 + piece_bytes·p.., inside the group block.
            let (sc, pair, v) = unsafe {
                let raw =
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(base.add(64 + 16 * p + 8 * h).cast()));
                let piece = base.add(Q4_K_CODES_AT + piece_bytes * p);
                if h == 0 {
                    prefetch(piece.wrapping_add(k_prefetch_ahead(N)), piece_bytes, stream);
                }
                let mut v = nibble_codes(piece.add(32 * h), m4);
                if FIFTH {
                    for (i, v) in v.iter_mut().enumerate() {
                        let bits = piece
                            .add(256 + 8 * i + 4 * h)
                            .cast::<u32>()
                            .read_unaligned();
                        let high = _mm256_and_si256(bits_to_bytes(u32::from_le(bits)), sixteen);
                        *v = _mm256_or_si256(*v, high);
                    }
                }
                let sc = _mm256_and_si256(raw, low6);
                (sc, pair_of(sc), v)
            };
            for t in 0..N {
                let y = &a[t][b].qs.as_chunks::<32>().0[p];
                isum[t][h] = _mm256_add_epi32(isum[t][h], dot(&v, y, sc, pair));
            }
        }
        if p < 7 {
            continue;
        }
        for h in 0..2 {
            // SAFETY: d and dmin at 0..64, the minimums' bytes at 64..256.
            let (dw, mw, mins) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(base.add(16 * h).cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(base.add(32 + 16 * h).cast())),
                    q4_k_minimums(base, h),
                )
            };
            for t in 0..N {
                let y = &a[t][b];
                let pairs = y.bsums.as_ptr().cast::<i32>();
                let mut msum = _mm256_setzero_si256();
                for (j, m) in mins.iter().enumerate() {
                    // SAFETY: word j is bsums[2j..2j + 2], inside the 16 sums.
                    let word = unsafe { pairs.add(j).read_unaligned() };
                    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(*m, _mm256_set1_epi32(word)));
                }
                let da = _mm256_set1_ps(y.d);
                let s = _mm256_cvtepi32_ps(isum[t][h]);
                acc[t][h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), s, acc[t][h]);
                let m = _mm256_cvtepi32_ps(msum);
                acc[t][h] = _mm256_fnmadd_ps(_mm256_mul_ps(mw, da), m, acc[t][h]);
                isum[t][h] = _mm256_setzero_si256();
            }
        }
    }
    store(&acc, out);
}

/// How far ahead of the piece being multiplied the K-quant kernels (AVX2, AVX-VNNI and
/// AVX-512) ask for their weights with `n` tokens: a one-token call streams them from memory and
/// asks further ahead (measured on Zen 5, docs/benchmarks.md); with several tokens they come
/// from cache, where the longer distance was slower. Without any software prefetch the
/// hardware's own left the one-token Q6_K kernel waiting on memory at AVX-512 (the 32-value
/// AVX-512 kernels measured 5–10% slower decode with one, so they have none).
pub(crate) const fn k_prefetch_ahead(n: usize) -> usize {
    if n == 1 { 4096 } else { 2048 }
}

/// Each 32-bit lane's low 16 bits copied into its high 16 bits: a per-row multiplier for
/// `vpmaddwd` against 16-bit pair sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pair_of(v: __m256i) -> __m256i {
    let low = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
    _mm256_or_si256(low, _mm256_slli_epi32::<16>(v))
}

/// Half `h`'s eight sub-block minimums of a Q4_K group block, lane `k` holding row
/// `8h + k`'s `m_j` in both 16-bit halves, so that `vpmaddwd` against the activation sums of
/// values `32j..32j + 16` and `32j + 16..32j + 32` gives `m_j·Σ y`.
///
/// # Safety
/// `base` must be valid for 256 bytes of reads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_minimums(base: *const u8, h: usize) -> [__m256i; 8] {
    let m4 = _mm256_set1_epi32(0x0F);
    let mut mins = [_mm256_setzero_si256(); 8];
    for (j, m) in mins.iter_mut().enumerate() {
        // SAFETY: bytes 64 + 16j + 8h.. and 192 + 16(j mod 4) + 8h.. lie inside the 256.
        let (top, low) = unsafe {
            (
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(base.add(64 + 16 * j + 8 * h).cast())),
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(base.add(192 + 16 * (j % 4) + 8 * h).cast())),
            )
        };
        let low = if j < 4 {
            low
        } else {
            _mm256_srli_epi32::<4>(low)
        };
        let v = _mm256_or_si256(
            _mm256_slli_epi32::<4>(_mm256_srli_epi32::<6>(top)),
            _mm256_and_si256(low, m4),
        );
        *m = _mm256_or_si256(v, _mm256_slli_epi32::<16>(v));
    }
    mins
}

/// Q6_K weights of one 16-row group × `N` Q8_K activation rows, as [`q4_kx16_q8_k`]: per 16
/// values `sc·(Σ c·y − 32·Σ y)` with the stored codes `c = q + 32`, summed in integers, times
/// `d·d_a` once per super-block.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q6_kx16_q8_k<const N: usize>(
    w: &[[u8; Q6_KX16_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [[f32; 16]; N],
) {
    q6_k_x16(w, a, out, |v, y, _, lo_pair, hi_pair| {
        let q = y.as_ptr().cast::<i32>();
        let mut pairs = [_mm256_setzero_si256(); 4];
        for (i, v) in v.iter().enumerate() {
            // SAFETY: word i of the 32-byte piece of qs.
            let yi = _mm256_set1_epi32(unsafe { q.add(i).read_unaligned() });
            // |pair| ≤ 2·63·127: two pair sums fit in 16 bits.
            pairs[i / 2] = _mm256_add_epi16(pairs[i / 2], _mm256_maddubs_epi16(*v, yi));
        }
        let lo = _mm256_add_epi32(
            _mm256_madd_epi16(pairs[0], lo_pair),
            _mm256_madd_epi16(pairs[1], lo_pair),
        );
        let hi = _mm256_add_epi32(
            _mm256_madd_epi16(pairs[2], hi_pair),
            _mm256_madd_epi16(pairs[3], hi_pair),
        );
        _mm256_add_epi32(lo, hi)
    });
}

/// The body of [`q6_kx16_q8_k`]: `dot(codes, y, [sc_lo, sc_hi], lo_pair, hi_pair)` is the
/// level's exact `sc_lo·Σ_{0..16} c·y + sc_hi·Σ_{16..32} c·y` per row of one 32-value piece,
/// given the rows' two scales as 32-bit lanes and each copied into both 16-bit halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q6_k_x16<const N: usize>(
    w: &[[u8; Q6_KX16_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [[f32; 16]; N],
    dot: impl Fn(&[__m256i; 8], &[i8; 32], [__m256i; 2], __m256i, __m256i) -> __m256i,
) {
    let nb = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    let stream = super::repack::streamed(N);
    let mut isum = [[_mm256_setzero_si256(); 2]; N];
    for i in 0..nb * 8 {
        let (b, p) = (i / 8, i % 8);
        let base = w[b].as_ptr();
        for h in 0..2 {
            // SAFETY: the half's scales of values 32p..32p + 32 at 32 + 32p + 8h.. and
            // 48 + 32p + 8h..; the piece at 288 + 384p.., inside the 3,360-byte group block.
            let (sc_lo, sc_hi, v) = unsafe {
                let sc = |s: usize| {
                    let at = base.add(Q6_K_SCALES_AT + 16 * s + 8 * h);
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(at.cast()))
                };
                let piece = base.add(Q6_K_CODES_AT + Q6_K_PIECE_BYTES * p);
                if h == 0 {
                    prefetch(
                        piece.wrapping_add(k_prefetch_ahead(N)),
                        Q6_K_PIECE_BYTES,
                        stream,
                    );
                }
                (sc(2 * p), sc(2 * p + 1), q6_k_codes(piece, h, m4))
            };
            let (lo_pair, hi_pair) = (pair_of(sc_lo), pair_of(sc_hi));
            // Row k's two scales as the 16-bit pair (lo, hi) of lane k.
            let both = _mm256_or_si256(
                _mm256_and_si256(sc_lo, _mm256_set1_epi32(0xFFFF)),
                _mm256_slli_epi32::<16>(sc_hi),
            );
            for t in 0..N {
                let y = &a[t][b];
                let scaled = dot(
                    &v,
                    &y.qs.as_chunks::<32>().0[p],
                    [sc_lo, sc_hi],
                    lo_pair,
                    hi_pair,
                );
                // SAFETY: bsums[2p..2p + 2] as one word, inside the 16 sums.
                let word = unsafe { y.bsums.as_ptr().add(2 * p).cast::<i32>().read_unaligned() };
                let offset = _mm256_madd_epi16(both, _mm256_set1_epi32(word));
                let s = _mm256_sub_epi32(scaled, _mm256_slli_epi32::<5>(offset));
                isum[t][h] = _mm256_add_epi32(isum[t][h], s);
            }
        }
        if p < 7 {
            continue;
        }
        for h in 0..2 {
            // SAFETY: the 16 f16 d at 0..32.
            let dw = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(base.add(16 * h).cast())) };
            for t in 0..N {
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(a[t][b].d));
                acc[t][h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum[t][h]), acc[t][h]);
                isum[t][h] = _mm256_setzero_si256();
            }
        }
    }
    store(&acc, out);
}

/// Half `h`'s eight code vectors (values + 32, in 0..64) of one Q6_K piece: low nibbles as the
/// 32-value formats have them, the top two bits of vector `4j + i` taken from bits `2i..2i + 2`
/// of the bytes of high-bit vector `j` and moved to bits 4–5.
///
/// # Safety
/// `piece` must be valid for 384 bytes of reads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_k_codes(piece: *const u8, h: usize, m4: __m256i) -> [__m256i; 8] {
    // SAFETY: four nibble vectors at 0..256, two high-bit vectors at 256..384; the half reads
    // its 32 bytes of each.
    let (mut v, high) = unsafe {
        (
            nibble_codes(piece.add(32 * h), m4),
            [
                _mm256_loadu_si256(piece.add(256 + 32 * h).cast()),
                _mm256_loadu_si256(piece.add(320 + 32 * h).cast()),
            ],
        )
    };
    let bits45 = _mm256_set1_epi8(0x30);
    for (j, hv) in high.into_iter().enumerate() {
        // Shifts of 16-bit lanes: the bits that cross into the other byte are masked off.
        let top = [
            _mm256_slli_epi16::<4>(hv),
            _mm256_slli_epi16::<2>(hv),
            hv,
            _mm256_srli_epi16::<2>(hv),
        ];
        for (i, t) in top.into_iter().enumerate() {
            v[4 * j + i] = _mm256_or_si256(v[4 * j + i], _mm256_and_si256(t, bits45));
        }
    }
    v
}
