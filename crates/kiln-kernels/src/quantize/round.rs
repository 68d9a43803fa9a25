//! Exact `roundf`-then-cast for the Q8_0 / Q8_1 quantizers without libm calls, and the block
//! maximum; both give ggml's reference bytes (see the tests).

use super::c_max;

/// `x.round() as i8` (C's `roundf`: half away from zero, then Rust's saturating cast) without
/// the call into libm that `f32::round` compiles to on baseline x86-64, which cost more than
/// the rest of the activation quantization together.
#[inline(always)]
pub(super) fn round_to_i8(x: f32) -> i8 {
    if x.abs() < 8_388_608.0 {
        round_small(x)
    } else {
        // Integers already (or NaN / infinite): no libm cost worth avoiding here.
        x.round() as i8
    }
}

/// [`round_to_i8`] for |x| < 2^23, without branches (so that block loops vectorize): the
/// truncation through i32 and the fraction `x - t` are exact there, and `2·(x - t)` truncated
/// is ±1 exactly when the fraction reaches one half.
#[inline(always)]
pub(super) fn round_small(x: f32) -> i8 {
    let t = x as i32;
    let adj = (2.0 * (x - t as f32)) as i32;
    (t + adj).clamp(-128, 127) as i8
}

/// The largest |x| of a 32-element block, as ggml's sequential `MAX(amax, fabsf(x))` loop
/// computes it. Without NaNs that maximum does not depend on the order, so eight running
/// maxima (which vectorize) give the same value; with a NaN the sequential loop decides.
#[inline(always)]
pub(super) fn block_amax(xb: &[f32]) -> f32 {
    let mut m = [0.0f32; 8];
    let mut nan = false;
    for c in xb.chunks_exact(8) {
        for j in 0..8 {
            m[j] = c_max(m[j], c[j].abs());
            nan |= c[j].is_nan();
        }
    }
    if nan {
        return xb.iter().fold(0.0f32, |m, v| c_max(m, v.abs()));
    }
    m.iter().fold(0.0f32, |a, &b| c_max(a, b))
}

/// `round_to_i8(v * id)` for a block. When `amax` and `id` are finite every |v·id| is at most
/// about 127, so the branch-free rounding applies to the whole block.
#[inline(always)]
pub(super) fn round_block(xb: &[f32], amax: f32, id: f32, qs: &mut [i8; 32]) {
    if amax.is_finite() && id.is_finite() {
        for (q, &v) in qs.iter_mut().zip(xb) {
            *q = round_small(v * id);
        }
    } else {
        for (q, &v) in qs.iter_mut().zip(xb) {
            *q = round_to_i8(v * id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{round_small, round_to_i8};

    #[test]
    fn round_to_i8_is_roundf_then_as_i8() {
        let edges = [
            0.0f32,
            -0.0,
            0.5,
            -0.5,
            1.5,
            -1.5,
            2.5,
            -2.5,
            126.5,
            -126.5,
            127.49999,
            127.5,
            -127.5,
            128.0,
            -128.5,
            -129.0,
            300.0,
            0.49999997,
            -0.49999997,
            1.4999999,
            8388607.5,
            8388608.0,
            -8388609.0,
            1e30,
            -1e30,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            1e-40,
        ];
        for x in edges {
            assert_eq!(round_to_i8(x), x.round() as i8, "{x}");
            if x.abs() < 8_388_608.0 {
                assert_eq!(round_small(x), x.round() as i8, "{x}");
            }
        }
        // Every f32 in [-130, 130] with a fraction near one half, and a sweep of others.
        let mut bits = (-130.0f32).to_bits();
        while f32::from_bits(bits) < -0.0 {
            let x = f32::from_bits(bits);
            assert_eq!(round_to_i8(x), x.round() as i8, "{x}");
            bits -= 97;
        }
        for i in 0..2_000_000u32 {
            let x = (i as f32 - 1_000_000.0) / 7_777.0;
            assert_eq!(round_to_i8(x), x.round() as i8, "{x}");
        }
    }
}
