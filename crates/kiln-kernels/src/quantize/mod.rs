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

use crate::error::{KernelError, Result};
use crate::format::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K};
use crate::level::{CpuLevel, cpu_level};
use crate::quantize::interleave::{BlockQ8_0x4, pack_row_q8_0x4, x4_groups};

pub mod interleave;
mod round;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::format::types::{GgmlType, QK, QK_K};
use half::f16;
use round::{block_amax, round_block};

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
pub(super) fn c_max(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// Quantizes `x` (length `32 * y.len()`) to Q8_0 exactly as ggml's `quantize_row_q8_0_ref`.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) -> Result<()> {
    check_blocks("quantize_row_q8_0 input", x.len(), y.len(), QK)?;
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let amax = block_amax(xb);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        round_block(xb, amax, id, &mut yb.qs);
    }
    Ok(())
}

/// Quantizes `x` (length `32 * y.len()`) to Q8_1 exactly as ggml's `quantize_row_q8_1_ref`;
/// `s` is `sum(q) * d` with the unrounded f32 `d`.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) -> Result<()> {
    check_blocks("quantize_row_q8_1 input", x.len(), y.len(), QK)?;
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let amax = block_amax(xb);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        round_block(xb, amax, id, &mut yb.qs);
        let sum: i32 = yb.qs.iter().map(|&q| q as i32).sum();
        yb.s = f16::from_f32(sum as f32 * d);
    }
    Ok(())
}

