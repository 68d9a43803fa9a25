//! AVX2 kernels for the K-quants (256-element super-blocks) × Q8_K.
//!
//! Every kernel walks the super-block in 32-element chunks: the weight codes are unpacked to
//! unsigned bytes, `maddubs` multiplies them with the int8 activations into 16 i16 pair sums
//! (at most 2·63·128 = 16128, so never saturated, even for a -128 activation), and `madd`
//! against a vector of sub-block scales widens them to i32 while applying the scale. One f32
//! FMA per super-block then applies `d`. Weight offsets that ggml subtracts (Q6_K's 32) and
//! the minimums (Q2_K, Q4_K, Q5_K) are folded in through the activation's `bsums`, so these
//! kernels assume consistent `bsums` (the scalar Q2_K/Q4_K/Q5_K references do too; every
//! `BlockQ8K` this crate produces has them).
//!
//! The integer part of each super-block is exact; the float result differs from the scalar
//! reference only by the order in which the per-lane partial sums are added (and each lane's
//! rounding to f32 where it passes 2^24, which only Q6_K's unsigned-code lanes can do, on
//! adversarial blocks: there the rounding is relative to Σ|scale|·(|code| + 32)·|y|, the
//! magnitude the tests use).

use super::{f16c_at, hsum_ps};
use crate::format::blocks::*;
use std::arch::x86_64::*;

/// The 32 bytes at `off` of a block (a bounds check that folds away for constant offsets).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn ld32<const N: usize>(b: &[u8; N], off: usize) -> __m256i {
    assert!(off + 32 <= N);
    // SAFETY: off + 32 <= N, checked above.
    unsafe { _mm256_loadu_si256(b.as_ptr().add(off).cast()) }
}

/// The 16 bytes at `off` of a block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn ld16<const N: usize>(b: &[u8; N], off: usize) -> __m128i {
    assert!(off + 16 <= N);
    // SAFETY: off + 16 <= N, checked above.
    unsafe { _mm_loadu_si128(b.as_ptr().add(off).cast()) }
}

/// Activations `off..off + 32` of a Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn y32(y: &BlockQ8K, off: usize) -> __m256i {
    assert!(off + 32 <= 256);
    // SAFETY: off + 32 <= 256 = qs.len(), checked above.
    unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(off).cast()) }
}

/// The sixteen per-16 activation sums of a Q8_K block as i16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn bsums(y: &BlockQ8K) -> __m256i {
    // SAFETY: reads exactly the 32 bytes of `bsums`.
    unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) }
}

/// Horizontal sum of 4 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_ps128(v: __m128) -> f32 {
    let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Q4_K/Q5_K scales and mins from the 12 scale bytes at offset 4 of the block, as two
/// little-endian words of eight 6-bit values each: `(scales, mins)`. Word arithmetic on the
/// layout described at [`crate::format::blocks`]' `k4_scales_mins`: values 0..4 are the low 6 bits of
/// bytes 0..4 (scales) / 4..8 (mins); values 4..8 take their low nibble from bytes 8..12 and
/// their top two bits from the spare high bits of bytes 0..4 / 4..8.
#[inline(always)]
pub(crate) fn k4_scales_mins_words<const N: usize>(b: &[u8; N]) -> (u64, u64) {
    let w = |o: usize| u32::from_le_bytes([b[4 + o], b[5 + o], b[6 + o], b[7 + o]]);
    let (a, m, c) = (w(0), w(4), w(8));
    const LOW6: u32 = 0x3F3F_3F3F;
    const NIB: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let sc_lo = a & LOW6;
    let mn_lo = m & LOW6;
    let sc_hi = (c & NIB) | (((a >> 6) & TOP2) << 4);
    let mn_hi = ((c >> 4) & NIB) | (((m >> 6) & TOP2) << 4);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        mn_lo as u64 | (mn_hi as u64) << 32,
    )
}

/// The sixteen Q3_K scales (6-bit, minus 32) from the 12 scale bytes at offset 96, as bytes.
/// Scale i has its low nibble in byte i (i < 8) or the high nibble of byte i - 8, and its top
/// two bits at bit 2·(i / 4) of byte 8 + i % 4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q3k_scales_i8(b: &[u8; Q3_K_BYTES]) -> __m128i {
    let w = |o: usize| u32::from_le_bytes([b[96 + o], b[97 + o], b[98 + o], b[99 + o]]);
    let (a, m, c) = (w(0), w(4), w(8));
    const NIB: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let v = _mm_setr_epi32(
        ((a & NIB) | ((c & TOP2) << 4)) as i32,
        ((m & NIB) | (((c >> 2) & TOP2) << 4)) as i32,
        (((a >> 4) & NIB) | (((c >> 4) & TOP2) << 4)) as i32,
        (((m >> 4) & NIB) | (((c >> 6) & TOP2) << 4)) as i32,
    );
    _mm_sub_epi8(v, _mm_set1_epi8(32))
}

