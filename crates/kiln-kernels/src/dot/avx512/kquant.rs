//! AVX-512 kernels for Q4_K, Q5_K and Q6_K × Q8_K. The AVX2 scheme (unsigned codes ×
//! activations with `maddubs`, then an i16 multiply-add against the sub-block scales), with
//! twice the width and the VNNI `vpdpwssd` fusing the scale multiply-add into the i32
//! accumulator: one 512-bit register holds 64 weights, which for Q4_K/Q5_K is exactly one
//! 32-byte run of packed nibbles (its low and high nibbles are consecutive sub-blocks) and for
//! Q6_K two of the 32-element runs that share a `ql` load. Integer sums are exact (the same
//! i16 bounds as the AVX2 kernels); `d` and the mins are applied in f32 once per super-block.
//! Q2_K and Q3_K use their AVX2 kernels at this level.

use crate::dot::avx2::{bsums, f16c_at, hsum_ps128, k4_min_sums, k4_scales_mins_words, ld16, ld32};
use crate::format::blocks::*;
use std::arch::x86_64::*;

/// 64 activations starting at `off`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn y64(y: &BlockQ8K, off: usize) -> __m512i {
    assert!(off + 64 <= 256);
    // SAFETY: off + 64 <= 256 = qs.len(), checked above.
    unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(off).cast()) }
}

/// The 64 bytes at `off` of a block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn ld64<const N: usize>(b: &[u8; N], off: usize) -> __m512i {
    assert!(off + 64 <= N);
    // SAFETY: off + 64 <= N, checked above.
    unsafe { _mm512_loadu_si512(b.as_ptr().add(off).cast()) }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// 32 packed bytes → 64 codes: low nibbles in bytes 0..32, high nibbles in 32..64.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn nibbles64(q: __m256i) -> __m512i {
    _mm512_and_si512(join(q, _mm256_srli_epi16::<4>(q)), _mm512_set1_epi8(0x0F))
}

/// Q4_K/Q5_K scale vector for the 64 elements of run `j`: with the eight scales as i16 in
/// every 128-bit lane of `s`, the low 256 bits get scale 2j, the high 256 bits scale 2j + 1.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn run_scales(s: __m512i, j: usize) -> __m512i {
    let b = (4 * j) as i16;
    let pick = join(
        _mm256_set1_epi16(b | (b + 1) << 8),
        _mm256_set1_epi16((b + 2) | (b + 3) << 8),
    );
    _mm512_shuffle_epi8(s, pick)
}

/// Q4_K/Q5_K per-block setup: `(scales as i16 in every 128-bit lane, mins as i16)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn k4_setup<const N: usize>(b: &[u8; N]) -> (__m512i, __m128i) {
    let (sc, mn) = k4_scales_mins_words(b);
    let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
    let mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
    (_mm512_broadcast_i32x4(sc16), mn16)
}

/// One 64-weight run: `sumi += scales · maddubs(x, y)` pairwise, in i32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn run_dot(sumi: __m512i, x: __m512i, y: __m512i, scales: __m512i) -> __m512i {
    _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(x, y), scales)
}

/// Q4_K weights × Q8_K activations.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q4_k_q8_k(w: &[[u8; Q4_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm512_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (b, y) in w.iter().zip(a) {
        let d = _mm512_set1_ps(y.d * f16c_at(b, 0));
        let dmin = _mm_set1_ps(y.d * f16c_at(b, 2));
        let (scales, mins) = k4_setup(b);
        acc_m = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(k4_min_sums(mins, y)), acc_m);
        let mut sumi = _mm512_setzero_si512();
        for j in 0..4 {
            let x = nibbles64(ld32(b, 16 + 32 * j));
            sumi = run_dot(sumi, x, y64(y, 64 * j), run_scales(scales, j));
        }
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
    }
    _mm512_reduce_add_ps(acc) - hsum_ps128(acc_m)
}

