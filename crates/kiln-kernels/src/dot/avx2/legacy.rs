//! AVX2 kernels for the legacy 32-element block types and the float types.

use super::{f16c, f16c_at, hsum_ps};
use crate::format::blocks::*;
use std::arch::x86_64::*;

/// 16 packed bytes → 32 bytes: low nibbles in bytes 0..16, high nibbles in 16..32, which is
/// the element order of the legacy 4/5-bit blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: reads exactly the 16 bytes of `qs`.
    let v = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(v, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m);
    _mm256_set_m128i(hi, lo)
}

/// Expands the 32 bits of `qh` into 32 bytes that are 0xFF where the bit is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn bits_to_bytes(qh: u32) -> __m256i {
    let v = _mm256_set1_epi32(qh as i32);
    // Byte i takes source byte i/8 ...
    let shuf = _mm256_setr_epi64x(
        0x0000_0000_0000_0000,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let v = _mm256_shuffle_epi8(v, shuf);
    // ... and is all-ones after OR-ing every bit except bit i%8 iff that bit was set.
    let mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(v, mask), _mm256_set1_epi64x(-1))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load32(p: &[i8; 32]) -> __m256i {
    // SAFETY: reads exactly the 32 bytes of `p`.
    unsafe { _mm256_loadu_si256(p.as_ptr().cast()) }
}

/// Loads the 32 bytes at `OFF` of a block; the const assert makes an out-of-range offset a
/// compile error rather than a runtime check.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load32_at<const OFF: usize, const N: usize>(b: &[u8; N]) -> __m256i {
    const { assert!(OFF + 32 <= N) };
    // SAFETY: OFF + 32 <= N, checked at compile time.
    unsafe { _mm256_loadu_si256(b.as_ptr().add(OFF).cast()) }
}

/// Unsigned × signed byte products summed into 8 i32 lanes, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_us8(x_u8: __m256i, y_i8: __m256i) -> __m256 {
    let p16 = _mm256_maddubs_epi16(x_u8, y_i8);
    let p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    _mm256_cvtepi32_ps(p32)
}

/// Signed × signed bytes: move x's sign onto y so `maddubs` (unsigned × signed) applies.
/// Exact as long as y has no -128 (negating it wraps); the Q8 quantizers only emit ±127,
/// as in ggml, so hand-built activation blocks must respect that too.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_ss8(x: __m256i, y: __m256i) -> __m256 {
    dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// The 16 `qs` bytes at `OFF` of a block (compile-time range check).
#[inline(always)]
pub(super) fn qs16<const OFF: usize, const N: usize>(b: &[u8; N]) -> &[u8; 16] {
    const { assert!(OFF + 16 <= N) };
    // SAFETY: OFF + 16 <= N, checked at compile time; [u8; 16] has alignment 1.
    unsafe { &*b.as_ptr().add(OFF).cast::<[u8; 16]>() }
}

/// Q4_0 × Q8_0.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_0_q8_0(w: &[[u8; Q4_0_BYTES]], a: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let eight = _mm256_set1_epi8(8);
    for (b, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(f16c_at(b, 0) * f16c(y.d));
        let q = _mm256_sub_epi8(nibbles(qs16::<2, _>(b)), eight);
        acc = _mm256_fmadd_ps(d, dot_ss8(q, load32(&y.qs)), acc);
    }
    hsum_ps(acc)
}

/// Q4_1 × Q8_1.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_1_q8_1(w: &[[u8; Q4_1_BYTES]], a: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summ = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(f16c_at(b, 0) * f16c(y.d));
        summ += f16c_at(b, 2) * f16c(y.s);
        acc = _mm256_fmadd_ps(d, dot_us8(nibbles(qs16::<4, _>(b)), load32(&y.qs)), acc);
    }
    hsum_ps(acc) + summ
}

