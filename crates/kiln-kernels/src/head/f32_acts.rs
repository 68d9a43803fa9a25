//! Quantized weights × unquantized (f32) activations. Used where the 8-bit rounding of the
//! activations costs measurable accuracy: the output head, whose logits feed the sampler
//! directly (on SmolLM2 it is most of the Q4_1 path's KL against f32). Q8_0 and Q6_K (the
//! head of llama-quantize's K-quant and Q4_0 files whose width is a multiple of 256) have
//! SIMD kernels; other types dequantize a block at a time into a stack buffer.

use half::f16;

use crate::Result;
use crate::format::blocks::{Q6_K_BYTES, Q8_0_BYTES};
use crate::format::dequant::dequantize_unchecked;
use crate::format::types::GgmlType;
use crate::level::{CpuLevel, cpu_level};
use crate::matmul::{QMatrix, check_len, par_drive};

/// `out[t * rows + r] = Σ W[r, i] · x[t, i]` with the weights dequantized block by block in
/// registers or a stack buffer, never as a whole matrix.
pub fn matmul_f32_activations(
    w: &QMatrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) -> Result<()> {
    check_len("matmul input x", n_tokens, w.cols(), x.len())?;
    check_len("matmul output", n_tokens, w.rows(), out.len())?;
    let (ty, cols, rb, data) = (w.ty(), w.cols(), w.row_bytes(), w.data());
    let level = cpu_level();
    par_drive(w.rows(), n_tokens, out, |r, t| {
        dot_at(
            level,
            ty,
            &data[r * rb..(r + 1) * rb],
            &x[t * cols..(t + 1) * cols],
        )
    });
    Ok(())
}

/// One row × one f32 vector at `level` (clamped to the hardware).
pub fn dot_at(level: CpuLevel, ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if ty == GgmlType::Q6_K && level.clamp_to_hardware() >= CpuLevel::Avx2 {
        // SAFETY: the level check guarantees avx2, fma and f16c (also at AVX-512).
        return unsafe { q6_k_f32_avx2(row, x) };
    }
    #[cfg(target_arch = "x86_64")]
    if ty == GgmlType::Q8_0 {
        let level = level.clamp_to_hardware();
        if level >= CpuLevel::Avx512 {
            // SAFETY: the level check guarantees the AVX-512 feature set.
            return unsafe { q8_0_f32_avx512(row, x) };
        }
        if level >= CpuLevel::Avx2 {
            // SAFETY: the level check guarantees avx2, fma and f16c.
            return unsafe { q8_0_f32_avx2(row, x) };
        }
    }
    let _ = level;
    if ty == GgmlType::Q8_0 {
        return q8_0_f32_scalar(row, x);
    }
    generic_scalar(ty, row, x)
}

/// Scalar reference for Q8_0 × f32.
pub fn q8_0_f32_scalar(row: &[u8], x: &[f32]) -> f32 {
    let mut sum = 0f32;
    for (block, xs) in row.chunks_exact(Q8_0_BYTES).zip(x.chunks_exact(32)) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let s: f32 = block[2..]
            .iter()
            .zip(xs)
            .map(|(&q, &v)| q as i8 as f32 * v)
            .sum();
        sum += d * s;
    }
    sum
}

