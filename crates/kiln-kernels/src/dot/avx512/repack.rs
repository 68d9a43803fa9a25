//! AVX-512 VNNI kernels for Q4_1, Q8_0 and Q5_0 weights repacked 16 rows at a time
//! ([`crate::repack`]): the sixteen 32-bit lanes of a vector are sixteen weight rows, so one
//! `vpdpbusd` multiplies four codes of every row by the same four activation bytes (a
//! broadcast), and after eight of them each lane holds its row's whole block sum. Per block
//! and token that is 8 `vpdpbusd`, one convert, one multiply and two FMA for 16 rows, where
//! the row kernels spend about that per row pair. The result of every token is a vector of
//! 16 consecutive outputs, stored as is.

use crate::dot::avx2::f16c;
use crate::format::blocks::{BlockQ8_0, BlockQ8_1};
use crate::repack::{Q4_1X16_BYTES, Q5_0X16_BYTES, Q8_0X16_BYTES};
use std::arch::x86_64::*;

/// Q4_1 weights of one 16-row group (`w`, one entry per block along the row) × `N` Q8_1
/// activation rows: `out[t][k] = dot(row k, a[t])`, with `sums[t]` the rows' exact block sums
/// `d·Σq` in place of the blocks' f16 `s`. Blocks past the shortest of `w`, the activation rows
/// and the sums are ignored.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q4_1x16_q8_1<const N: usize>(
    w: &[[u8; Q4_1X16_BYTES]],
    a: [&[BlockQ8_1]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    let nb = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let nb = sums.iter().fold(nb, |n, r| n.min(r.len()));
    let m4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); N];
    for (b, g) in w[..nb].iter().enumerate() {
        // SAFETY: every load reads inside the 320-byte group block: scales at 0..32,
        // minimums at 32..64, the four code vectors at 64..320.
        let (dw, mw, p) = unsafe {
            let base = g.as_ptr();
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(base.cast())),
                _mm512_cvtph_ps(_mm256_loadu_si256(base.add(32).cast())),
                vectors::<4>(base.add(64)),
            )
        };
        let v = nibble_codes(&p, m4);
        for t in 0..N {
            let y = &a[t][b];
            let s = _mm512_cvtepi32_ps(block_dot(&v, &y.qs, _mm512_setzero_si512()));
            let d = _mm512_mul_ps(dw, _mm512_set1_ps(f16c(y.d)));
            acc[t] = _mm512_fmadd_ps(d, s, acc[t]);
            acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sums[t][b]), acc[t]);
        }
    }
    for t in 0..N {
        // SAFETY: `out[t]` is 16 floats.
        unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}

/// Q8_0 weights of one 16-row group × `N` Q8_0 activation rows, as [`q4_1x16_q8_1`]; `sums[t]`
/// are the activation blocks' integer `Σq`. The codes are stored as `w + 128` (unsigned, as
/// `vpdpbusd` wants them), so `128·Σq` is taken off each block's integer sum.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q8_0x16_q8_0<const N: usize>(
    w: &[[u8; Q8_0X16_BYTES]],
    a: [&[BlockQ8_0]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    offset_codes_x16(w, 128, a, sums, out, |g| {
        // SAFETY: the eight code vectors lie at 32..544 of the 544-byte group block.
        unsafe { vectors::<8>(g.as_ptr().add(32)) }
    })
}

/// Q5_0 weights of one 16-row group × `N` Q8_0 activation rows, as [`q8_0x16_q8_0`]: codes
/// `nibble + 16·bit` (`w + 16`), the 5th bits stored as one 64-bit byte mask per code vector.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q5_0x16_q8_0<const N: usize>(
    w: &[[u8; Q5_0X16_BYTES]],
    a: [&[BlockQ8_0]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    offset_codes_x16(w, 16, a, sums, out, |g| {
        let base = g.as_ptr();
        // SAFETY: masks at 32..96, the four nibble vectors at 96..352 of the 352-byte block.
        let p = unsafe { vectors::<4>(base.add(96)) };
        let mut v = nibble_codes(&p, m4);
        for (i, v) in v.iter_mut().enumerate() {
            // SAFETY: mask `i` of eight, at 32..96 of the block.
            let mask = unsafe { base.add(32 + 8 * i).cast::<u64>().read_unaligned() };
            let mask = u64::from_le(mask);
            *v = _mm512_mask_add_epi8(*v, mask, *v, sixteen);
        }
        v
    })
}

