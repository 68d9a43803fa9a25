//! AVX-512 VNNI kernel for repacked Q8_0 weights × 16-bit activations (`crate::head::i16_acts`): the
//! output head, whose activations keep 16 bits. A group block's eight code vectors widen to
//! sixteen vectors of signed 16-bit pairs (rows 0..8 and 8..16), and `vpdpwssd` multiplies two
//! codes of each row by two broadcast activations per 32-bit lane; each row's two lanes are
//! added at the end of the block.

use crate::repack::Q8_0X16_BYTES;
use std::arch::x86_64::*;

/// One 16-row group of repacked Q8_0 weights × `N` rows of 16-bit activations (`x[t]`, with
/// one f32 scale per 32 values in `d[t]`): `out[t][k] = dot(row k, x[t])`. Blocks past the
/// shortest input are ignored.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q8_0x16_q16<const N: usize>(
    w: &[[u8; Q8_0X16_BYTES]],
    x: [&[i16]; N],
    d: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    let nb = x.iter().fold(w.len(), |n, r| n.min(r.len() / 32));
    let nb = d.iter().fold(nb, |n, r| n.min(r.len()));
    let flip = _mm512_set1_epi8(0x80u8 as i8);
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let mut acc = [_mm512_setzero_ps(); N];
    for (b, g) in w[..nb].iter().enumerate() {
        let base = g.as_ptr();
        // SAFETY: (this load and the ones below) scales at 0..32 and the eight code vectors at
        // 32..544 of the group block.
        let dw = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(base.cast())) };
        // Codes are `w + 128`; lane k of vector i is codes 4i..4i + 4 of row k. (A loop, not
        // `std::array::from_fn`, whose closure would not inherit the target features.)
        let mut wide = [[_mm512_setzero_si512(); 2]; 8];
        for (i, w) in wide.iter_mut().enumerate() {
            // SAFETY: code vector `i` of eight, inside the group block (see above).
            let c = unsafe { _mm512_loadu_si512(base.add(32 + 64 * i).cast()) };
            let s = _mm512_xor_si512(c, flip);
            *w = [
                _mm512_cvtepi8_epi16(_mm512_castsi512_si256(s)),
                _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64::<1>(s)),
            ];
        }
        for t in 0..N {
            let xs = x[t][32 * b..32 * b + 32].as_ptr().cast::<i64>();
            let mut lo = _mm512_setzero_si512();
            let mut hi = _mm512_setzero_si512();
            for (i, [wl, wh]) in wide.iter().enumerate() {
                // SAFETY: activations 4i..4i + 4 of the block's 32.
                let xv = _mm512_set1_epi64(unsafe { xs.add(i).read_unaligned() });
                lo = _mm512_dpwssd_epi32(lo, *wl, xv);
                hi = _mm512_dpwssd_epi32(hi, *wh, xv);
            }
            // Lanes 2k and 2k + 1 hold row k's two halves (rows 8.. in `hi`).
            let s = _mm512_add_epi32(
                _mm512_permutex2var_epi32(lo, even, hi),
                _mm512_permutex2var_epi32(lo, odd, hi),
            );
            let scale = _mm512_mul_ps(dw, _mm512_set1_ps(d[t][b]));
            acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc[t]);
        }
    }
    for t in 0..N {
        // SAFETY: `out[t]` is 16 floats.
        unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}
