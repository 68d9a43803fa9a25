//! AVX-512 (F/BW/VL + VNNI) dot products for the two formats that dominate the test model:
//! Q4_1 × Q8_1 and Q8_0 × Q8_0. Two 32-element blocks go through one 512-bit `vpdpbusd`
//! (u8 × i8 → i32, no intermediate i16 saturation); the per-block scales are applied as a
//! lane-blended scale vector with FMA. An odd trailing block uses the AVX2 kernel.
//!
//! Safety: every function requires [`crate::CpuLevel::Avx512`] (which includes the AVX2 set).

use super::avx2::{self, f16c, f16c_at};
use crate::blocks::*;
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn load_pair(a: &[i8; 32], b: &[i8; 32]) -> __m512i {
    // SAFETY: each load reads exactly the 32 bytes of its array.
    unsafe {
        join(
            _mm256_loadu_si256(a.as_ptr().cast()),
            _mm256_loadu_si256(b.as_ptr().cast()),
        )
    }
}

/// Scale vector: lanes 0..8 = `da`, lanes 8..16 = `db`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn scales(da: f32, db: f32) -> __m512 {
    _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(da), _mm512_set1_ps(db))
}

/// Q4_1 × Q8_1.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q4_1_q8_1(w: &[[u8; Q4_1_BYTES]], a: &[BlockQ8_1]) -> f32 {
    let n = w.len().min(a.len());
    let (w2, wt) = w[..n].as_chunks::<2>();
    let (a2, at) = a[..n].as_chunks::<2>();
    let mut acc = _mm512_setzero_ps();
    let mut summ = 0.0f32;
    for ([b0, b1], [y0, y1]) in w2.iter().zip(a2) {
        // SAFETY (qs pointers): bytes 4..20 of a 20-byte block.
        let (q0, q1) = unsafe {
            (
                &*b0.as_ptr().add(4).cast::<[u8; 16]>(),
                &*b1.as_ptr().add(4).cast::<[u8; 16]>(),
            )
        };
        let x = join(avx2::nibbles(q0), avx2::nibbles(q1));
        let y = load_pair(&y0.qs, &y1.qs);
        let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), x, y);
        let d = scales(f16c_at(b0, 0) * f16c(y0.d), f16c_at(b1, 0) * f16c(y1.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
        summ += f16c_at(b0, 2) * f16c(y0.s) + f16c_at(b1, 2) * f16c(y1.s);
    }
    _mm512_reduce_add_ps(acc) + summ + avx2::q4_1_q8_1(wt, at)
}

/// Q8_0 × Q8_0.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q8_0_q8_0(w: &[[u8; Q8_0_BYTES]], a: &[BlockQ8_0]) -> f32 {
    let n = w.len().min(a.len());
    let (w2, wt) = w[..n].as_chunks::<2>();
    let (a2, at) = a[..n].as_chunks::<2>();
    let mut acc = _mm512_setzero_ps();
    let zero = _mm512_setzero_si512();
    for ([b0, b1], [y0, y1]) in w2.iter().zip(a2) {
        // SAFETY: bytes 2..34 of a 34-byte block.
        let x = unsafe {
            join(
                _mm256_loadu_si256(b0.as_ptr().add(2).cast()),
                _mm256_loadu_si256(b1.as_ptr().add(2).cast()),
            )
        };
        let y = load_pair(&y0.qs, &y1.qs);
        // |x| as unsigned (|-128| = 128 fits u8) times y with x's sign moved onto it.
        let ax = _mm512_abs_epi8(x);
        let neg = _mm512_movepi8_mask(x);
        let sy = _mm512_mask_sub_epi8(y, neg, zero, y);
        let p = _mm512_dpbusd_epi32(zero, ax, sy);
        let d = scales(f16c_at(b0, 0) * f16c(y0.d), f16c_at(b1, 0) * f16c(y1.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    _mm512_reduce_add_ps(acc) + avx2::q8_0_q8_0(wt, at)
}

/// Q4_1 weights × `N` Q8_1 activation rows (a token tile): each weight pair is unpacked once
/// and used `N` times, which is what makes prefill compute-bound rather than unpack-bound.
/// `out[t]` receives the dot with `a[t]`; rows shorter than `w` are cut to the shortest.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q4_1_q8_1_tile<const N: usize>(
    w: &[[u8; Q4_1_BYTES]],
    a: [&[BlockQ8_1]; N],
    out: &mut [f32; N],
) {
    let n = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let (w2, wt) = w[..n].as_chunks::<2>();
    let mut acc = [_mm512_setzero_ps(); N];
    let mut summ = [0f32; N];
    for (i, [b0, b1]) in w2.iter().enumerate() {
        // SAFETY (qs pointers): bytes 4..20 of a 20-byte block.
        let (q0, q1) = unsafe {
            (
                &*b0.as_ptr().add(4).cast::<[u8; 16]>(),
                &*b1.as_ptr().add(4).cast::<[u8; 16]>(),
            )
        };
        let x = join(avx2::nibbles(q0), avx2::nibbles(q1));
        let (d0, d1) = (f16c_at(b0, 0), f16c_at(b1, 0));
        let (m0, m1) = (f16c_at(b0, 2), f16c_at(b1, 2));
        for t in 0..N {
            let (y0, y1) = (&a[t][2 * i], &a[t][2 * i + 1]);
            let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), x, load_pair(&y0.qs, &y1.qs));
            let d = scales(d0 * f16c(y0.d), d1 * f16c(y1.d));
            acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[t]);
            summ[t] += m0 * f16c(y0.s) + m1 * f16c(y1.s);
        }
    }
    let done = 2 * w2.len();
    for t in 0..N {
        out[t] = _mm512_reduce_add_ps(acc[t]) + summ[t] + avx2::q4_1_q8_1(wt, &a[t][done..n]);
    }
}
