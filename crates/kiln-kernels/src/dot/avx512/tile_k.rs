//! AVX-512 VNNI token tiles for Q4_K and Q6_K × Q8_K: one weight row against `N` activation
//! rows. A super-block's four 64-weight runs and their scale vectors are built once and kept
//! in registers (8 of the 32) while every token's `maddubs` + `vpdpwssd` goes through them;
//! per token the steps are the row kernel's, in its order, so `out[t]` is bit-identical to
//! [`super::q4_k_q8_k`] / [`super::q6_k_q8_k`] on `a[t]`.

use super::kquant::{group_scales, join, k4_setup, ld64, nibbles64, run_dot, run_scales, y64};
use crate::dot::avx2::{bsums, f16c_at, hsum_ps128, k4_min_sums, ld16, ld32};
use crate::dot::cut;
use crate::format::blocks::*;
use std::arch::x86_64::*;

/// Q4_K weights × `N` Q8_K activation rows.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q4_k_q8_k_tile<const N: usize>(
    w: &[[u8; Q4_K_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [f32; N],
) {
    let (n, a) = cut(w, a);
    let mut acc = [_mm512_setzero_ps(); N];
    let mut acc_m = [_mm_setzero_ps(); N];
    for (i, b) in w[..n].iter().enumerate() {
        let (dw, dmw) = (f16c_at(b, 0), f16c_at(b, 2));
        let (scales, mins) = k4_setup(b);
        // Loops, not `std::array::from_fn`: its closure would not inherit the target features.
        let mut x = [_mm512_setzero_si512(); 4];
        let mut s = [_mm512_setzero_si512(); 4];
        for j in 0..4 {
            x[j] = nibbles64(ld32(b, 16 + 32 * j));
            s[j] = run_scales(scales, j);
        }
        for t in 0..N {
            let y = &a[t][i];
            let dmin = _mm_set1_ps(y.d * dmw);
            acc_m[t] = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(k4_min_sums(mins, y)), acc_m[t]);
            let mut sumi = _mm512_setzero_si512();
            for j in 0..4 {
                sumi = run_dot(sumi, x[j], y64(y, 64 * j), s[j]);
            }
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y.d * dw), _mm512_cvtepi32_ps(sumi), acc[t]);
        }
    }
    for t in 0..N {
        out[t] = _mm512_reduce_add_ps(acc[t]) - hsum_ps128(acc_m[t]);
    }
}

/// Q6_K weights × `N` Q8_K activation rows.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q6_k_q8_k_tile<const N: usize>(
    w: &[[u8; Q6_K_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [f32; N],
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let m3 = _mm512_set1_epi8(0x03);
    let m48 = _mm512_set1_epi8(0x30);
    let (n, a) = cut(w, a);
    let mut acc = [_mm512_setzero_ps(); N];
    for (i, b) in w[..n].iter().enumerate() {
        let dw = f16c_at(b, 208);
        let s16 = _mm256_cvtepi8_epi16(ld16(b, 192));
        let scales = _mm512_zextsi256_si512(s16);
        // Runs in activation order: (x01, x23) of half 0, then of half 1 (see the row kernel).
        let mut x = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            let ql = ld64(b, 64 * h);
            let qh = ld32(b, 128 + 32 * h);
            let qh2 = join(qh, _mm256_srli_epi16::<2>(qh));
            x[2 * h] = _mm512_ternarylogic_epi32::<0xEC>(
                ql,
                _mm512_slli_epi16::<4>(_mm512_and_si512(qh2, m3)),
                m4,
            );
            x[2 * h + 1] = _mm512_ternarylogic_epi32::<0xEC>(
                _mm512_srli_epi16::<4>(ql),
                _mm512_and_si512(qh2, m48),
                m4,
            );
        }
        let mut s = [_mm512_setzero_si512(); 4];
        for (r, s) in s.iter_mut().enumerate() {
            *s = group_scales(scales, 4 * r);
        }
        for t in 0..N {
            let y = &a[t][i];
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(s16, bsums(y)));
            let mut sumi = _mm512_setzero_si512();
            for r in 0..4 {
                sumi = run_dot(sumi, x[r], y64(y, 64 * r), s[r]);
            }
            sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(offset));
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y.d * dw), _mm512_cvtepi32_ps(sumi), acc[t]);
        }
    }
    for t in 0..N {
        out[t] = _mm512_reduce_add_ps(acc[t]);
    }
}