/// Sixteen per-16-element scale bytes → i16 lanes reordered so that a 256-bit `madd` scale
/// vector for 32-element chunk `c` is one in-lane shuffle ([`chunk_scales`]): the low half
/// holds the even scales (first 16 elements of each chunk), the high half the odd ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn scales16_even_odd(s: __m128i, signed: bool) -> __m256i {
    let eo = _mm_shuffle_epi8(
        s,
        _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15),
    );
    if signed {
        _mm256_cvtepi8_epi16(eo)
    } else {
        _mm256_cvtepu8_epi16(eo)
    }
}

/// The four 32-code vectors (unsigned 6-bit values) of half `h` of a Q6_K block: low nibbles
/// from `ql`, high pairs from `qh`. Shared by the row and the token-tile kernels.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q6k_codes(b: &[u8; Q6_K_BYTES], h: usize) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(0x03);
    let m12 = _mm256_set1_epi8(0x0C);
    let m48 = _mm256_set1_epi8(0x30);
    let m192 = _mm256_set1_epi8(0xC0u8 as i8);
    let ql0 = ld32(b, 64 * h);
    let ql1 = ld32(b, 64 * h + 32);
    let qh = ld32(b, 128 + 32 * h);
    [
        _mm256_or_si256(
            _mm256_and_si256(ql0, m4),
            _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(ql1, m4),
            _mm256_slli_epi16::<2>(_mm256_and_si256(qh, m12)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
            _mm256_and_si256(qh, m48),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
            _mm256_srli_epi16::<2>(_mm256_and_si256(qh, m192)),
        ),
    ]
}

/// Broadcasts i16 lane `c` of each 128-bit half of `v` over that half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn chunk_scales(v: __m256i, c: usize) -> __m256i {
    let lo = (2 * c) as i16;
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(lo | (lo + 1) << 8))
}

/// `maddubs` of 32 unsigned codes with 32 activations, then `madd` with the scale vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scaled_dot(q: __m256i, y: __m256i, scales: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), scales)
}

/// Q4_K/Q5_K minimum term for one super-block: `Σ_k min_k · (bsum_2k + bsum_2k+1)` in 4 i32
/// lanes, from the mins as eight i16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn k4_min_sums(mins16: __m128i, y: &BlockQ8K) -> __m128i {
    let bs = bsums(y);
    let pairs = _mm_hadd_epi16(
        _mm256_castsi256_si128(bs),
        _mm256_extracti128_si256::<1>(bs),
    );
    _mm_madd_epi16(mins16, pairs)
}

/// Q4_K/Q5_K per-block setup: `(scales broadcast to both halves as i16, mins as i16)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn k4_setup<const N: usize>(b: &[u8; N]) -> (__m256i, __m128i) {
    let (sc, mn) = k4_scales_mins_words(b);
    let sm = _mm256_cvtepu8_epi16(_mm_set_epi64x(mn as i64, sc as i64));
    (
        _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm)),
        _mm256_extracti128_si256::<1>(sm),
    )
}

/// Q2_K weights × Q8_K activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q2_k_q8_k(w: &[[u8; Q2_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm256_setzero_ps();
    for (b, y) in w.iter().zip(a) {
        let dall = _mm256_set1_ps(y.d * f16c_at(b, 80));
        let dmin = _mm256_set1_ps(y.d * f16c_at(b, 82));
        let sb = ld16(b, 0);
        let scales = scales16_even_odd(_mm_and_si128(sb, m4), false);
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sb), m4));
        let summs = _mm256_madd_epi16(mins, bsums(y));
        acc_m = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(summs), acc_m);
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let qs = ld32(b, 16 + 32 * h);
            // Chunk c = 4h + s holds bits 2s..2s+2 of the half's 32 bytes.
            let parts = [
                qs,
                _mm256_srli_epi16::<2>(qs),
                _mm256_srli_epi16::<4>(qs),
                _mm256_srli_epi16::<6>(qs),
            ];
            for (s, p) in parts.into_iter().enumerate() {
                let c = 4 * h + s;
                let q = _mm256_and_si256(p, m3);
                let d = scaled_dot(q, y32(y, 32 * c), chunk_scales(scales, c));
                sumi = _mm256_add_epi32(sumi, d);
            }
        }
        acc = _mm256_fmadd_ps(dall, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - hsum_ps(acc_m)
}

