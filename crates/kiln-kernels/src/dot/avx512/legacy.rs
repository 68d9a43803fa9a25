//! AVX-512 VNNI kernels for Q4_1 × Q8_1, Q5_0 × Q8_0 and Q8_0 × Q8_0. Two 32-element blocks go through
//! one 512-bit `vpdpbusd` (u8 × i8 → i32, no intermediate i16 saturation); the per-block
//! scales are applied as a lane-blended scale vector with FMA. An odd trailing block uses the
//! AVX2 kernel.

use crate::dot::avx2::{self, f16c, f16c_at};
use crate::format::blocks::*;
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn load_pair(a: &[i8; 32], b: &[i8; 32]) -> __m512i {
    // SAFETY: each load reads exactly the 32 bytes of its array.
    unsafe {
        join(
            _mm256_loadu_si256(a.as_ptr().cast()),
            _mm256_loadu_si256(b.as_ptr().cast()),
        )
    }
}

/// Scale vector: lanes 0..8 = `da`, lanes 8..16 = `db`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn scales(da: f32, db: f32) -> __m512 {
    _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(da), _mm512_set1_ps(db))
}

/// The weight side of a Q4_1 block pair: the 64 nibbles as bytes in the order
/// `[lo0, lo1, hi0, hi1]` (16 bytes each) and the scales `[d0, m0, d1, m1]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q4_1_pair(b0: &[u8; Q4_1_BYTES], b1: &[u8; Q4_1_BYTES]) -> (__m512i, __m128) {
    // SAFETY: each load reads bytes 4..20 of a 20-byte block.
    let (q0, q1) = unsafe {
        (
            _mm_loadu_si128(b0.as_ptr().add(4).cast()),
            _mm_loadu_si128(b1.as_ptr().add(4).cast()),
        )
    };
    let v = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q0), q1);
    let m = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(v, m);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m);
    // Each block's header is `d` then `m`: one f16 pair per block, converted together.
    let heads = _mm_set_epi32(0, 0, u32_at(b1, 0) as i32, u32_at(b0, 0) as i32);
    (join(lo, hi), _mm_cvtph_ps(heads))
}

/// The activation side of a block pair, in the same lane order as [`q4_1_pair`], and the
/// scales `[d0, s0, d1, s1]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q8_1_pair(y0: &BlockQ8_1, y1: &BlockQ8_1) -> (__m512i, __m128) {
    // [y0 | y1] in qwords is [y0lo(0,1), y0hi(2,3), y1lo(4,5), y1hi(6,7)]; reorder to
    // [y0lo, y1lo, y0hi, y1hi] to meet the nibbles.
    let y = _mm512_permutexvar_epi64(
        _mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7),
        load_pair(&y0.qs, &y1.qs),
    );
    let bits = |b: &BlockQ8_1| (b.d.to_bits() as u32 | (b.s.to_bits() as u32) << 16) as i32;
    (y, _mm_cvtph_ps(_mm_set_epi32(0, 0, bits(y1), bits(y0))))
}

/// One block pair's contribution: `acc += Σ d·dy·(q·qy)` per lane, `mins += [_, m·s, _, m·s]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q4_1_pair_step(
    x: __m512i,
    ws: __m128,
    y: __m512i,
    ys: __m128,
    acc: __m512,
    mins: __m128,
) -> (__m512, __m128) {
    let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), x, y);
    let prod = _mm_mul_ps(ws, ys);
    // Lanes 0-3 and 8-11 hold block 0's sums, 4-7 and 12-15 block 1's.
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2);
    let d = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(prod));
    (
        _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc),
        _mm_add_ps(mins, prod),
    )
}

/// Sum of the vector accumulator and the `m·s` lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q4_1_finish(acc: __m512, mins: __m128) -> f32 {
    let m = _mm_add_ss(
        _mm_movehdup_ps(mins),
        _mm_movehl_ps(mins, _mm_movehdup_ps(mins)),
    );
    _mm512_reduce_add_ps(acc) + _mm_cvtss_f32(m)
}

/// Q4_1 × Q8_1.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q4_1_q8_1(w: &[[u8; Q4_1_BYTES]], a: &[BlockQ8_1]) -> f32 {
    let n = w.len().min(a.len());
    let (w2, wt) = w[..n].as_chunks::<2>();
    let (a2, at) = a[..n].as_chunks::<2>();
    let (mut acc, mut mins) = (_mm512_setzero_ps(), _mm_setzero_ps());
    for ([b0, b1], [y0, y1]) in w2.iter().zip(a2) {
        let (x, ws) = q4_1_pair(b0, b1);
        let (y, ys) = q8_1_pair(y0, y1);
        (acc, mins) = q4_1_pair_step(x, ws, y, ys, acc, mins);
    }
    q4_1_finish(acc, mins) + avx2::q4_1_q8_1(wt, at)
}

