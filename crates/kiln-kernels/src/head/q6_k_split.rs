//! The output head on Q6_K weights (llama-quantize's head for K-quant and Q4_0 files whose
//! width is a multiple of 256) with 15-bit activations, in the file layout.
//!
//! The head's logits feed the sampler directly, so its activations are not rounded to 8 bits
//! (see [`crate::head::f32_acts`]). Here each 256 values share an f32 scale and take 15-bit
//! codes `q = 128·hi + lo` (`hi` signed, `lo` in 0..128), so both halves fit the signed
//! operand of `vpmaddubsw` against the unsigned 6-bit weight codes: two byte multiplies per
//! weight instead of the f32 path's conversion of every weight to float, which leaves that path
//! compute-bound on a head of a 128k vocabulary. The weight codes' offset of 32 is taken out
//! once per 16 values through the activations' sums.

use crate::error::Result;
use crate::format::blocks::Q6_K_BYTES;
use crate::format::types::GgmlType;
use crate::level::CpuLevel;
use crate::matmul::{QMatrix, check_len, par_drive};

/// The largest activation code: `hi = q >> 7` must fit an i8.
const CODE_MAX: f32 = 16383.0;

/// Activations as 15-bit codes split into two bytes, with one f32 scale per 256 values and the
/// codes' sum per 16 values, reused between calls.
#[derive(Debug, Default)]
pub struct SplitActivations {
    n_rows: usize,
    cols: usize,
    hi: Vec<i8>,
    lo: Vec<i8>,
    sums: Vec<i32>,
    scales: Vec<f32>,
}

/// One row of [`SplitActivations`].
#[derive(Clone, Copy, Debug)]
pub struct SplitRow<'a> {
    /// `q >> 7` of each code.
    pub hi: &'a [i8],
    /// `q & 127` of each code.
    pub lo: &'a [i8],
    /// Σ q over each 16 values.
    pub sums: &'a [i32],
    /// The scale of each 256 values.
    pub scales: &'a [f32],
}

impl SplitActivations {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes `n_rows` rows of `x` (row length a multiple of 256): per block of 256, scale
    /// `max|x| / 16383` and codes `round(x / scale)`. Non-finite values never panic; they only
    /// spoil their own block.
    pub fn quantize(&mut self, x: &[f32], n_rows: usize) -> Result<()> {
        let cols = x.len().checked_div(n_rows).unwrap_or(0);
        check_len("15-bit activation rows", n_rows, cols, x.len())?;
        check_len("15-bit activation blocks", cols / 256, 256, cols)?;
        self.hi.clear();
        self.lo.clear();
        self.sums.clear();
        self.scales.clear();
        for block in x.chunks_exact(256) {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / CODE_MAX;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            for sub in block.chunks_exact(16) {
                let mut sum = 0i32;
                for &v in sub {
                    // `as` saturates and maps NaN to 0; the clamp keeps `hi` in i8.
                    let q = ((v * id).round() as i32).clamp(-16383, 16383);
                    sum += q;
                    self.hi.push((q >> 7) as i8);
                    self.lo.push((q & 127) as i8);
                }
                self.sums.push(sum);
            }
            self.scales.push(d);
        }
        self.n_rows = n_rows;
        self.cols = cols;
        Ok(())
    }

    /// Row `t` (empty past the last row).
    pub fn row(&self, t: usize) -> SplitRow<'_> {
        if t >= self.n_rows {
            return SplitRow {
                hi: &[],
                lo: &[],
                sums: &[],
                scales: &[],
            };
        }
        let (c, b) = (self.cols, self.cols / 256);
        SplitRow {
            hi: &self.hi[t * c..(t + 1) * c],
            lo: &self.lo[t * c..(t + 1) * c],
            sums: &self.sums[t * 16 * b..(t + 1) * 16 * b],
            scales: &self.scales[t * b..(t + 1) * b],
        }
    }
}

