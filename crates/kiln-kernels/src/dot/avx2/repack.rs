//! AVX2 kernels for Q4_1, Q8_0 and Q5_0 weights repacked 16 rows at a time
//! ([`crate::repack`]), on the same layout as the AVX-512 VNNI kernels (a Q5_0 matrix's fifth
//! bits aside: [`crate::repack::FifthBits`]): a 64-byte code vector
//! holds rows 0..8 in its first 32 bytes and rows 8..16 in the second, so each half is one
//! `ymm` whose 32-bit lane `k` holds four codes of one row. Without VNNI, `vpmaddubsw`
//! multiplies the codes by a broadcast activation word into 16-bit pair sums, which are added
//! in 16 bits while they cannot overflow and widened once per block with `vpmaddwd`.
//!
//! The integer block sums are exact, and the float steps per block and row are the AVX-512
//! kernels' (`acc += (d_w·d_y)·Σ`, then the Q4_1 minimum term), so both levels give the same
//! bits. Decode and prefill run the same kernel.

// The half index `h` addresses the weights' bytes as well as the accumulators.
#![allow(clippy::needless_range_loop)]

use super::f16c;
use crate::format::blocks::{BlockQ8_0, BlockQ8_1};
use crate::repack::{Q4_0X16_BYTES, Q4_1X16_BYTES, Q5_0X16_BYTES, Q8_0X16_BYTES};
use std::arch::x86_64::*;

/// Q4_1 weights of one 16-row group (`w`, one entry per block along the row) × `N` Q8_1
/// activation rows: `out[t][k] = dot(row k, a[t])`, with `sums[t]` the rows' exact block sums
/// `d·Σq` in place of the blocks' f16 `s`. Blocks past the shortest of `w`, the activation rows
/// and the sums are ignored.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_1x16_q8_1<const N: usize>(
    w: &[[u8; Q4_1X16_BYTES]],
    a: [&[BlockQ8_1]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    let ones = _mm256_set1_epi16(1);
    // |pair| ≤ 2·15·127, so the eight pair sums of a block fit in 16 bits.
    q4_1_x16(w, a, sums, out, |v, qs| {
        _mm256_madd_epi16(block_pairs(v, qs), ones)
    });
}

/// The body of [`q4_1x16_q8_1`] with the block's integer dot product `dot(codes, qs)` (exact,
/// per 32-bit lane) given by the level.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q4_1_x16<const N: usize>(
    w: &[[u8; Q4_1X16_BYTES]],
    a: [&[BlockQ8_1]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
    dot: impl Fn(&[__m256i; 8], &[i8; 32]) -> __m256i,
) {
    let nb = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let nb = sums.iter().fold(nb, |n, r| n.min(r.len()));
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    let stream = streamed(N);
    for (b, g) in w[..nb].iter().enumerate() {
        let base = g.as_ptr();
        if N == 1 {
            prefetch(base.wrapping_add(FAR_PREFETCH_AHEAD), Q4_1X16_BYTES, stream);
        }
        for h in 0..2 {
            // SAFETY: scales at 0..32, minimums at 32..64 and the four code vectors at
            // 64..320 of the 320-byte group block; half `h` reads its 16 or 32 bytes of each.
            let (dw, mw, v) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(base.add(16 * h).cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(base.add(32 + 16 * h).cast())),
                    nibble_codes(base.add(64 + 32 * h), m4),
                )
            };
            for t in 0..N {
                let y = &a[t][b];
                let s = dot(&v, &y.qs);
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(f16c(y.d)));
                acc[t][h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t][h]);
                acc[t][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sums[t][b]), acc[t][h]);
            }
        }
    }
    store(&acc, out);
}