/// Defines `$name(level, x, y)`: the scalar quantizer `$reference` at `level` (clamped to the
/// hardware), run by the AVX2 quantizer `x86::$avx2` from [`CpuLevel::Avx2`] up, with the
/// same bytes.
macro_rules! quantize_at {
    ($(#[$doc:meta])* $name:ident, $block:ty, $len:expr, $reference:ident, $avx2:ident) => {
        $(#[$doc])*
        pub(crate) fn $name(level: CpuLevel, x: &[f32], y: &mut [$block]) -> Result<()> {
            check_blocks(concat!(stringify!($reference), " input"), x.len(), y.len(), $len)?;
            #[cfg(target_arch = "x86_64")]
            if level.clamp_to_hardware() >= CpuLevel::Avx2 {
                // SAFETY: the clamped level guarantees avx2, fma and f16c.
                unsafe { x86::$avx2(x, y) };
                return Ok(());
            }
            let _ = level;
            $reference(x, y)
        }
    };
}

quantize_at!(
    /// [`quantize_row_q8_0`] at `level`, AVX2 from [`CpuLevel::Avx2`] up.
    quantize_q8_0_at, BlockQ8_0, QK, quantize_row_q8_0, q8_0
);
quantize_at!(
    /// [`quantize_row_q8_1`] at `level`, AVX2 from [`CpuLevel::Avx2`] up.
    quantize_q8_1_at, BlockQ8_1, QK, quantize_row_q8_1, q8_1
);
quantize_at!(
    /// [`quantize_row_q8_k`] at `level`, AVX2 from [`CpuLevel::Avx2`] up.
    quantize_q8_k_at, BlockQ8K, QK_K, quantize_row_q8_k, q8_k
);

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
    /// Interleaved copy of the Q8_0 rows for the AVX-512 tiles, built on demand.
    q8_0x4: Vec<BlockQ8_0x4>,
    x4_ready: bool,
    /// Per block, for the repacked kernels (built on demand): Q8_1, the exact `f16(d)·Σq` (the
    /// block's own `s` is rounded to f16); Q8_0, the integer `Σq`.
    block_sums: Vec<f32>,
    sums_ready: bool,
}

/// Quantizes `x` into `y` (`elems` values per block) with `f`, split across the pool in
/// pieces of whole blocks when there is enough to pay for a dispatch (a prefill chunk). Blocks
/// are quantized independently, so the split does not change a byte.
fn par_blocks<B: Send>(
    x: &[f32],
    y: &mut [B],
    elems: usize,
    f: impl Fn(&[f32], &mut [B]) -> Result<()> + Sync,
) -> Result<()> {
    const MIN_PARALLEL: usize = 1 << 15;
    const PIECE: usize = 1 << 13;
    if x.len() < MIN_PARALLEL {
        return f(x, y);
    }
    let per_piece = (PIECE / elems).max(1);
    let failed = std::sync::atomic::AtomicBool::new(false);
    crate::pool::for_each_chunk_mut(y, per_piece, 1, |c, piece| {
        let start = c * per_piece * elems;
        let xs = x.get(start..start + piece.len() * elems).unwrap_or(&[]);
        if f(xs, piece).is_err() {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    if failed.into_inner() {
        // The lengths were checked by the caller; redo serially for the error itself.
        return f(x, y);
    }
    Ok(())
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
            q8_0x4: Vec::new(),
            x4_ready: false,
            block_sums: Vec::new(),
            sums_ready: false,
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
        self.x4_ready = false;
        self.sums_ready = false;
        match format {
            ActFormat::F32 => {
                self.f32s.clear();
                self.f32s.extend_from_slice(x);
            }
            ActFormat::Q8_0 => {
                self.q8_0.resize(total, BlockQ8_0::default());
                par_blocks(x, &mut self.q8_0[..total], QK, |x, y| {
                    quantize_q8_0_at(cpu_level(), x, y)
                })?;
            }
            ActFormat::Q8_1 => {
                self.q8_1.resize(total, BlockQ8_1::default());
                par_blocks(x, &mut self.q8_1[..total], QK, |x, y| {
                    quantize_q8_1_at(cpu_level(), x, y)
                })?;
            }
            ActFormat::Q8K => {
                self.q8k.resize(total, BlockQ8K::default());
                par_blocks(x, &mut self.q8k[..total], QK_K, |x, y| {
                    quantize_q8_k_at(cpu_level(), x, y)
                })?;
            }
        }
        self.n_rows = n_rows;
        self.cols = cols;
        Ok(())
    }

    /// Builds the interleaved copy of Q8_0 rows that the AVX-512 Q8_0 / Q5_0 tiles read
    /// (see [`crate::quantize::interleave`]); does nothing for other formats or if already built.
    pub(crate) fn prepare_q8_0x4(&mut self) {
        if self.x4_ready || self.format != ActFormat::Q8_0 {
            return;
        }
        let per = self.cols / QK;
        let groups = x4_groups(per);
        self.q8_0x4
            .resize(groups * self.n_rows, BlockQ8_0x4::default());
        if per > 0 {
            let src = self.q8_0[..per * self.n_rows].chunks_exact(per);
            for (s, d) in src.zip(self.q8_0x4.chunks_exact_mut(groups)) {
                pack_row_q8_0x4(s, d);
            }
        }
        self.x4_ready = true;
    }

    /// Builds [`QuantizedActivations::row_block_sums`] for the current rows (no-op for the
    /// formats without them, or when already built). Both kinds are exact in f32: `|Σq|` is
    /// below 2^12, and `f16(d)·Σq` an 11-bit significand times such an integer. ggml's Q8_1 `s`
    /// rounds `d·Σq` to f16 with the unrounded `d`.
    pub(crate) fn prepare_block_sums(&mut self) {
        if self.sums_ready {
            return;
        }
        let per = self.cols / QK;
        let n = self.n_rows * per;
        let isum = |qs: &[i8; 32]| qs.iter().map(|&q| i32::from(q)).sum::<i32>() as f32;
        self.block_sums.clear();
        match self.format {
            ActFormat::Q8_1 => self
                .block_sums
                .extend(self.q8_1[..n].iter().map(|b| b.d.to_f32() * isum(&b.qs))),
            ActFormat::Q8_0 => self
                .block_sums
                .extend(self.q8_0[..n].iter().map(|b| isum(&b.qs))),
            ActFormat::F32 | ActFormat::Q8K => return,
        }
        self.sums_ready = true;
    }

    /// Row `t` of the block sums, or `None` if they are not built or `t` is out of range.
    pub(crate) fn row_block_sums(&self, t: usize) -> Option<&[f32]> {
        if !self.sums_ready || t >= self.n_rows {
            return None;
        }
        let per = self.cols / QK;
        self.block_sums.get(t * per..(t + 1) * per)
    }

    /// Row `t` of the interleaved copy, or `None` if it is not built or `t` is out of range.
    pub(crate) fn row_q8_0x4(&self, t: usize) -> Option<&[BlockQ8_0x4]> {
        if !self.x4_ready || t >= self.n_rows {
            return None;
        }
        let groups = x4_groups(self.cols / QK);
        self.q8_0x4.get(t * groups..(t + 1) * groups)
    }

    /// A buffer holding copies of `rows`, which must share one format and length (callers
    /// check; a row of another length or format is dropped, and later rows shift up).
    pub(crate) fn from_rows(rows: &[ActRow<'_>]) -> Self {
        let mut s = Self::new();
        let Some(first) = rows.first() else {
            return s;
        };
        let (format, cols) = (first.format(), first.n_elems());
        for r in rows {
            if r.format() != format || r.n_elems() != cols {
                continue;
            }
            match *r {
                ActRow::F32(v) => s.f32s.extend_from_slice(v),
                ActRow::Q8_0(v) => s.q8_0.extend_from_slice(v),
                ActRow::Q8_1(v) => s.q8_1.extend_from_slice(v),
                ActRow::Q8K(v) => s.q8k.extend_from_slice(v),
            }
            s.n_rows += 1;
        }
        s.format = format;
        s.cols = cols;
        s
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

#[cfg(test)]
mod tests;