/// Whether a head matrix of type `ty` takes this path at `level`.
pub fn worthwhile(level: CpuLevel, ty: GgmlType) -> bool {
    cfg!(target_arch = "x86_64")
        && ty == GgmlType::Q6_K
        && level.clamp_to_hardware() >= CpuLevel::Avx2
}

/// `out[t * rows + r] = dot(row r, x row t)` with `x` quantized into `scratch`.
pub fn matmul_q6_k_split(
    w: &QMatrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut SplitActivations,
) -> Result<()> {
    matmul_q6_k_split_at(crate::cpu_level(), w, x, n_tokens, out, scratch)
}

/// [`matmul_q6_k_split`] at an explicit level (clamped to the hardware); below AVX2 it runs
/// the scalar reference (tests only). Only Q6_K weights are accepted.
pub fn matmul_q6_k_split_at(
    level: CpuLevel,
    w: &QMatrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut SplitActivations,
) -> Result<()> {
    if w.ty() != GgmlType::Q6_K {
        return Err(crate::KernelError::Unsupported {
            op: "15-bit activation head",
            ty: w.ty(),
        });
    }
    check_len("matmul input x", n_tokens, w.cols(), x.len())?;
    check_len("matmul output", n_tokens, w.rows(), out.len())?;
    scratch.quantize(x, n_tokens)?;
    let level = level.clamp_to_hardware();
    let acts = &*scratch;
    let (rb, data) = (w.row_bytes(), w.data());
    par_drive(w.rows(), n_tokens, out, |r, t| {
        let row = &data[r * rb..(r + 1) * rb];
        let x = acts.row(t);
        #[cfg(target_arch = "x86_64")]
        if level >= CpuLevel::Avx512 {
            // SAFETY: the level is clamped to the hardware, so the AVX-512 set is present;
            // `row` holds `cols / 256` blocks and `x` the same number of 256-value blocks.
            return unsafe { q6_k_split_avx512(row, x) };
        }
        #[cfg(target_arch = "x86_64")]
        if level >= CpuLevel::Avx2 {
            // SAFETY: the level is clamped to the hardware, so avx2, fma and f16c are present;
            // `row` holds `cols / 256` blocks and `x` the same number of 256-value blocks.
            return unsafe { q6_k_split_avx2(row, x) };
        }
        q6_k_split_reference(row, x)
    });
    Ok(())
}

/// The scalar reference: per block `d_w·d_x·Σ_j scale_j·Σ (code − 32)·q` as an exact integer
/// sum, added in block order.
pub fn q6_k_split_reference(row: &[u8], x: SplitRow<'_>) -> f32 {
    let mut total = 0f32;
    for (sb, block) in row.chunks_exact(Q6_K_BYTES).enumerate() {
        let (ql, qh, sc) = (&block[..128], &block[128..192], &block[192..208]);
        let dw = half::f16::from_le_bytes([block[208], block[209]]).to_f32();
        let mut isum = 0i64;
        for i in 0..256 {
            let (half, l) = (i / 128, i % 128);
            let (quarter, l) = (l / 32, l % 32);
            let low = ql[64 * half + 32 * (quarter % 2) + l] >> (4 * (quarter / 2)) & 0x0F;
            let high = (qh[32 * half + l] >> (2 * quarter)) & 3;
            let code = i64::from(low | high << 4) - 32;
            let q = i64::from(x.hi[256 * sb + i]) * 128 + i64::from(x.lo[256 * sb + i]);
            isum += i64::from(sc[i / 16] as i8) * code * q;
        }
        total += dw * x.scales[sb] * isum as f32;
    }
    total
}

