//! The scale searches behind the K-quant encoders: for one sub-block, find a scale (and for
//! the affine formats a minimum) and the integer codes that go with it.
//!
//! These are ggml's reference searches (`make_qx_quants`, `make_q3_quants`,
//! `make_qkx2_quants`). Their results feed comparisons (`a < b`, "is this error smaller"), so
//! one ulp of difference in a sum can pick another candidate and change whole sub-blocks. Every
//! sum here therefore runs sequentially, element by element, with the operands grouped as ggml
//! groups them (`(w * x) * l`, not `w * (x * l)`), and without fused multiply-adds.

/// Below this largest magnitude a group counts as all zero (ggml's `GROUP_MAX_EPS`).
pub(super) const GROUP_EPS: f32 = 1e-15;

/// Rounds to the nearest integer, ties to even, the way ggml's `nearest_int` does: adding
/// 1.5·2^23 leaves no fraction bits in the mantissa, so the addition itself rounds, and the
/// integer is read back from the low mantissa bits. Exact for |f| < 2^22; beyond that (and for
/// NaN / ±inf) it returns the same wrapped value ggml does rather than saturating, because the
/// encoders clamp what it returns and must clamp the same number.
#[inline(always)]
pub(super) fn nearest_int(f: f32) -> i32 {
    let biased = f + 12_582_912.0;
    (biased.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// The element of largest magnitude as `(|v|, v)`; the first one wins a tie.
pub(super) fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// `nearest_int(iscale * v)` clamped to the signed code range `[-nmax, nmax - 1]`.
#[inline(always)]
fn signed_code(iscale: f32, v: f32, nmax: i32) -> i32 {
    nearest_int(iscale * v).clamp(-nmax, nmax - 1)
}

/// Rounds every element at `iscale` into `codes` (offset by `nmax`) and returns the x²-weighted
/// sums `(Σ w·x·l, Σ w·l²)` of the least-squares scale `Σwxl / Σwl²`.
fn round_and_fit(x: &[f32], iscale: f32, nmax: i32, codes: &mut [i8]) -> (f32, f32) {
    let (mut sum_xl, mut sum_l2) = (0.0f32, 0.0f32);
    for (c, &v) in codes.iter_mut().zip(x) {
        let l = signed_code(iscale, v, nmax);
        *c = (l + nmax) as i8;
        let w = v * v;
        sum_xl += w * v * l as f32;
        sum_l2 += w * l as f32 * l as f32;
    }
    (sum_xl, sum_l2)
}

/// Symmetric codes in `[0, 2·nmax)` (value `scale · (code − nmax)`) for Q6_K's 16-element
/// groups; returns the scale, negative when the largest-magnitude element is positive (ggml
/// maps that element to code 0, −nmax, which has the wider range).
///
/// Rounding at `nmax / max` alone wastes the grid whenever one element dominates, so the
/// search also tries the nineteen grids `(nmax ± 0.1k) / max` and keeps the one whose
/// least-squares scale explains the most x²-weighted energy (`(Σwxl)² / Σwl²`), weighting by x²
/// so large weights, which matter most in a dot product, are fit best. (ggml's `make_qx_quants`
/// with `rmse_type = 1`.)
pub(super) fn symmetric_search(x: &[f32], nmax: i32, codes: &mut [i8]) -> f32 {
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_EPS {
        codes.fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let (sum_xl, sum_l2) = round_and_fit(x, -nmax_f / max, nmax, codes);
    let mut scale = if sum_l2 != 0.0 { sum_xl / sum_l2 } else { 0.0 };
    let mut best = scale * sum_xl;
    let mut trial = [0i8; 32];
    let trial = &mut trial[..x.len()];
    for step in (-9..=9).filter(|&s| s != 0) {
        let iscale = -(nmax_f + 0.1 * step as f32) / max;
        let (sum_xl, sum_l2) = round_and_fit(x, iscale, nmax, trial);
        // Compare (Σwxl)²/Σwl² against the best without dividing: both sides times Σwl².
        if sum_l2 > 0.0 && sum_xl * sum_xl > best * sum_l2 {
            codes.copy_from_slice(trial);
            scale = sum_xl / sum_l2;
            best = scale * sum_xl;
        }
    }
    scale
}

/// Symmetric codes in `[0, 2·nmax)` for Q3_K's 16-element groups (value
/// `scale · (code − nmax)`); returns the scale.
///
/// With only eight levels, rounding at one grid is far from optimal, so after rounding at
/// `nmax / max` this walks the elements up to five times and moves each one to the code the
/// current fit would give it, keeping a move only when it raises the x²-weighted explained
/// energy `(Σwxl)² / Σwl²`; it stops early once a pass changes nothing. (ggml's
/// `make_q3_quants` with `do_rmse`.)
pub(super) fn q3_search(x: &[f32], nmax: i32, codes: &mut [i8]) -> f32 {
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_EPS {
        // Note: ggml leaves these at 0, not at the zero code `nmax`; the group's scale is 0,
        // so either decodes to zero.
        codes.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sum_xl, mut sum_l2) = (0.0f32, 0.0f32);
    for (c, &v) in codes.iter_mut().zip(x) {
        let l = signed_code(iscale, v, nmax);
        *c = l as i8;
        let w = v * v;
        sum_xl += w * v * l as f32;
        sum_l2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (c, &v) in codes.iter_mut().zip(x) {
            let w = v * v;
            let old = *c as f32;
            // The sums without this element, then with it at the code they suggest.
            let mut slx = sum_xl - w * v * old;
            if slx <= 0.0 || slx.is_nan() {
                continue;
            }
            let mut sl2 = sum_l2 - w * old * old;
            let new = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
            if new == *c as i32 {
                continue;
            }
            slx += w * v * new as f32;
            sl2 += w * new as f32 * new as f32;
            if sl2 > 0.0 && slx * slx * sum_l2 > sum_xl * sum_xl * sl2 {
                *c = new as i8;
                sum_xl = slx;
                sum_l2 = sl2;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    for c in codes.iter_mut() {
        *c += nmax as i8;
    }
    if sum_l2 > 0.0 { sum_xl / sum_l2 } else { 0.0 }
}

/// The candidate grids of [`affine_search`]: `nmax + rmin + k·rdelta` steps over the range
/// for `k = 0..=steps`, and whether the error is absolute (`mad`) or squared.
#[derive(Clone, Copy)]
pub(super) struct AffineGrid {
    /// Offset of the first candidate from `nmax` (negative: a coarser grid first).
    pub rmin: f32,
    /// Spacing of the candidates.
    pub rdelta: f32,
    /// Number of candidates after the first.
    pub steps: u32,
    /// Weighted absolute error instead of weighted squared error.
    pub mad: bool,
}

/// A fitted affine group: value `scale · code − min`, codes in `[0, nmax]`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Affine {
    /// Step between codes (≥ 0 in practice).
    pub scale: f32,
    /// The amount subtracted (≥ 0: the offset is never positive, so 0 stays representable).
    pub min: f32,
}

/// The weighted error of decoding `codes` as `scale · code + offset`.
fn affine_error(x: &[f32], w: &[f32], codes: &[u8], scale: f32, offset: f32, mad: bool) -> f32 {
    let mut err = 0.0f32;
    for ((&v, &wi), &c) in x.iter().zip(w).zip(codes) {
        let diff = scale * c as f32 + offset - v;
        err += wi * if mad { diff.abs() } else { diff * diff };
    }
    err
}

/// Codes in `[0, nmax]` for an affine group (Q2_K, Q4_K, Q5_K sub-blocks) with per-element
/// weights `w`; returns the fit.
///
/// Starts from the plain min/max grid, then for each candidate grid rounds the elements and
/// solves the weighted least-squares line through (code, value) — slope the scale, intercept
/// the offset, which is pinned to 0 when it comes out positive — keeping whichever candidate
/// has the smallest weighted error. Each candidate grid starts at the best offset found so far
/// rather than at the block minimum, so the grid follows the fit as it improves. (ggml's
/// `make_qkx2_quants`, where one variable is both; the bytes depend on it.)
pub(super) fn affine_search(
    x: &[f32],
    w: &[f32],
    nmax: u8,
    grid: AffineGrid,
    codes: &mut [u8],
) -> Affine {
    let (mut lo, mut hi) = (x[0], x[0]);
    let (mut sum_w, mut sum_x) = (w[0], w[0] * x[0]);
    for (&v, &wi) in x.iter().zip(w).skip(1) {
        if v < lo {
            lo = v;
        }
        if v > hi {
            hi = v;
        }
        sum_w += wi;
        sum_x += wi * v;
    }
    // The offset may only be negative: a block that is all positive still starts at zero.
    if lo > 0.0 {
        lo = 0.0;
    }
    if hi == lo {
        codes.fill(0);
        return Affine {
            scale: 0.0,
            min: -lo,
        };
    }
    let nmax_f = f32::from(nmax);
    let code_of = |iscale: f32, v: f32, origin: f32| {
        nearest_int(iscale * (v - origin)).clamp(0, i32::from(nmax))
    };
    let iscale = nmax_f / (hi - lo);
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = code_of(iscale, v, lo) as u8;
    }
    // The line `scale · code + offset` with the smallest error so far.
    let (mut best_scale, mut best_offset) = (1.0 / iscale, lo);
    let mut best_err = affine_error(x, w, codes, best_scale, best_offset, grid.mad);
    let mut trial = [0u8; 32];
    let trial = &mut trial[..x.len()];
    for k in 0..=grid.steps {
        let iscale = (grid.rmin + grid.rdelta * k as f32 + nmax_f) / (hi - best_offset);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((c, &v), &wi) in trial.iter_mut().zip(x).zip(w) {
            let l = code_of(iscale, v, best_offset);
            *c = l as u8;
            let l = l as f32;
            sum_l += wi * l;
            sum_l2 += wi * l * l;
            sum_xl += wi * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det <= 0.0 || det.is_nan() {
            continue;
        }
        let mut scale = (sum_w * sum_xl - sum_x * sum_l) / det;
        let mut offset = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if offset > 0.0 {
            offset = 0.0;
            scale = sum_xl / sum_l2;
        }
        let err = affine_error(x, w, trial, scale, offset, grid.mad);
        if err < best_err {
            codes.copy_from_slice(trial);
            best_err = err;
            (best_scale, best_offset) = (scale, offset);
        }
    }
    Affine {
        scale: best_scale,
        min: -best_offset,
    }
}
