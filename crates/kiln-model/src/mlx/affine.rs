//! MLX's affine quantization, bit for bit: the CPU kernel `quantize` of
//! `mlx/backend/cpu/quantized.cpp` (MLX 0.32; its graph fallback in `mlx/ops.cpp` computes the
//! same), golden-tested against `mx.quantize` / `mx.dequantize` output.
//!
//! Per group of `group_size` consecutive elements of a row, in **f32** arithmetic on the input
//! values (a bf16 weight is widened to f32 first):
//! - `scale = max((max − min) / (2^bits − 1), 1e-7)`, made negative unless `|min| > |max|`;
//! - `edge` = the larger-magnitude extreme (`min` when `|min| > |max|`, else `max`);
//! - `q0 = rint(edge / scale)`; when `q0 ≠ 0` the scale becomes `edge / q0` and the bias `edge`
//!   (so that extreme is hit exactly), otherwise the bias is 0;
//! - codes `q = clamp(rint((w − bias) / scale), 0, 2^bits − 1)`, rounding half to even, computed
//!   with the *f32* scale and bias; only afterwards are scale and bias rounded to the weight's
//!   dtype (bf16 here) for storage.
//!
//! Codes are packed as one little-endian bit stream per row: code `i` occupies bits
//! `[i·bits, (i+1)·bits)`, so for 2/4/8 bits each u32 word holds `32/bits` whole codes (lowest
//! index in the least significant bits) and for 3/5/6 bits codes straddle word boundaries (MLX
//! writes 8 codes per 3 or 5 bytes, 4 codes per 3 bytes, which is the same stream).

use half::bf16;

use crate::ModelError;

/// Bit widths MLX's affine mode supports.
pub const SUPPORTED_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes MLX's affine mode supports.
pub const SUPPORTED_GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// MLX's floor on the scale, so a constant group does not divide by zero.
const EPS: f32 = 1e-7;

/// One matrix quantized MLX-style: groups of `group_size` along each row.
#[derive(Debug, Clone, PartialEq)]
pub struct AffineMatrix {
    /// Number of rows (output features).
    pub rows: usize,
    /// Logical elements per row (input features).
    pub cols: usize,
    /// Bits per code.
    pub bits: u32,
    /// Elements sharing one scale and bias.
    pub group_size: usize,
    /// [rows, cols*bits/32] little-endian uint32 words, lowest-index code in the least significant bits.
    pub packed: Vec<u32>,
    /// [rows, cols/group_size], bf16, as MLX stores them for a bf16 weight.
    pub scales: Vec<bf16>,
    /// [rows, cols/group_size], bf16: the value code 0 stands for.
    pub biases: Vec<bf16>,
}

impl AffineMatrix {
    /// u32 words per packed row (`cols·bits/32`).
    pub fn packed_cols(&self) -> usize {
        self.cols.saturating_mul(self.bits as usize) / 32
    }

    /// Groups per row (`cols/group_size`).
    pub fn groups_per_row(&self) -> usize {
        self.cols.checked_div(self.group_size).unwrap_or(0)
    }

    /// Whether `bits` and `group_size` are MLX's and the buffers have the lengths the shape
    /// implies (always so for [`affine_quantize`]'s output).
    pub fn is_consistent(&self) -> bool {
        let groups = self.rows.checked_mul(self.cols / self.group_size.max(1));
        check_params(self.bits, self.group_size).is_ok()
            && self.cols.is_multiple_of(self.group_size)
            && self.rows.checked_mul(self.packed_cols()) == Some(self.packed.len())
            && groups == Some(self.scales.len())
            && groups == Some(self.biases.len())
    }

    /// Every code, row-major, one byte each (empty unless [`AffineMatrix::is_consistent`]).
    pub fn codes(&self) -> Vec<u8> {
        if !self.is_consistent() {
            return Vec::new();
        }
        let mut out = vec![0u8; self.rows * self.cols];
        let pc = self.packed_cols();
        if pc == 0 {
            return out;
        }
        for (words, dst) in self
            .packed
            .chunks_exact(pc)
            .zip(out.chunks_exact_mut(self.cols))
        {
            unpack_row(words.iter().copied(), self.bits, dst);
        }
        out
    }
}

