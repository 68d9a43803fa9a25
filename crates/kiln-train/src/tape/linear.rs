//! A frozen projection with an optional LoRA beside it: `y = x·Wᵀ + s·(drop(x)·A)·B`. The base
//! stays in its file's storage type and is dequantized to f32 for each product (forward and
//! backward), so a quantized model trains in little more than its own size.

use std::borrow::Cow;
use std::sync::Arc;

use kiln_kernels::pool;
use kiln_model::backend::HostTensor;

use crate::TrainError;
use crate::gemm::{View, matmul, matmul_into};
use crate::lora::LoraParam;

/// A base weight `[rows = out, cols = in]`.
pub struct MatrixData {
    /// The tensor's name in the model.
    pub name: String,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    weight: Weight,
}

enum Weight {
    F32(Vec<f32>),
    Stored(HostTensor),
}

impl MatrixData {
    /// Keeps `t` as stored, or dequantized once when `dense`.
    pub fn new(name: &str, t: HostTensor, dense: bool) -> Result<Self, TrainError> {
        let (rows, cols) = (t.rows, t.cols);
        let weight = if dense || t.ty == kiln_kernels::GgmlType::F32 {
            Weight::F32(dequantize(&t)?)
        } else {
            t.row_bytes()?;
            Weight::Stored(t)
        };
        Ok(Self {
            name: name.into(),
            rows,
            cols,
            weight,
        })
    }

    /// The weight in f32, dequantized now unless it is kept so.
    pub fn f32(&self) -> Result<Cow<'_, [f32]>, TrainError> {
        Ok(match &self.weight {
            Weight::F32(w) => Cow::Borrowed(w),
            Weight::Stored(t) => Cow::Owned(dequantize(t)?),
        })
    }

    /// Row `r` in f32 (an embedding lookup).
    pub fn row(&self, r: usize, dst: &mut [f32]) -> Result<(), TrainError> {
        match &self.weight {
            Weight::F32(w) => dst.copy_from_slice(&w[r * self.cols..(r + 1) * self.cols]),
            Weight::Stored(t) => {
                let rb = t.row_bytes()?;
                kiln_kernels::dequantize_row(t.ty, &t.bytes[r * rb..(r + 1) * rb], dst)?;
            }
        }
        Ok(())
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match &self.weight {
            Weight::F32(w) => w.len() * 4,
            Weight::Stored(t) => t.bytes.len(),
        }
    }
}

/// The whole tensor in f32, rows dequantized in parallel.
fn dequantize(t: &HostTensor) -> Result<Vec<f32>, TrainError> {
    let rb = t.row_bytes()?;
    if t.bytes.len() != rb * t.rows {
        return Err(TrainError::Shape(format!(
            "tensor holds {} bytes, expected {} rows of {rb}",
            t.bytes.len(),
            t.rows
        )));
    }
    let mut out = vec![0f32; t.rows * t.cols];
    let failed = std::sync::atomic::AtomicBool::new(false);
    pool::for_each_chunk_mut(&mut out, t.cols, 16, |r, dst| {
        if kiln_kernels::dequantize_row(t.ty, &t.bytes[r * rb..(r + 1) * rb], dst).is_err() {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    if failed.into_inner() {
        return Err(TrainError::Shape(format!(
            "cannot dequantize {:?} rows",
            t.ty
        )));
    }
    Ok(out)
}

/// What a projection's backward needs besides its input.
pub(crate) struct LinearSaved {
    pub w: Arc<MatrixData>,
    /// Index of its LoRA parameters, when adapted and active.
    pub lora: Option<usize>,
    /// `drop(x)·A`, `[rows, r]`.
    pub xa: Vec<f32>,
    /// The dropout multipliers applied to `x` on the LoRA path.
    pub mask: Option<Vec<f32>>,
}

/// `x·Wᵀ (+ s·(drop(x)·A)·B)` and `drop(x)·A`.
pub(crate) fn forward(
    x: &[f32],
    rows: usize,
    w: &MatrixData,
    lora: Option<&LoraParam>,
    mask: Option<&[f32]>,
) -> Result<(Vec<f32>, Vec<f32>), TrainError> {
    let wf = w.f32()?;
    let mut y = matmul(
        View::rows(x, rows, w.cols),
        View::rows(&wf, w.rows, w.cols).t(),
    );
    let Some(l) = lora else {
        return Ok((y, Vec::new()));
    };
    let dropped: Cow<'_, [f32]> = match mask {
        Some(m) => Cow::Owned(x.iter().zip(m).map(|(a, b)| a * b).collect()),
        None => Cow::Borrowed(x),
    };
    let xa = matmul(
        View::rows(&dropped, rows, l.in_features),
        View::rows(&l.a, l.in_features, l.rank),
    );
    matmul_into(
        &mut y,
        w.rows,
        View::rows(&xa, rows, l.rank),
        View::rows(&l.b, l.rank, l.out_features),
        l.scale,
        true,
    );
    Ok((y, xa))
}

/// Accumulates the LoRA gradients and returns `∂L/∂x` when `need_dx`.
pub(crate) fn backward(
    x: &[f32],
    rows: usize,
    dy: &[f32],
    saved: &LinearSaved,
    lora: Option<&mut LoraParam>,
    need_dx: bool,
) -> Result<Option<Vec<f32>>, TrainError> {
    let w = &saved.w;
    let mut dx = if need_dx {
        let wf = w.f32()?;
        Some(matmul(
            View::rows(dy, rows, w.rows),
            View::rows(&wf, w.rows, w.cols),
        ))
    } else {
        None
    };
    let Some(l) = lora else {
        return Ok(dx);
    };
    let (r, dyv) = (l.rank, View::rows(dy, rows, l.out_features));
    matmul_into(
        &mut l.grad_b,
        l.out_features,
        View::rows(&saved.xa, rows, r).t(),
        dyv,
        l.scale,
        true,
    );
    let mut dxa = matmul(dyv, View::rows(&l.b, r, l.out_features).t());
    dxa.iter_mut().for_each(|v| *v *= l.scale);
    let dropped: Cow<'_, [f32]> = match &saved.mask {
        Some(m) => Cow::Owned(x.iter().zip(m).map(|(a, b)| a * b).collect()),
        None => Cow::Borrowed(x),
    };
    let dxa_v = View::rows(&dxa, rows, r);
    matmul_into(
        &mut l.grad_a,
        r,
        View::rows(&dropped, rows, l.in_features).t(),
        dxa_v,
        1.0,
        true,
    );
    if let Some(dx) = dx.as_mut() {
        let mut from_lora = matmul(dxa_v, View::rows(&l.a, l.in_features, r).t());
        if let Some(m) = &saved.mask {
            from_lora.iter_mut().zip(m).for_each(|(v, k)| *v *= k);
        }
        dx.iter_mut().zip(&from_lora).for_each(|(a, b)| *a += b);
    }
    Ok(dx)
}