/// Q3_K weights × Q8_K activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q3_k_q8_k(w: &[[u8; Q3_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let zero = _mm256_setzero_si256();
    let mut acc = _mm256_setzero_ps();
    for (b, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(y.d * f16c_at(b, 108));
        let scales = scales16_even_odd(q3k_scales_i8(b), true);
        let hmask = ld32(b, 0);
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let qs = ld32(b, 32 + 32 * h);
            let parts = [
                qs,
                _mm256_srli_epi16::<2>(qs),
                _mm256_srli_epi16::<4>(qs),
                _mm256_srli_epi16::<6>(qs),
            ];
            for (s, p) in parts.into_iter().enumerate() {
                let c = 4 * h + s;
                let lo = _mm256_and_si256(p, m3);
                // Value = lo - 4 where hmask bit c is clear: subtract 4·y there.
                let bit = _mm256_set1_epi8((1u8 << c) as i8);
                let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), zero);
                let off = _mm256_and_si256(clear, four);
                let yv = y32(y, 32 * c);
                let p16 =
                    _mm256_sub_epi16(_mm256_maddubs_epi16(lo, yv), _mm256_maddubs_epi16(off, yv));
                let sd = _mm256_madd_epi16(p16, chunk_scales(scales, c));
                sumi = _mm256_add_epi32(sumi, sd);
            }
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// Q4_K weights × Q8_K activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_k_q8_k(w: &[[u8; Q4_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (b, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(y.d * f16c_at(b, 0));
        let dmin = _mm_set1_ps(y.d * f16c_at(b, 2));
        let (scales, mins) = k4_setup(b);
        acc_m = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(k4_min_sums(mins, y)), acc_m);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            // 32 bytes = 64 elements: low nibbles are sub-block 2j, high nibbles 2j + 1.
            let qs = ld32(b, 16 + 32 * j);
            let lo = _mm256_and_si256(qs, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qs), m4);
            let dl = scaled_dot(lo, y32(y, 64 * j), chunk_scales(scales, 2 * j));
            let dh = scaled_dot(hi, y32(y, 64 * j + 32), chunk_scales(scales, 2 * j + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(dl, dh));
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - hsum_ps128(acc_m)
}

/// Q5_K weights × Q8_K activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_k_q8_k(w: &[[u8; Q5_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let bit0 = _mm256_set1_epi8(1);
    let bit1 = _mm256_set1_epi8(2);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (b, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(y.d * f16c_at(b, 0));
        let dmin = _mm_set1_ps(y.d * f16c_at(b, 2));
        let (scales, mins) = k4_setup(b);
        acc_m = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(k4_min_sums(mins, y)), acc_m);
        // Bits 2j / 2j + 1 of each qh byte are the 5th bits of sub-blocks 2j / 2j + 1. The
        // 16-bit shift below drags bits of the neighbouring byte into the top of each byte,
        // but only bits 0 and 1 are ever read, and those stay clean for the 3 shifts.
        let mut qh = ld32(b, 16);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let qs = ld32(b, 48 + 32 * j);
            let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, bit0));
            let h1 = _mm256_slli_epi16::<3>(_mm256_and_si256(qh, bit1));
            let lo = _mm256_or_si256(_mm256_and_si256(qs, m4), h0);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(qs), m4), h1);
            qh = _mm256_srli_epi16::<2>(qh);
            let dl = scaled_dot(lo, y32(y, 64 * j), chunk_scales(scales, 2 * j));
            let dh = scaled_dot(hi, y32(y, 64 * j + 32), chunk_scales(scales, 2 * j + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(dl, dh));
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - hsum_ps128(acc_m)
}

/// Q6_K weights × Q8_K activations. The codes are used unsigned (0..64) and the offset of 32
/// comes back as `32 · Σ scale_g · bsum_g`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q6_k_q8_k(w: &[[u8; Q6_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(y.d * f16c_at(b, 208));
        let raw = ld16(b, 192);
        let scales = scales16_even_odd(raw, true);
        let offset = _mm256_madd_epi16(_mm256_cvtepi8_epi16(raw), bsums(y));
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let qs = q6k_codes(b, h);
            for (t, q) in qs.into_iter().enumerate() {
                let c = 4 * h + t;
                let sd = scaled_dot(q, y32(y, 32 * c), chunk_scales(scales, c));
                sumi = _mm256_add_epi32(sumi, sd);
            }
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<5>(offset));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}
