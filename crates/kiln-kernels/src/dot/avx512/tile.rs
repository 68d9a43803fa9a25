//! AVX-512 VNNI token tiles for Q8_0 and Q5_0 weights × interleaved Q8_0 activations
//! ([`BlockQ8_0x4`]): one weight row against `N` tokens, four blocks per step.
//!
//! Per group of four weight blocks, once per tile: the signed weights in the interleaved
//! order, the `-128 · Σx` that the activations' unsigned `y + 128` codes call for (per lane,
//! as the starting value of the integer sums), and the four scales. Per token and group: two
//! `vpdpbusd`, one convert, one multiply of the two scale vectors and one FMA for all four
//! blocks, reading 192 bytes of activations. The row kernels spend a scale conversion, a
//! multiply, a blend and an FMA per *two* blocks, per token.
//!
//! Integer sums are exact. The float result differs from the scalar reference only in
//! rounding: each block's `dw·dy` times its four lane sums is added by FMA into 16 running lane
//! sums, which are added up at the end, where the reference adds one rounded product per block
//! in block order.

use crate::format::blocks::*;
use crate::quantize::interleave::BlockQ8_0x4;
use std::arch::x86_64::*;

/// The 16 bytes at `OFF` of each of four blocks, block `k` in 128-bit lane `k`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn load4<const OFF: usize, const B: usize>(b: &[[u8; B]; 4]) -> __m512i {
    const { assert!(OFF + 16 <= B) };
    // SAFETY: each load reads bytes OFF..OFF + 16 of a B-byte block (checked above).
    unsafe {
        let ld = |k: usize| _mm_loadu_si128(b[k].as_ptr().add(OFF).cast());
        let v = _mm512_castsi128_si512(ld(0));
        let v = _mm512_inserti32x4::<1>(v, ld(1));
        let v = _mm512_inserti32x4::<2>(v, ld(2));
        _mm512_inserti32x4::<3>(v, ld(3))
    }
}

/// Block `k` in 128-bit lane `k` → chunk `c` of block `k` in 32-bit lane `4c + k`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn transpose4(v: __m512i) -> __m512i {
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_epi32(idx, v)
}

/// The f16 scales at offset 0 of four blocks, as `[d0, d1, d2, d3]` in every 128-bit lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn scales4<const B: usize>(b: &[[u8; B]; 4]) -> __m512 {
    let h = |k: usize| u16::from_le_bytes([b[k][0], b[k][1]]) as u64;
    let bits = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
    _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64)))
}

/// A weight group ready for the token loop: elements 0..16 and 16..32 of the four blocks
/// (signed, interleaved), `-128 · Σx` per lane and the scales.
struct Group {
    lo: __m512i,
    hi: __m512i,
    bias: __m512i,
    d: __m512,
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn group<const B: usize>(b: &[[u8; B]; 4], lo: __m512i, hi: __m512i) -> Group {
    let c128 = _mm512_set1_epi8(0x80u8 as i8);
    let zero = _mm512_setzero_si512();
    let sum128 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, c128, lo), c128, hi);
    Group {
        lo,
        hi,
        bias: _mm512_sub_epi32(zero, sum128),
        d: scales4(b),
    }
}

/// One token's group: `acc + (dw·dy) · Σ x·y` for four blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn step(g: &Group, y: &BlockQ8_0x4, acc: __m512) -> __m512 {
    // SAFETY: the loads read exactly the two halves of `qs` and the scales.
    let (ylo, yhi, dy) = unsafe {
        (
            _mm512_loadu_si512(y.qs.as_ptr().cast()),
            _mm512_loadu_si512(y.qs.as_ptr().add(64).cast()),
            _mm512_loadu_ps(y.d.as_ptr()),
        )
    };
    let s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(g.bias, ylo, g.lo), yhi, g.hi);
    _mm512_fmadd_ps(_mm512_mul_ps(g.d, dy), _mm512_cvtepi32_ps(s), acc)
}

/// Shared tile body: `decode(four blocks)` gives their signed weights as `(elements 0..16,
/// elements 16..32)` in the interleaved order. A last group of fewer than four blocks is
/// padded with zero blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn x4_tile<const B: usize, const N: usize>(
    w: &[[u8; B]],
    a: [&[BlockQ8_0x4]; N],
    out: &mut [f32; N],
    decode: impl Fn(&[[u8; B]; 4]) -> (__m512i, __m512i),
) {
    let groups = a.iter().fold(w.len().div_ceil(4), |n, r| n.min(r.len()));
    let mut acc = [_mm512_setzero_ps(); N];
    let mut pad = [[0u8; B]; 4];
    for g in 0..groups {
        let blocks: &[[u8; B]; 4] = match w[4 * g..].first_chunk::<4>() {
            Some(b) => b,
            None => {
                let rest = &w[4 * g..];
                pad[..rest.len()].copy_from_slice(rest);
                &pad
            }
        };
        let (lo, hi) = decode(blocks);
        let grp = group(blocks, lo, hi);
        for t in 0..N {
            acc[t] = step(&grp, &a[t][g], acc[t]);
        }
    }
    for t in 0..N {
        out[t] = _mm512_reduce_add_ps(acc[t]);
    }
}

/// Q8_0 weights × `N` interleaved Q8_0 activation rows.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q8_0_q8_0x4_tile<const N: usize>(
    w: &[[u8; Q8_0_BYTES]],
    a: [&[BlockQ8_0x4]; N],
    out: &mut [f32; N],
) {
    x4_tile(w, a, out, |b| {
        let lo = transpose4(load4::<2, Q8_0_BYTES>(b));
        (lo, transpose4(load4::<18, Q8_0_BYTES>(b)))
    })
}

/// Q5_0 weights × `N` interleaved Q8_0 activation rows. A weight is `nibble + 16·bit - 16`:
/// the nibbles minus 16 where the 5th bit is clear. The four blocks' `qh` halves are that
/// bit as byte masks, in the order of the blocks' nibbles before interleaving.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q5_0_q8_0x4_tile<const N: usize>(
    w: &[[u8; Q5_0_BYTES]],
    a: [&[BlockQ8_0x4]; N],
    out: &mut [f32; N],
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    x4_tile(w, a, out, |b| {
        let q = load4::<6, Q5_0_BYTES>(b);
        let qh = |k: usize| u32_at(&b[k], 2) as u64;
        let half = |s: u32| (0..4).fold(0u64, |m, k| m | ((qh(k) >> s) & 0xFFFF) << (16 * k));
        let lo = _mm512_and_si512(q, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
        let lo = _mm512_mask_sub_epi8(lo, !half(0), lo, sixteen);
        let hi = _mm512_mask_sub_epi8(hi, !half(16), hi, sixteen);
        (transpose4(lo), transpose4(hi))
    })
}
