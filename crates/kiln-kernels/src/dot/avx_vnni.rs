//! AVX-VNNI kernels of the 16-row repacked layout ([`crate::repack`]): the AVX2 level's
//! bodies (`avx2/repack.rs`, `avx2/repack_k.rs`, same layout, same decoding of the codes) with
//! each block's integer dot product formed by `vpdpbusd` on `ymm`, as the AVX-512 kernels form
//! it on `zmm`. One `vpdpbusd` multiplies four unsigned codes of 8 rows by four broadcast
//! activation bytes and adds them to 32-bit sums, where AVX2 needs `vpmaddubsw`, 16-bit adds
//! and a widening `vpmaddwd`; Q8_0's codes are used as stored (`w + 128`, unsigned) with
//! `128·Σq` taken off, where AVX2 flips them back and multiplies through `vpsignb`.
//!
//! The integer sums are exact and the float steps are the AVX2 bodies', so results are the
//! AVX2 kernels' bits. Types without a VNNI kernel here (Q5_K, Q5_0 in the mask layout) run
//! their AVX2 kernel, re-exported under the same name.
//!
//! Safety: every function here requires avx2, fma, f16c and avxvnni
//! ([`crate::CpuLevel::AvxVnni`]).

use super::avx2::repack::{
    FAR_PREFETCH_AHEAD, PREFETCH_AHEAD, nibble_codes, offset_codes_x16, q4_1_x16, q5_0_plane_codes,
};
use super::avx2::repack_k::{k4_x16, q6_k_x16};
use crate::format::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K};
use crate::repack::kquant::{Q4_KX16_BYTES, Q6_KX16_BYTES};
use crate::repack::{Q4_0X16_BYTES, Q4_1X16_BYTES, Q5_0X16_BYTES, Q8_0X16_BYTES};
use std::arch::x86_64::*;

pub use super::avx2::{q5_0x16_q8_0, q5_kx16_q8_k};

/// `Σ_i v[i] · (word i of qs, broadcast)` per 32-bit lane, in two independent `vpdpbusd`
/// chains: a half group's eight unsigned code vectors (codes `4i..4i + 4` of 8 rows in vector
/// `i`) against one 32-value activation block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
fn block_dot(v: &[__m256i; 8], qs: &[i8; 32]) -> __m256i {
    let q = qs.as_ptr().cast::<i32>();
    let mut s = [_mm256_setzero_si256(); 2];
    for (i, v) in v.iter().enumerate() {
        // SAFETY: word i of the 32-byte `qs`.
        let y = _mm256_set1_epi32(unsafe { q.add(i).read_unaligned() });
        s[i % 2] = _mm256_dpbusd_avx_epi32(s[i % 2], *v, y);
    }
    _mm256_add_epi32(s[0], s[1])
}

/// [`block_dot`] of vectors `4j..4j + 4` alone (codes `16j..16j + 16` of the block), for
/// `j` in 0..2: the two 16-value halves a Q6_K piece scales apart.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
fn half_block_dots(v: &[__m256i; 8], qs: &[i8; 32]) -> [__m256i; 2] {
    let q = qs.as_ptr().cast::<i32>();
    let mut s = [_mm256_setzero_si256(); 2];
    for (i, v) in v.iter().enumerate() {
        // SAFETY: word i of the 32-byte `qs`.
        let y = _mm256_set1_epi32(unsafe { q.add(i).read_unaligned() });
        s[i / 4] = _mm256_dpbusd_avx_epi32(s[i / 4], *v, y);
    }
    s
}

