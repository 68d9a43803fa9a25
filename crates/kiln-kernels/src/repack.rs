//! Weights repacked at load into groups of [`GROUP_ROWS`] rows, block by block, for the
//! AVX-512 VNNI kernels that compute 16 rows per instruction (`dot/avx512/repack.rs`).
//!
//! Q4_1 group block ([`Q4_1X16_BYTES`] = 16 file blocks): the 16 rows' f16 scales, their 16
//! f16 minimums, then four 64-byte code vectors; 32-bit lane `k` of vector `j` holds bytes
//! `4j..4j + 4` of row `k`'s packed nibbles, so the low nibbles of vector `j` are codes
//! `4j..4j + 4` and the high nibbles codes `16 + 4j..`. The group blocks of one group follow
//! each other along the row; groups follow each other down the matrix. A last group with fewer
//! than 16 rows is padded with zero blocks, whose outputs are dropped.
//!
//! Same bytes as the file layout (plus the padding). The minimum term multiplies the exact sum
//! of the block's dequantized activations, `f16(d)·Σq`, where the row kernels (as ggml) use the
//! block's `s`, rounded to f16: the two agree to f16 rounding. Prefill and decode run the same
//! kernel, so they agree to the bit.

use crate::blocks::{BlockQ8_1, Q4_1_BYTES};
use crate::error::{KernelError, Result};
use crate::level::CpuLevel;
use crate::matmul::{QMatrix, check_len};
use crate::quantize::{ActRow, QuantizedActivations};
use crate::tile::TOKEN_TILE;
use crate::types::GgmlType;

/// Rows per interleaved group.
pub const GROUP_ROWS: usize = 16;
/// Bytes of one Q4_1 group block: 16 scales, 16 minimums, 256 code bytes.
pub const Q4_1X16_BYTES: usize = GROUP_ROWS * Q4_1_BYTES;

/// A weight matrix in the interleaved layout of this module.
#[derive(Debug, Clone)]
pub struct RepackedMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl RepackedMatrix {
    /// Whether `ty` has an interleaved layout with kernels at `level` (clamped to the
    /// hardware). Other levels can still run a repacked matrix, through the scalar reference.
    pub fn worthwhile(level: CpuLevel, ty: GgmlType) -> bool {
        cfg!(target_arch = "x86_64")
            && level.clamp_to_hardware() >= CpuLevel::Avx512
            && ty == GgmlType::Q4_1
    }

    /// Repacks a copy of `w`; an error if its type has no interleaved layout.
    pub fn new(w: &QMatrix<'_>) -> Result<Self> {
        Self::from_file_bytes(w.ty(), w.rows(), w.cols(), w.data().to_vec())
    }

