//! Weights repacked at load into groups of [`GROUP_ROWS`] rows, block by block, for the
//! AVX-512 VNNI kernels that compute 16 rows per instruction (`dot/avx512/repack.rs`): the
//! 32-bit lanes of a vector are the 16 rows, so one broadcast activation word meets four codes
//! of every row. The AVX2 kernels (`dot/avx2/repack.rs`) read the same layout as two halves of
//! eight rows, one 256-bit vector each; only a Q5_0 block's fifth bits are laid out for the
//! level that loads the matrix ([`FifthBits`]).
//!
//! A group block is 16 file blocks (one per row, same position along the row) rearranged; in
//! every layout, code vector `i` (64 bytes) holds codes `4i..4i + 4` of row `k` in lane `k`:
//! - Q4_1 ([`Q4_1X16_BYTES`]): 16 f16 scales, 16 f16 minimums, then four nibble vectors; lane
//!   `k` of vector `j` is bytes `4j..4j + 4` of row `k`'s packed nibbles, whose low nibbles are
//!   codes `4j..` and high nibbles codes `16 + 4j..`.
//! - Q4_0 ([`Q4_0X16_BYTES`]): 16 f16 scales, then four nibble vectors as for Q4_1; codes are
//!   `w + 8`.
//! - Q8_0 ([`Q8_0X16_BYTES`]): 16 f16 scales, then eight code vectors of `w + 128` (unsigned).
//! - Q5_0 ([`Q5_0X16_BYTES`]): 16 f16 scales, 64 bytes of the codes' fifth bits (as masks
//!   for AVX-512, as bit planes for AVX2: [`FifthBits`]), then four nibble vectors as for
//!   Q4_1; codes are `nibble + 16·bit = w + 16`.
//! - Q4_K and Q6_K: 256-value super-blocks, laid out as [`crate::repack::kquant`] describes.
//!
//! The group blocks of a group follow each other along the row; groups follow each other down
//! the matrix. A last group with fewer than 16 rows is padded with zero blocks, whose outputs
//! are dropped. Same bytes as the file layout, plus that padding.
//!
//! Results equal the row kernels' up to float rounding; for Q4_1 the minimum term multiplies
//! the exact sum of the block's dequantized activations, `f16(d)·Σq`, where the row kernels
//! (as ggml) use the block's `s`, rounded to f16. Prefill and decode run the same kernel, so
//! they agree to the bit.

pub mod kquant;
mod legacy;
mod successor;

pub(crate) use successor::one_token_matmul_done;

pub use legacy::FifthBits;

use crate::arena::WeightBuf;
use crate::dot::dot_unchecked;
use crate::error::{KernelError, Result};
use crate::format::blocks::{
    BlockQ8_0, BlockQ8_1, BlockQ8K, Q4_0_BYTES, Q4_1_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q5_K_BYTES,
    Q6_K_BYTES, Q8_0_BYTES,
};
use crate::format::types::GgmlType;
use crate::level::CpuLevel;
use crate::matmul::tile::TOKEN_TILE;
use crate::matmul::{QMatrix, check_len};
use crate::quantize::{ActFormat, ActRow, QuantizedActivations};
use kquant::{Q4_KX16_BYTES, Q5_KX16_BYTES, Q6_KX16_BYTES};
use std::ops::Range;

/// Rows per interleaved group.
pub const GROUP_ROWS: usize = 16;
/// Bytes of one Q4_1 group block: 16 scales, 16 minimums, 256 code bytes.
pub const Q4_1X16_BYTES: usize = GROUP_ROWS * Q4_1_BYTES;
/// Bytes of one Q4_0 group block: 16 scales, 256 code bytes.
pub const Q4_0X16_BYTES: usize = GROUP_ROWS * Q4_0_BYTES;
/// Bytes of one Q8_0 group block: 16 scales, 512 code bytes.
pub const Q8_0X16_BYTES: usize = GROUP_ROWS * Q8_0_BYTES;
/// Bytes of one Q5_0 group block: 16 scales, 64 bytes of fifth bits, 256 nibble bytes.
pub const Q5_0X16_BYTES: usize = GROUP_ROWS * Q5_0_BYTES;

/// Bytes of one file block of a repackable type.
fn file_block_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_0 => Some(Q4_0_BYTES),
        GgmlType::Q4_1 => Some(Q4_1_BYTES),
        GgmlType::Q8_0 => Some(Q8_0_BYTES),
        GgmlType::Q5_0 => Some(Q5_0_BYTES),
        GgmlType::Q4_K => Some(Q4_K_BYTES),
        GgmlType::Q5_K => Some(Q5_K_BYTES),
        GgmlType::Q6_K => Some(Q6_K_BYTES),
        _ => None,
    }
}

/// The largest file block of a repackable type.
const MAX_FILE_BLOCK: usize = Q6_K_BYTES;

/// Writes row `k`'s file block `blk` into the group block `dst` (zeroed before its first row).
fn pack(ty: GgmlType, bits: FifthBits, k: usize, blk: &[u8], dst: &mut [u8]) {
    match ty {
        GgmlType::Q4_K => kquant::pack_q4_k(k, blk, dst),
        GgmlType::Q5_K => kquant::pack_q5_k(k, blk, dst),
        GgmlType::Q6_K => kquant::pack_q6_k(k, blk, dst),
        _ => legacy::pack(ty, bits, k, blk, dst),
    }
}

