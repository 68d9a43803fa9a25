//! AVX2 token tiles for Q4_K and Q6_K × Q8_K: one weight row against `N` activation rows.
//!
//! The weight side (unpacked codes and scale vectors) is built once per 32-element chunk and
//! used by every token. The integer sums are exact, so accumulating them chunk-major instead
//! of token-major gives the same i32 lanes; the float steps per token are the row kernel's, in
//! its order, so `out[t]` is bit-identical to the row kernel on `a[t]`.

use super::kquant::{bsums, chunk_scales, hsum_ps128, k4_min_sums, k4_setup, ld16, ld32, y32};
use super::kquant::{q6k_codes, scaled_dot, scales16_even_odd};
use super::{f16c_at, hsum_ps};
use crate::dot::cut;
use crate::format::blocks::*;
use std::arch::x86_64::*;

/// Q4_K weights × `N` Q8_K activation rows; `out[t]` is bit-identical to
/// [`super::q4_k_q8_k`] on `a[t]`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_k_q8_k_tile<const N: usize>(
    w: &[[u8; Q4_K_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [f32; N],
) {
    let m4 = _mm256_set1_epi8(0x0F);
    let (n, a) = cut(w, a);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_m = [_mm_setzero_ps(); N];
    for (i, b) in w[..n].iter().enumerate() {
        let (dw, dmw) = (f16c_at(b, 0), f16c_at(b, 2));
        let (scales, mins) = k4_setup(b);
        let mut sumi = [_mm256_setzero_si256(); N];
        for j in 0..4 {
            let qs = ld32(b, 16 + 32 * j);
            let lo = _mm256_and_si256(qs, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qs), m4);
            let (sl, sh) = (chunk_scales(scales, 2 * j), chunk_scales(scales, 2 * j + 1));
            for t in 0..N {
                let y = &a[t][i];
                let dl = scaled_dot(lo, y32(y, 64 * j), sl);
                let dh = scaled_dot(hi, y32(y, 64 * j + 32), sh);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(dl, dh));
            }
        }
        for t in 0..N {
            let y = &a[t][i];
            let dmin = _mm_set1_ps(y.d * dmw);
            acc_m[t] = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(k4_min_sums(mins, y)), acc_m[t]);
            let d = _mm256_set1_ps(y.d * dw);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    for t in 0..N {
        out[t] = hsum_ps(acc[t]) - hsum_ps128(acc_m[t]);
    }
}

/// Q6_K weights × `N` Q8_K activation rows; `out[t]` is bit-identical to
/// [`super::q6_k_q8_k`] on `a[t]`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q6_k_q8_k_tile<const N: usize>(
    w: &[[u8; Q6_K_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [f32; N],
) {
    let (n, a) = cut(w, a);
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, b) in w[..n].iter().enumerate() {
        let dw = f16c_at(b, 208);
        let raw = ld16(b, 192);
        let scales = scales16_even_odd(raw, true);
        let s16 = _mm256_cvtepi8_epi16(raw);
        let mut sumi = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            let qs = q6k_codes(b, h);
            for (k, q) in qs.into_iter().enumerate() {
                let c = 4 * h + k;
                let sc = chunk_scales(scales, c);
                for t in 0..N {
                    let sd = scaled_dot(q, y32(&a[t][i], 32 * c), sc);
                    sumi[t] = _mm256_add_epi32(sumi[t], sd);
                }
            }
        }
        for t in 0..N {
            let y = &a[t][i];
            let offset = _mm256_madd_epi16(s16, bsums(y));
            let s = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32::<5>(offset));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y.d * dw), _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    for t in 0..N {
        out[t] = hsum_ps(acc[t]);
    }
}