/// Q8_0 weights of one 16-row group × `N` Q8_0 activation rows, as [`q4_1x16_q8_1`]; `sums`
/// is unused (the AVX-512 kernel needs it for its unsigned codes) and kept for one signature.
/// The stored codes `w + 128` are flipped back to signed, and each product pair is formed as
/// `|w|·(y·sign w)` (`vpsignb`), which `vpmaddubsw` cannot saturate.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q8_0x16_q8_0<const N: usize>(
    w: &[[u8; Q8_0X16_BYTES]],
    a: [&[BlockQ8_0]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    let nb = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let nb = sums.iter().fold(nb, |n, r| n.min(r.len()));
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    let stream = streamed(N);
    for (b, g) in w[..nb].iter().enumerate() {
        let base = g.as_ptr();
        if N == 1 {
            prefetch(base.wrapping_add(FAR_PREFETCH_AHEAD), Q8_0X16_BYTES, stream);
        }
        for h in 0..2 {
            // SAFETY: scales at 0..32 and eight 64-byte code vectors at 32..544 of the
            // 544-byte group block; half `h` reads 16 bytes of scales and 32 of each vector.
            let dw = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(base.add(16 * h).cast())) };
            let mut signed = [_mm256_setzero_si256(); 8];
            let mut abs = [_mm256_setzero_si256(); 8];
            for i in 0..8 {
                // SAFETY: as above.
                let c = unsafe { _mm256_loadu_si256(base.add(32 + 64 * i + 32 * h).cast()) };
                signed[i] = _mm256_xor_si256(c, flip);
                abs[i] = _mm256_abs_epi8(signed[i]);
            }
            for t in 0..N {
                let y = &a[t][b];
                let q = y.qs.as_ptr().cast::<i32>();
                let mut s = _mm256_setzero_si256();
                for i in 0..8 {
                    // SAFETY: word i of the 32-byte `qs`.
                    let yi = _mm256_set1_epi32(unsafe { q.add(i).read_unaligned() });
                    let p = _mm256_maddubs_epi16(abs[i], _mm256_sign_epi8(yi, signed[i]));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                }
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(f16c(y.d)));
                acc[t][h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t][h]);
            }
        }
    }
    store(&acc, out);
}

/// Q5_0 weights of one 16-row group × `N` Q8_0 activation rows, as [`q8_0x16_q8_0`], with
/// `sums[t]` the activation blocks' integer `Σq`: the codes are `nibble + 16·bit` (`w + 16`),
/// so `16·Σq` is taken off each block's integer sum. The fifth bits are the AVX-512 layout's
/// masks ([`crate::repack::FifthBits::Masks`]); [`q5_0p16_q8_0`] reads AVX2's bit planes.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_0x16_q8_0<const N: usize>(
    w: &[[u8; Q5_0X16_BYTES]],
    a: [&[BlockQ8_0]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    offset_codes_x16(
        w,
        16,
        PREFETCH_AHEAD,
        a,
        sums,
        out,
        |base, h| {
            // SAFETY: `base` is a 352-byte Q5_0 group block.
            unsafe { q5_0_mask_codes(base, h) }
        },
        |v, qs| pairs_dot_halves(v, qs),
    )
}

/// Half `h`'s eight code vectors of a Q5_0 group block with the fifth bits as masks
/// ([`crate::repack::FifthBits::Masks`]).
///
/// # Safety
/// `base` must be valid for the 352 bytes of a Q5_0 group block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_mask_codes(base: *const u8, h: usize) -> [__m256i; 8] {
    let m4 = _mm256_set1_epi8(0x0F);
    let sixteen = _mm256_set1_epi8(16);
    // SAFETY: eight 8-byte masks at 32..96 and four nibble vectors at 96..352 of the
    // 352-byte group block; half `h` reads its part of each.
    let mut v = unsafe { nibble_codes(base.add(96 + 32 * h), m4) };
    for (i, v) in v.iter_mut().enumerate() {
        // SAFETY: half `h` of mask `i`, inside 32..96.
        let bits = unsafe { base.add(32 + 8 * i + 4 * h).cast::<u32>().read_unaligned() };
        let high = _mm256_and_si256(super::bits_to_bytes(u32::from_le(bits)), sixteen);
        *v = _mm256_or_si256(*v, high);
    }
    v
}

/// [`q5_0x16_q8_0`] on the bit-plane layout ([`crate::repack::FifthBits::Planes`]): half `h`'s
/// 32 plane bytes hold, in bit `i` of each byte, the fifth bit of the code that code vector
/// `i` has at that byte, so one 16-bit shift brings it to bit 4 (no bit crosses a byte: the
/// shifts are at most four) and a mask and an OR set it.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_0p16_q8_0<const N: usize>(
    w: &[[u8; Q5_0X16_BYTES]],
    a: [&[BlockQ8_0]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    offset_codes_x16(
        w,
        16,
        PREFETCH_AHEAD,
        a,
        sums,
        out,
        |base, h| {
            // SAFETY: `base` is a 352-byte Q5_0 group block.
            unsafe { q5_0_plane_codes(base, h) }
        },
        |v, qs| pairs_dot_halves(v, qs),
    )
}