/// Q8_0 weights of one 16-row group × `N` Q8_0 activation rows, as the AVX2 kernel;
/// `sums[t]` are the activation blocks' integer `Σq`, since the codes are used as stored
/// (`w + 128`) and `128·Σq` is taken off each block's sum.
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni ([`crate::CpuLevel::AvxVnni`]).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn q8_0x16_q8_0<const N: usize>(
    w: &[[u8; Q8_0X16_BYTES]],
    a: [&[BlockQ8_0]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    if N == 1 {
        // Decode keeps the AVX2 kernel: in the first A/B (docs/benchmarks.md, "AVX-VNNI")
        // one token through `vpdpbusd` was slower, and it gains nothing at the memory limit.
        return super::avx2::q8_0x16_q8_0(w, a, sums, out);
    }
    let decode = |base: *const u8, h: usize| {
        let mut v = [_mm256_setzero_si256(); 8];
        for (i, v) in v.iter_mut().enumerate() {
            // SAFETY: eight 64-byte code vectors at 32..544 of the 544-byte group block; half
            // `h` reads 32 bytes of each.
            *v = unsafe { _mm256_loadu_si256(base.add(32 + 64 * i + 32 * h).cast()) };
        }
        v
    };
    offset_codes_x16(w, 128, FAR_PREFETCH_AHEAD, a, sums, out, decode, |v, qs| {
        block_dot(v, qs)
    })
}

/// Q4_0 weights of one 16-row group × `N` Q8_0 activation rows (codes `w + 8`), as the AVX2
/// kernel.
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni ([`crate::CpuLevel::AvxVnni`]).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn q4_0x16_q8_0<const N: usize>(
    w: &[[u8; Q4_0X16_BYTES]],
    a: [&[BlockQ8_0]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    let m4 = _mm256_set1_epi8(0x0F);
    let decode = |base: *const u8, h: usize| {
        // SAFETY: four nibble vectors at 32..288 of the 288-byte group block; half `h` reads
        // its 32 bytes of each.
        unsafe { nibble_codes(base.add(32 + 32 * h), m4) }
    };
    offset_codes_x16(w, 8, PREFETCH_AHEAD, a, sums, out, decode, |v, qs| {
        block_dot(v, qs)
    })
}

/// Q5_0 weights on the bit-plane layout ([`crate::repack::FifthBits::Planes`], the layout
/// repacked for this level) × `N` Q8_0 activation rows, as the AVX2 kernel.
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni ([`crate::CpuLevel::AvxVnni`]).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn q5_0p16_q8_0<const N: usize>(
    w: &[[u8; Q5_0X16_BYTES]],
    a: [&[BlockQ8_0]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    // SAFETY: every group block is a 352-byte Q5_0 one.
    let decode = |base: *const u8, h: usize| unsafe { q5_0_plane_codes(base, h) };
    offset_codes_x16(w, 16, PREFETCH_AHEAD, a, sums, out, decode, |v, qs| {
        block_dot(v, qs)
    })
}

/// Q4_1 weights of one 16-row group × `N` Q8_1 activation rows, as the AVX2 kernel.
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni ([`crate::CpuLevel::AvxVnni`]).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn q4_1x16_q8_1<const N: usize>(
    w: &[[u8; Q4_1X16_BYTES]],
    a: [&[BlockQ8_1]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    q4_1_x16(w, a, sums, out, |v, qs| block_dot(v, qs))
}

/// Q4_K weights of one 16-row group × `N` Q8_K activation rows, as the AVX2 kernel: each
/// piece's exact sum times the rows' sub-block scales (`vpmulld`).
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni ([`crate::CpuLevel::AvxVnni`]).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn q4_kx16_q8_k<const N: usize>(
    w: &[[u8; Q4_KX16_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [[f32; 16]; N],
) {
    k4_x16::<_, N, false>(w, a, out, 256, |v, y, sc, _| {
        _mm256_mullo_epi32(block_dot(v, y), sc)
    })
}

/// Q6_K weights of one 16-row group × `N` Q8_K activation rows, as the AVX2 kernel: the two
/// 16-value halves of each piece summed apart and multiplied by their scales (`vpmulld`).
///
/// # Safety
/// The CPU must support avx2, fma, f16c and avxvnni ([`crate::CpuLevel::AvxVnni`]).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn q6_kx16_q8_k<const N: usize>(
    w: &[[u8; Q6_KX16_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [[f32; 16]; N],
) {
    q6_k_x16(w, a, out, |v, y, [sc_lo, sc_hi], _, _| {
        let [lo, hi] = half_block_dots(v, y);
        _mm256_add_epi32(_mm256_mullo_epi32(lo, sc_lo), _mm256_mullo_epi32(hi, sc_hi))
    })
}
