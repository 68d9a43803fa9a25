//! Encoders for the legacy 32-element block formats, as ggml's reference quantizers
//! (`quantize_row_q{4_0,4_1,5_0,5_1,8_0}_ref`) produce them: one pass for the range, one scale
//! (and for the `_1` formats a minimum) per block, then each value rounded onto the grid.
//!
//! ggml rounds by adding one half and converting to an 8-bit integer, a C conversion that
//! truncates toward zero. It is exact for the values a block normally produces; only when the
//! reciprocal scale overflows (a block of subnormals) does a value leave the 8-bit range, and
//! there the bytes follow what ggml's x86-64 build does (see [`c_to_byte`]).

use super::kquant_search::signed_absmax;
use crate::format::blocks::{Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES};
use crate::format::types::QK;
use half::f16;

/// C's `(int8_t)v` / `(uint8_t)v` as ggml's x86-64 build computes it: truncation to a 32-bit
/// integer (`cvttss2si`, which yields `i32::MIN` for NaN and out-of-range values) keeping the
/// low byte. Rust's saturating `as u8` would differ for those values.
#[inline(always)]
fn c_to_byte(v: f32) -> u8 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        v as i32 as u8
    } else {
        0
    }
}

/// `MIN(top, (int8_t)v)` as ggml computes a code: a signed comparison, then stored as a byte.
#[inline(always)]
fn code_at_most(v: f32, top: i8) -> u8 {
    (c_to_byte(v) as i8).min(top) as u8
}

/// Stores `v` as a little-endian f16 at `out[..2]`.
#[inline(always)]
fn put_f16(out: &mut [u8], v: f32) {
    out[..2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// ggml's `1/d`, or 0 for an empty block.
#[inline(always)]
fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// The block's minimum and maximum (starting from ±`f32::MAX`, as ggml does).
fn min_max(x: &[f32; QK]) -> (f32, f32) {
    let (mut lo, mut hi) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < lo {
            lo = v;
        }
        if v > hi {
            hi = v;
        }
    }
    (lo, hi)
}

/// Packs 32 five-bit codes: low nibbles as Q4 does (element j low, j + 16 high, in byte j),
/// the fifth bits into a u32 with element j at bit j.
fn pack_5bit(codes: &[u8; QK], qh: &mut [u8], qs: &mut [u8]) {
    let mut high = 0u32;
    for (j, q) in qs.iter_mut().enumerate().take(QK / 2) {
        let (a, b) = (codes[j], codes[j + QK / 2]);
        *q = (a & 0xF) | ((b & 0xF) << 4);
        high |= u32::from((a & 0x10) >> 4) << j;
        high |= u32::from((b & 0x10) >> 4) << (j + QK / 2);
    }
    qh[..4].copy_from_slice(&high.to_le_bytes());
}

/// Q4_0: `x ≈ d·(q − 8)`. The element of largest magnitude gets code 0 (−8, the wider end),
/// so `d = max / −8` carries its sign.
pub(super) fn q4_0(x: &[f32; QK], out: &mut [u8; Q4_0_BYTES]) {
    let (_, max) = signed_absmax(x);
    let d = max / -8.0;
    let id = inverse(d);
    put_f16(&mut out[..2], d);
    for (j, q) in out[2..].iter_mut().enumerate() {
        let lo = code_at_most(x[j] * id + 8.5, 15);
        let hi = code_at_most(x[j + QK / 2] * id + 8.5, 15);
        *q = lo | (hi << 4);
    }
}

/// Q4_1: `x ≈ d·q + m` with `m` the block minimum and 15 steps up to the maximum.
pub(super) fn q4_1(x: &[f32; QK], out: &mut [u8; Q4_1_BYTES]) {
    let (lo, hi) = min_max(x);
    let d = (hi - lo) / 15.0;
    let id = inverse(d);
    put_f16(&mut out[..2], d);
    put_f16(&mut out[2..4], lo);
    for (j, q) in out[4..].iter_mut().enumerate() {
        let a = code_at_most((x[j] - lo) * id + 0.5, 15);
        let b = code_at_most((x[j + QK / 2] - lo) * id + 0.5, 15);
        *q = a | (b << 4);
    }
}

/// Q5_0: `x ≈ d·(q − 16)`, `d = max / −16` as for Q4_0.
pub(super) fn q5_0(x: &[f32; QK], out: &mut [u8; Q5_0_BYTES]) {
    let (_, max) = signed_absmax(x);
    let d = max / -16.0;
    let id = inverse(d);
    put_f16(&mut out[..2], d);
    let codes: [u8; QK] = std::array::from_fn(|j| code_at_most(x[j] * id + 16.5, 31));
    let (qh, qs) = out[2..].split_at_mut(4);
    pack_5bit(&codes, qh, qs);
}

/// Q5_1: `x ≈ d·q + m` with 31 steps from the minimum to the maximum. (ggml applies no upper
/// clamp here; the top value rounds to 31 anyway.)
pub(super) fn q5_1(x: &[f32; QK], out: &mut [u8; Q5_1_BYTES]) {
    let (lo, hi) = min_max(x);
    let d = (hi - lo) / 31.0;
    let id = inverse(d);
    put_f16(&mut out[..2], d);
    put_f16(&mut out[2..4], lo);
    let codes: [u8; QK] = std::array::from_fn(|j| c_to_byte((x[j] - lo) * id + 0.5));
    let (qh, qs) = out[4..].split_at_mut(4);
    pack_5bit(&codes, qh, qs);
}

/// `(int8_t)roundf(v)` as ggml's build computes it: C's `roundf` (half away from zero), then
/// [`c_to_byte`]. Below 2^23 the rounding is done by hand, as in [`crate::quantize`]: `f32::round`
/// is a libm call on baseline x86-64. Truncation and the fraction `v - t` are exact there, and
/// twice the fraction truncates to ±1 exactly when it reaches one half. From 2^23 up, `v` is
/// already an integer (or not finite) and `roundf` returns it unchanged.
#[inline(always)]
fn c_round_to_byte(v: f32) -> u8 {
    if v.abs() < 8_388_608.0 {
        let t = v as i32;
        (t + (2.0 * (v - t as f32)) as i32) as u8
    } else {
        c_to_byte(v)
    }
}

/// Q8_0: `x ≈ d·q`, `d = amax / 127`, `q = round(x / d)` half away from zero.
///
/// Not [`crate::quantize::quantize_row_q8_0`], although the Q8_0 activations use the same
/// ggml reference: that one saturates to ±127 where C's conversion wraps, which shows when the
/// reciprocal scale overflows (a block of subnormals); weight files must match ggml there too.
pub(super) fn q8_0(x: &[f32; QK], out: &mut [u8; Q8_0_BYTES]) {
    let amax = x
        .iter()
        .fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() });
    let d = amax / 127.0;
    let id = inverse(d);
    put_f16(&mut out[..2], d);
    for (q, &v) in out[2..].iter_mut().zip(x) {
        *q = c_round_to_byte(v * id);
    }
}
