//! AVX-512 VNNI kernels for Q4_K and Q6_K weights repacked 16 rows at a time
//! ([`crate::repack::kquant`]): as for the 32-value formats (`repack.rs`), lane `k` of every vector
//! is row `k`, so each `vpdpbusd` multiplies four codes of 16 rows by one broadcast activation
//! word. Per 32 (Q4_K) or 16 (Q6_K) values the integer sum is multiplied by the rows' sub-block
//! scales (`vpmulld`) and summed in integers; floats enter once per super-block, as in ggml.

use super::repack::{block_dot, nibble_codes, vectors};
use crate::dot::avx2::repack_k::k_prefetch_ahead;
use crate::format::blocks::BlockQ8K;
use crate::repack::kquant::{
    Q4_K_CODES_AT, Q4_KX16_BYTES, Q6_K_CODES_AT, Q6_K_PIECE_BYTES, Q6_K_SCALES_AT, Q6_KX16_BYTES,
};
use std::arch::x86_64::*;

/// Q4_K weights of one 16-row group (`w`, one entry per super-block along the row) × `N` Q8_K
/// activation rows: `out[t][k] = dot(row k, a[t])`. Per super-block and row,
/// `d_a·(d·Σ_j sc_j·Σ q·y − dmin·Σ_j m_j·Σ y)`, the sums over sub-block `j` exact integers.
/// Blocks past the shortest of `w` and the activation rows are ignored.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q4_kx16_q8_k<const N: usize>(
    w: &[[u8; Q4_KX16_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [[f32; 16]; N],
) {
    let nb = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let m4 = _mm512_set1_epi8(0x0F);
    let low6 = _mm512_set1_epi32(63);
    let mut acc = [_mm512_setzero_ps(); N];
    let mut isum = [_mm512_setzero_si512(); N];
    // One loop over all pieces rather than a nest: a fixed count of 8 gets unrolled, and the
    // compiler then decodes every piece's codes up front and spills them to the stack.
    for i in 0..nb * 8 {
        let (b, p) = (i / 8, i % 8);
        let base = w[b].as_ptr();
        // SAFETY: scale bytes at 64 + 16p (inside 64..192); the piece's four code vectors at
        // 256 + 256p..512 + 256p, inside the 2,304-byte group block.
        let (sc, v) = unsafe {
            let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(base.add(64 + 16 * p).cast()));
            let piece = base.add(Q4_K_CODES_AT + 256 * p);
            prefetch(piece.wrapping_add(k_prefetch_ahead(N)), 256);
            let p4 = vectors::<4>(piece);
            (_mm512_and_si512(raw, low6), nibble_codes(&p4, m4))
        };
        for t in 0..N {
            let y = &a[t][b].qs.as_chunks::<32>().0[p];
            let s = block_dot(&v, y, _mm512_setzero_si512());
            isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s, sc));
        }
        if p < 7 {
            continue;
        }
        // SAFETY: d and dmin at 0..64, the minimums' bytes at 64..256.
        let (dw, mw, mins) = unsafe {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(base.cast())),
                _mm512_cvtph_ps(_mm256_loadu_si256(base.add(32).cast())),
                q4_k_minimums(base),
            )
        };
        for t in 0..N {
            let y = &a[t][b];
            let pairs = y.bsums.as_ptr().cast::<i32>();
            let mut msum = _mm512_setzero_si512();
            for (j, m) in mins.iter().enumerate() {
                // SAFETY: word j is bsums[2j..2j + 2], inside the 16 sums.
                let word = unsafe { pairs.add(j).read_unaligned() };
                msum = _mm512_dpwssd_epi32(msum, *m, _mm512_set1_epi32(word));
            }
            let da = _mm512_set1_ps(y.d);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum[t]), acc[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(mw, da), _mm512_cvtepi32_ps(msum), acc[t]);
            isum[t] = _mm512_setzero_si512();
        }
    }
    for t in 0..N {
        // SAFETY: `out[t]` is 16 floats.
        unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}

/// Asks for the cache lines of `bytes` from `at` (an address past the matrix is harmless: a
/// prefetch never faults).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn prefetch(at: *const u8, bytes: usize) {
    for line in 0..bytes.div_ceil(64) {
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * line).cast());
    }
}

/// The eight sub-block minimums of a Q4_K group block, lane `k` holding row `k`'s `m_j` in both
/// 16-bit halves, so that `vpdpwssd` against the activation sums of values `32j..32j + 16` and
/// `32j + 16..32j + 32` gives `m_j·Σ y`.
///
/// # Safety
/// `base` must be valid for 256 bytes of reads.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_minimums(base: *const u8) -> [__m512i; 8] {
    let m4 = _mm512_set1_epi32(0x0F);
    let mut mins = [_mm512_setzero_si512(); 8];
    for (j, m) in mins.iter_mut().enumerate() {
        // SAFETY: bytes 64 + 16j.. and 192 + 16(j mod 4).. lie inside the caller's 256.
        let (top, low) = unsafe {
            (
                _mm512_cvtepu8_epi32(_mm_loadu_si128(base.add(64 + 16 * j).cast())),
                _mm512_cvtepu8_epi32(_mm_loadu_si128(base.add(192 + 16 * (j % 4)).cast())),
            )
        };
        let low = if j < 4 {
            low
        } else {
            _mm512_srli_epi32::<4>(low)
        };
        let v = _mm512_or_si512(
            _mm512_slli_epi32::<4>(_mm512_srli_epi32::<6>(top)),
            _mm512_and_si512(low, m4),
        );
        *m = _mm512_or_si512(v, _mm512_slli_epi32::<16>(v));
    }
    mins
}

