//! Whole tiles of TurboQuant rows decoded (in the rotated space) at the CPU's instruction-set
//! level, as `affine_tile.rs` does for affine rows: one call per tile of a KV head's
//! consecutive rows, the row width a constant, the norm's f16 converted inline.

use super::turbo::{MAX_DIM, TurboCodec};
use super::{TileForms, codes_of, decode_tile, read_f16};
use crate::level::CpuLevel;

impl TurboCodec {
    /// Decodes the consecutive rows of `rows` (`row_bytes()` each) into `out` in the rotated
    /// space, `dim()` values a row, at `level`: the same bits as
    /// [`TurboCodec::dequantize_rotated`] row by row, at every level.
    ///
    /// # Panics
    /// If `out` is not whole rows, or `rows` holds fewer rows than `out`.
    pub fn dequantize_rows_rotated_at(&self, level: CpuLevel, rows: &[u8], out: &mut [f32]) {
        let forms = TileForms {
            #[cfg(target_arch = "x86_64")]
            avx512: rows_avx512,
            #[cfg(target_arch = "x86_64")]
            avx2: rows_avx2,
            portable: rows_lanes,
        };
        // SAFETY: the forms need no more than their levels' features.
        unsafe {
            decode_tile(
                self,
                (self.dim(), self.row_bytes()),
                level,
                rows,
                out,
                forms,
            )
        }
    }
}

/// The AVX-512 form: sixteen codes at a time become indices, and the centroids come from a
/// register permute (up to 32 of them: 5 bits) or a gather (8 bits), times the row's factor.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn rows_avx512(codec: &TurboCodec, rows: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let (dim, bits) = (codec.dim(), codec.bits());
    if !dim.is_multiple_of(16) || dim > MAX_DIM {
        return rows_lanes(codec, rows, out);
    }
    let (lut, inv_sqrt_dim) = codec.decode_parts();
    let code_bytes = dim * usize::from(bits) / 8;
    // SAFETY: (all loads below) `lut` holds 256 floats; `codes` holds `dim` bytes, a multiple
    // of 16; each `o` chunk holds 16 floats.
    let (low, high) = unsafe {
        (
            _mm512_loadu_ps(lut.as_ptr()),
            _mm512_loadu_ps(lut.as_ptr().add(16)),
        )
    };
    let mut buf = [0u8; MAX_DIM];
    for (row, o) in rows
        .chunks_exact(codec.row_bytes())
        .zip(out.chunks_exact_mut(dim))
    {
        let (packed, norm) = row.split_at(code_bytes);
        let scale = read_f16(norm) * inv_sqrt_dim;
        let scale = _mm512_set1_ps(scale);
        let codes = codes_of(packed, bits, dim, &mut buf);
        for (c, o) in codes.chunks_exact(16).zip(o.chunks_exact_mut(16)) {
            // SAFETY: see above.
            unsafe {
                let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(c.as_ptr().cast()));
                let centroids = match bits {
                    ..=4 => _mm512_permutexvar_ps(idx, low),
                    5 => _mm512_permutex2var_ps(low, idx, high),
                    _ => _mm512_i32gather_ps::<4>(idx, lut.as_ptr()),
                };
                _mm512_storeu_ps(o.as_mut_ptr(), _mm512_mul_ps(centroids, scale));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows_avx2(codec: &TurboCodec, rows: &[u8], out: &mut [f32]) {
    rows_lanes(codec, rows, out)
}

#[inline(always)]
fn rows_lanes(codec: &TurboCodec, rows: &[u8], out: &mut [f32]) {
    match codec.dim() {
        64 => rows_of::<64>(codec, rows, out),
        128 => rows_of::<128>(codec, rows, out),
        256 => rows_of::<256>(codec, rows, out),
        512 => rows_of::<512>(codec, rows, out),
        _ => {
            for (row, o) in rows
                .chunks_exact(codec.row_bytes())
                .zip(out.chunks_exact_mut(codec.dim()))
            {
                codec.dequantize_rotated(row, o);
            }
        }
    }
}

/// `centroid[code] · (norm/√dim)` per element, as `dequantize_rotated` computes it.
#[inline(always)]
fn rows_of<const D: usize>(codec: &TurboCodec, rows: &[u8], out: &mut [f32]) {
    let (lut, inv_sqrt_dim) = codec.decode_parts();
    let bits = codec.bits();
    let code_bytes = D * usize::from(bits) / 8;
    let mut buf = [0u8; D];
    for (row, o) in rows
        .chunks_exact(codec.row_bytes())
        .zip(out.as_chunks_mut::<D>().0)
    {
        let (packed, norm) = row.split_at(code_bytes);
        let scale = read_f16(norm) * inv_sqrt_dim;
        let codes = codes_of(packed, bits, D, &mut buf);
        for (o, &c) in o.iter_mut().zip(codes) {
            *o = lut[usize::from(c)] * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{TURBO_DIMS, check_tiles_against_rows};

    /// Every level decodes a tile exactly as `dequantize_rotated` decodes each of its rows, for
    /// every width and row size, zero and huge norms and rows of random bytes included. On a
    /// CPU without AVX-512 the AVX-512 form is not reached (`supported_levels`).
    #[test]
    fn tiles_equal_row_by_row_decoding_at_every_level() {
        for bits in [2, 3, 4, 5, 8] {
            for dim in TURBO_DIMS {
                let c = TurboCodec::new(dim, bits, 42).unwrap();
                check_tiles_against_rows(
                    (dim, c.row_bytes(), 11),
                    |x, row| c.quantize(x, row),
                    |row, out| c.dequantize_rotated(row, out),
                    |level, rows, out| c.dequantize_rows_rotated_at(level, rows, out),
                    &format!("{bits} bits, dim {dim}"),
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "fewer encoded rows")]
    fn short_input_is_refused() {
        let codec = TurboCodec::new(64, 3, 1).unwrap();
        let rows = vec![0u8; codec.row_bytes()];
        codec.dequantize_rows_rotated_at(CpuLevel::Scalar, &rows, &mut [0.0; 128]);
    }
}