/// Writes row `k`'s file block, read back from the group block `src`, into `out` (one file
/// block's bytes).
fn unpack(ty: GgmlType, bits: FifthBits, k: usize, src: &[u8], out: &mut [u8]) {
    match ty {
        GgmlType::Q4_K => kquant::unpack_q4_k(k, src, out),
        GgmlType::Q5_K => kquant::unpack_q5_k(k, src, out),
        GgmlType::Q6_K => kquant::unpack_q6_k(k, src, out),
        _ => legacy::unpack(ty, bits, k, src, out),
    }
}

/// A weight matrix in the interleaved layout of this module.
#[derive(Debug, Clone)]
pub struct RepackedMatrix {
    ty: GgmlType,
    fifth_bits: FifthBits,
    rows: usize,
    cols: usize,
    data: WeightBuf,
}

impl RepackedMatrix {
    /// Whether `ty` has an interleaved layout with kernels at `level` (clamped to the
    /// hardware). Other levels can still run a repacked matrix, through the scalar reference.
    pub fn worthwhile(level: CpuLevel, ty: GgmlType) -> bool {
        cfg!(target_arch = "x86_64")
            && level.clamp_to_hardware() >= CpuLevel::Avx2
            && file_block_bytes(ty).is_some()
    }

    /// Repacks `w` in the layout for the process's level; an error if its type has no
    /// interleaved layout.
    pub fn new(w: &QMatrix<'_>) -> Result<Self> {
        Self::from_file_bytes(w.ty(), w.rows(), w.cols(), w.data())
    }

