//! Host-memory tensors shared by the CPU backends and the loaders.

use kiln_kernels::GgmlType;

use super::TensorBytes;
use crate::ModelError;

/// A tensor as read from a model file: raw storage bytes of one type, viewed as a matrix.
#[derive(Debug, Clone)]
pub struct HostTensor {
    /// Storage type.
    pub ty: GgmlType,
    /// Number of rows (1 for vectors).
    pub rows: usize,
    /// Elements per row.
    pub cols: usize,
    /// `rows * row_bytes(cols)` bytes: the file's own where the loader could leave them.
    pub bytes: TensorBytes,
}

impl HostTensor {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> Result<usize, ModelError> {
        Ok(self.ty.row_bytes(self.cols)?)
    }

    /// Dequantizes the whole tensor to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>, ModelError> {
        let rb = self.row_bytes()?;
        let mut out = vec![0f32; self.rows * self.cols];
        if self.bytes.len() != rb * self.rows {
            return Err(ModelError::Forward(format!(
                "tensor holds {} bytes, expected {} rows of {rb}",
                self.bytes.len(),
                self.rows
            )));
        }
        for (src, dst) in self
            .bytes
            .chunks_exact(rb)
            .zip(out.chunks_exact_mut(self.cols))
        {
            kiln_kernels::dequantize_row(self.ty, src, dst)?;
        }
        Ok(out)
    }

    /// Reorders rows: row `i` of the result is row `order[i]` of `self`.
    pub fn permute_rows(&mut self, order: &[usize]) -> Result<(), ModelError> {
        let rb = self.row_bytes()?;
        if order.len() != self.rows || order.iter().any(|&r| r >= self.rows) {
            return Err(ModelError::Forward(
                "row permutation does not match the tensor".into(),
            ));
        }
        let mut out = Vec::with_capacity(self.bytes.len());
        for &r in order {
            out.extend_from_slice(&self.bytes[r * rb..(r + 1) * rb]);
        }
        self.bytes = out.into();
        Ok(())
    }

    /// Cuts the tensor into consecutive blocks of `rows[i]` rows (a fused Q/K/V projection into
    /// its three); the counts must add up to the tensor's rows.
    pub fn split_rows(&self, rows: &[usize]) -> Result<Vec<HostTensor>, ModelError> {
        let rb = self.row_bytes()?;
        if rows.iter().sum::<usize>() != self.rows || self.bytes.len() != rb * self.rows {
            return Err(ModelError::Forward(format!(
                "cannot split {} rows into {rows:?}",
                self.rows
            )));
        }
        let mut start = 0;
        let mut parts = Vec::with_capacity(rows.len());
        for &n in rows {
            let bytes = (self.bytes.slice(start * rb..(start + n) * rb))
                .ok_or_else(|| ModelError::Forward("split past the tensor's bytes".into()))?;
            start += n;
            parts.push(HostTensor {
                ty: self.ty,
                rows: n,
                cols: self.cols,
                bytes,
            });
        }
        Ok(parts)
    }
}

/// Row-major f32 activations `[rows, cols]`.
#[derive(Debug, Clone, PartialEq)]
pub struct HostAct {
    /// The values.
    pub data: Vec<f32>,
    /// Number of rows (tokens).
    pub rows: usize,
    /// Width of a row.
    pub cols: usize,
}

impl HostAct {
    /// Zero-filled activations.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            data: vec![0.0; rows * cols],
            rows,
            cols,
        }
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// Row `i`, mutable.
    pub fn row_mut(&mut self, i: usize) -> &mut [f32] {
        &mut self.data[i * self.cols..(i + 1) * self.cols]
    }
}