/// The AVX2 kernel: each 128-value half of a block is rebuilt as four vectors of 32 unsigned
/// codes in element order (as in the f32 path), so 16-value sub-block `j` is one 128-bit lane.
///
/// # Safety
/// The CPU must have avx2, fma and f16c; `x` must have as many 256-value blocks as `row`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_split_avx2(row: &[u8], x: SplitRow<'_>) -> f32 {
    use std::arch::x86_64::*;
    let (m4, m2) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
    let (mut acc, mut offset) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (sb, block) in row.chunks_exact(Q6_K_BYTES).enumerate() {
        let d = crate::dot::avx2::f16c(half::f16::from_le_bytes([block[208], block[209]]))
            * x.scales[sb];
        let sc = &block[192..208];
        let (mut ihi, mut ilo) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for half in 0..2 {
            // SAFETY: the loads read bytes 64·half..64·half + 64 (ql) and
            // 128 + 32·half..+32 (qh) of the 210-byte block.
            let codes = unsafe {
                let p = block.as_ptr();
                let ql0 = _mm256_loadu_si256(p.add(64 * half).cast());
                let ql1 = _mm256_loadu_si256(p.add(64 * half + 32).cast());
                let qh = _mm256_loadu_si256(p.add(128 + 32 * half).cast());
                // Two bits of qh to bits 4..6 of each byte, masked before the 16-bit shift.
                let h = |s: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(s, m2));
                [
                    _mm256_or_si256(_mm256_and_si256(ql0, m4), h(qh)),
                    _mm256_or_si256(_mm256_and_si256(ql1, m4), h(_mm256_srli_epi16::<2>(qh))),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        h(_mm256_srli_epi16::<4>(qh)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        h(_mm256_srli_epi16::<6>(qh)),
                    ),
                ]
            };
            for (k, c) in codes.iter().enumerate() {
                let j = 8 * half + 2 * k;
                let scale = _mm256_set_m128i(
                    _mm_set1_epi16(i16::from(sc[j + 1] as i8)),
                    _mm_set1_epi16(i16::from(sc[j] as i8)),
                );
                let at = 256 * sb + 16 * j;
                // SAFETY: `x` has 256 codes per block; this reads 32 of block `sb`'s.
                let (xh, xl) = unsafe {
                    (
                        _mm256_loadu_si256(x.hi.as_ptr().add(at).cast()),
                        _mm256_loadu_si256(x.lo.as_ptr().add(at).cast()),
                    )
                };
                // Codes ≤ 63 and |hi|, |lo| ≤ 128: the byte-pair sums never saturate, and the
                // i32 lanes stay under 2^26 over a block.
                let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(*c, xh), scale);
                let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(*c, xl), scale);
                ihi = _mm256_add_epi32(ihi, ph);
                ilo = _mm256_add_epi32(ilo, pl);
            }
        }
        // SAFETY: `sums` has 16 per block and `sc` is 16 bytes of the block.
        let bias = unsafe {
            let sums = x.sums.as_ptr().add(16 * sb);
            let s0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(sc.as_ptr().cast()));
            let s1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(sc.as_ptr().add(8).cast()));
            _mm256_add_epi32(
                _mm256_mullo_epi32(s0, _mm256_loadu_si256(sums.cast())),
                _mm256_mullo_epi32(s1, _mm256_loadu_si256(sums.add(8).cast())),
            )
        };
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ihi), _mm256_set1_ps(128.0 * d), acc);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ilo), _mm256_set1_ps(d), acc);
        offset = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bias), _mm256_set1_ps(32.0 * d), offset);
    }
    crate::dot::avx2::hsum_ps(_mm256_sub_ps(acc, offset))
}