/// Any type: dequantize one block at a time into a stack buffer, then an f32 dot.
fn generic_scalar(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let (elems, bytes) = (ty.block_elems(), ty.block_bytes());
    let mut buf = [0f32; 256];
    let mut sum = 0f32;
    for (block, xs) in row.chunks_exact(bytes).zip(x.chunks_exact(elems)) {
        dequantize_unchecked(ty, block, &mut buf[..elems]);
        sum += buf[..elems].iter().zip(xs).map(|(a, b)| a * b).sum::<f32>();
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q8_0_f32_avx512(row: &[u8], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm512_setzero_ps();
    for (block, xs) in row.chunks_exact(Q8_0_BYTES).zip(x.chunks_exact(32)) {
        let d = crate::dot::avx2::f16c(f16::from_le_bytes([block[0], block[1]]));
        // SAFETY: block has 2 + 32 bytes and xs 32 floats; the loads read 16 of each at
        // offsets 0 and 16.
        let partial = unsafe {
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                block.as_ptr().add(2).cast(),
            )));
            let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                block.as_ptr().add(18).cast(),
            )));
            let p = _mm512_mul_ps(lo, _mm512_loadu_ps(xs.as_ptr()));
            _mm512_fmadd_ps(hi, _mm512_loadu_ps(xs.as_ptr().add(16)), p)
        };
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), partial, acc);
    }
    _mm512_reduce_add_ps(acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_f32_avx2(row: &[u8], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    for (block, xs) in row.chunks_exact(Q8_0_BYTES).zip(x.chunks_exact(32)) {
        let d = crate::dot::avx2::f16c(f16::from_le_bytes([block[0], block[1]]));
        let mut partial = _mm256_setzero_ps();
        for k in 0..4 {
            // SAFETY: block has 2 + 32 bytes and xs has 32 floats; each load reads 8 of each
            // at offset 8k < 32.
            unsafe {
                let q = _mm_loadl_epi64(block.as_ptr().add(2 + 8 * k).cast());
                let qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                let xv = _mm256_loadu_ps(xs.as_ptr().add(8 * k));
                partial = _mm256_fmadd_ps(qf, xv, partial);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), partial, acc);
    }
    crate::dot::avx2::hsum_ps(acc)
}

/// Q6_K × f32: each 128-value half of a super-block is rebuilt as four vectors of 32 signed
/// codes (low nibbles of `ql` or its high nibbles, plus two bits of `qh` each), in element
/// order, so 16-value sub-block `j` is one 128-bit lane and takes scale byte `j`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k_f32_avx2(row: &[u8], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let (m4, m2, bias) = (
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi8(3),
        _mm256_set1_epi8(32),
    );
    // Two accumulators: even and odd sub-blocks, so the FMA chains overlap.
    let mut acc = [_mm256_setzero_ps(); 2];
    for (block, xs) in row.chunks_exact(Q6_K_BYTES).zip(x.chunks_exact(256)) {
        let d = crate::dot::avx2::f16c(f16::from_le_bytes([block[208], block[209]]));
        for half in 0..2 {
            // SAFETY: the loads read bytes 64·half..64·half + 64 (ql) and
            // 128 + 32·half..+32 (qh) of the 210-byte block.
            let codes = unsafe {
                let p = block.as_ptr();
                let ql0 = _mm256_loadu_si256(p.add(64 * half).cast());
                let ql1 = _mm256_loadu_si256(p.add(64 * half + 32).cast());
                let qh = _mm256_loadu_si256(p.add(128 + 32 * half).cast());
                // Two bits of qh moved to bits 4..6 of each byte (masked before the 16-bit
                // shift left, so no bit crosses into the next byte).
                let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m2));
                let h1 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(qh), m2));
                let h2 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(qh), m2));
                let h3 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(qh), m2));
                let up0 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4);
                let up1 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4);
                [
                    _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(ql0, m4), h0), bias),
                    _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(ql1, m4), h1), bias),
                    _mm256_sub_epi8(_mm256_or_si256(up0, h2), bias),
                    _mm256_sub_epi8(_mm256_or_si256(up1, h3), bias),
                ]
            };
            for (k, q) in codes.iter().enumerate() {
                for (lane, lane_acc) in acc.iter_mut().enumerate() {
                    let j = 8 * half + 2 * k + lane;
                    let v = if lane == 0 {
                        _mm256_castsi256_si128(*q)
                    } else {
                        _mm256_extracti128_si256::<1>(*q)
                    };
                    let a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
                    let b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v)));
                    // SAFETY: xs has 256 floats; sub-block j reads 16·j..16·j + 16.
                    let p = unsafe {
                        let at = xs.as_ptr().add(16 * j);
                        let p = _mm256_mul_ps(a, _mm256_loadu_ps(at));
                        _mm256_fmadd_ps(b, _mm256_loadu_ps(at.add(8)), p)
                    };
                    let scale = _mm256_set1_ps(d * f32::from(block[192 + j] as i8));
                    *lane_acc = _mm256_fmadd_ps(scale, p, *lane_acc);
                }
            }
        }
    }
    crate::dot::avx2::hsum_ps(_mm256_add_ps(acc[0], acc[1]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::level::supported_levels;

    fn random_q8_0(blocks: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let mut s = seed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut row = vec![];
        for _ in 0..blocks {
            row.extend(f16::from_f32(0.01 + (next() % 100) as f32 / 1000.0).to_le_bytes());
            row.extend(
                (0..32)
                    .map(|_| (next() % 255) as u8 ^ 0x80)
                    .map(|b| if b == 0x80 { 0x81 } else { b }),
            );
        }
        let x = (0..blocks * 32)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        (row, x)
    }

    #[test]
    fn q8_0_simd_matches_scalar_and_generic_at_every_level() {
        for blocks in [1, 3, 18, 37] {
            let (row, x) = random_q8_0(blocks, blocks as u64 * 7919);
            let reference = q8_0_f32_scalar(&row, &x);
            let generic = generic_scalar(GgmlType::Q8_0, &row, &x);
            let scale: f32 = x.iter().map(|v| v.abs()).sum::<f32>() * 0.2;
            assert!(
                (reference - generic).abs() <= 1e-5 * scale,
                "generic {generic} vs {reference}"
            );
            for level in supported_levels() {
                let got = dot_at(level, GgmlType::Q8_0, &row, &x);
                assert!(
                    (got - reference).abs() <= 1e-5 * scale,
                    "{level:?}: {got} vs {reference}"
                );
            }
        }
    }

    #[test]
    fn q6_k_simd_matches_generic_at_every_level() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for blocks in [1, 2, 5, 12] {
            let mut row = vec![];
            for _ in 0..blocks {
                let mut b: Vec<u8> = (0..208).map(|_| next() as u8).collect();
                b.extend(f16::from_f32(0.001 + (next() % 100) as f32 / 10000.0).to_le_bytes());
                row.extend(b);
            }
            let x: Vec<f32> = (0..blocks * 256)
                .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let reference = generic_scalar(GgmlType::Q6_K, &row, &x);
            let mut deq = vec![0f32; blocks * 256];
            dequantize_unchecked(GgmlType::Q6_K, &row, &mut deq);
            let scale: f32 = deq.iter().zip(&x).map(|(w, v)| (w * v).abs()).sum();
            for level in supported_levels() {
                let got = dot_at(level, GgmlType::Q6_K, &row, &x);
                assert!(
                    (got - reference).abs() <= 1e-5 * scale,
                    "{level:?}, {blocks} blocks: {got} vs {reference}"
                );
            }
        }
    }

    #[test]
    fn matmul_matches_per_row_dots() {
        let (rows, blocks) = (70, 4);
        let mut data = vec![];
        for r in 0..rows {
            data.extend(random_q8_0(blocks, r as u64 + 1).0);
        }
        let (_, x) = random_q8_0(blocks * 2, 99);
        let w = QMatrix::new(GgmlType::Q8_0, rows, blocks * 32, &data).expect("matrix");
        let mut out = vec![0f32; rows * 2];
        matmul_f32_activations(&w, &x, 2, &mut out).expect("matmul");
        for t in 0..2 {
            for r in 0..rows {
                let want = dot_at(
                    cpu_level(),
                    GgmlType::Q8_0,
                    w.row(r).expect("row"),
                    &x[t * 128..(t + 1) * 128],
                );
                assert_eq!(out[t * rows + r], want);
            }
        }
        assert!(matmul_f32_activations(&w, &x[..10], 2, &mut out).is_err());
    }
}