/// Half `h`'s eight code vectors of a Q5_0 group block with the fifth bits as planes
/// ([`crate::repack::FifthBits::Planes`]).
///
/// # Safety
/// `base` must be valid for the 352 bytes of a Q5_0 group block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_0_plane_codes(base: *const u8, h: usize) -> [__m256i; 8] {
    let m4 = _mm256_set1_epi8(0x0F);
    let sixteen = _mm256_set1_epi8(16);
    // SAFETY: the planes at 32..96 and four nibble vectors at 96..352 of the 352-byte
    // group block; half `h` reads its 32 bytes of each.
    let (mut v, p) = unsafe {
        let v = nibble_codes(base.add(96 + 32 * h), m4);
        (v, _mm256_loadu_si256(base.add(32 + 32 * h).cast()))
    };
    let at_bit4 = [
        _mm256_slli_epi16::<4>(p),
        _mm256_slli_epi16::<3>(p),
        _mm256_slli_epi16::<2>(p),
        _mm256_slli_epi16::<1>(p),
        p,
        _mm256_srli_epi16::<1>(p),
        _mm256_srli_epi16::<2>(p),
        _mm256_srli_epi16::<3>(p),
    ];
    for (v, high) in v.iter_mut().zip(at_bit4) {
        *v = _mm256_or_si256(*v, _mm256_and_si256(high, sixteen));
    }
    v
}

/// Q4_0 weights of one 16-row group × `N` Q8_0 activation rows, as [`q5_0x16_q8_0`] without
/// the fifth bits: codes `w + 8`, so `8·Σq` is taken off each block's integer sum. (No AVX-512
/// kernel exists for Q4_0; this one runs at that level too.)
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_0x16_q8_0<const N: usize>(
    w: &[[u8; Q4_0X16_BYTES]],
    a: [&[BlockQ8_0]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
) {
    let m4 = _mm256_set1_epi8(0x0F);
    offset_codes_x16(
        w,
        8,
        PREFETCH_AHEAD,
        a,
        sums,
        out,
        |base, h| {
            // SAFETY: four nibble vectors at 32..288 of the 288-byte group block; half `h` reads
            // its 32 bytes of each.
            unsafe { nibble_codes(base.add(32 + 32 * h), m4) }
        },
        |v, qs| pairs_dot_halves(v, qs),
    )
}

/// Shared body of the offset-code kernels (Q5_0, Q4_0; Q8_0 with VNNI): `decode(block, h)`
/// gives half `h`'s eight code vectors (codes `w + offset`, unsigned), `dot(codes, qs)` their
/// exact integer dot product with an activation block per 32-bit lane; the scales are the
/// block's first 32 bytes, and a one-token call prefetches `ahead` bytes on. `sums` must hold
/// the activation blocks' exact integer `Σq` (as [`crate::QuantizedActivations`] makes them),
/// which is what the correction converts.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // the level's two hooks beside the kernel's arguments
pub(crate) fn offset_codes_x16<const B: usize, const N: usize>(
    w: &[[u8; B]],
    offset: i32,
    ahead: usize,
    a: [&[BlockQ8_0]; N],
    sums: [&[f32]; N],
    out: &mut [[f32; 16]; N],
    decode: impl Fn(*const u8, usize) -> [__m256i; 8],
    dot: impl Fn(&[__m256i; 8], &[i8; 32]) -> __m256i,
) {
    let nb = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let nb = sums.iter().fold(nb, |n, r| n.min(r.len()));
    let off = _mm256_set1_ps(offset as f32);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    let stream = streamed(N);
    for (b, g) in w[..nb].iter().enumerate() {
        let base = g.as_ptr();
        if N == 1 {
            prefetch(base.wrapping_add(ahead), B, stream);
        }
        for h in 0..2 {
            // SAFETY: the 16 f16 scales are the first 32 bytes of every group block (B ≥ 32).
            let dw = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(base.add(16 * h).cast())) };
            let v = decode(base, h);
            for t in 0..N {
                let y = &a[t][b];
                let s = dot(&v, &y.qs);
                // |Σq| < 2^12, so the f32 sum is an exact integer, and so is its product with
                // the offset (≤ 128, below 2^24); the vector conversion skips the checks of a
                // scalar `as`.
                let o = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_set1_ps(sums[t][b]), off));
                let s = _mm256_sub_epi32(s, o);
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(f16c(y.d)));
                acc[t][h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t][h]);
            }
        }
    }
    store(&acc, out);
}

