//! Softmax pieces for attention. `exp` dominates attention at long context (one per visible key
//! per head per layer), and libm's `expf` is a scalar call; this version is branch-free straight
//! line code over plain arrays, which the compiler vectorises at the baseline instruction set.

/// `s[i] = exp(s[i] - max)` for every element; returns the sum. Relative error ≤ 3e-7 (2.5 ulp) for
/// arguments in [-87, 0] (those below flush to 0, which is what the softmax wants).
pub fn exp_shifted_in_place(s: &mut [f32], max: f32) -> f32 {
    exp_shifted_lanes(s, max)
}

/// The body of [`exp_shifted_in_place`], inlined into each instruction-set variant
/// (`tile::exp_shifted_in_place_at`).
#[inline(always)]
pub(crate) fn exp_shifted_lanes(s: &mut [f32], max: f32) -> f32 {
    let mut sum = [0f32; 8];
    let mut chunks = s.chunks_exact_mut(8);
    for c in &mut chunks {
        for i in 0..8 {
            let e = exp_approx(c[i] - max);
            c[i] = e;
            sum[i] += e;
        }
    }
    let mut total: f32 = sum.iter().sum();
    for x in chunks.into_remainder() {
        *x = exp_approx(*x - max);
        total += *x;
    }
    total
}

/// exp(x) for x ≤ 0; below -87 (where exp leaves f32's normal range) it is exp(-87), which the
/// softmax treats as zero.
#[inline(always)]
fn exp_approx(x: f32) -> f32 {
    exp_reduced(x.max(-87.0))
}

/// exp(x) for x in [-87, 88] by range reduction to `2^n · e^r`, |r| ≤ ln2/2, and a degree-6
/// polynomial; branch-free, so loops over it vectorise. Shared with `act`'s SiLU.
#[inline(always)]
pub(crate) fn exp_reduced(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Round to nearest with the 1.5·2^23 trick: no `round` call, so it vectorises.
    const MAGIC: f32 = 12_582_912.0;
    let shifted = x * LOG2E + MAGIC;
    let n = shifted - MAGIC;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // 2^n from the integer n held in `shifted`'s low mantissa bits (|n| ≤ 127 < 2^22), the same
    // bits as `(n as i32 + 127) << 23`: a float-to-int `as` saturates, which the compiler does
    // lane by lane with scalar converts and selects (prefill at 1 thread: +9% without it).
    let biased = shifted
        .to_bits()
        .wrapping_sub(MAGIC.to_bits())
        .wrapping_add(127);
    let scale = f32::from_bits(biased << 23);
    p * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_f64_exp_to_f32_precision() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let got = exp_approx(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_7;
        }
        assert!(worst <= 3e-7, "worst relative error {worst}");
        assert_eq!(exp_approx(0.0), 1.0);
        assert_eq!(exp_approx(-1000.0), exp_approx(-87.0));
    }

    /// The power of two built from the mantissa bits is the one a saturating cast built, for
    /// every argument the callers pass (the softmax's [-87, 0], SiLU's [-87, 88]).
    #[test]
    fn power_of_two_from_the_mantissa_matches_the_cast() {
        let reference = |x: f32| {
            const MAGIC: f32 = 12_582_912.0;
            let n = (x * std::f32::consts::LOG2_E + MAGIC) - MAGIC;
            let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
            let p = 1.0
                + r * (1.0
                    + r * (0.5
                        + r * (1.0 / 6.0
                            + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
            p * f32::from_bits(((n as i32 + 127) as u32) << 23)
        };
        const STEPS: u32 = 500_000;
        let xs = (0..=STEPS).map(|i| -87.0 + 175.0 * i as f32 / STEPS as f32);
        for x in xs.chain([88.0, -87.0, 0.0, -0.0]) {
            assert_eq!(exp_reduced(x).to_bits(), reference(x).to_bits(), "exp({x})");
        }
        // SiLU's clamp lets NaN through; it must stay NaN.
        assert!(exp_reduced(f32::NAN).is_nan());
    }

    #[test]
    fn shifted_exp_sums_like_the_reference() {
        let mut s: Vec<f32> = (0..101).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want: Vec<f64> = s.iter().map(|&v| ((v - max) as f64).exp()).collect();
        let sum = exp_shifted_in_place(&mut s, max);
        for (g, w) in s.iter().zip(&want) {
            assert!(((*g as f64 - w) / w).abs() <= 3e-7);
        }
        assert!((sum as f64 - want.iter().sum::<f64>()).abs() <= 1e-5 * want.iter().sum::<f64>());
    }
}
