//! Whole tiles of affine rows decoded at the CPU's instruction-set level. Attention decodes a
//! quantized cache a tile of one KV head's consecutive rows at a time; row by row at the x86-64
//! baseline, an 8- or 4-bit cache decoded slower than a dense one read in place, although it
//! reads 4–7× fewer bytes.

use super::affine::AffineCodec;
use super::{TileForms, decode_tile, read_f16};
use crate::level::CpuLevel;

impl AffineCodec {
    /// Decodes the consecutive rows of `rows` (`row_bytes()` each) into `out`, `dim()` values a
    /// row, at `level`: the same bits as [`AffineCodec::dequantize`] row by row, at every level.
    ///
    /// # Panics
    /// If `out` is not whole rows, or `rows` holds fewer rows than `out`.
    pub fn dequantize_rows_at(&self, level: CpuLevel, rows: &[u8], out: &mut [f32]) {
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn rows_avx512(codec: &AffineCodec, rows: &[u8], out: &mut [f32]) {
    rows_lanes(codec, rows, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows_avx2(codec: &AffineCodec, rows: &[u8], out: &mut [f32]) {
    rows_lanes(codec, rows, out)
}

/// `scale·code + bias` per element, as `dequantize` computes it (a multiply, then an add:
/// Rust never fuses them), with the 8- and 4-bit codes read straight from the row. The group
/// width is a constant in each arm, so the loops have fixed trip counts and vectorise.
#[inline(always)]
fn rows_lanes(codec: &AffineCodec, rows: &[u8], out: &mut [f32]) {
    match (codec.bits(), codec.group()) {
        (8, 32) => rows_of::<32, 32>(codec, rows, out, group8),
        (8, 64) => rows_of::<64, 64>(codec, rows, out, group8),
        (8, 128) => rows_of::<128, 128>(codec, rows, out, group8),
        (4, 32) => rows_of::<32, 16>(codec, rows, out, group4),
        (4, 64) => rows_of::<64, 32>(codec, rows, out, group4),
        (4, 128) => rows_of::<128, 64>(codec, rows, out, group4),
        _ => {
            for (row, o) in rows
                .chunks_exact(codec.row_bytes())
                .zip(out.chunks_exact_mut(codec.dim()))
            {
                codec.dequantize(row, o);
            }
        }
    }
}

/// Every row of `rows`: its groups of `G` values (`B` code bytes each), decoded by `decode`.
#[inline(always)]
fn rows_of<const G: usize, const B: usize>(
    codec: &AffineCodec,
    rows: &[u8],
    out: &mut [f32],
    decode: impl Fn(&[u8; B], f32, f32, &mut [f32; G]),
) {
    let dim = codec.dim();
    debug_assert!(
        dim.is_multiple_of(G),
        "AffineCodec::new keeps rows whole groups"
    );
    let code_bytes = dim / G * B;
    for (row, o) in rows
        .chunks_exact(codec.row_bytes())
        .zip(out.chunks_exact_mut(dim))
    {
        let (codes, params) = row.split_at(code_bytes);
        let groups = codes
            .as_chunks::<B>()
            .0
            .iter()
            .zip(params.as_chunks::<4>().0)
            .zip(o.as_chunks_mut::<G>().0);
        for ((cs, p), og) in groups {
            let (scale, bias) = (read_f16(&p[..2]), read_f16(&p[2..]));
            decode(cs, scale, bias, og);
        }
    }
}

#[inline(always)]
fn group8<const G: usize>(codes: &[u8; G], scale: f32, bias: f32, out: &mut [f32; G]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = scale * f32::from(c) + bias;
    }
}

/// Two codes a byte, low nibble first (`pack_bits`' order).
#[inline(always)]
fn group4<const G: usize, const B: usize>(
    packed: &[u8; B],
    scale: f32,
    bias: f32,
    out: &mut [f32; G],
) {
    let mut codes = [0u8; G];
    for (pair, &byte) in codes.as_chunks_mut::<2>().0.iter_mut().zip(packed) {
        *pair = [byte & 0x0f, byte >> 4];
    }
    for (o, &c) in out.iter_mut().zip(&codes) {
        *o = scale * f32::from(c) + bias;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::check_tiles_against_rows;

    /// Every level decodes a tile exactly as `dequantize` decodes each of its rows, for every
    /// width, group size and several row widths: quantized rows with hostile scales (f16
    /// extremes, zero) and rows of random bytes (NaN and infinite scales, any codes). On a CPU
    /// without AVX-512 the AVX-512 form is not reached (`supported_levels`).
    #[test]
    fn tiles_equal_row_by_row_decoding_at_every_level() {
        for bits in [2, 3, 4, 5, 6, 8] {
            for group in [32, 64, 128] {
                for dim in [group, 3 * group, 256] {
                    let c = AffineCodec::new(dim, bits, group).unwrap();
                    check_tiles_against_rows(
                        (dim, c.row_bytes(), 9),
                        |x, row| c.quantize(x, row),
                        |row, out| c.dequantize(row, out),
                        |level, rows, out| c.dequantize_rows_at(level, rows, out),
                        &format!("{bits} bits, group {group}, dim {dim}"),
                    );
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "fewer encoded rows")]
    fn short_input_is_refused() {
        let codec = AffineCodec::new(64, 4, 64).unwrap();
        let rows = vec![0u8; codec.row_bytes()];
        codec.dequantize_rows_at(CpuLevel::Scalar, &rows, &mut [0.0; 128]);
    }
}