/// Q8_0 × Q8_0.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q8_0_q8_0(w: &[[u8; Q8_0_BYTES]], a: &[BlockQ8_0]) -> f32 {
    let n = w.len().min(a.len());
    let (w2, wt) = w[..n].as_chunks::<2>();
    let (a2, at) = a[..n].as_chunks::<2>();
    let mut acc = _mm512_setzero_ps();
    let zero = _mm512_setzero_si512();
    for ([b0, b1], [y0, y1]) in w2.iter().zip(a2) {
        // SAFETY: bytes 2..34 of a 34-byte block.
        let x = unsafe {
            join(
                _mm256_loadu_si256(b0.as_ptr().add(2).cast()),
                _mm256_loadu_si256(b1.as_ptr().add(2).cast()),
            )
        };
        let y = load_pair(&y0.qs, &y1.qs);
        // |x| as unsigned (|-128| = 128 fits u8) times y with x's sign moved onto it.
        let ax = _mm512_abs_epi8(x);
        let neg = _mm512_movepi8_mask(x);
        let sy = _mm512_mask_sub_epi8(y, neg, zero, y);
        let p = _mm512_dpbusd_epi32(zero, ax, sy);
        let d = scales(f16c_at(b0, 0) * f16c(y0.d), f16c_at(b1, 0) * f16c(y1.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    _mm512_reduce_add_ps(acc) + avx2::q8_0_q8_0(wt, at)
}

/// Q5_0 × Q8_0. A weight is `nibble + 16·bit - 16`: where the 5th bit is set it is the
/// nibble itself (≥ 0), elsewhere `nibble - 16` (< 0, magnitude `16 - nibble`), so the block
/// pair's 64 `qh` bits are directly the mask of non-negative weights.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q5_0_q8_0(w: &[[u8; Q5_0_BYTES]], a: &[BlockQ8_0]) -> f32 {
    let n = w.len().min(a.len());
    let (w2, wt) = w[..n].as_chunks::<2>();
    let (a2, at) = a[..n].as_chunks::<2>();
    let mut acc = _mm512_setzero_ps();
    let zero = _mm512_setzero_si512();
    let sixteen = _mm512_set1_epi8(16);
    for ([b0, b1], [y0, y1]) in w2.iter().zip(a2) {
        let nib = join(avx2::nibbles(q5_0_qs(b0)), avx2::nibbles(q5_0_qs(b1)));
        let pos = u32_at(b0, 2) as u64 | (u32_at(b1, 2) as u64) << 32;
        let ax = _mm512_mask_blend_epi8(pos, _mm512_sub_epi8(sixteen, nib), nib);
        let y = load_pair(&y0.qs, &y1.qs);
        let sy = _mm512_mask_sub_epi8(y, !pos, zero, y);
        let p = _mm512_dpbusd_epi32(zero, ax, sy);
        let d = scales(f16c_at(b0, 0) * f16c(y0.d), f16c_at(b1, 0) * f16c(y1.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    _mm512_reduce_add_ps(acc) + avx2::q5_0_q8_0(wt, at)
}

/// The 16 packed nibble bytes of a Q5_0 block.
#[inline(always)]
fn q5_0_qs(b: &[u8; Q5_0_BYTES]) -> &[u8; 16] {
    // Constant bounds inside a fixed-size array: the check folds away.
    b[6..22].try_into().expect("bytes 6..22 of a 22-byte block")
}

/// Q4_1 weights × `N` Q8_1 activation rows (a token tile): each weight pair is unpacked once
/// and used `N` times, which is what makes prefill compute-bound rather than unpack-bound.
/// `out[t]` receives the dot with `a[t]`, bit-identical to [`q4_1_q8_1`]; rows shorter than
/// `w` are cut to the shortest.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q4_1_q8_1_tile<const N: usize>(
    w: &[[u8; Q4_1_BYTES]],
    a: [&[BlockQ8_1]; N],
    out: &mut [f32; N],
) {
    let n = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let (w2, wt) = w[..n].as_chunks::<2>();
    let mut acc = [_mm512_setzero_ps(); N];
    let mut mins = [_mm_setzero_ps(); N];
    for (i, [b0, b1]) in w2.iter().enumerate() {
        let (x, ws) = q4_1_pair(b0, b1);
        for t in 0..N {
            let (y, ys) = q8_1_pair(&a[t][2 * i], &a[t][2 * i + 1]);
            (acc[t], mins[t]) = q4_1_pair_step(x, ws, y, ys, acc[t], mins[t]);
        }
    }
    let done = 2 * w2.len();
    for t in 0..N {
        out[t] = q4_1_finish(acc[t], mins[t]) + avx2::q4_1_q8_1(wt, &a[t][done..n]);
    }
}