/// The AVX-512 kernel: each block is rebuilt as four vectors of 64 unsigned codes in element
/// order, so 16-value sub-block `j` is 128-bit lane `j % 4` of vector `j / 4`; `vpdpwssd`
/// weighs each lane's byte-pair sums by its sub-block scale.
///
/// # Safety
/// The CPU must support the [`CpuLevel::Avx512`] feature set; `x` must have as many 256-value
/// blocks as `row`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k_split_avx512(row: &[u8], x: SplitRow<'_>) -> f32 {
    use std::arch::x86_64::*;
    let (m4, m2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(3));
    // 16-bit shifts that bring bits 0..1 / 2..3 (codes 0..64 of a half) and 4..5 / 6..7
    // (codes 64..128) of the shared high-bit bytes down, one count per 256-bit half.
    let shift_low = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
    let shift_high = _mm512_add_epi16(shift_low, _mm512_set1_epi16(4));
    // Lane `l` of scale vector `k` takes sub-block `4k + l`'s scale, as 16-bit words.
    let lane = |k: i16| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set_m128i(
                _mm_set1_epi16(4 * k + 1),
                _mm_set1_epi16(4 * k),
            )),
            _mm256_set_m128i(_mm_set1_epi16(4 * k + 3), _mm_set1_epi16(4 * k + 2)),
        )
    };
    let pick = [lane(0), lane(1), lane(2), lane(3)];
    let (mut acc, mut offset) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for (sb, block) in row.chunks_exact(Q6_K_BYTES).enumerate() {
        let d = crate::dot::avx2::f16c(half::f16::from_le_bytes([block[208], block[209]]))
            * x.scales[sb];
        let p = block.as_ptr();
        // SAFETY: 16 scale bytes at 192 of the 210-byte block.
        let sc16 = unsafe {
            _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192).cast())))
        };
        let (mut ihi, mut ilo) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for half in 0..2 {
            // SAFETY: bytes 64·half..+64 (ql) and 128 + 32·half..+32 (qh) of the block.
            let (ql, qh) = unsafe {
                (
                    _mm512_loadu_si512(p.add(64 * half).cast()),
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(128 + 32 * half).cast())),
                )
            };
            let h = |s: __m512i| _mm512_slli_epi16::<4>(_mm512_and_si512(s, m2));
            let codes = [
                _mm512_or_si512(
                    _mm512_and_si512(ql, m4),
                    h(_mm512_srlv_epi16(qh, shift_low)),
                ),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                    h(_mm512_srlv_epi16(qh, shift_high)),
                ),
            ];
            for (i, c) in codes.iter().enumerate() {
                let k = 2 * half + i;
                let scale = _mm512_permutexvar_epi16(pick[k], sc16);
                let at = 256 * sb + 64 * k;
                // SAFETY: `x` has 256 codes per block; this reads 64 of block `sb`'s.
                let (xh, xl) = unsafe {
                    (
                        _mm512_loadu_si512(x.hi.as_ptr().add(at).cast()),
                        _mm512_loadu_si512(x.lo.as_ptr().add(at).cast()),
                    )
                };
                // As in the AVX2 kernel: the byte-pair sums never saturate.
                ihi = _mm512_dpwssd_epi32(ihi, _mm512_maddubs_epi16(*c, xh), scale);
                ilo = _mm512_dpwssd_epi32(ilo, _mm512_maddubs_epi16(*c, xl), scale);
            }
        }
        // SAFETY: `sums` has 16 per block; 16 scale bytes at 192.
        let bias = unsafe {
            let s = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(192).cast()));
            _mm512_mullo_epi32(s, _mm512_loadu_si512(x.sums.as_ptr().add(16 * sb).cast()))
        };
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ihi), _mm512_set1_ps(128.0 * d), acc);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ilo), _mm512_set1_ps(d), acc);
        offset = _mm512_fmadd_ps(_mm512_cvtepi32_ps(bias), _mm512_set1_ps(32.0 * d), offset);
    }
    _mm512_reduce_add_ps(_mm512_sub_ps(acc, offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head::f32_acts::dot_at;
    use crate::level::supported_levels;

    fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    fn q6_k_matrix(rows: usize, blocks: usize, seed: u64) -> Vec<u8> {
        let mut next = xorshift(seed);
        let mut data = vec![];
        for _ in 0..rows * blocks {
            data.extend((0..208).map(|_| next() as u8));
            let d = half::f16::from_f32(0.001 + (next() % 100) as f32 / 10_000.0);
            data.extend(d.to_le_bytes());
        }
        data
    }

    /// Every level agrees with the exact integer reference within float rounding and with
    /// the f32-activation path within the 15-bit rounding; prefill rows equal decode.
    #[test]
    fn matches_reference_and_f32_path_at_every_level() {
        let (rows, blocks, n_tokens) = (37, 3, 3);
        let cols = blocks * 256;
        let data = q6_k_matrix(rows, blocks, 0x5EED);
        let w = QMatrix::new(GgmlType::Q6_K, rows, cols, &data).expect("matrix");
        let mut next = xorshift(77);
        let mut x: Vec<f32> = (0..n_tokens * cols)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        x[5] = 40.0; // one outlier: its block's scale grows, the others' do not
        let mut acts = SplitActivations::new();
        acts.quantize(&x, n_tokens).expect("quantize");
        for level in supported_levels() {
            let mut out = vec![0f32; rows * n_tokens];
            let mut scratch = SplitActivations::new();
            matmul_q6_k_split_at(level, &w, &x, n_tokens, &mut out, &mut scratch).expect("mm");
            for t in 0..n_tokens {
                let xt = &x[t * cols..(t + 1) * cols];
                for r in 0..rows {
                    let row = w.row(r).expect("row");
                    let got = out[t * rows + r];
                    let exact = q6_k_split_reference(row, acts.row(t));
                    let f32_path = dot_at(CpuLevel::Scalar, GgmlType::Q6_K, row, xt);
                    let mut deq = vec![0f32; cols];
                    crate::format::dequant::dequantize_unchecked(GgmlType::Q6_K, row, &mut deq);
                    let scale: f32 = deq.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                    assert!(
                        (got - exact).abs() <= 1e-5 * scale,
                        "{level:?}: {got} vs {exact}"
                    );
                    assert!(
                        (got - f32_path).abs() <= 1e-3 * scale,
                        "{level:?}: {got} vs {f32_path}"
                    );
                }
            }
            let mut one = vec![0f32; rows];
            let mut scratch = SplitActivations::new();
            matmul_q6_k_split_at(level, &w, &x[cols..2 * cols], 1, &mut one, &mut scratch)
                .expect("decode");
            assert_eq!(one, out[rows..2 * rows], "{level:?}");
        }
    }

    #[test]
    fn codes_split_and_sum_exactly() {
        let mut next = xorshift(3);
        let x: Vec<f32> = (0..512)
            .map(|_| (next() % 20001) as f32 / 100.0 - 100.0)
            .collect();
        let mut acts = SplitActivations::new();
        acts.quantize(&x, 1).expect("quantize");
        let row = acts.row(0);
        for (i, &v) in x.iter().enumerate() {
            let q = i32::from(row.hi[i]) * 128 + i32::from(row.lo[i]);
            assert!(row.lo[i] >= 0);
            let back = q as f32 * row.scales[i / 256];
            assert!(
                (back - v).abs() <= row.scales[i / 256] * 0.5 + 1e-4,
                "{i}: {back} vs {v}"
            );
        }
        for (j, &s) in row.sums.iter().enumerate() {
            let want: i32 = (16 * j..16 * j + 16)
                .map(|i| i32::from(row.hi[i]) * 128 + i32::from(row.lo[i]))
                .sum();
            assert_eq!(s, want);
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        let data = q6_k_matrix(2, 1, 1);
        let w = QMatrix::new(GgmlType::Q6_K, 2, 256, &data).expect("matrix");
        let mut out = vec![0f32; 2];
        let mut scratch = SplitActivations::new();
        assert!(matmul_q6_k_split(&w, &[0.0; 100], 1, &mut out, &mut scratch).is_err());
        let q8 = vec![0u8; 34 * 8];
        let w8 = QMatrix::new(GgmlType::Q8_0, 1, 256, &q8).expect("q8");
        assert!(matmul_q6_k_split(&w8, &[0.0; 256], 1, &mut out[..1], &mut scratch).is_err());
        let mut nan = vec![1.0f32; 512];
        nan[3] = f32::NAN;
        nan[300] = f32::INFINITY;
        scratch
            .quantize(&nan, 1)
            .expect("non-finite values quantize");
    }
}
