//! Matrix × activations driver: quantize activations once, then split weight rows across
//! pool tasks, each task reading its weight rows once per token tile.

pub mod dense;
mod float;
pub mod tile;

use std::ops::Range;

use crate::dot::dot_unchecked;
use crate::error::{KernelError, Result};
use crate::format::dequant::dequantize_unchecked;
use crate::format::types::GgmlType;
use crate::level::{CpuLevel, cpu_level};
use crate::matmul::tile::{TOKEN_TILE, needs_q8_0x4, tile_unchecked};
use crate::quantize::{ActFormat, ActRow, QuantizedActivations};

/// A row-major weight matrix of `rows` rows, each `cols` elements of type `ty`, borrowed as
/// raw ggml bytes.
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// Wraps `data`, checking that it is exactly `rows * ty.row_bytes(cols)` bytes.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self> {
        let row_bytes = ty.row_bytes(cols)?;
        let need = row_bytes
            .checked_mul(rows)
            .ok_or(KernelError::Overflow("matrix bytes"))?;
        if data.len() != need {
            return Err(KernelError::LengthMismatch {
                what: "QMatrix data bytes",
                expected: need,
                actual: data.len(),
            });
        }
        Ok(Self {
            ty,
            rows,
            cols,
            row_bytes,
            data,
        })
    }

    /// Element type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The raw bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Raw bytes of row `r`, or `None` if out of range.
    pub fn row(&self, r: usize) -> Option<&'a [u8]> {
        self.data.get(r * self.row_bytes..(r + 1) * self.row_bytes)
    }
}

/// Dequantizes the whole matrix to `rows * cols` f32 values.
pub fn dequantize_matrix(w: &QMatrix<'_>) -> Vec<f32> {
    let mut out = vec![0.0f32; w.rows * w.cols];
    if w.cols > 0 {
        for (src, dst) in w
            .data
            .chunks_exact(w.row_bytes.max(1))
            .zip(out.chunks_exact_mut(w.cols))
        {
            dequantize_unchecked(w.ty, src, dst);
        }
    }
    out
}

/// Smallest number of rows one pool task gets, so task overhead stays negligible.
const MIN_ROWS_PER_TASK: usize = 64;