/// Q5_K weights × Q8_K activations.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q5_k_q8_k(w: &[[u8; Q5_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let sixteen = _mm512_set1_epi8(16);
    let mut acc = _mm512_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (b, y) in w.iter().zip(a) {
        let d = _mm512_set1_ps(y.d * f16c_at(b, 0));
        let dmin = _mm_set1_ps(y.d * f16c_at(b, 2));
        let (scales, mins) = k4_setup(b);
        acc_m = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(k4_min_sums(mins, y)), acc_m);
        // qh in both halves: run j's low half reads bit 2j, its high half bit 2j + 1.
        let qh = ld32(b, 16);
        let qh2 = join(qh, qh);
        let mut sumi = _mm512_setzero_si512();
        for j in 0..4 {
            let bits = join(
                _mm256_set1_epi8((1u8 << (2 * j)) as i8),
                _mm256_set1_epi8((1u8 << (2 * j + 1)) as i8),
            );
            let x = nibbles64(ld32(b, 48 + 32 * j));
            let x = _mm512_mask_add_epi8(x, _mm512_test_epi8_mask(qh2, bits), x, sixteen);
            sumi = run_dot(sumi, x, y64(y, 64 * j), run_scales(scales, j));
        }
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
    }
    _mm512_reduce_add_ps(acc) - hsum_ps128(acc_m)
}

/// Q6_K scale vector for the 64 elements starting at 16-element group `g`: with the sixteen
/// scales as i16 in the low 256 bits of `s`, 128-bit lane k gets scale g + k.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn group_scales(s: __m512i, g: usize) -> __m512i {
    let lanes = _mm512_setr_epi32(
        0, 0, 0, 0, 0x1_0001, 0x1_0001, 0x1_0001, 0x1_0001, 0x2_0002, 0x2_0002, 0x2_0002, 0x2_0002,
        0x3_0003, 0x3_0003, 0x3_0003, 0x3_0003,
    );
    let idx = _mm512_add_epi16(lanes, _mm512_set1_epi16(g as i16));
    _mm512_permutexvar_epi16(idx, s)
}

/// Q6_K weights × Q8_K activations (unsigned codes; the offset of 32 comes back through
/// `bsums`, as in the AVX2 kernel).
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q6_k_q8_k(w: &[[u8; Q6_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm512_set1_epi8(0x0F);
    let m3 = _mm512_set1_epi8(0x03);
    let m48 = _mm512_set1_epi8(0x30);
    let mut acc = _mm512_setzero_ps();
    for (b, y) in w.iter().zip(a) {
        let d = _mm512_set1_ps(y.d * f16c_at(b, 208));
        let s16 = _mm256_cvtepi8_epi16(ld16(b, 192));
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(s16, bsums(y)));
        let scales = _mm512_zextsi256_si512(s16);
        let mut sumi = _mm512_setzero_si512();
        for h in 0..2 {
            // ql0 | ql1 of this half, and qh | qh >> 2: runs (0, 1) take bits 0-1 / 2-3 of
            // qh as their 5th-6th bits, runs (2, 3) bits 4-5 / 6-7.
            let ql = ld64(b, 64 * h);
            let qh = ld32(b, 128 + 32 * h);
            let qh2 = join(qh, _mm256_srli_epi16::<2>(qh));
            // (a & 0x0F) | b, with b's bits already confined to 4-5.
            let x01 = _mm512_ternarylogic_epi32::<0xEC>(
                ql,
                _mm512_slli_epi16::<4>(_mm512_and_si512(qh2, m3)),
                m4,
            );
            let x23 = _mm512_ternarylogic_epi32::<0xEC>(
                _mm512_srli_epi16::<4>(ql),
                _mm512_and_si512(qh2, m48),
                m4,
            );
            sumi = run_dot(sumi, x01, y64(y, 128 * h), group_scales(scales, 8 * h));
            sumi = run_dot(
                sumi,
                x23,
                y64(y, 128 * h + 64),
                group_scales(scales, 8 * h + 4),
            );
        }
        sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(offset));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
    }
    _mm512_reduce_add_ps(acc)
}
