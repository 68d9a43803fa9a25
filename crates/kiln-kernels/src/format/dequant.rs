//! Row dequantization for the float and legacy (32-element block) types. The arithmetic
//! order of every formula matches ggml's reference (`d * q + m`, no fused multiply-add), so
//! the output is bit-identical to ggml / gguf-py.

use crate::error::{KernelError, Result};
use crate::format::blocks::*;
use crate::format::dequant_k;
use crate::format::types::GgmlType;

/// Dequantizes one row of `dst.len()` elements of type `ty` from `src`, which must be exactly
/// `ty.row_bytes(dst.len())` bytes.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let need = ty.row_bytes(dst.len())?;
    if src.len() != need {
        return Err(KernelError::LengthMismatch {
            what: "dequantize_row source bytes",
            expected: need,
            actual: src.len(),
        });
    }
    dequantize_unchecked(ty, src, dst);
    Ok(())
}

/// Dequantizes assuming `src`/`dst` lengths were validated; a mismatch only leaves part of
/// `dst` unwritten, it cannot read out of bounds.
pub(crate) fn dequantize_unchecked(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, b) in dst.iter_mut().zip(src.as_chunks::<4>().0) {
                *o = f32::from_le_bytes(*b);
            }
        }
        GgmlType::F16 => {
            for (o, b) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
                *o = half::f16::from_bits(u16::from_le_bytes(*b)).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, b) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
                *o = f32::from_bits((u16::from_le_bytes(*b) as u32) << 16);
            }
        }
        GgmlType::Q4_0 => q4_0(src.as_chunks().0, dst),
        GgmlType::Q4_1 => q4_1(src.as_chunks().0, dst),
        GgmlType::Q5_0 => q5_0(src.as_chunks().0, dst),
        GgmlType::Q5_1 => q5_1(src.as_chunks().0, dst),
        GgmlType::Q8_0 => q8_0(src.as_chunks().0, dst),
        GgmlType::Q8_1 => q8_1(src.as_chunks().0, dst),
        GgmlType::Q2_K => dequant_k::q2_k(src.as_chunks().0, dst),
        GgmlType::Q3_K => dequant_k::q3_k(src.as_chunks().0, dst),
        GgmlType::Q4_K => dequant_k::q4_k(src.as_chunks().0, dst),
        GgmlType::Q5_K => dequant_k::q5_k(src.as_chunks().0, dst),
        GgmlType::Q6_K => dequant_k::q6_k(src.as_chunks().0, dst),
        GgmlType::Q8_K => dequant_k::q8_k(src.as_chunks().0, dst),
    }
}

fn q4_0(src: &[[u8; Q4_0_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = d * ((q & 0xF) as i32 - 8) as f32;
            y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
        }
    }
}

fn q4_1(src: &[[u8; Q4_1_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        for j in 0..16 {
            let q = b[4 + j];
            y[j] = d * (q & 0xF) as f32 + m;
            y[j + 16] = d * (q >> 4) as f32 + m;
        }
    }
}

fn q5_0(src: &[[u8; Q5_0_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        let qh = u32_at(b, 2);
        for j in 0..16 {
            let q = b[6 + j];
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (((q & 0xF) as u32 | h0) as i32 - 16) as f32;
            y[j + 16] = d * (((q >> 4) as u32 | h1) as i32 - 16) as f32;
        }
    }
}

fn q5_1(src: &[[u8; Q5_1_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        let qh = u32_at(b, 4);
        for j in 0..16 {
            let q = b[8 + j];
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * ((q & 0xF) as u32 | h0) as f32 + m;
            y[j + 16] = d * ((q >> 4) as u32 | h1) as f32 + m;
        }
    }
}

fn q8_0(src: &[[u8; Q8_0_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for (o, &q) in y.iter_mut().zip(&b[2..]) {
            *o = d * (q as i8) as f32;
        }
    }
}

fn q8_1(src: &[[u8; Q8_1_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for (o, &q) in y.iter_mut().zip(&b[4..]) {
            *o = d * (q as i8) as f32;
        }
    }
}