/// Q5_0 × Q8_0.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_0_q8_0(w: &[[u8; Q5_0_BYTES]], a: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let bit4 = _mm256_set1_epi8(0x10);
    let sixteen = _mm256_set1_epi8(16);
    for (b, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(f16c_at(b, 0) * f16c(y.d));
        let hi = _mm256_and_si256(bits_to_bytes(u32_at(b, 2)), bit4);
        let q = _mm256_sub_epi8(_mm256_or_si256(nibbles(qs16::<6, _>(b)), hi), sixteen);
        acc = _mm256_fmadd_ps(d, dot_ss8(q, load32(&y.qs)), acc);
    }
    hsum_ps(acc)
}

/// Q5_1 × Q8_1.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_1_q8_1(w: &[[u8; Q5_1_BYTES]], a: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summ = 0.0f32;
    let bit4 = _mm256_set1_epi8(0x10);
    for (b, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(f16c_at(b, 0) * f16c(y.d));
        summ += f16c_at(b, 2) * f16c(y.s);
        let hi = _mm256_and_si256(bits_to_bytes(u32_at(b, 4)), bit4);
        let q = _mm256_or_si256(nibbles(qs16::<8, _>(b)), hi);
        acc = _mm256_fmadd_ps(d, dot_us8(q, load32(&y.qs)), acc);
    }
    hsum_ps(acc) + summ
}

/// Q8_0 × Q8_0.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q8_0_q8_0(w: &[[u8; Q8_0_BYTES]], a: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(f16c_at(b, 0) * f16c(y.d));
        acc = _mm256_fmadd_ps(d, dot_ss8(load32_at::<2, _>(b), load32(&y.qs)), acc);
    }
    hsum_ps(acc)
}

/// Float dot body shared by the float kernels: `$load(i)` widens 8 weights at element `i`
/// to f32, `$tail(i)` one weight. A macro rather than a function so the loads are compiled
/// inside the caller's `#[target_feature]` context.
macro_rules! float_dot {
    ($n:expr, $x:expr, $load:expr, $tail:expr $(,)?) => {{
        let n: usize = $n;
        let x: &[f32] = $x;
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let j = i + 8 * k;
                // SAFETY: j + 8 <= n <= x.len().
                let xv = unsafe { _mm256_loadu_ps(x.as_ptr().add(j)) };
                *a = _mm256_fmadd_ps($load(j), xv, *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: i + 8 <= n <= x.len().
            let xv = unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) };
            acc[0] = _mm256_fmadd_ps($load(i), xv, acc[0]);
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut r = hsum_ps(s);
        while i < n {
            r += $tail(i) * x[i];
            i += 1;
        }
        r
    }};
}

/// f32 weights × f32 activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn f32s_f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    float_dot!(
        n,
        x,
        // SAFETY: float_dot only loads at i + 8 <= n.
        |i| unsafe { _mm256_loadu_ps(w.as_ptr().add(i)) },
        |i| w[i]
    )
}

/// f32 weights (little-endian bytes) × f32 activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn f32_f32(w: &[[u8; 4]], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let p = w.as_ptr().cast::<f32>();
    // SAFETY: float_dot only loads at i + 8 <= n; loadu has no alignment requirement and x86
    // is little-endian, so the bytes are the floats.
    float_dot!(n, x, |i| unsafe { _mm256_loadu_ps(p.add(i)) }, |i| {
        f32::from_le_bytes(w[i])
    })
}

/// f16 weights × f32 activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn f16_f32(w: &[[u8; 2]], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let p = w.as_ptr().cast::<u8>();
    float_dot!(
        n,
        x,
        // SAFETY: float_dot only loads 8 halves at i + 8 <= n.
        |i| unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i).cast())) },
        |i| half::f16::from_bits(u16::from_le_bytes(w[i])).to_f32(),
    )
}

/// bf16 weights × f32 activations.
///
/// # Safety
/// The CPU must support avx2, fma and f16c ([`crate::CpuLevel::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn bf16_f32(w: &[[u8; 2]], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let p = w.as_ptr().cast::<u8>();
    float_dot!(
        n,
        x,
        // SAFETY: float_dot only loads 8 halves at i + 8 <= n.
        |i| unsafe {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(2 * i).cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        },
        |i| f32::from_bits((u16::from_le_bytes(w[i]) as u32) << 16),
    )
}
