//! The gated MLP's activation, `gate = silu(gate) · up`, as straight-line code the compiler
//! vectorises. libm's `expf` is a scalar call: on SmolLM2 it was ~2% of a decoded token, all of
//! it on the calling thread while the pool waits. Element-wise only, so every instruction-set
//! level gives the same bits.

use crate::level::CpuLevel;

/// `gate[i] = gate[i] / (1 + exp(-gate[i])) · up[i]` at `level`. Relative error of the
/// activation ≤ 4e-7 (the exponential's 2.5 ulp and two roundings) for gate > -88; below,
/// where the true value is under 5e-37 in magnitude, the result is -0 (libm's `expf`
/// overflows from -88.72).
///
/// # Panics
/// If the lengths differ.
pub fn silu_mul_in_place_at(level: CpuLevel, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up widths");
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx512 {
        // SAFETY: AVX-512F is present (the level is clamped to the hardware).
        return unsafe { silu_mul_avx512(gate, up) };
    }
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx2 {
        // SAFETY: AVX2 is present (the level is clamped to the hardware).
        return unsafe { silu_mul_avx2(gate, up) };
    }
    let _ = level;
    silu_mul_lanes(gate, up)
}

/// [`silu_mul_in_place_at`] at the machine's level.
pub fn silu_mul_in_place(gate: &mut [f32], up: &[f32]) {
    silu_mul_in_place_at(crate::cpu_level(), gate, up)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) {
    silu_mul_lanes(gate, up)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    silu_mul_lanes(gate, up)
}

#[inline(always)]
fn silu_mul_lanes(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp_clamped(-*g)) * u;
    }
}

/// exp(x): exp(-87) below -87 (the activation is then x to f32 precision), infinite from 88
/// (the activation is then -0, as with libm's overflow from 88.72), otherwise the softmax's
/// exponential.
#[inline(always)]
fn exp_clamped(x: f32) -> f32 {
    let e = crate::attention::softmax::exp_reduced(x.clamp(-87.0, 88.0));
    if x >= 88.0 { f32::INFINITY } else { e }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn silu_f64(x: f32) -> f64 {
        let x = x as f64;
        x / (1.0 + (-x).exp())
    }

    #[test]
    fn silu_matches_f64_to_f32_precision_over_the_whole_range() {
        let xs: Vec<f32> = (0..200_001).map(|i| -100.0 + i as f32 * 0.001).collect();
        let mut gate = xs.clone();
        silu_mul_in_place(&mut gate, &vec![1.0; xs.len()]);
        for (&x, &got) in xs.iter().zip(&gate) {
            let want = silu_f64(x);
            let err = (got as f64 - want).abs();
            assert!(
                err <= 4e-7 * want.abs() + 1e-36,
                "silu({x}) = {got}, want {want}"
            );
        }
        let mut extremes = [-1e30f32, -89.0, 89.0, 1e30, 0.0, -0.0];
        silu_mul_in_place(&mut extremes, &[1.0; 6]);
        assert!(extremes[0] == 0.0 && extremes[1].abs() < 1e-36);
        assert_eq!(&extremes[2..], &[89.0, 1e30, 0.0, 0.0]);
    }

    #[test]
    fn every_level_gives_the_same_bits() {
        let mut gate: Vec<f32> = crate::testutil::noise(1_037, 7)
            .iter()
            .map(|x| x * 3.0)
            .collect();
        // The clamps, the overflow branch and the special values, inside whole vectors too.
        let extremes = [-1e30, -100.0, -88.5, -88.0, -87.5, 87.5, 88.0, 100.0, 1e30];
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0];
        gate.splice(0..0, extremes.iter().chain(&specials).copied());
        let up = crate::testutil::noise(gate.len(), 11);
        let mut want = gate.clone();
        silu_mul_lanes(&mut want, &up);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for level in crate::supported_levels() {
            let mut got = gate.clone();
            silu_mul_in_place_at(level, &mut got, &up);
            assert_eq!(bits(&got), bits(&want), "at {level:?}");
        }
    }
}
