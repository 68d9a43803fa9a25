//! Activation quantization (scalar reference, ggml-exact) and the reusable buffer that holds
//! quantized activation rows for the dot products.
//!
//! ggml pairs each weight type with an activation format ("vec_dot_type"): Q4_0/Q5_0/Q8_0
//! with Q8_0, Q4_1/Q5_1 with Q8_1, the K-quants with Q8_K, float weights with f32 here.
//! The quantizers below follow ggml's `quantize_row_*_ref` arithmetic step by step (same
//! scale formula, `roundf` = round half away from zero for Q8_0/Q8_1, the `nearest_int`
//! magic-number rounding = round half to even for Q8_K) so the integer codes are identical.
//! Note: ggml's own AVX2 `quantize_row_q8_0/1` differ slightly from its reference (they use
//! `127/amax` and round-half-even); this crate follows the reference.

use crate::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K};
use crate::error::{KernelError, Result};
use crate::types::{GgmlType, QK, QK_K};
use half::f16;

/// Activation format that a weight type's dot product consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActFormat {
    /// Plain f32 (float weight types).
    F32,
    /// Q8_0 blocks (Q4_0, Q5_0, Q8_0 weights).
    Q8_0,
    /// Q8_1 blocks (Q4_1, Q5_1 weights).
    Q8_1,
    /// Q8_K super-blocks (K-quant weights).
    Q8K,
}

impl ActFormat {
    /// The activation format `weight` is multiplied against; Q8_1/Q8_K are activation-only
    /// formats and have no dot product as weights.
    pub fn for_weight(weight: GgmlType) -> Result<Self> {
        use GgmlType::*;
        Ok(match weight {
            F32 | F16 | BF16 => ActFormat::F32,
            Q4_0 | Q5_0 | Q8_0 => ActFormat::Q8_0,
            Q4_1 | Q5_1 => ActFormat::Q8_1,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => ActFormat::Q8K,
            Q8_1 | Q8_K => {
                return Err(KernelError::Unsupported {
                    op: "vec_dot (as weight type)",
                    ty: weight,
                });
            }
        })
    }

    /// Elements per block of this format.
    pub fn block_elems(self) -> usize {
        match self {
            ActFormat::F32 => 1,
            ActFormat::Q8_0 | ActFormat::Q8_1 => QK,
            ActFormat::Q8K => QK_K,
        }
    }
}

fn check_blocks(what: &'static str, x_len: usize, blocks: usize, per: usize) -> Result<()> {
    let expected = blocks
        .checked_mul(per)
        .ok_or(KernelError::Overflow("quantize length"))?;
    if x_len != expected {
        return Err(KernelError::LengthMismatch {
            what,
            expected,
            actual: x_len,
        });
    }
    Ok(())
}

/// ggml's `MAX(a, b)` macro: `a > b ? a : b` (NaN handling included).
#[inline(always)]
fn c_max(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// Quantizes `x` (length `32 * y.len()`) to Q8_0 exactly as ggml's `quantize_row_q8_0_ref`.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) -> Result<()> {
    check_blocks("quantize_row_q8_0 input", x.len(), y.len(), QK)?;
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| c_max(m, v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
    Ok(())
}

/// Quantizes `x` (length `32 * y.len()`) to Q8_1 exactly as ggml's `quantize_row_q8_1_ref`;
/// `s` is `sum(q) * d` with the unrounded f32 `d`.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) -> Result<()> {
    check_blocks("quantize_row_q8_1 input", x.len(), y.len(), QK)?;
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| c_max(m, v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        let mut sum: i32 = 0;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        yb.s = f16::from_f32(sum as f32 * d);
    }
    Ok(())
}

/// ggml's `nearest_int`: adding 1.5·2^23 pushes the fraction out of the mantissa, so the FPU's
/// round-to-nearest-even does the rounding; valid for |x| < 2^22.
#[inline(always)]
fn nearest_int(f: f32) -> i32 {
    let v = f + 12_582_912.0;
    (v.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// Quantizes `x` (length `256 * y.len()`) to Q8_K exactly as ggml's `quantize_row_q8_K_ref`
/// (scale from the signed element of largest magnitude, `d = 1 / (-127 / max)`).
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) -> Result<()> {
    check_blocks("quantize_row_q8_k input", x.len(), y.len(), QK_K)?;
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            // ggml leaves bsums untouched here; zero is what they would sum to.
            *yb = BlockQ8K::default();
            continue;
        }
        let iscale = -127.0f32 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, g) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i16).sum();
        }
        yb.d = 1.0 / iscale;
    }
    Ok(())
}