/// `init + Σ_i v[i] · (word i of qs, broadcast)`, per 32-bit lane: a group's eight code
/// vectors (codes `4i..4i + 4` of every row in vector `i`) against one 32-value activation
/// block, in two independent `vpdpbusd` chains.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn block_dot(v: &[__m512i; 8], qs: &[i8; 32], init: __m512i) -> __m512i {
    let q = qs.as_ptr().cast::<i32>();
    let mut s0 = init;
    let mut s1 = _mm512_setzero_si512();
    for i in (0..8).step_by(2) {
        // SAFETY: reads bytes 4i..4i + 8 of the 32-byte `qs`.
        let (y0, y1) = unsafe { (q.add(i).read_unaligned(), q.add(i + 1).read_unaligned()) };
        s0 = _mm512_dpbusd_epi32(s0, v[i], _mm512_set1_epi32(y0));
        s1 = _mm512_dpbusd_epi32(s1, v[i + 1], _mm512_set1_epi32(y1));
    }
    _mm512_add_epi32(s0, s1)
}

/// `K` consecutive 64-byte vectors from `base`. (Kept out of `std::array::from_fn`, whose
/// closure does not inherit the target features and is not inlined.)
///
/// # Safety
/// `base` must be valid for `64·K` bytes of reads.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn vectors<const K: usize>(base: *const u8) -> [__m512i; K] {
    let mut v = [_mm512_setzero_si512(); K];
    for (j, v) in v.iter_mut().enumerate() {
        // SAFETY: inside the caller's `64·K` bytes.
        *v = unsafe { _mm512_loadu_si512(base.add(64 * j).cast()) };
    }
    v
}

/// Four packed-nibble vectors → eight code vectors: vector `i` holds codes `4i..4i + 4` of
/// every row, low nibbles for `i < 4`, high ones (codes `16 + 4(i − 4)..`) above.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn nibble_codes(p: &[__m512i; 4], m4: __m512i) -> [__m512i; 8] {
    let mut v = [_mm512_setzero_si512(); 8];
    for j in 0..4 {
        v[j] = _mm512_and_si512(p[j], m4);
        v[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(p[j]), m4);
    }
    v
}

/// Shared body of the Q8_0-activation kernels: `decode` gives a group block's eight code
/// vectors (codes `w + offset`, vector `i` = codes `4i..4i + 4` of every row); the scales are
/// the block's first 32 bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn offset_codes_x16<const B: usize, const N: usize>(
    w: &[[u8; B]],
    offset: i32,
    a: [&[BlockQ8_0]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
    decode: impl Fn(&[u8; B]) -> [__m512i; 8],
) {
    let nb = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let nb = sums.iter().fold(nb, |n, r| n.min(r.len()));
    let mut acc = [_mm512_setzero_ps(); N];
    for (b, g) in w[..nb].iter().enumerate() {
        // SAFETY: the 16 f16 scales are the first 32 bytes of every group block (B ≥ 32).
        let dw = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(g.as_ptr().cast())) };
        let v = decode(g);
        for t in 0..N {
            let y = &a[t][b];
            // |Σq| < 2^12, so the f32 sum is an exact integer.
            let init = _mm512_set1_epi32(-offset * sums[t][b] as i32);
            let s = _mm512_cvtepi32_ps(block_dot(&v, &y.qs, init));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(f16c(y.d))), s, acc[t]);
        }
    }
    for t in 0..N {
        // SAFETY: `out[t]` is 16 floats.
        unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}
