//! Matrix × activations driver: quantize activations once, then split weight rows across
//! pool tasks, each task reading its weight rows once per token tile.

use crate::dequant::dequantize_unchecked;
use crate::dot::{dot_f32_at, dot_unchecked};
use crate::error::{KernelError, Result};
use crate::level::cpu_level;
use crate::quantize::{ActFormat, ActRow, QuantizedActivations};
use crate::types::GgmlType;

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
/// Tokens processed per pass over a task's weight rows: their activations stay in L1 while
/// the task's weight rows stay in L2.
const TOKEN_TILE: usize = 8;

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
    pool.run(n_tasks, &task);
}

/// Like [`par_drive`], but `tile(r, t0, out)` computes row `r` against tokens `t0..t0 +
/// out.len()` at once (at most [`TOKEN_TILE`] tokens).
fn par_drive_tiles(
    rows: usize,
    n_tokens: usize,
    out: &mut [f32],
    tile: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    debug_assert_eq!(out.len(), rows * n_tokens);
    if rows == 0 || n_tokens == 0 {
        return;
    }
    let pool = crate::pool::global();
    let per_task = rows.div_ceil(pool.threads() * 4).max(MIN_ROWS_PER_TASK / 4);
    let n_tasks = rows.div_ceil(per_task);
    let ptr = OutPtr(out.as_mut_ptr());
    pool.run(n_tasks, &|c: usize| {
        let (r0, r1) = (c * per_task, ((c + 1) * per_task).min(rows));
        let mut buf = [0f32; TOKEN_TILE];
        let mut t0 = 0;
        while t0 < n_tokens {
            let t1 = (t0 + TOKEN_TILE).min(n_tokens);
            for r in r0..r1 {
                tile(r, t0, &mut buf[..t1 - t0]);
                for (k, v) in buf[..t1 - t0].iter().enumerate() {
                    // SAFETY: t0 + k < n_tokens and r < rows: in bounds of `out`; tasks own
                    // disjoint row ranges.
                    unsafe { *ptr.get().add((t0 + k) * rows + r) = *v };
                }
            }
            t0 = t1;
        }
    });
}

/// One Q4_1 row against a tile of Q8_1 activation rows, through the AVX-512 tile kernel.
#[cfg(target_arch = "x86_64")]
fn q4_1_tile(row: &[u8], acts: &QuantizedActivations, t0: usize, out: &mut [f32]) {
    use crate::dot::avx512::q4_1_q8_1_tile;
    let w = row.as_chunks().0;
    let a = |k: usize| match acts.row(t0 + k) {
        Some(ActRow::Q8_1(blocks)) => blocks,
        _ => &[],
    };
    macro_rules! tile {
        ($n:literal) => {{
            let rows: [&[crate::blocks::BlockQ8_1]; $n] = std::array::from_fn(a);
            let mut res = [0f32; $n];
            // SAFETY: only called when the CPU level is AVX-512.
            unsafe { q4_1_q8_1_tile::<$n>(w, rows, &mut res) };
            out.copy_from_slice(&res);
        }};
    }
    match out.len() {
        8 => tile!(8),
        7 => tile!(7),
        6 => tile!(6),
        5 => tile!(5),
        4 => tile!(4),
        3 => tile!(3),
        2 => tile!(2),
        _ => tile!(1),
    }
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
    check_len("matmul input x", n_tokens, w.cols, x.len())?;
    check_len("matmul output", n_tokens, w.rows, out.len())?;
    let format = ActFormat::for_weight(w.ty)?;
    let level = cpu_level();
    let (ty, cols, rb, data) = (w.ty, w.cols, w.row_bytes, w.data);
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
    let scratch = &*scratch;
    #[cfg(target_arch = "x86_64")]
    if ty == GgmlType::Q4_1 && level >= crate::level::CpuLevel::Avx512 && n_tokens > 1 {
        par_drive_tiles(w.rows, n_tokens, out, |r, t0, tile| {
            q4_1_tile(&data[r * rb..(r + 1) * rb], scratch, t0, tile)
        });
        return Ok(());
    }
    par_drive(w.rows, n_tokens, out, |r, t| match scratch.row(t) {
        Some(act) => dot_unchecked(level, ty, &data[r * rb..(r + 1) * rb], act),
        None => 0.0,
    });
    Ok(())
}

/// Plain f32 matmul: `w` is `[rows, cols]`, `x` is `[n_tokens, cols]`, `out[t * rows + r]`.
pub fn matmul_f32(
    w: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) -> Result<()> {
    check_len("matmul_f32 weights", rows, cols, w.len())?;
    check_len("matmul_f32 input x", n_tokens, cols, x.len())?;
    check_len("matmul_f32 output", n_tokens, rows, out.len())?;
    let level = cpu_level();
    par_drive(rows, n_tokens, out, |r, t| {
        dot_f32_at(
            level,
            &w[r * cols..(r + 1) * cols],
            &x[t * cols..(t + 1) * cols],
        )
    });
    Ok(())
}
