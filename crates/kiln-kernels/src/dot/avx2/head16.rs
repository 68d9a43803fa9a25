//! AVX2 kernel for repacked Q8_0 weights × 16-bit activations (`crate::head::i16_acts`): the
//! output head. Each 8-row half of a code vector widens to two vectors of signed 16-bit codes
//! (rows 0..4 and 4..8 of the half), and `vpmaddwd` multiplies two codes of a row by two
//! broadcast activations per 32-bit lane; a row's two lanes are added at the end of the block.
//! The integer sums are exact and the float steps are the AVX-512 kernel's: the same bits.

// The half index `h` addresses the weights' bytes as well as the accumulators.
#![allow(clippy::needless_range_loop)]

use crate::repack::Q8_0X16_BYTES;
use std::arch::x86_64::*;

/// One 16-row group of repacked Q8_0 weights × `N` rows of 16-bit activations (`x[t]`, with
/// one f32 scale per 32 values in `d[t]`): `out[t][k] = dot(row k, x[t])`. Blocks past the
/// shortest input are ignored.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q8_0x16_q16<const N: usize>(
    w: &[[u8; Q8_0X16_BYTES]],
    x: [&[i16]; N],
    d: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    let nb = x.iter().fold(w.len(), |n, r| n.min(r.len() / 32));
    let nb = d.iter().fold(nb, |n, r| n.min(r.len()));
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    let stream = super::repack::streamed(N);
    for (b, g) in w[..nb].iter().enumerate() {
        let base = g.as_ptr();
        if N == 1 {
            super::repack::prefetch(
                base.wrapping_add(super::repack::FAR_PREFETCH_AHEAD),
                Q8_0X16_BYTES,
                stream,
            );
        }
        // Each token's 32 activations of this block, sliced (and bounds-checked) once.
        let mut xs = [std::ptr::null::<i64>(); N];
        for t in 0..N {
            xs[t] = x[t][32 * b..32 * b + 32].as_ptr().cast();
        }
        for h in 0..2 {
            // SAFETY: (this load and the ones below) scales at 0..32 and the eight code
            // vectors at 32..544 of the group block; half `h` reads its 16 or 32 bytes.
            let dw = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(base.add(16 * h).cast())) };
            let mut lo = [_mm256_setzero_si256(); N];
            let mut hi = [_mm256_setzero_si256(); N];
            for i in 0..8 {
                // SAFETY: code vector `i`, half `h` (see above). Codes are `w + 128`.
                let c = unsafe { _mm256_loadu_si256(base.add(32 + 64 * i + 32 * h).cast()) };
                let s = _mm256_xor_si256(c, flip);
                let wl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(s));
                let wh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(s));
                for t in 0..N {
                    // SAFETY: activations 4i..4i + 4 of the block's 32.
                    let xv = _mm256_set1_epi64x(unsafe { xs[t].add(i).read_unaligned() });
                    lo[t] = _mm256_add_epi32(lo[t], _mm256_madd_epi16(wl, xv));
                    hi[t] = _mm256_add_epi32(hi[t], _mm256_madd_epi16(wh, xv));
                }
            }
            for t in 0..N {
                // Lanes 2k, 2k + 1 hold row k's two halves; the horizontal add leaves rows in
                // the order 0 1 4 5 | 2 3 6 7, which the 64-bit permute puts right.
                let s = _mm256_hadd_epi32(lo[t], hi[t]);
                let s = _mm256_permute4x64_epi64::<0b11_01_10_00>(s);
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(d[t][b]));
                acc[t][h] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s), acc[t][h]);
            }
        }
    }
    super::repack::store(&acc, out);
}