/// The sum of `v[i] · (word i of qs, broadcast)` as 16-bit pair sums per lane (eight
/// `vpmaddubsw`); the caller guarantees the total fits in 16 bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn block_pairs(v: &[__m256i; 8], qs: &[i8; 32]) -> __m256i {
    let (lo, hi) = block_pairs_halves(v, qs);
    _mm256_add_epi16(lo, hi)
}

/// The exact integer dot product of codes below 32 with an activation block, per 32-bit lane:
/// |pair| ≤ 2·31·127, so four pair sums fit in 16 bits and the block is widened in two halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn pairs_dot_halves(v: &[__m256i; 8], qs: &[i8; 32]) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let (lo, hi) = block_pairs_halves(v, qs);
    _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones))
}

/// [`block_pairs`] in two halves (codes `0..16` of the block and `16..32`), for codes whose
/// eight pair sums could overflow 16 bits but four cannot.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn block_pairs_halves(v: &[__m256i; 8], qs: &[i8; 32]) -> (__m256i, __m256i) {
    let q = qs.as_ptr().cast::<i32>();
    let mut s = [_mm256_setzero_si256(); 2];
    for (i, v) in v.iter().enumerate() {
        // SAFETY: word i of the 32-byte `qs`.
        let y = _mm256_set1_epi32(unsafe { q.add(i).read_unaligned() });
        s[i / 4] = _mm256_add_epi16(s[i / 4], _mm256_maddubs_epi16(*v, y));
    }
    (s[0], s[1])
}

/// One half of four packed-nibble vectors (at `p`, 64 bytes apart) → eight code vectors:
/// vector `i` holds codes `4i..4i + 4` of the half's eight rows, low nibbles for `i < 4`,
/// high ones (codes `16 + 4(i − 4)..`) above.
///
/// # Safety
/// `p + 64j .. p + 64j + 32` must be readable for `j < 4`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn nibble_codes(p: *const u8, m4: __m256i) -> [__m256i; 8] {
    let mut v = [_mm256_setzero_si256(); 8];
    for j in 0..4 {
        // SAFETY: the caller's bytes.
        let packed = unsafe { _mm256_loadu_si256(p.add(64 * j).cast()) };
        v[j] = _mm256_and_si256(packed, m4);
        v[j + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), m4);
    }
    v
}

/// Writes each token's two halves (rows 0..8, 8..16) as its 16 outputs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn store<const N: usize>(acc: &[[__m256; 2]; N], out: &mut [[f32; 16]; N]) {
    for (acc, out) in acc.iter().zip(out.iter_mut()) {
        // SAFETY: `out` is 16 floats.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), acc[1]);
        }
    }
}

/// How far ahead of the block being multiplied a one-token call asks for its weights: on a
/// Zen 3 VM decode ran 10–20% faster with it (any distance from 768 to 3,072 bytes alike);
/// with several tokens the weights come from cache and the hint would only cost instructions.
pub(crate) const PREFETCH_AHEAD: usize = 1536;

/// [`PREFETCH_AHEAD`] for the kernels that measured faster asking further ahead: the 8-bit
/// codes (the Q8_0 kernel and the 16-bit head) and Q4_1 (`docs/benchmarks-history.md`, issue 20).
pub(crate) const FAR_PREFETCH_AHEAD: usize = 3072;

/// Asks for the cache lines of `bytes` from `at` (an address past the matrix is harmless: a
/// prefetch never faults): into L1 alone when the weights are `streamed` past the caches
/// ([`crate::stream`]), else into every level.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn prefetch(at: *const u8, bytes: usize, streamed: bool) {
    for line in 0..bytes.div_ceil(64) {
        let p = at.wrapping_add(64 * line).cast();
        if streamed {
            _mm_prefetch::<_MM_HINT_NTA>(p);
        } else {
            _mm_prefetch::<_MM_HINT_T0>(p);
        }
    }
}

/// Whether a call with `n` tokens streams its weights: only one-token calls do (several
/// tokens reuse each weight across token tiles, from L2).
#[inline]
pub(crate) fn streamed(n: usize) -> bool {
    n == 1 && crate::stream::weights_exceed_cache()
}
