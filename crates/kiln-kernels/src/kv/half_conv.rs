//! Conversions between f32 and the 16-bit formats of a dense KV cache (IEEE f16, bf16), a
//! slice at a time. The `half` crate converts one value per call behind a feature check;
//! reading an f16 cache that way made attention three times slower than reading f32 in
//! place. f16 ↔ f32 uses F16C / AVX-512 conversions; bf16 → f32 is a shift the compiler
//! vectorises. Every conversion is exact or correctly rounded, so each level gives the same
//! bits, NaN payloads aside. (`half`'s own per-value conversion, the scalar reference, uses F16C
//! whenever the CPU has it, whatever `KILN_CPU_LEVEL` says.)

use half::{bf16, f16};

use crate::level::CpuLevel;

/// `dst[i] = f32(src[i])` for f16 bit patterns `src`, at `level` (exact).
///
/// # Panics
/// If the lengths differ.
pub fn f16_to_f32_at(level: CpuLevel, src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16 → f32 lengths");
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx512 {
        // SAFETY: AVX-512F is present (the level is clamped to the hardware).
        return unsafe { x86::f16_to_f32_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx2 {
        // SAFETY: the AVX2 level includes F16C (see `level::detect`).
        return unsafe { x86::f16_to_f32_f16c(src, dst) };
    }
    let _ = level;
    f16_to_f32_scalar(src, dst)
}

/// `dst[i] = f16(src[i])` (round to nearest, ties to even) as bit patterns, at `level`.
///
/// # Panics
/// If the lengths differ.
pub fn f32_to_f16_at(level: CpuLevel, src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "f32 → f16 lengths");
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx512 {
        // SAFETY: AVX-512F is present (the level is clamped to the hardware).
        return unsafe { x86::f32_to_f16_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx2 {
        // SAFETY: the AVX2 level includes F16C (see `level::detect`).
        return unsafe { x86::f32_to_f16_f16c(src, dst) };
    }
    let _ = level;
    f32_to_f16_scalar(src, dst)
}

/// `dst[i] = f32(src[i])` for bf16 bit patterns `src` (exact; every level gives the same bits).
///
/// # Panics
/// If the lengths differ.
pub fn bf16_to_f32_at(level: CpuLevel, src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "bf16 → f32 lengths");
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx512 {
        // SAFETY: AVX-512F is present (the level is clamped to the hardware).
        return unsafe { x86::bf16_to_f32_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx2 {
        // SAFETY: AVX2 is present (the level is clamped to the hardware).
        return unsafe { x86::bf16_to_f32_avx2(src, dst) };
    }
    let _ = level;
    bf16_to_f32_lanes(src, dst)
}

/// The scalar reference of [`f16_to_f32_at`].
pub fn f16_to_f32_scalar(src: &[u16], dst: &mut [f32]) {
    for (o, &b) in dst.iter_mut().zip(src) {
        *o = f16::from_bits(b).to_f32();
    }
}

/// The scalar reference of [`f32_to_f16_at`].
pub fn f32_to_f16_scalar(src: &[f32], dst: &mut [u16]) {
    for (o, &v) in dst.iter_mut().zip(src) {
        *o = f16::from_f32(v).to_bits();
    }
}

/// bf16 → f32 is the bits moved to the high half: `half`'s conversion, without its per-value
/// call, so the loop vectorises.
#[inline(always)]
fn bf16_to_f32_lanes(src: &[u16], dst: &mut [f32]) {
    for (o, &b) in dst.iter_mut().zip(src) {
        *o = f32::from_bits(u32::from(b) << 16);
    }
}

/// The scalar reference of [`bf16_to_f32_at`] (`half` quiets signalling NaNs; the shift keeps
/// them, which a cache never holds: it stores `bf16::from_f32`'s quiet ones).
pub fn bf16_to_f32_scalar(src: &[u16], dst: &mut [f32]) {
    for (o, &b) in dst.iter_mut().zip(src) {
        *o = bf16::from_bits(b).to_f32();
    }
}

/// The vector forms. Safety, for each: the CPU supports the features the function enables;
/// `src` and `dst` have the same length (the public entry points assert it).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Round to nearest even (F16C's immediate has no exception-suppression bit; AVX-512's
    /// conversion suppresses them).
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT;
    const NEAREST_NO_EXC: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    #[target_feature(enable = "avx512f,avx2,f16c")]
    pub(super) unsafe fn f16_to_f32_avx512(src: &[u16], dst: &mut [f32]) {
        let mut s = src.chunks_exact(16);
        let mut d = dst.chunks_exact_mut(16);
        for (s, d) in (&mut s).zip(&mut d) {
            // SAFETY: both chunks hold 16 elements; unaligned loads and stores.
            unsafe {
                let h = _mm256_loadu_si256(s.as_ptr().cast());
                _mm512_storeu_ps(d.as_mut_ptr(), _mm512_cvtph_ps(h));
            }
        }
        super::f16_to_f32_scalar(s.remainder(), d.into_remainder());
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn f16_to_f32_f16c(src: &[u16], dst: &mut [f32]) {
        let mut s = src.chunks_exact(8);
        let mut d = dst.chunks_exact_mut(8);
        for (s, d) in (&mut s).zip(&mut d) {
            // SAFETY: both chunks hold 8 elements; unaligned loads and stores.
            unsafe {
                let h = _mm_loadu_si128(s.as_ptr().cast());
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
        super::f16_to_f32_scalar(s.remainder(), d.into_remainder());
    }

    #[target_feature(enable = "avx512f,avx2,f16c")]
    pub(super) unsafe fn f32_to_f16_avx512(src: &[f32], dst: &mut [u16]) {
        let mut s = src.chunks_exact(16);
        let mut d = dst.chunks_exact_mut(16);
        for (s, d) in (&mut s).zip(&mut d) {
            // SAFETY: both chunks hold 16 elements; unaligned loads and stores.
            unsafe {
                let h = _mm512_cvtps_ph::<NEAREST_NO_EXC>(_mm512_loadu_ps(s.as_ptr()));
                _mm256_storeu_si256(d.as_mut_ptr().cast(), h);
            }
        }
        super::f32_to_f16_scalar(s.remainder(), d.into_remainder());
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn f32_to_f16_f16c(src: &[f32], dst: &mut [u16]) {
        let mut s = src.chunks_exact(8);
        let mut d = dst.chunks_exact_mut(8);
        for (s, d) in (&mut s).zip(&mut d) {
            // SAFETY: both chunks hold 8 elements; unaligned loads and stores.
            unsafe {
                let h = _mm256_cvtps_ph::<NEAREST>(_mm256_loadu_ps(s.as_ptr()));
                _mm_storeu_si128(d.as_mut_ptr().cast(), h);
            }
        }
        super::f32_to_f16_scalar(s.remainder(), d.into_remainder());
    }

    #[target_feature(enable = "avx512f,avx2")]
    pub(super) unsafe fn bf16_to_f32_avx512(src: &[u16], dst: &mut [f32]) {
        super::bf16_to_f32_lanes(src, dst)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn bf16_to_f32_avx2(src: &[u16], dst: &mut [f32]) {
        super::bf16_to_f32_lanes(src, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every 16-bit pattern, in an odd-length slice so the vector loops' tails run too.
    fn all_patterns() -> Vec<u16> {
        (0..=u16::MAX).chain([0x3c00, 0x7e00, 0xfc01]).collect()
    }

    #[test]
    fn f16_to_f32_is_exact_at_every_level_for_every_pattern() {
        let src = all_patterns();
        let mut want = vec![0.0; src.len()];
        f16_to_f32_scalar(&src, &mut want);
        for level in crate::supported_levels() {
            let mut got = vec![0.0; src.len()];
            f16_to_f32_at(level, &src, &mut got);
            assert_eq!(bits(&got), bits(&want), "at {level:?}");
        }
    }

    #[test]
    fn bf16_to_f32_is_exact_at_every_level_for_every_pattern() {
        let src = all_patterns();
        let mut want = vec![0.0; src.len()];
        bf16_to_f32_scalar(&src, &mut want);
        for level in crate::supported_levels() {
            let mut got = vec![0.0; src.len()];
            bf16_to_f32_at(level, &src, &mut got);
            // NaNs may differ in payload (half quiets them); everything else bit for bit.
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "pattern {:#06x} at {level:?}: {g} vs {w}",
                    src[i]
                );
            }
        }
    }

    #[test]
    fn f32_to_f16_rounds_like_the_reference_at_every_level() {
        let mut next = crate::testutil::xorshift(0x9e37_79b9);
        // Random bit patterns cover every exponent; the rest are the rounding edges: halfway
        // cases, the largest finite f16 and just past it, subnormals, zeros, infinities, NaNs.
        let mut src: Vec<f32> = (0..100_003).map(|_| f32::from_bits(next())).collect();
        src.extend_from_slice(&[
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            65504.0,
            65519.99,
            65520.0,
            5.960_464_5e-8,
            f32::from_bits(0x32ff_ffff),
            f32::from_bits(0x3300_0000),
            f32::from_bits(0x3300_0001),
            3.0 * f32::from_bits(0x3300_0000),
            -0.0,
            0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffc1_2345),
        ]);
        src.extend(crate::testutil::noise(1_001, 5));
        let mut want = vec![0u16; src.len()];
        f32_to_f16_scalar(&src, &mut want);
        for level in crate::supported_levels() {
            let mut got = vec![0u16; src.len()];
            f32_to_f16_at(level, &src, &mut got);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let nan = |b: u16| b & 0x7c00 == 0x7c00 && b & 0x03ff != 0;
                assert!(
                    g == w || (nan(g) && nan(w)),
                    "{} ({:#010x}) at {level:?}: {g:#06x} vs {w:#06x}",
                    src[i],
                    src[i].to_bits()
                );
            }
        }
    }
}