/// Checks `bits` and `group_size` against what MLX's affine mode accepts.
pub fn check_params(bits: u32, group_size: usize) -> Result<(), String> {
    if !SUPPORTED_BITS.contains(&bits) {
        return Err(format!(
            "bits {bits} is not supported (2, 3, 4, 5, 6, 8 are)"
        ));
    }
    if !SUPPORTED_GROUP_SIZES.contains(&group_size) {
        return Err(format!(
            "group size {group_size} is not supported (32, 64, 128 are)"
        ));
    }
    Ok(())
}

/// Quantizes the row-major `[rows, cols]` matrix `w` exactly as MLX's `mx.quantize(w,
/// group_size, bits)` does for a weight of `w`'s values.
///
/// MLX quantizes the weight in its own dtype (kiln's use: bf16) widened to f32; this function
/// takes the f32 values as given, so a caller that wants MLX-identical output rounds them to bf16
/// first (`bf16::from_f32(x).to_f32()`), as `mx.quantize` on a bf16 array sees them. The stored
/// scales and biases are bf16 whatever the input.
///
/// Errors: unsupported bits or group size, a width not a multiple of the group size, a buffer of
/// the wrong length, or a non-finite value (MLX's output for those is undefined).
pub fn affine_quantize(
    w: &[f32],
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
) -> Result<AffineMatrix, ModelError> {
    let fail = |reason: String| ModelError::Quantization(reason);
    check_params(bits, group_size).map_err(fail)?;
    if cols == 0 || !cols.is_multiple_of(group_size) {
        return Err(fail(format!(
            "width {cols} is not a positive multiple of the group size {group_size}"
        )));
    }
    if rows.checked_mul(cols) != Some(w.len()) {
        return Err(fail(format!(
            "{} values for a [{rows}, {cols}] matrix",
            w.len()
        )));
    }
    if let Some(i) = w.iter().position(|x| !x.is_finite()) {
        return Err(fail(format!(
            "non-finite value {} at row {}, column {}",
            w[i],
            i / cols,
            i % cols
        )));
    }
    let n_bins = ((1u32 << bits) - 1) as f32;
    let groups = rows * (cols / group_size);
    let mut scales = Vec::with_capacity(groups);
    let mut biases = Vec::with_capacity(groups);
    let mut codes = vec![0u8; w.len()];
    for (g, dst) in w
        .chunks_exact(group_size)
        .zip(codes.chunks_exact_mut(group_size))
    {
        let (scale, bias) = group_scale_bias(g, n_bins);
        for (&x, q) in g.iter().zip(dst.iter_mut()) {
            // In range by the clamp, so the cast neither truncates nor saturates.
            *q = ((x - bias) / scale).round_ties_even().clamp(0.0, n_bins) as u8;
        }
        scales.push(bf16::from_f32(scale));
        biases.push(bf16::from_f32(bias));
    }
    let pc = cols * bits as usize / 32;
    let mut packed = vec![0u32; rows * pc];
    for (src, dst) in codes.chunks_exact(cols).zip(packed.chunks_exact_mut(pc)) {
        pack_row(src, bits, dst);
    }
    Ok(AffineMatrix {
        rows,
        cols,
        bits,
        group_size,
        packed,
        scales,
        biases,
    })
}

/// MLX's scale and bias for one group, in f32 (before the cast to the storage dtype).
fn group_scale_bias(g: &[f32], n_bins: f32) -> (f32, f32) {
    let (mut w_min, mut w_max) = (f32::INFINITY, f32::NEG_INFINITY);
    for &x in g {
        w_max = w_max.max(x);
        w_min = w_min.min(x);
    }
    let mask = w_min.abs() > w_max.abs();
    let mut scale = ((w_max - w_min) / n_bins).max(EPS);
    if !mask {
        scale = -scale;
    }
    let edge = if mask { w_min } else { w_max };
    let q0 = (edge / scale).round_ties_even();
    if q0 != 0.0 {
        (edge / q0, edge)
    } else {
        (scale, 0.0)
    }
}