    /// [`Self::with_fifth_bits`] in the layout whose kernels are fastest at the process's
    /// level ([`FifthBits::for_level`]).
    pub fn from_file_bytes(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self> {
        let fifth_bits = FifthBits::for_level(crate::cpu_level());
        Self::with_fifth_bits(fifth_bits, ty, rows, cols, bytes)
    }

    /// Repacks `bytes` (`rows` rows of `cols` elements of `ty`, file layout; a model file's map
    /// or a copy), a Q5_0 matrix's fifth bits laid out as `fifth_bits` (every level runs
    /// either): each group of 16 rows packed from `bytes` into fresh huge-page storage (group
    /// `g` takes exactly the bytes of rows `16g..16g + 16`), the groups spread over the pool.
    /// An error if `ty` has no interleaved layout or the size is wrong.
    pub fn with_fifth_bits(
        fifth_bits: FifthBits,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self> {
        let fb = file_block_bytes(ty).ok_or(KernelError::Unsupported { op: "repack", ty })?;
        let rb = QMatrix::new(ty, rows, cols, bytes)?.row_bytes();
        let stripe = GROUP_ROWS * rb;
        // The groups are packed straight from the file's bytes into huge pages (see `arena`)
        // on the pool: the first touch of those pages, which on some VMs costs more than the
        // packing, is then spread over the threads too. The last group's padding rows are
        // packed from zero blocks (a zero scale: their outputs are zero), as the file's rows
        // are, since a packed zero block is not all zero bytes in every layout (Q8_0 flips
        // its codes' sign bit).
        let padded = rows.div_ceil(GROUP_ROWS) * stripe;
        let mut data = WeightBuf::zeroed(padded);
        let zero_row = vec![0u8; rb];
        crate::pool::for_each_chunk_mut(&mut data, stripe.max(1), 1, |g, group| {
            for k in 0..GROUP_ROWS {
                let start = (g * GROUP_ROWS + k) * rb;
                let row = bytes.get(start..start + rb).unwrap_or(&zero_row);
                for (blk, dst) in row.chunks_exact(fb).zip(group.chunks_exact_mut(16 * fb)) {
                    pack(ty, fifth_bits, k, blk, dst);
                }
            }
        });
        Ok(Self {
            ty,
            fifth_bits,
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

    /// The repacked bytes, every group in order.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Group `g`'s bytes.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let stripe = GROUP_ROWS * self.blocks_per_row() * file_block_bytes(self.ty).unwrap_or(0);
        &self.data[g * stripe..(g + 1) * stripe]
    }

    /// Row `r` back in the file layout.
    pub fn file_row(&self, r: usize) -> Vec<u8> {
        let fb = file_block_bytes(self.ty).unwrap_or(0);
        let mut row = vec![0u8; fb * self.blocks_per_row()];
        for (src, out) in self.row_blocks(r).zip(row.chunks_exact_mut(fb.max(1))) {
            unpack(self.ty, self.fifth_bits, r % GROUP_ROWS, src, out);
        }
        row
    }

    /// Row `r` dequantized into `dst` (`cols` values), one block at a time through a stack
    /// buffer: the embedding lookup of a tied head allocates nothing per token.
    pub fn dequantize_row(&self, r: usize, dst: &mut [f32]) -> Result<()> {
        check_len("repacked row", 1, self.cols, dst.len())?;
        if r >= self.rows {
            return Err(KernelError::LengthMismatch {
                what: "repacked row index",
                expected: self.rows,
                actual: r,
            });
        }
        let fb = file_block_bytes(self.ty).unwrap_or(0);
        let mut block = [0u8; MAX_FILE_BLOCK];
        let elems = self.ty.block_elems();
        for (src, d) in self.row_blocks(r).zip(dst.chunks_exact_mut(elems)) {
            unpack(
                self.ty,
                self.fifth_bits,
                r % GROUP_ROWS,
                src,
                &mut block[..fb],
            );
            crate::dequantize_row(self.ty, &block[..fb], d)?;
        }
        Ok(())
    }

    /// File blocks in a row (32 or 256 values each).
    fn blocks_per_row(&self) -> usize {
        self.cols / self.ty.block_elems()
    }

    /// The group blocks holding row `r`, in order along the row.
    fn row_blocks(&self, r: usize) -> std::slice::ChunksExact<'_, u8> {
        let gb = GROUP_ROWS * file_block_bytes(self.ty).unwrap_or(0);
        self.group(r / GROUP_ROWS).chunks_exact(gb.max(1))
    }
}

/// `out[t * rows + r] = dot(row r, x row t)`, as [`crate::matmul()`]: activations quantized
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

/// [`matmul_repacked`] at an explicit level (clamped to the hardware); below AVX2 every
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
    matmul_repacked_many_at(level, [w], x, n_tokens, [out], scratch)
}

/// Several matrices against one input (Q, K and V; gate and up), `outs[m]` as `out` of
/// [`matmul_repacked`] for `ws[m]`, to the bit: the activations are quantized once, and the
/// groups of all the matrices go through one dispatch of the pool, so that the small ones do
/// not each pay for waking the workers and waiting for the last of them. The matrices must
/// take the same activation format.
pub fn matmul_repacked_many<const M: usize>(
    ws: [&RepackedMatrix; M],
    x: &[f32],
    n_tokens: usize,
    outs: [&mut [f32]; M],
    scratch: &mut QuantizedActivations,
) -> Result<()> {
    matmul_repacked_many_at(crate::cpu_level(), ws, x, n_tokens, outs, scratch)
}

/// [`matmul_repacked_many`] at an explicit level, as [`matmul_repacked_at`].
pub fn matmul_repacked_many_at<const M: usize>(
    level: CpuLevel,
    ws: [&RepackedMatrix; M],
    x: &[f32],
    n_tokens: usize,
    outs: [&mut [f32]; M],
    scratch: &mut QuantizedActivations,
) -> Result<()> {
    check_many(ws, x, n_tokens)?;
    for (w, out) in ws.iter().zip(&outs) {
        check_len("matmul output", n_tokens, w.rows, out.len())?;
    }
    let ptrs = outs.map(|o| OutPtr(o.as_mut_ptr()));
    run_many(level, ws, x, n_tokens, ptrs, scratch)
}

/// [`matmul_repacked_many`] into vectors it sizes: each `outs[m]` ends up `n_tokens × rows`
/// long, its allocation reused and never zeroed first, since every element is written (a
/// prefill's outputs are megabytes, and zeroing them is a serial pass over memory). After an
/// error they hold no result: their old values, or nothing.
pub fn matmul_repacked_many_into<const M: usize>(
    ws: [&RepackedMatrix; M],
    x: &[f32],
    n_tokens: usize,
    outs: [&mut Vec<f32>; M],
    scratch: &mut QuantizedActivations,
) -> Result<()> {
    check_many(ws, x, n_tokens)?;
    let mut lens = [0usize; M];
    for (w, len) in ws.iter().zip(&mut lens) {
        *len = n_tokens
            .checked_mul(w.rows)
            .ok_or(KernelError::Overflow("matmul output"))?;
    }
    let mut outs = outs;
    for (out, &len) in outs.iter_mut().zip(&lens) {
        out.clear();
        out.reserve(len);
    }
    let ptrs = outs.each_mut().map(|o| OutPtr(o.as_mut_ptr()));
    run_many(crate::cpu_level(), ws, x, n_tokens, ptrs, scratch)?;
    if n_tokens == 1 {
        successor::one_token_matmul_done(&ws.map(RepackedMatrix::bytes));
    }
    for (out, len) in outs.into_iter().zip(lens) {
        // SAFETY: the capacity is at least `len` (reserved above), and `run_many` returned
        // normally, so `par_groups_many` wrote every element: each of the matrix's groups, for
        // every token, copies its live rows from an initialised tile buffer.
        unsafe { out.set_len(len) };
    }
    Ok(())
}

/// The checks of [`matmul_repacked_many_at`] on the weights and input: sizes, and one
/// activation format for all the matrices.
fn check_many<const M: usize>(ws: [&RepackedMatrix; M], x: &[f32], n_tokens: usize) -> Result<()> {
    let Some(first) = ws.first() else {
        return Ok(());
    };
    let format = ActFormat::for_weight(first.ty)?;
    for w in ws {
        check_len("matmul input x", n_tokens, w.cols, x.len())?;
        if ActFormat::for_weight(w.ty)? != format {
            return Err(KernelError::Unsupported {
                op: "one dispatch for weights of different activation formats",
                ty: w.ty,
            });
        }
    }
    Ok(())
}

/// Quantizes `x` once and runs every group of `ws` on the pool, into `outs[m]`, which must
/// have room for `n_tokens × rows[m]` values (checked by the callers).
fn run_many<const M: usize>(
    level: CpuLevel,
    ws: [&RepackedMatrix; M],
    x: &[f32],
    n_tokens: usize,
    outs: [OutPtr; M],
    scratch: &mut QuantizedActivations,
) -> Result<()> {
    let Some(first) = ws.first() else {
        return Ok(());
    };
    scratch.quantize_rows_into(first.ty, x, n_tokens)?;
    scratch.prepare_block_sums();
    let level = level.clamp_to_hardware();
    let acts = &*scratch;
    let rows = ws.map(|w| w.rows);
    par_groups_many(rows, n_tokens, outs, &|m, gs, ts, out| {
        // SAFETY: `par_groups_many` gives each call groups no other call has, of matrix `m`,
        // whose output `out` is.
        unsafe { tile_groups(level, ws[m], gs, acts, ts, out) }
    });
    Ok(())
}

/// Callback of [`par_groups`]: the consecutive groups `gs` against the tokens `ts` (at most
/// [`TOKEN_TILE`]), results stored through `out` ([`GroupOut::store`]).
pub(crate) type GroupRun<'a> = dyn Fn(Range<usize>, Range<usize>, GroupOut) + Sync + 'a;

/// Runs `run` over every group of `rows` rows and every token tile, writing
/// `out[t * rows + r]`: groups are split across the pool, each thread taking a contiguous
/// range of them (`Pool::run_contiguous`); inside a task, token tiles are the outer loop so
/// the tile's activations stay in L1 while the task's weights come from L2, and each call
/// gets a task's whole run of groups, so the kernel is chosen once per run, not per 16-row
/// group (a group of a decoded token is a few kilobytes: choosing per group was a measurable
/// share of the stream, docs/benchmarks-history.md).
pub(crate) fn par_groups(rows: usize, n_tokens: usize, out: &mut [f32], run: &GroupRun<'_>) {
    let ptr = OutPtr(out.as_mut_ptr());
    par_groups_many([rows], n_tokens, [ptr], &|_, gs, ts, out| run(gs, ts, out));
}

/// Callback of [`par_groups_many`]: as [`GroupRun`], for matrix `m`.
type StackedRun<'a> = dyn Fn(usize, Range<usize>, Range<usize>, GroupOut) + Sync + 'a;

/// [`par_groups`] over the groups of `M` matrices at once, as if stacked: the callback also
/// gets the matrix `m`, whose results go to `outs[m]` (`rows[m]` per token).
fn par_groups_many<const M: usize>(
    rows: [usize; M],
    n_tokens: usize,
    outs: [OutPtr; M],
    run: &StackedRun<'_>,
) {
    let mut starts = [0usize; M];
    let mut groups = 0;
    for (start, r) in starts.iter_mut().zip(rows) {
        *start = groups;
        groups += r.div_ceil(GROUP_ROWS);
    }
    if groups == 0 || n_tokens == 0 {
        return;
    }
    let pool = crate::pool::global();
    // Prefill: small tasks, since the last one to finish is what the other threads wait for.
    // Decode: two tasks per thread, each a long stretch of the weight stream that the
    // prefetchers follow; the second is what a faster thread can take over. Four were slower
    // on a Zen 2 (Q8_0 decode at two threads −4%, docs/benchmarks-history.md).
    let split = if n_tokens > 1 { 8 } else { 2 };
    let per_task = groups.div_ceil(pool.threads() * split).max(1);
    pool.run_contiguous(groups.div_ceil(per_task), &|task| {
        let g_end = ((task + 1) * per_task).min(groups);
        for t0 in (0..n_tokens).step_by(TOKEN_TILE) {
            let ts = t0..(t0 + TOKEN_TILE).min(n_tokens);
            let mut stacked = task * per_task;
            while stacked < g_end {
                // The last matrix starting at or before this group (empty ones start where
                // the next does, so they are never chosen), and its groups up to the task's
                // end.
                let m = starts.iter().rposition(|&s| s <= stacked).unwrap_or(0);
                let g = stacked - starts[m];
                let g1 = rows[m].div_ceil(GROUP_ROWS).min(g + g_end - stacked);
                let out = GroupOut {
                    ptr: outs[m],
                    rows: rows[m],
                    tokens: n_tokens,
                };
                run(m, g..g1, ts.clone(), out);
                stacked += g1 - g;
            }
        }
    });
}

/// Where a matrix's results go: `tokens × rows` values, token-major.
#[derive(Clone, Copy)]
pub(crate) struct GroupOut {
    ptr: OutPtr,
    rows: usize,
    tokens: usize,
}

impl GroupOut {
    /// Stores group `g`'s results for the tokens `ts`: `buf[k][i]` is row `16g + i` of token
    /// `ts.start + k` (rows past the matrix's end are dropped).
    ///
    /// # Safety
    /// No other thread may be writing or reading group `g` of these tokens, and the output
    /// must still be alive (both hold inside a [`par_groups`] callback for its own groups).
    pub(crate) unsafe fn store(self, g: usize, ts: Range<usize>, buf: &[[f32; GROUP_ROWS]]) {
        let first = g * GROUP_ROWS;
        assert!(first < self.rows && ts.end <= self.tokens && buf.len() >= ts.len());
        let live = GROUP_ROWS.min(self.rows - first);
        for (k, vals) in buf[..ts.len()].iter().enumerate() {
            // SAFETY: token ts.start + k < tokens and rows first..first + live ≤ rows, inside
            // the output (checked above); the caller guarantees no one else touches them.
            unsafe {
                let dst = self.ptr.get().add((ts.start + k) * self.rows + first);
                // A whole group is one fixed-size store; a variable-length copy is a
                // `memmove` call, ~3% of a decoded token.
                if live == GROUP_ROWS {
                    dst.cast::<[f32; GROUP_ROWS]>().write_unaligned(*vals);
                } else {
                    std::ptr::copy_nonoverlapping(vals.as_ptr(), dst, live);
                }
            }
        }
    }

    /// Runs `kernel` on each group of `gs` of `w` (the group's blocks of `B` bytes, into a
    /// buffer of `N` tokens' rows) and stores its results for the tokens `ts` (`N` of them).
    ///
    /// # Safety
    /// As [`GroupOut::store`] for every group of `gs`.
    #[inline]
    pub(crate) unsafe fn each_group<const B: usize, const N: usize>(
        self,
        w: &RepackedMatrix,
        gs: Range<usize>,
        ts: Range<usize>,
        mut kernel: impl FnMut(&[[u8; B]], &mut [[f32; GROUP_ROWS]; N]),
    ) {
        let mut buf = [[0f32; GROUP_ROWS]; N];
        for g in gs {
            kernel(w.group(g).as_chunks::<B>().0, &mut buf);
            // SAFETY: the caller's promise.
            unsafe { self.store(g, ts.clone(), &buf) };
        }
    }
}

/// Output pointer shared by tasks that write disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements, and `pool.run` returns only when all are done.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`.
unsafe impl Sync for OutPtr {}
impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

fn q8_1_row(acts: &QuantizedActivations, t: usize) -> &[BlockQ8_1] {
    match acts.row(t) {
        Some(ActRow::Q8_1(b)) => b,
        _ => &[],
    }
}

fn q8_k_row(acts: &QuantizedActivations, t: usize) -> &[BlockQ8K] {
    match acts.row(t) {
        Some(ActRow::Q8K(b)) => b,
        _ => &[],
    }
}

fn q8_0_row(acts: &QuantizedActivations, t: usize) -> &[BlockQ8_0] {
    match acts.row(t) {
        Some(ActRow::Q8_0(b)) => b,
        _ => &[],
    }
}

/// One arm per tile width of a 32-value kernel of `crate::dot::$m` (the same names and
/// signatures at AVX2 and AVX-512): the tile's activation rows gathered once, then the kernel
/// on each group of the run.
#[cfg(target_arch = "x86_64")]
macro_rules! arms {
    ($m:ident, $kernel:ident, $rows:ident, $B:expr, ($w:expr, $gs:expr, $acts:expr, $ts:expr, $out:expr); $($n:literal)*) => {
        {
            let (w, gs, acts, ts, out) = ($w, $gs, $acts, $ts, $out);
            match ts.len() {
                $($n => {
                    let rows: [_; $n] = std::array::from_fn(|k| $rows(acts, ts.start + k));
                    let sums: [&[f32]; $n] = std::array::from_fn(|k| {
                        acts.row_block_sums(ts.start + k).unwrap_or(&[])
                    });
                    // SAFETY: the level is clamped to the hardware, which has the features of
                    // level `$m`; `each_group` as the caller of `tile_groups` promises.
                    unsafe {
                        out.each_group::<{ $B }, $n>(w, gs, ts, |blocks, buf| {
                            crate::dot::$m::$kernel::<$n>(blocks, rows, sums, buf)
                        })
                    }
                })*
                // Tiles hold 1..=TOKEN_TILE tokens; a wider one would leave its outputs
                // unwritten behind the caller's `set_len`.
                _ => unreachable!("token tile of {} rows", ts.len()),
            }
        }
    };
}

/// As [`arms`] for the K-quant kernels, which take the minimums' sums from the Q8_K blocks.
#[cfg(target_arch = "x86_64")]
macro_rules! k_arms {
    ($m:ident, $kernel:ident, $B:expr, ($w:expr, $gs:expr, $acts:expr, $ts:expr, $out:expr); $($n:literal)*) => {
        {
            let (w, gs, acts, ts, out) = ($w, $gs, $acts, $ts, $out);
            match ts.len() {
                $($n => {
                    let rows: [_; $n] = std::array::from_fn(|k| q8_k_row(acts, ts.start + k));
                    // SAFETY: as for `arms`.
                    unsafe {
                        out.each_group::<{ $B }, $n>(w, gs, ts, |blocks, buf| {
                            crate::dot::$m::$kernel::<$n>(blocks, rows, buf)
                        })
                    }
                })*
                // Tiles hold 1..=TOKEN_TILE tokens; a wider one would leave its outputs
                // unwritten behind the caller's `set_len`.
                _ => unreachable!("token tile of {} rows", ts.len()),
            }
        }
    };
}

/// The body of [`tile_groups`] at the x86 level `$m` (`avx2`, `avx_vnni` or `avx512`), with
/// `$m256` the module of that level's 256-bit kernels, which run the types without a 512-bit
/// kernel (`avx_vnni` for itself, `avx2` for the others).
#[cfg(target_arch = "x86_64")]
macro_rules! x86_tile_groups {
    ($m:ident, $m256:ident, $w:expr, $gs:expr, $acts:expr, $ts:expr, $out:expr) => {{
        let (w, gs, acts, ts, out) = ($w, $gs, $acts, $ts, $out);
        match w.ty {
            GgmlType::Q4_K => k_arms!($m, q4_kx16_q8_k, Q4_KX16_BYTES, (w, gs, acts, ts, out); 1 2 3 4 5 6 7 8),
            // No 512-bit kernel: the 256-bit one runs at every level.
            GgmlType::Q5_K => k_arms!($m256, q5_kx16_q8_k, Q5_KX16_BYTES, (w, gs, acts, ts, out); 1 2 3 4 5 6 7 8),
            GgmlType::Q6_K => k_arms!($m, q6_kx16_q8_k, Q6_KX16_BYTES, (w, gs, acts, ts, out); 1 2 3 4 5 6 7 8),
            // No 512-bit kernel: the 256-bit one runs at every level.
            GgmlType::Q4_0 => arms!($m256, q4_0x16_q8_0, q8_0_row, Q4_0X16_BYTES, (w, gs, acts, ts, out); 1 2 3 4 5 6 7 8),
            GgmlType::Q4_1 => arms!($m, q4_1x16_q8_1, q8_1_row, Q4_1X16_BYTES, (w, gs, acts, ts, out); 1 2 3 4 5 6 7 8),
            GgmlType::Q8_0 => arms!($m, q8_0x16_q8_0, q8_0_row, Q8_0X16_BYTES, (w, gs, acts, ts, out); 1 2 3 4 5 6 7 8),
            // The bit planes have 256-bit kernels only, which run at every level.
            GgmlType::Q5_0 if w.fifth_bits == FifthBits::Planes => arms!($m256, q5_0p16_q8_0, q8_0_row, Q5_0X16_BYTES, (w, gs, acts, ts, out); 1 2 3 4 5 6 7 8),
            GgmlType::Q5_0 => arms!($m, q5_0x16_q8_0, q8_0_row, Q5_0X16_BYTES, (w, gs, acts, ts, out); 1 2 3 4 5 6 7 8),
            // Only the types above are repacked; another would leave its outputs unwritten.
            other => unreachable!("no repacked kernel for {other:?}"),
        }
    }};
}

/// The consecutive groups `gs` of `w` against the tokens `ts` (at most [`TOKEN_TILE`]),
/// stored through `out`.
///
/// # Safety
/// As [`GroupOut::store`] for every group of `gs`.
unsafe fn tile_groups(
    level: CpuLevel,
    w: &RepackedMatrix,
    gs: Range<usize>,
    acts: &QuantizedActivations,
    ts: Range<usize>,
    out: GroupOut,
) {
    #[cfg(target_arch = "x86_64")]
    if level >= CpuLevel::Avx2 {
        match level {
            CpuLevel::Avx512 => x86_tile_groups!(avx512, avx2, w, gs, acts, ts, out),
            CpuLevel::AvxVnni => x86_tile_groups!(avx_vnni, avx_vnni, w, gs, acts, ts, out),
            _ => x86_tile_groups!(avx2, avx2, w, gs, acts, ts, out),
        }
        return;
    }
    let mut buf = [[0f32; GROUP_ROWS]; TOKEN_TILE];
    for g in gs {
        scalar_group(w, g, acts, ts.clone(), &mut buf);
        // SAFETY: the caller's promise.
        unsafe { out.store(g, ts.clone(), &buf) };
    }
}

/// One group against the tokens `ts` through the scalar row kernels on the rows unpacked to
/// the file layout: `buf[k][i]` = row `16g + i`, token `ts.start + k`.
fn scalar_group(
    w: &RepackedMatrix,
    g: usize,
    acts: &QuantizedActivations,
    ts: Range<usize>,
    buf: &mut [[f32; GROUP_ROWS]; TOKEN_TILE],
) {
    for i in 0..GROUP_ROWS.min(w.rows - g * GROUP_ROWS) {
        let row = w.file_row(g * GROUP_ROWS + i);
        for (out, t) in buf.iter_mut().zip(ts.clone()) {
            out[i] = match (w.ty, acts.row(t)) {
                (GgmlType::Q4_1, _) => {
                    let sums = acts.row_block_sums(t).unwrap_or(&[]);
                    q4_1_reference(&row, q8_1_row(acts, t), sums)
                }
                (ty, Some(a)) => dot_unchecked(CpuLevel::Scalar, ty, &row, a),
                (_, None) => 0.0,
            };
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

    const TYPES: [GgmlType; 7] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// Random blocks of `ty` (scales below 0.05, Q4_1 minimums above −0.2; K-quant super-block
    /// scales below 0.05/64, since their sub-block scales multiply them by up to 63 or 128), and
    /// the largest |weight| they can hold.
    fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> (Vec<u8>, f32) {
        let mut next = crate::testutil::xorshift(seed);
        let mut data = Vec::new();
        for _ in 0..rows * cols / ty.block_elems() {
            let scale = |v: u32, k: f32| half::f16::from_f32((v % 1000) as f32 / 20_000.0 / k);
            match ty {
                GgmlType::Q4_1 => {
                    data.extend_from_slice(&scale(next(), 1.0).to_le_bytes());
                    let m = half::f16::from_f32(-((next() % 1000) as f32) / 5_000.0);
                    data.extend_from_slice(&m.to_le_bytes());
                    data.extend((0..16).map(|_| next() as u8));
                }
                GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0 => {
                    data.extend_from_slice(&scale(next(), 1.0).to_le_bytes());
                    let n = match ty {
                        GgmlType::Q8_0 => 32,
                        GgmlType::Q5_0 => 20,
                        _ => 16,
                    };
                    data.extend((0..n).map(|_| next() as u8));
                }
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    data.extend_from_slice(&scale(next(), 64.0).to_le_bytes());
                    data.extend_from_slice(&scale(next(), 64.0).to_le_bytes());
                    let n = if ty == GgmlType::Q4_K { 140 } else { 172 };
                    data.extend((0..n).map(|_| next() as u8));
                }
                GgmlType::Q6_K => {
                    data.extend((0..208).map(|_| next() as u8));
                    data.extend_from_slice(&scale(next(), 64.0).to_le_bytes());
                }
                _ => unreachable!(),
            }
        }
        let wmax = match ty {
            GgmlType::Q4_1 => 15.0 * 0.05 + 0.2,
            GgmlType::Q8_0 => 128.0 * 0.05,
            GgmlType::Q4_K => 0.05 / 64.0 * 63.0 * 16.0,
            GgmlType::Q5_K => 0.05 / 64.0 * 63.0 * 32.0,
            GgmlType::Q6_K => 0.05 / 64.0 * 128.0 * 32.0,
            _ => 16.0 * 0.05,
        };
        (data, wmax)
    }

    /// A shape's columns, rounded up to a whole number of `ty`'s blocks.
    fn cols_for(ty: GgmlType, cols: usize) -> usize {
        cols.next_multiple_of(ty.block_elems())
    }

    #[test]
    fn file_rows_survive_the_round_trip() {
        for ty in TYPES {
            let (rows, cols) = (37, cols_for(ty, 96) * 2);
            let (data, _) = matrix(ty, rows, cols, 1);
            let rb = data.len() / rows;
            let w = RepackedMatrix::new(&QMatrix::new(ty, rows, cols, &data).unwrap()).unwrap();
            assert_eq!(w.size_bytes(), 48 * rb, "{ty:?}");
            let mut want = vec![0f32; cols];
            let mut got = vec![0f32; cols];
            for r in 0..rows {
                assert_eq!(w.file_row(r), data[r * rb..(r + 1) * rb], "{ty:?} row {r}");
                crate::dequantize_row(ty, &data[r * rb..(r + 1) * rb], &mut want).unwrap();
                w.dequantize_row(r, &mut got).unwrap();
                assert_eq!(got, want, "{ty:?} row {r} dequantized");
            }
            assert!(w.dequantize_row(rows, &mut got).is_err());
            assert!(w.dequantize_row(0, &mut got[1..]).is_err());
        }
    }

    #[test]
    fn padding_rows_are_packed_zero_blocks() {
        // A 37-row matrix pads its last group with 11 rows: they must hold what packing zero
        // file blocks gives (not zero bytes: Q8_0 flips its codes), as if the file had them.
        for ty in TYPES {
            let (rows, cols) = (37, cols_for(ty, 96) * 2);
            let (mut data, _) = matrix(ty, rows, cols, 3);
            let rb = data.len() / rows;
            let ragged = RepackedMatrix::new(&QMatrix::new(ty, rows, cols, &data).unwrap());
            data.resize(48 * rb, 0);
            let whole = RepackedMatrix::new(&QMatrix::new(ty, 48, cols, &data).unwrap());
            assert!(ragged.unwrap().bytes() == whole.unwrap().bytes(), "{ty:?}");
        }
    }

    #[test]
    fn other_types_do_not_repack() {
        let data = vec![0u8; 110 * 16];
        let q = QMatrix::new(GgmlType::Q3_K, 16, 256, &data).unwrap();
        assert!(RepackedMatrix::new(&q).is_err());
        assert!(!RepackedMatrix::worthwhile(
            CpuLevel::Avx512,
            GgmlType::Q3_K
        ));
        assert!(!RepackedMatrix::worthwhile(
            CpuLevel::Scalar,
            GgmlType::Q8_0
        ));
    }

    /// Every type, level, tile width and a ragged last group agree with the scalar reference
    /// within float rounding, and with the row kernels on the file layout within that (plus,
    /// for Q4_1, the f16 rounding of their `s`); decode (one token) and prefill agree to the
    /// bit, and so do the AVX2 and AVX-512 kernels.
    #[test]
    fn repacked_matmul_matches_the_scalar_row_kernel() {
        let shapes = [(48, 576, 13), (21, 64, 8), (16, 32, 1), (35, 1536, 3)];
        for (ty, (rows, cols, tokens)) in TYPES.into_iter().flat_map(|t| shapes.map(|s| (t, s))) {
            let cols = cols_for(ty, cols);
            let (data, wmax) = matrix(ty, rows, cols, rows as u32);
            let q = QMatrix::new(ty, rows, cols, &data).unwrap();
            let w = RepackedMatrix::new(&q).unwrap();
            let mut s = 7u32;
            let x: Vec<f32> = (0..tokens * cols)
                .map(|_| {
                    s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    ((s >> 8) % 2001) as f32 / 1000.0 - 1.0
                })
                .collect();
            // Σ|terms| ≤ cols · max|w| · max|x|, with |x| ≤ 1.
            let rounding = 1e-5 * cols as f32 * wmax;
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
            let mut simd: Option<Vec<f32>> = None;
            for level in supported_levels() {
                let mut got = vec![0f32; tokens * rows];
                matmul_repacked_at(level, &w, &x, tokens, &mut got, &mut scratch).unwrap();
                // The AVX2 and AVX-512 kernels make the same float steps on the same exact
                // integer sums.
                if level >= CpuLevel::Avx2 {
                    let first = simd.get_or_insert_with(|| got.clone());
                    assert_eq!(first.as_slice(), got.as_slice(), "{ty:?} {level:?} vs AVX2");
                }
                for (i, (g, e)) in got.iter().zip(&reference).enumerate() {
                    assert!((g - e).abs() <= rounding, "{ty:?} {level:?} {i}: {g} {e}");
                }
                // Q4_1's `s` is f16: 2^-11 · |s| ≤ 32 · |m| < 0.2 per block.
                let s_round = if ty == GgmlType::Q4_1 { 0.0032 } else { 0.0 };
                let tol = rounding + (cols / 32) as f32 * s_round;
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!((g - e).abs() <= tol, "{ty:?} {level:?} {i}: {g} {e}");
                }
                let last = &x[(tokens - 1) * cols..];
                let mut one = vec![0f32; rows];
                matmul_repacked_at(level, &w, last, 1, &mut one, &mut scratch).unwrap();
                assert_eq!(one, got[(tokens - 1) * rows..], "{ty:?} {level:?}: decode");
            }
        }
    }

    /// Q5_0's two fifth-bit layouts are different bytes that hold the same file rows and give
    /// the same bits at every level, prefill and decode, whichever the hardware would pick.
    #[test]
    fn both_fifth_bit_layouts_give_the_same_bits() {
        let ty = GgmlType::Q5_0;
        for (rows, cols, tokens) in [(48, 576, 13), (21, 64, 8), (16, 32, 1)] {
            let (data, _) = matrix(ty, rows, cols, 3 + rows as u32);
            let rb = data.len() / rows;
            let build =
                |bits| RepackedMatrix::with_fifth_bits(bits, ty, rows, cols, &data).unwrap();
            let (masks, planes) = (build(FifthBits::Masks), build(FifthBits::Planes));
            assert_ne!(
                masks.group(0),
                planes.group(0),
                "{rows}x{cols}: the same bytes"
            );
            for r in 0..rows {
                let want = &data[r * rb..(r + 1) * rb];
                assert_eq!(masks.file_row(r), want, "masks, row {r}");
                assert_eq!(planes.file_row(r), want, "planes, row {r}");
            }
            let x: Vec<f32> = (0..tokens * cols)
                .map(|i| ((i * 53) % 197) as f32 / 98.0 - 1.0)
                .collect();
            let mut scratch = QuantizedActivations::new();
            for level in supported_levels() {
                for n in [tokens, 1] {
                    let mut run = |w: &RepackedMatrix| {
                        let mut out = vec![f32::NAN; n * rows];
                        matmul_repacked_at(level, w, &x[..n * cols], n, &mut out, &mut scratch)
                            .unwrap();
                        out
                    };
                    let (m, p) = (run(&masks), run(&planes));
                    assert_eq!(m, p, "{rows}x{cols}, {n} tokens, {level:?}");
                }
            }
        }
    }

    /// One dispatch over several matrices gives each its own matmul's results to the bit,
    /// whatever their sizes (a ragged group, an empty matrix), at every level; matrices of
    /// different activation formats are refused.
    #[test]
    fn stacked_matrices_match_their_own_matmuls() {
        let cols = 256;
        let build = |ty, rows, seed| {
            let (data, _) = matrix(ty, rows, cols, seed);
            RepackedMatrix::new(&QMatrix::new(ty, rows, cols, &data).unwrap()).unwrap()
        };
        let ws = [
            build(GgmlType::Q5_0, 40, 1),
            build(GgmlType::Q8_0, 0, 2),
            build(GgmlType::Q8_0, 16, 3),
        ];
        for tokens in [1, 11] {
            let x: Vec<f32> = (0..tokens * cols)
                .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
                .collect();
            let mut scratch = QuantizedActivations::new();
            for level in supported_levels() {
                let mut alone: Vec<Vec<f32>> = Vec::new();
                for w in &ws {
                    let mut out = vec![0f32; tokens * w.rows()];
                    matmul_repacked_at(level, w, &x, tokens, &mut out, &mut scratch).unwrap();
                    alone.push(out);
                }
                let mut got: Vec<Vec<f32>> = ws
                    .iter()
                    .map(|w| vec![f32::NAN; tokens * w.rows()])
                    .collect();
                let [a, b, c] = &mut got[..] else {
                    unreachable!()
                };
                let refs = [&ws[0], &ws[1], &ws[2]];
                matmul_repacked_many_at(level, refs, &x, tokens, [a, b, c], &mut scratch).unwrap();
                assert_eq!(got, alone, "{level:?}, {tokens} tokens");
                if level == crate::cpu_level() {
                    // Into vectors of any length and content: sized, every element written.
                    let mut vs = [vec![f32::NAN; 3], Vec::new(), vec![f32::NAN; 999]];
                    matmul_repacked_many_into(refs, &x, tokens, vs.each_mut(), &mut scratch)
                        .unwrap();
                    assert_eq!(vs.to_vec(), alone, "into vectors, {tokens} tokens");
                }
            }
        }
        let q4_1 = build(GgmlType::Q4_1, 16, 4);
        let (mut a, mut b) = (vec![0f32; 40], vec![0f32; 16]);
        let x = vec![0.5f32; cols];
        let mut scratch = QuantizedActivations::new();
        let err = matmul_repacked_many([&ws[0], &q4_1], &x, 1, [&mut a, &mut b], &mut scratch);
        assert!(err.is_err());
        let mut vs = [vec![1.0f32; 40], vec![1.0f32; 16]];
        let err = matmul_repacked_many_into([&ws[0], &q4_1], &x, 1, vs.each_mut(), &mut scratch);
        assert!(err.is_err());
    }
}
