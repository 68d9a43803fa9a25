//! AVX2 + FMA (+F16C) dot products. Integer block sums are exact (`maddubs` pairs cannot
//! saturate for these value ranges); per-block scales are applied in 8 f32 lanes with FMA,
//! so the float result differs from the scalar reference only by summation order.
//!
//! `legacy` holds the 32-element block types and the float types, `kquant` the 256-element
//! K-quants (Q2_K..Q6_K × Q8_K); `tile` and `tile_k` the token tiles of prefill (one weight
//! row against several tokens) for Q4_1, Q5_0, Q8_0, Q4_K and Q6_K; `repack` and `repack_k`
//! the kernels of the 16-row repacked layout ([`crate::repack`]) for Q4_1 / Q8_0 / Q5_0 and
//! Q4_K / Q6_K, and `head16` the 16-bit head on it.
//!
//! Safety: every function here requires the CPU to support avx2, fma and f16c
//! (i.e. [`crate::CpuLevel::Avx2`] or higher). Loads stay inside the fixed-size block
//! arrays they are given, so no length precondition exists beyond that.

mod head16;
mod kquant;
mod legacy;
pub(super) mod repack;
pub(super) mod repack_k;
mod tile;
mod tile_k;

pub use head16::*;
pub use kquant::*;
pub use legacy::*;
pub use repack::*;
pub use repack_k::*;
pub use tile::*;
pub use tile_k::*;

pub(crate) use kquant::{bsums, hsum_ps128, k4_min_sums, k4_scales_mins_words, ld16, ld32};

use std::arch::x86_64::*;

/// One f16 → f32 with the F16C instruction, inlined: `half`'s conversion re-checks the CPU
/// feature on every call, which costs more than the block's integer dot product.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16c(h: half::f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
}

/// The little-endian f16 at `off` of a block, through F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16c_at<const N: usize>(b: &[u8; N], off: usize) -> f32 {
    f16c(half::f16::from_bits(u16::from_le_bytes([
        b[off],
        b[off + 1],
    ])))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_ps(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}
