//! AVX2 token tiles for the 32-element block types: one weight row against `N` activation rows.
//!
//! Each kernel is its row kernel with the weight side (unpacking, |x|, the f16 scale) moved out
//! of the token loop; what happens per token is the row kernel's arithmetic in the row
//! kernel's order, so `out[t]` is bit-identical to the row kernel on `a[t]` (prefill and decode
//! agree exactly). Rows of different lengths are cut to the shortest, as the row kernels'
//! `zip` does.

use super::legacy::{bits_to_bytes, dot_us8, load32, load32_at, nibbles, qs16};
use super::{f16c, f16c_at, hsum_ps};
use crate::dot::cut;
use crate::format::blocks::*;
use std::arch::x86_64::*;

/// One Q8_0 activation block against a signed weight block given as `|x|` and `x` (whose
/// signs move onto `y`): `acc + (dw·dy) · Σ x·y`, as the row kernels compute it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn signed_step(ax: __m256i, x: __m256i, dw: f32, y: &BlockQ8_0, acc: __m256) -> __m256 {
    let d = _mm256_set1_ps(dw * f16c(y.d));
    _mm256_fmadd_ps(d, dot_us8(ax, _mm256_sign_epi8(load32(&y.qs), x)), acc)
}

/// Shared body of the signed tiles: `$decode(b)` gives a weight block's 32 signed values.
macro_rules! signed_tile {
    ($w:expr, $a:expr, $out:expr, $decode:expr) => {{
        let (n, a) = cut($w, $a);
        let mut acc = [_mm256_setzero_ps(); N];
        for (i, b) in $w[..n].iter().enumerate() {
            let x: __m256i = $decode(b);
            let ax = _mm256_sign_epi8(x, x);
            let dw = f16c_at(b, 0);
            for t in 0..N {
                acc[t] = signed_step(ax, x, dw, &a[t][i], acc[t]);
            }
        }
        for t in 0..N {
            $out[t] = hsum_ps(acc[t]);
        }
    }};
}

/// Q8_0 weights × `N` Q8_0 activation rows; `out[t]` is bit-identical to
/// [`super::q8_0_q8_0`] on `a[t]`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q8_0_q8_0_tile<const N: usize>(
    w: &[[u8; Q8_0_BYTES]],
    a: [&[BlockQ8_0]; N],
    out: &mut [f32; N],
) {
    signed_tile!(w, a, out, |b| load32_at::<2, _>(b))
}

/// Q5_0 weights × `N` Q8_0 activation rows; `out[t]` is bit-identical to
/// [`super::q5_0_q8_0`] on `a[t]`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_0_q8_0_tile<const N: usize>(
    w: &[[u8; Q5_0_BYTES]],
    a: [&[BlockQ8_0]; N],
    out: &mut [f32; N],
) {
    let bit4 = _mm256_set1_epi8(0x10);
    let sixteen = _mm256_set1_epi8(16);
    signed_tile!(w, a, out, |b: &[u8; Q5_0_BYTES]| {
        let hi = _mm256_and_si256(bits_to_bytes(u32_at(b, 2)), bit4);
        _mm256_sub_epi8(_mm256_or_si256(nibbles(qs16::<6, _>(b)), hi), sixteen)
    })
}

/// Q4_1 weights × `N` Q8_1 activation rows; `out[t]` is bit-identical to
/// [`super::q4_1_q8_1`] on `a[t]`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_1_q8_1_tile<const N: usize>(
    w: &[[u8; Q4_1_BYTES]],
    a: [&[BlockQ8_1]; N],
    out: &mut [f32; N],
) {
    let (n, a) = cut(w, a);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut summ = [0f32; N];
    for (i, b) in w[..n].iter().enumerate() {
        let x = nibbles(qs16::<4, _>(b));
        let (dw, mw) = (f16c_at(b, 0), f16c_at(b, 2));
        for t in 0..N {
            let y = &a[t][i];
            let d = _mm256_set1_ps(dw * f16c(y.d));
            summ[t] += mw * f16c(y.s);
            acc[t] = _mm256_fmadd_ps(d, dot_us8(x, load32(&y.qs)), acc[t]);
        }
    }
    for t in 0..N {
        out[t] = hsum_ps(acc[t]) + summ[t];
    }
}