/// Dequantizes to f32: `w = scale·q + bias`, with the bf16 scale and bias widened to f32 and
/// one f32 multiply and one f32 add (no fused multiply-add), which is also what kiln's Q4_1 /
/// Q5_1 dequantization computes, so the two agree exactly.
///
/// Empty for a matrix that is not [`AffineMatrix::is_consistent`].
///
/// MLX's own `mx.dequantize` of a bf16 model rounds `scale·q` to bf16 and then the sum, so its
/// output can differ from this by that double rounding; [`affine_dequantize_bf16`] reproduces it.
pub fn affine_dequantize(m: &AffineMatrix) -> Vec<f32> {
    let scales: Vec<f32> = m.scales.iter().map(|s| s.to_f32()).collect();
    let biases: Vec<f32> = m.biases.iter().map(|b| b.to_f32()).collect();
    let codes = m.codes();
    let mut out = vec![0f32; codes.len()];
    dequantize_codes(&codes, m.group_size, &scales, &biases, &mut out);
    out
}

/// What `mx.dequantize` returns on MLX's CPU for bf16 scales and biases, bit for bit:
/// `bf16(bf16(q·scale) + bias)` (MLX multiplies and adds in bf16, each op rounded). Empty for a
/// matrix that is not [`AffineMatrix::is_consistent`].
pub fn affine_dequantize_bf16(m: &AffineMatrix) -> Vec<bf16> {
    let codes = m.codes();
    let mut out = Vec::with_capacity(codes.len());
    if codes.is_empty() {
        return out;
    }
    let scale_bias = m.scales.iter().zip(&m.biases);
    for (q, (s, b)) in codes.chunks_exact(m.group_size).zip(scale_bias) {
        for &q in q {
            let prod = bf16::from_f32(q as f32 * s.to_f32());
            out.push(bf16::from_f32(prod.to_f32() + b.to_f32()));
        }
    }
    out
}

/// `out[i] = scales[g]·codes[i] + biases[g]` for `g = i / group_size`, in f32.
pub(crate) fn dequantize_codes(
    codes: &[u8],
    group_size: usize,
    scales: &[f32],
    biases: &[f32],
    out: &mut [f32],
) {
    if group_size == 0 {
        return;
    }
    let groups = codes
        .chunks_exact(group_size)
        .zip(out.chunks_exact_mut(group_size));
    for ((q, dst), (&s, &b)) in groups.zip(scales.iter().zip(biases)) {
        for (&q, y) in q.iter().zip(dst.iter_mut()) {
            *y = s * q as f32 + b;
        }
    }
}

/// Packs one row of codes into its bit stream (`dst.len()·32 == codes.len()·bits`).
pub(crate) fn pack_row(codes: &[u8], bits: u32, dst: &mut [u32]) {
    let mut acc = 0u64;
    let mut filled = 0u32;
    let mut words = dst.iter_mut();
    for &q in codes {
        acc |= u64::from(q) << filled;
        filled += bits;
        if filled >= 32 {
            if let Some(w) = words.next() {
                *w = acc as u32;
            }
            acc >>= 32;
            filled -= 32;
        }
    }
}

/// Unpacks a row's bit stream into `dst.len()` codes (missing words read as zero bits).
pub(crate) fn unpack_row(mut words: impl Iterator<Item = u32>, bits: u32, dst: &mut [u8]) {
    let mask = (1u64 << bits) - 1;
    let mut acc = 0u64;
    let mut avail = 0u32;
    for q in dst {
        if avail < bits {
            acc |= u64::from(words.next().unwrap_or(0)) << avail;
            avail += 32;
        }
        *q = (acc & mask) as u8;
        acc >>= bits;
        avail -= bits;
    }
}
