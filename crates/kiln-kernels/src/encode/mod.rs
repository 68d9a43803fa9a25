//! Weight encoders: f32 rows to ggml block bytes, for writing quantized model files.
//!
//! These are the inverse of [`crate::format::dequant`] and follow llama.cpp's *reference* quantizers
//! (`quantize_row_*_ref`, the path `llama-quantize` takes without an importance matrix): the
//! same searches, the same float operations in the same order, round-to-nearest f16 scales, so
//! the bytes are identical to ggml's (see `tests.rs`, which checks them against a golden file
//! made by ggml itself). Per-block arithmetic only, so rows (and blocks) encode independently
//! and the parallel split of [`encode_rows`] cannot change a byte.
//!
//! Non-finite inputs do not panic; they spoil the block (or K-quant super-block) that holds
//! them, exactly as in ggml, and leave every other block untouched.

mod kquant;
mod kquant_search;
mod legacy;

use crate::error::{KernelError, Result};
use crate::format::types::GgmlType;

/// Below this many elements [`encode_rows`] stays on the calling thread.
const MIN_PARALLEL_ELEMS: usize = 1 << 16;

/// Whether [`encode_row`] handles `ty`: every weight type of this crate, not the
/// activation-only formats Q8_1 and Q8_K.
pub fn can_encode(ty: GgmlType) -> bool {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => {
            true
        }
        Q8_1 | Q8_K => false,
    }
}

fn check_encodable(ty: GgmlType) -> Result<()> {
    if can_encode(ty) {
        Ok(())
    } else {
        Err(KernelError::Unsupported { op: "encode", ty })
    }
}

/// Encodes one row into `out` (`out.len() == ty.row_bytes(row.len())`). Errors when `ty`
/// cannot be encoded, `row.len()` is not a whole number of blocks, or `out` has the wrong
/// length.
pub fn encode_row(ty: GgmlType, row: &[f32], out: &mut [u8]) -> Result<()> {
    check_encodable(ty)?;
    let need = ty.row_bytes(row.len())?;
    if out.len() != need {
        return Err(KernelError::LengthMismatch {
            what: "encode_row output bytes",
            expected: need,
            actual: out.len(),
        });
    }
    encode_checked(ty, row, out)
}

/// Encodes `rows × cols` row-major f32 values as `ty` (row by row; rows in parallel on the
/// process-wide pool). Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
/// Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Errors ([`KernelError`]) when `cols` is not a
/// multiple of the type's block size, `data.len() != rows * cols`, or the type cannot be
/// encoded (Q8_1, Q8_K).
pub fn encode_rows(ty: GgmlType, data: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>> {
    check_encodable(ty)?;
    let row_bytes = ty.row_bytes(cols)?;
    let n = rows
        .checked_mul(cols)
        .ok_or(KernelError::Overflow("encode_rows elements"))?;
    if data.len() != n {
        return Err(KernelError::LengthMismatch {
            what: "encode_rows input",
            expected: n,
            actual: data.len(),
        });
    }
    let total = rows
        .checked_mul(row_bytes)
        .ok_or(KernelError::Overflow("encode_rows bytes"))?;
    let mut out = vec![0u8; total];
    if n == 0 {
        return Ok(out);
    }
    if n < MIN_PARALLEL_ELEMS || rows == 1 {
        encode_piece(ty, data, &mut out, cols, row_bytes)?;
        return Ok(out);
    }
    // One row per piece on the process-wide pool (so `-t` holds), at least
    // MIN_PARALLEL_ELEMS values per task.
    let rows_per_task = MIN_PARALLEL_ELEMS.div_ceil(cols);
    let failure = std::sync::Mutex::new(None);
    crate::pool::for_each_chunk_mut(&mut out, row_bytes, rows_per_task, |r, o| {
        if let Err(e) = encode_checked(ty, &data[r * cols..(r + 1) * cols], o) {
            *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
    });
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Encodes consecutive rows of `cols` elements (`row_bytes` each), lengths already checked.
fn encode_piece(
    ty: GgmlType,
    x: &[f32],
    o: &mut [u8],
    cols: usize,
    row_bytes: usize,
) -> Result<()> {
    for (row, out) in x.chunks_exact(cols).zip(o.chunks_exact_mut(row_bytes)) {
        encode_checked(ty, row, out)?;
    }
    Ok(())
}

/// `f` on every `N`-element block of `row` and its `B`-byte slot of `out`.
fn per_block<const N: usize, const B: usize>(
    row: &[f32],
    out: &mut [u8],
    f: impl Fn(&[f32; N], &mut [u8; B]),
) {
    let (xs, _) = row.as_chunks::<N>();
    let (os, _) = out.as_chunks_mut::<B>();
    for (x, o) in xs.iter().zip(os) {
        f(x, o);
    }
}

/// Dispatches one row whose lengths [`encode_row`] / [`encode_rows`] validated.
fn encode_checked(ty: GgmlType, row: &[f32], out: &mut [u8]) -> Result<()> {
    use GgmlType::*;
    match ty {
        F32 => per_block(row, out, |x: &[f32; 1], o: &mut [u8; 4]| {
            *o = x[0].to_le_bytes();
        }),
        F16 => encode_f16(row, out),
        BF16 => per_block(row, out, |x: &[f32; 1], o: &mut [u8; 2]| {
            *o = half::bf16::from_f32(x[0]).to_bits().to_le_bytes();
        }),
        Q4_0 => per_block(row, out, legacy::q4_0),
        Q4_1 => per_block(row, out, legacy::q4_1),
        Q5_0 => per_block(row, out, legacy::q5_0),
        Q5_1 => per_block(row, out, legacy::q5_1),
        Q8_0 => per_block(row, out, legacy::q8_0),
        Q2_K => per_block(row, out, kquant::q2_k),
        Q3_K => per_block(row, out, kquant::q3_k),
        Q4_K => per_block(row, out, kquant::q4_k),
        Q5_K => per_block(row, out, kquant::q5_k),
        Q6_K => per_block(row, out, kquant::q6_k),
        Q8_1 | Q8_K => return check_encodable(ty),
    }
    Ok(())
}

/// f16 with round-to-nearest-even (ggml's `GGML_FP32_TO_FP16`), through `half`'s slice
/// conversion, which uses the CPU's conversion instructions where it can.
fn encode_f16(row: &[f32], out: &mut [u8]) {
    use half::slice::HalfFloatSliceExt;
    const CHUNK: usize = 256;
    let mut buf = [half::f16::ZERO; CHUNK];
    for (x, o) in row.chunks(CHUNK).zip(out.chunks_mut(2 * CHUNK)) {
        let h = &mut buf[..x.len()];
        h.convert_from_f32_slice(x);
        for (v, b) in h.iter().zip(o.chunks_exact_mut(2)) {
            b.copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests;