/// Q6_K weights of one 16-row group × `N` Q8_K activation rows, as [`q4_kx16_q8_k`]: per 16
/// values `sc·(Σ c·y − 32·Σ y)` with the stored codes `c = q + 32`, summed in integers, times
/// `d·d_a` once per super-block.
///
/// # Safety
/// The CPU must support the [`crate::CpuLevel::Avx512`] feature set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q6_kx16_q8_k<const N: usize>(
    w: &[[u8; Q6_KX16_BYTES]],
    a: [&[BlockQ8K]; N],
    out: &mut [[f32; 16]; N],
) {
    let nb = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let m4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); N];
    let mut isum = [_mm512_setzero_si512(); N];
    // One loop over all pieces, as in `q4_kx16_q8_k`.
    for i in 0..nb * 8 {
        let (b, p) = (i / 8, i % 8);
        let base = w[b].as_ptr();
        // SAFETY: the scales of values 32p..32p + 32 at 32 + 32p..64 + 32p; the piece at
        // 288 + 384p..672 + 384p, inside the 3,360-byte group block.
        let (sc_lo, sc_hi, v) = unsafe {
            let sc = |s: usize| {
                _mm512_cvtepi8_epi32(_mm_loadu_si128(base.add(Q6_K_SCALES_AT + 16 * s).cast()))
            };
            let piece = base.add(Q6_K_CODES_AT + Q6_K_PIECE_BYTES * p);
            prefetch(piece.wrapping_add(k_prefetch_ahead(N)), Q6_K_PIECE_BYTES);
            (sc(2 * p), sc(2 * p + 1), q6_k_codes(piece, m4))
        };
        for t in 0..N {
            let y = &a[t][b];
            let q = y.qs.as_chunks::<32>().0[p].as_ptr().cast::<i32>();
            let (s_lo, s_hi) = (i32::from(y.bsums[2 * p]), i32::from(y.bsums[2 * p + 1]));
            let mut lo = _mm512_set1_epi32(-32 * s_lo);
            let mut hi = _mm512_set1_epi32(-32 * s_hi);
            for i in 0..4 {
                // SAFETY: words i and 4 + i of the 32-byte piece of qs.
                let (y0, y1) =
                    unsafe { (q.add(i).read_unaligned(), q.add(4 + i).read_unaligned()) };
                lo = _mm512_dpbusd_epi32(lo, v[i], _mm512_set1_epi32(y0));
                hi = _mm512_dpbusd_epi32(hi, v[4 + i], _mm512_set1_epi32(y1));
            }
            let s = _mm512_add_epi32(_mm512_mullo_epi32(lo, sc_lo), _mm512_mullo_epi32(hi, sc_hi));
            isum[t] = _mm512_add_epi32(isum[t], s);
        }
        if p < 7 {
            continue;
        }
        // SAFETY: the 16 f16 d at 0..32.
        let dw = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(base.cast())) };
        for t in 0..N {
            let d = _mm512_mul_ps(dw, _mm512_set1_ps(a[t][b].d));
            acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum[t]), acc[t]);
            isum[t] = _mm512_setzero_si512();
        }
    }
    for t in 0..N {
        // SAFETY: `out[t]` is 16 floats.
        unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}

/// The eight code vectors (values + 32, in 0..64) of one Q6_K piece: low nibbles as the
/// 32-value formats have them, the top two bits of vector `4h + i` taken from bits `2i..2i + 2`
/// of the bytes of high-bit vector `h` and moved to bits 4–5.
///
/// # Safety
/// `piece` must be valid for 384 bytes of reads.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k_codes(piece: *const u8, m4: __m512i) -> [__m512i; 8] {
    // SAFETY: four nibble vectors at 0..256, two high-bit vectors at 256..384.
    let (p4, high) = unsafe { (vectors::<4>(piece), vectors::<2>(piece.add(256))) };
    let mut v = nibble_codes(&p4, m4);
    let bits45 = _mm512_set1_epi8(0x30);
    for (h, hv) in high.into_iter().enumerate() {
        // Shifts of 16-bit lanes: the bits that cross into the other byte are masked off.
        let top = [
            _mm512_slli_epi16::<4>(hv),
            _mm512_slli_epi16::<2>(hv),
            hv,
            _mm512_srli_epi16::<2>(hv),
        ];
        for (i, t) in top.into_iter().enumerate() {
            v[4 * h + i] = _mm512_or_si512(v[4 * h + i], _mm512_and_si512(t, bits45));
        }
    }
    v
}