pub(crate) fn check_len(what: &'static str, a: usize, b: usize, actual: usize) -> Result<()> {
    let expected = a.checked_mul(b).ok_or(KernelError::Overflow(what))?;
    if actual != expected {
        return Err(KernelError::LengthMismatch {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}

/// Output pointer shared by tasks that write disjoint row ranges.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks only write disjoint elements (distinct rows), and the pointer outlives them
// because `par_drive` blocks until every task is done.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`.
unsafe impl Sync for OutPtr {}
impl OutPtr {
    /// Method (not field) access so closures capture the whole Sync wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Runs `dot(r, t)` for every row r < rows and token t < n_tokens, writing
/// `out[t * rows + r]`; rows are split into tasks, tokens are tiled inside each task.
pub(crate) fn par_drive(
    rows: usize,
    n_tokens: usize,
    out: &mut [f32],
    dot: impl Fn(usize, usize) -> f32 + Sync,
) {
    debug_assert_eq!(out.len(), rows * n_tokens);
    if rows == 0 || n_tokens == 0 {
        return;
    }
    let pool = crate::pool::global();
    let threads = pool.threads();
    let per_task = rows.div_ceil(threads * 4).max(MIN_ROWS_PER_TASK);
    let n_tasks = rows.div_ceil(per_task);
    let ptr = OutPtr(out.as_mut_ptr());
    let task = |c: usize| {
        let r0 = c * per_task;
        let r1 = (r0 + per_task).min(rows);
        let mut t0 = 0;
        while t0 < n_tokens {
            let t1 = (t0 + TOKEN_TILE).min(n_tokens);
            for r in r0..r1 {
                for t in t0..t1 {
                    let v = dot(r, t);
                    // SAFETY: t < n_tokens and r < rows, so the index is in bounds of `out`
                    // (len rows * n_tokens); row ranges of different tasks are disjoint.
                    unsafe { *ptr.get().add(t * rows + r) = v };
                }
            }
            t0 = t1;
        }
    };
    pool.run_contiguous(n_tasks, &task);
}

/// Weight rows per call of a tile closure, which resolves the tile's activation rows once for
/// all of them.
const TILE_ROWS: usize = 16;

/// Weight bytes a task sweeps once per token tile before moving to its next rows: small enough
/// to be read from L2 by every tile (a large matrix, such as an f32 output head, would
/// otherwise come from memory once per tile).
const ROW_BLOCK_BYTES: usize = 256 << 10;

/// Like [`par_drive`], but `tile(rs, ts, buf)` computes rows `rs` (at most [`TILE_ROWS`])
/// against tokens `ts` (at most [`TOKEN_TILE`]) at once: `buf[i][k]` = row `rs.start + i`,
/// token `ts.start + k`. `row_bytes` (the weight bytes of a row) sizes the row blocks.
pub(crate) fn par_drive_tiles(
    rows: usize,
    n_tokens: usize,
    row_bytes: usize,
    out: &mut [f32],
    tile: impl Fn(Range<usize>, Range<usize>, &mut [[f32; TOKEN_TILE]]) + Sync,
) {
    debug_assert_eq!(out.len(), rows * n_tokens);
    if rows == 0 || n_tokens == 0 {
        return;
    }
    let pool = crate::pool::global();
    let per_task = rows.div_ceil(pool.threads() * 4).max(TILE_ROWS);
    let n_tasks = rows.div_ceil(per_task);
    let block = (ROW_BLOCK_BYTES / row_bytes.max(1))
        .max(1)
        .next_multiple_of(TILE_ROWS);
    let ptr = OutPtr(out.as_mut_ptr());
    pool.run_contiguous(n_tasks, &|c: usize| {
        let (r0, r1) = (c * per_task, ((c + 1) * per_task).min(rows));
        let mut buf = [[0f32; TOKEN_TILE]; TILE_ROWS];
        for b0 in (r0..r1).step_by(block) {
            let b1 = (b0 + block).min(r1);
            for t0 in (0..n_tokens).step_by(TOKEN_TILE) {
                let t1 = (t0 + TOKEN_TILE).min(n_tokens);
                for q0 in (b0..b1).step_by(TILE_ROWS) {
                    let q1 = (q0 + TILE_ROWS).min(b1);
                    let buf = &mut buf[..q1 - q0];
                    tile(q0..q1, t0..t1, buf);
                    for k in 0..t1 - t0 {
                        for (i, v) in buf.iter().enumerate() {
                            // SAFETY: t0 + k < n_tokens and q0 + i < rows: in bounds of
                            // `out`; tasks own disjoint row ranges.
                            unsafe { *ptr.get().add((t0 + k) * rows + q0 + i) = v[k] };
                        }
                    }
                }
            }
        }
    });
}

/// `out[t * rows + r] = dot(W row r, x row t)` for `x` of shape `[n_tokens, cols]`
/// (row-major). Activations are quantized once into `scratch` (format chosen by the weight
/// type); no allocation happens once `scratch` has seen this size.
pub fn matmul(
    w: &QMatrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut QuantizedActivations,
) -> Result<()> {
    matmul_at(cpu_level(), w, x, n_tokens, out, scratch)
}

/// [`matmul`] at an explicit level (clamped to what the CPU supports); tests use it to run
/// every level's kernels through the driver. Several tokens go through the token tiles
/// ([`crate::matmul::tile`]); one token through the row kernels of [`crate::vec_dot_at`].
pub fn matmul_at(
    level: CpuLevel,
    w: &QMatrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut QuantizedActivations,
) -> Result<()> {
    check_len("matmul input x", n_tokens, w.cols, x.len())?;
    check_len("matmul output", n_tokens, w.rows, out.len())?;
    let format = ActFormat::for_weight(w.ty)?;
    let level = level.clamp_to_hardware();
    let (ty, cols, rb, data) = (w.ty, w.cols, w.row_bytes, w.data);
    if format == ActFormat::F32 && n_tokens > 1 && float::supported(level, ty) {
        float::matmul_float(level, ty, data, rb, w.rows, cols, x, n_tokens, out);
        return Ok(());
    }
    if format == ActFormat::F32 {
        // Float weights read the f32 activations in place; no copy into scratch.
        par_drive(w.rows, n_tokens, out, |r, t| {
            dot_unchecked(
                level,
                ty,
                &data[r * rb..(r + 1) * rb],
                ActRow::F32(&x[t * cols..(t + 1) * cols]),
            )
        });
        return Ok(());
    }
    scratch.quantize_rows_into(w.ty, x, n_tokens)?;
    if n_tokens > 1 && needs_q8_0x4(level, ty) {
        scratch.prepare_q8_0x4();
    }
    let scratch = &*scratch;
    if n_tokens > 1 {
        par_drive_tiles(w.rows, n_tokens, rb, out, |rs, ts, buf| {
            tile_unchecked(level, ty, (data, rb), rs, scratch, ts, buf)
        });
        return Ok(());
    }
    par_drive(w.rows, n_tokens, out, |r, t| match scratch.row(t) {
        Some(act) => dot_unchecked(level, ty, &data[r * rb..(r + 1) * rb], act),
        None => 0.0,
    });
    Ok(())
}