    /// Repacks `bytes` (`rows` rows of `cols` elements of `ty`, file layout) in place: group
    /// `g` takes exactly the bytes of rows `16g..16g + 16`, so only one group's worth is copied
    /// aside at a time and loading never holds the matrix twice. An error if `ty` has no
    /// interleaved layout or the size is wrong.
    pub fn from_file_bytes(ty: GgmlType, rows: usize, cols: usize, bytes: Vec<u8>) -> Result<Self> {
        if ty != GgmlType::Q4_1 {
            return Err(KernelError::Unsupported { op: "repack", ty });
        }
        let rb = QMatrix::new(ty, rows, cols, &bytes)?.row_bytes();
        let nb = rb / Q4_1_BYTES;
        let stripe = GROUP_ROWS * rb;
        let mut data = bytes;
        // Padding rows are zero blocks, in either layout.
        data.resize(rows.div_ceil(GROUP_ROWS) * stripe, 0);
        let mut file = vec![0u8; stripe];
        for group in data.chunks_exact_mut(stripe.max(1)) {
            file.copy_from_slice(group);
            for (k, row) in file.chunks_exact(rb.max(1)).enumerate() {
                for (b, blk) in row.chunks_exact(Q4_1_BYTES).enumerate() {
                    let dst = &mut group[b * Q4_1X16_BYTES..(b + 1) * Q4_1X16_BYTES];
                    dst[2 * k..2 * k + 2].copy_from_slice(&blk[0..2]);
                    dst[32 + 2 * k..32 + 2 * k + 2].copy_from_slice(&blk[2..4]);
                    for j in 0..4 {
                        let at = 64 + 64 * j + 4 * k;
                        dst[at..at + 4].copy_from_slice(&blk[4 + 4 * j..8 + 4 * j]);
                    }
                }
            }
        }
        debug_assert_eq!(nb * Q4_1X16_BYTES, stripe);
        Ok(Self {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// Storage type of the blocks.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held (the file's bytes plus the last group's padding).
    pub fn size_bytes(&self) -> usize {
        self.data.len()
    }

    fn blocks_per_row(&self) -> usize {
        self.cols / 32
    }

    /// Group `g`'s blocks.
    fn group(&self, g: usize) -> &[[u8; Q4_1X16_BYTES]] {
        let nb = self.blocks_per_row();
        self.data[g * nb * Q4_1X16_BYTES..(g + 1) * nb * Q4_1X16_BYTES]
            .as_chunks()
            .0
    }

    /// Row `r` back in the file layout.
    pub fn file_row(&self, r: usize) -> Vec<u8> {
        let (g, k) = (r / GROUP_ROWS, r % GROUP_ROWS);
        let mut row = Vec::with_capacity(self.blocks_per_row() * Q4_1_BYTES);
        for blk in self.group(g) {
            row.extend_from_slice(&blk[2 * k..2 * k + 2]);
            row.extend_from_slice(&blk[32 + 2 * k..32 + 2 * k + 2]);
            for j in 0..4 {
                let at = 64 + 64 * j + 4 * k;
                row.extend_from_slice(&blk[at..at + 4]);
            }
        }
        row
    }
}

/// `out[t * rows + r] = dot(row r, x row t)`, as [`crate::matmul`]: activations quantized
/// once into `scratch`, groups of rows split across the pool, token tiles inside each task.
pub fn matmul_repacked(
    w: &RepackedMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut QuantizedActivations,
) -> Result<()> {
    matmul_repacked_at(crate::cpu_level(), w, x, n_tokens, out, scratch)
}

/// [`matmul_repacked`] at an explicit level (clamped to the hardware); below AVX-512 every
/// dot goes through the scalar row kernel on the row unpacked back to the file layout — the
/// reference the kernel is tested against, far too slow for real use.
pub fn matmul_repacked_at(
    level: CpuLevel,
    w: &RepackedMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut QuantizedActivations,
) -> Result<()> {
    check_len("matmul input x", n_tokens, w.cols, x.len())?;
    check_len("matmul output", n_tokens, w.rows, out.len())?;
    scratch.quantize_rows_into(w.ty, x, n_tokens)?;
    scratch.prepare_q8_1_sums();
    let level = level.clamp_to_hardware();
    let acts = &*scratch;
    let rows = w.rows;
    let groups = rows.div_ceil(GROUP_ROWS);
    if groups == 0 || n_tokens == 0 {
        return Ok(());
    }
    let pool = crate::pool::global();
    let per_task = groups.div_ceil(pool.threads() * 4).max(1);
    let ptr = OutPtr(out.as_mut_ptr());
    pool.run(groups.div_ceil(per_task), &|task| {
        let g_end = ((task + 1) * per_task).min(groups);
        for g in task * per_task..g_end {
            let blocks = w.group(g);
            let live = GROUP_ROWS.min(rows - g * GROUP_ROWS);
            for t0 in (0..n_tokens).step_by(TOKEN_TILE) {
                let t1 = (t0 + TOKEN_TILE).min(n_tokens);
                let mut buf = [[0f32; GROUP_ROWS]; TOKEN_TILE];
                group_tile(level, w, g, blocks, acts, t0..t1, &mut buf);
                for (k, vals) in buf[..t1 - t0].iter().enumerate() {
                    for (i, &v) in vals[..live].iter().enumerate() {
                        // SAFETY: t0 + k < n_tokens and g·16 + i < rows: inside `out`; tasks
                        // own disjoint groups of rows.
                        unsafe { *ptr.get().add((t0 + k) * rows + g * GROUP_ROWS + i) = v };
                    }
                }
            }
        }
    });
    Ok(())
}

/// Output pointer shared by tasks that write disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements, and `pool.run` returns only when all are done.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

fn act_row(acts: &QuantizedActivations, t: usize) -> &[BlockQ8_1] {
    match acts.row(t) {
        Some(ActRow::Q8_1(b)) => b,
        _ => &[],
    }
}

/// One group against the tokens `ts` (at most [`TOKEN_TILE`]): `buf[k][i]` = row
/// `16g + i`, token `ts.start + k`.
fn group_tile(
    level: CpuLevel,
    w: &RepackedMatrix,
    g: usize,
    blocks: &[[u8; Q4_1X16_BYTES]],
    acts: &QuantizedActivations,
    ts: std::ops::Range<usize>,
    buf: &mut [[f32; GROUP_ROWS]; TOKEN_TILE],
) {
    #[cfg(target_arch = "x86_64")]
    if level >= CpuLevel::Avx512 {
        macro_rules! arms {
            ($($n:literal)*) => {
                match ts.len() {
                    $($n => {
                        let rows: [&[BlockQ8_1]; $n] =
                            std::array::from_fn(|k| act_row(acts, ts.start + k));
                        let sums: [&[f32]; $n] = std::array::from_fn(|k| {
                            acts.row_q8_1_sums(ts.start + k).unwrap_or(&[])
                        });
                        let out = buf.first_chunk_mut::<$n>().expect("tile <= TOKEN_TILE");
                        // SAFETY: the level is clamped to the hardware, which has AVX-512.
                        unsafe {
                            crate::dot::avx512::q4_1x16_q8_1::<$n>(blocks, rows, sums, out)
                        };
                    })*
                    _ => {}
                }
            };
        }
        arms!(1 2 3 4 5 6 7 8);
        return;
    }
    let _ = blocks;
    for i in 0..GROUP_ROWS.min(w.rows - g * GROUP_ROWS) {
        let row = w.file_row(g * GROUP_ROWS + i);
        for (out, t) in buf.iter_mut().zip(ts.clone()) {
            let sums = acts.row_q8_1_sums(t).unwrap_or(&[]);
            out[i] = q4_1_reference(&row, act_row(acts, t), sums);
        }
    }
}

/// The scalar reference of the kernel: per block `d_w·d_y·Σ q_w·q_y + m_w·sum`, with `sum` the
/// exact activation block sum, added in block order.
fn q4_1_reference(row: &[u8], a: &[BlockQ8_1], sums: &[f32]) -> f32 {
    let mut total = 0f32;
    for ((blk, y), &sum) in row.chunks_exact(Q4_1_BYTES).zip(a).zip(sums) {
        let f16_at = |o: usize| half::f16::from_le_bytes([blk[o], blk[o + 1]]).to_f32();
        let (d, m) = (f16_at(0), f16_at(2));
        let mut isum = 0i32;
        for (j, &b) in blk[4..].iter().enumerate() {
            isum += i32::from(b & 0x0F) * i32::from(y.qs[j]);
            isum += i32::from(b >> 4) * i32::from(y.qs[j + 16]);
        }
        total += d * y.d.to_f32() * isum as f32 + m * sum;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::level::supported_levels;
    use crate::matmul::matmul_at;

    fn q4_1_matrix(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let mut x = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        let mut data = Vec::new();
        for _ in 0..rows * cols / 32 {
            let d = half::f16::from_f32((next() % 1000) as f32 / 20_000.0);
            let m = half::f16::from_f32(-((next() % 1000) as f32) / 5_000.0);
            data.extend_from_slice(&d.to_le_bytes());
            data.extend_from_slice(&m.to_le_bytes());
            data.extend((0..16).map(|_| next() as u8));
        }
        data
    }

    #[test]
    fn file_rows_survive_the_round_trip() {
        let (rows, cols) = (37, 96);
        let data = q4_1_matrix(rows, cols, 1);
        let w =
            RepackedMatrix::new(&QMatrix::new(GgmlType::Q4_1, rows, cols, &data).unwrap()).unwrap();
        assert_eq!(w.size_bytes(), 48 * 3 * Q4_1_BYTES);
        for r in 0..rows {
            assert_eq!(w.file_row(r), data[r * 60..(r + 1) * 60], "row {r}");
        }
    }

    #[test]
    fn only_q4_1_repacks() {
        let data = vec![0u8; 34 * 16];
        let q = QMatrix::new(GgmlType::Q8_0, 16, 32, &data).unwrap();
        assert!(RepackedMatrix::new(&q).is_err());
        assert!(!RepackedMatrix::worthwhile(
            CpuLevel::Avx512,
            GgmlType::Q8_0
        ));
    }

    /// Every level, every tile width and a ragged last group agree with the scalar reference
    /// within float rounding, and with the row kernels on the file layout within that plus the
    /// f16 rounding of their `s`; decode (one token) and prefill agree to the bit.
    #[test]
    fn repacked_matmul_matches_the_scalar_row_kernel() {
        for (rows, cols, tokens) in [(48, 576, 13), (21, 64, 8), (16, 32, 1), (35, 1536, 3)] {
            let data = q4_1_matrix(rows, cols, rows as u32);
            let q = QMatrix::new(GgmlType::Q4_1, rows, cols, &data).unwrap();
            let w = RepackedMatrix::new(&q).unwrap();
            let mut s = 7u32;
            let x: Vec<f32> = (0..tokens * cols)
                .map(|_| {
                    s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    ((s >> 8) % 2001) as f32 / 1000.0 - 1.0
                })
                .collect();
            let mut scratch = QuantizedActivations::new();
            let mut want = vec![0f32; tokens * rows];
            matmul_at(CpuLevel::Scalar, &q, &x, tokens, &mut want, &mut scratch).unwrap();
            let mut reference = vec![0f32; tokens * rows];
            matmul_repacked_at(
                CpuLevel::Scalar,
                &w,
                &x,
                tokens,
                &mut reference,
                &mut scratch,
            )
            .unwrap();
            for level in supported_levels() {
                let mut got = vec![0f32; tokens * rows];
                matmul_repacked_at(level, &w, &x, tokens, &mut got, &mut scratch).unwrap();
                // Against the kernel's own reference: float rounding only.
                for (i, (g, e)) in got.iter().zip(&reference).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-5 * cols as f32 * 2.0,
                        "{level:?} {i}: {g} {e}"
                    );
                }
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    // Σ|terms| ≤ cols · max|w| · max|x| with |w| < 2, |x| ≤ 1; the f16
                    // rounding of the row kernel's `s` (|s| ≤ 32, |m| < 0.2) adds up to
                    // 2^-11 · 32 · 0.2 per block.
                    let tol = 1e-5 * cols as f32 * 2.0 + (cols / 32) as f32 * 0.0032;
                    assert!((g - e).abs() <= tol, "{level:?} {i}: {g} {e}");
                }
                let last = &x[(tokens - 1) * cols..];
                let mut one = vec![0f32; rows];
                matmul_repacked_at(level, &w, last, 1, &mut one, &mut scratch).unwrap();
                assert_eq!(
                    one,
                    got[(tokens - 1) * rows..],
                    "{level:?}: decode vs prefill"
                );
            }
        }
    }
}
