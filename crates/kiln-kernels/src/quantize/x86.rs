//! AVX2 activation quantizers for Q8_0 and Q8_1 (used at the AVX2 and AVX-512 levels): the
//! same scales and codes as the scalar reference, byte for byte. A prefill quantizes every
//! matmul input, so at the tiles' speed the scalar loop (its sequential maximum and Rust's
//! saturating float→int casts, which baseline x86-64 cannot vectorize) cost a sixth of a Q8_0
//! matmul.
//!
//! Why the result is the reference's: without NaNs the largest |x| does not depend on the
//! order it is searched in; `d`, `1/d` and `x·id` are the same IEEE operations; and for
//! finite `amax` and `id` every |x·id| is below 2^23, where truncating `t` and `2·(x·id - t)`
//! to integers rounds half away from zero exactly (`roundf`). Blocks with a NaN, an infinite
//! `amax` or an infinite `id` (subnormal `d`) take the scalar path.
//!
//! Safety: the functions require avx2 (they are only called at [`crate::CpuLevel::Avx2`] or
//! above).

use half::f16;
use std::arch::x86_64::*;

use crate::format::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K};

/// One block's codes, or `None` if the block needs the scalar path. Returns `(d, codes as
/// four vectors of eight i32)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn block(xb: &[f32; 32]) -> Option<(f32, [__m256i; 4])> {
    // SAFETY: each load reads 8 of the block's 32 floats.
    let v: [__m256; 4] =
        std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * i)) });
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let a = v.map(|v| _mm256_and_ps(v, abs));
    let nan = v.iter().fold(_mm256_setzero_ps(), |n, &v| {
        _mm256_or_ps(n, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v))
    });
    if _mm256_movemask_ps(nan) != 0 {
        return None;
    }
    let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    if !(amax.is_finite() && id.is_finite()) {
        return None;
    }
    let ids = _mm256_set1_ps(id);
    let two = _mm256_set1_ps(2.0);
    let q = v.map(|v| {
        let p = _mm256_mul_ps(v, ids);
        let t = _mm256_cvttps_epi32(p);
        let adj = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_sub_ps(p, _mm256_cvtepi32_ps(t)), two));
        _mm256_add_epi32(t, adj)
    });
    Some((d, q))
}

/// f32 → f16 with F16C (round to nearest even, as `half` does, without its per-call CPU
/// feature check).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn to_f16(v: f32) -> f16 {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v));
    f16::from_bits(_mm_extract_epi16::<0>(h) as u16)
}

/// Packs 32 i32 codes (each within i8) into bytes, in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pack(q: [__m256i; 4], out: &mut [i8; 32]) {
    // The packs work within 128-bit halves; the permute puts the 4-byte runs back in order.
    let b = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: writes exactly the 32 bytes of `out`.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), b) };
}

/// [`crate::quantize_row_q8_0`] for `x.len() == 32 * y.len()` (callers check).
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, yb) in x.as_chunks::<32>().0.iter().zip(y.iter_mut()) {
        match block(xb) {
            Some((d, q)) => {
                yb.d = to_f16(d);
                pack(q, &mut yb.qs);
            }
            None => {
                let _ = super::quantize_row_q8_0(xb, std::slice::from_mut(yb));
            }
        }
    }
}

/// [`crate::quantize_row_q8_1`] for `x.len() == 32 * y.len()` (callers check).
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (xb, yb) in x.as_chunks::<32>().0.iter().zip(y.iter_mut()) {
        match block(xb) {
            Some((d, q)) => {
                yb.d = to_f16(d);
                let s =
                    _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
                let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
                let sum =
                    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)));
                yb.s = to_f16(sum as f32 * d);
                pack(q, &mut yb.qs);
            }
            None => {
                let _ = super::quantize_row_q8_1(xb, std::slice::from_mut(yb));
            }
        }
    }
}

/// [`crate::quantize_row_q8_k`] for `x.len() == 256 * y.len()` (callers check). The scale
/// comes from the first element of largest magnitude, as in the reference loop: the vector
/// maximum finds that magnitude (NaN-free blocks only), a compare finds its first position.
/// Blocks with a NaN, an infinite maximum or an infinite `-127 / max` take the scalar path;
/// elsewhere every `|x · iscale|` is at most 127 and `vcvtps2dq` rounds half to even, as the
/// reference's `nearest_int` does below 2^22.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (xb, yb) in x.as_chunks::<256>().0.iter().zip(y.iter_mut()) {
        if !q8_k_block(xb, yb) {
            let _ = super::quantize_row_q8_k(xb, std::slice::from_mut(yb));
        }
    }
}

/// One Q8_K block; `false` (and `y` untouched) where the block needs the scalar path.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_k_block(xb: &[f32; 256], y: &mut BlockQ8K) -> bool {
    let (chunks, _) = xb.as_chunks::<8>();
    // SAFETY: each load reads one chunk of eight floats.
    let load = |c: &[f32; 8]| unsafe { _mm256_loadu_ps(c.as_ptr()) };
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut m = _mm256_setzero_ps();
    let mut nan = _mm256_setzero_ps();
    for c in chunks {
        let v = load(c);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        m = _mm256_max_ps(m, _mm256_and_ps(v, abs_mask));
    }
    if _mm256_movemask_ps(nan) != 0 {
        return false;
    }
    let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    if amax == 0.0 {
        *y = BlockQ8K::default();
        return true;
    }
    let at = _mm256_set1_ps(amax);
    let first = chunks.iter().enumerate().find_map(|(i, c)| {
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
            _mm256_and_ps(load(c), abs_mask),
            at,
        ));
        (hit != 0).then(|| 8 * i + hit.trailing_zeros() as usize)
    });
    let Some(first) = first else {
        return false;
    };
    let iscale = -127.0f32 / xb[first];
    if !(amax.is_finite() && iscale.is_finite()) {
        return false;
    }
    let scale = _mm256_set1_ps(iscale);
    let top = _mm256_set1_epi32(127);
    let q = |c: &[f32; 8]| _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(load(c), scale)), top);
    for (out, c) in
        y.qs.as_chunks_mut::<32>()
            .0
            .iter_mut()
            .zip(chunks.as_chunks::<4>().0)
    {
        pack([q(&c[0]), q(&c[1]), q(&c[2]), q(&c[3])], out);
    }
    for (s, g) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
        *s = g.iter().map(|&q| q as i16).sum();
    }
    y.d = 1.0 / iscale;
    true
}