/// One row of activations in the format a dot product consumes.
#[derive(Debug, Clone, Copy)]
pub enum ActRow<'a> {
    /// Plain floats.
    F32(&'a [f32]),
    /// Q8_0 blocks.
    Q8_0(&'a [BlockQ8_0]),
    /// Q8_1 blocks.
    Q8_1(&'a [BlockQ8_1]),
    /// Q8_K super-blocks.
    Q8K(&'a [BlockQ8K]),
}

impl ActRow<'_> {
    /// The format of this row.
    pub fn format(&self) -> ActFormat {
        match self {
            ActRow::F32(_) => ActFormat::F32,
            ActRow::Q8_0(_) => ActFormat::Q8_0,
            ActRow::Q8_1(_) => ActFormat::Q8_1,
            ActRow::Q8K(_) => ActFormat::Q8K,
        }
    }

    /// Number of (logical) elements in the row.
    pub fn n_elems(&self) -> usize {
        match self {
            ActRow::F32(v) => v.len(),
            ActRow::Q8_0(v) => v.len() * QK,
            ActRow::Q8_1(v) => v.len() * QK,
            ActRow::Q8K(v) => v.len() * QK_K,
        }
    }
}

/// Reusable buffer of quantized activation rows; once it has held the largest shape it
/// sees, later calls do not allocate.
#[derive(Debug, Clone)]
pub struct QuantizedActivations {
    format: ActFormat,
    n_rows: usize,
    cols: usize,
    f32s: Vec<f32>,
    q8_0: Vec<BlockQ8_0>,
    q8_1: Vec<BlockQ8_1>,
    q8k: Vec<BlockQ8K>,
}

impl Default for QuantizedActivations {
    fn default() -> Self {
        Self::new()
    }
}

impl QuantizedActivations {
    /// An empty buffer.
    pub fn new() -> Self {
        Self {
            format: ActFormat::F32,
            n_rows: 0,
            cols: 0,
            f32s: Vec::new(),
            q8_0: Vec::new(),
            q8_1: Vec::new(),
            q8k: Vec::new(),
        }
    }

    /// The format of the rows currently held.
    pub fn format(&self) -> ActFormat {
        self.format
    }

    /// Number of rows currently held.
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Elements per row currently held.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Quantizes one activation row `x` for a dot product with weights of type `weight_ty`.
    pub fn quantize_into(&mut self, weight_ty: GgmlType, x: &[f32]) -> Result<()> {
        self.quantize_rows_into(weight_ty, x, 1)
    }

    /// Quantizes `n_rows` activation rows (`x` is `[n_rows, cols]` row-major) for weights of
    /// type `weight_ty`; `cols` must be a multiple of the activation block size.
    pub fn quantize_rows_into(
        &mut self,
        weight_ty: GgmlType,
        x: &[f32],
        n_rows: usize,
    ) -> Result<()> {
        let format = ActFormat::for_weight(weight_ty)?;
        let cols = x.len().checked_div(n_rows).unwrap_or(0);
        if cols.checked_mul(n_rows) != Some(x.len()) {
            return Err(KernelError::LengthMismatch {
                what: "activation rows",
                expected: cols.saturating_mul(n_rows),
                actual: x.len(),
            });
        }
        // The weight type's block size is what must divide cols (K-quants need 256).
        weight_ty.n_blocks(cols)?;
        let nb = cols / format.block_elems();
        let total = nb * n_rows;
        // Reset first so a failure below leaves an empty, consistent buffer.
        self.n_rows = 0;
        self.cols = 0;
        self.format = format;
        match format {
            ActFormat::F32 => {
                self.f32s.clear();
                self.f32s.extend_from_slice(x);
            }
            ActFormat::Q8_0 => {
                self.q8_0.resize(total, BlockQ8_0::default());
                quantize_row_q8_0(x, &mut self.q8_0[..total])?;
            }
            ActFormat::Q8_1 => {
                self.q8_1.resize(total, BlockQ8_1::default());
                quantize_row_q8_1(x, &mut self.q8_1[..total])?;
            }
            ActFormat::Q8K => {
                self.q8k.resize(total, BlockQ8K::default());
                quantize_row_q8_k(x, &mut self.q8k[..total])?;
            }
        }
        self.n_rows = n_rows;
        self.cols = cols;
        Ok(())
    }

    /// Row `t` of the held activations, or `None` if out of range.
    pub fn row(&self, t: usize) -> Option<ActRow<'_>> {
        if t >= self.n_rows {
            return None;
        }
        let per = self.cols / self.format.block_elems();
        let r = t * per..(t + 1) * per;
        Some(match self.format {
            ActFormat::F32 => ActRow::F32(self.f32s.get(r)?),
            ActFormat::Q8_0 => ActRow::Q8_0(self.q8_0.get(r)?),
            ActFormat::Q8_1 => ActRow::Q8_1(self.q8_1.get(r)?),
            ActFormat::Q8K => ActRow::Q8K(self.q8k.get(r)?),
        })
    }
}
