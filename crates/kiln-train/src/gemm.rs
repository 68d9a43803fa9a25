//! f32 matrix products through the `gemm` crate (the same kernels candle's CPU backend uses),
//! behind bounds-checked views so that callers never touch a raw pointer.

use gemm::Parallelism;

/// A read-only view of an f32 matrix with arbitrary (non-negative) strides.
#[derive(Clone, Copy)]
pub struct View<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> View<'a> {
    /// `data` as a row-major `rows × cols` matrix.
    pub fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::strided(data, rows, cols, cols)
    }

    /// A row-major `rows × cols` block whose rows are `row_stride` apart (a head's columns).
    pub fn strided(data: &'a [f32], rows: usize, cols: usize, row_stride: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride,
            col_stride: 1,
        }
    }

    /// The transpose, without copying.
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    fn fits(&self) -> bool {
        if self.rows == 0 || self.cols == 0 {
            return true;
        }
        let last = (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride;
        last < self.data.len()
    }
}

/// Whether a product of this many multiply-adds is worth the rayon pool.
fn parallelism(flops: usize) -> Parallelism {
    if flops >= 1 << 20 {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

/// `dst = beta · a·b` (or `dst += beta · a·b` with `accumulate`), `dst` row-major `m × n` with
/// rows `dst_stride` apart.
///
/// # Panics
/// When the shapes disagree or a view reaches past its slice: a programming error of the
/// trainer's own shape bookkeeping, never of user input (shapes come from the model config).
pub fn matmul_into(
    dst: &mut [f32],
    dst_stride: usize,
    a: View<'_>,
    b: View<'_>,
    beta: f32,
    accumulate: bool,
) {
    let par = parallelism(a.rows * a.cols * b.cols);
    product(dst, dst_stride, a, b, beta, accumulate, par);
}

/// [`matmul_into`] on the calling thread only, for products that already run one per worker.
pub fn matmul_into_serial(
    dst: &mut [f32],
    dst_stride: usize,
    a: View<'_>,
    b: View<'_>,
    beta: f32,
    accumulate: bool,
) {
    product(dst, dst_stride, a, b, beta, accumulate, Parallelism::None);
}

fn product(
    dst: &mut [f32],
    dst_stride: usize,
    a: View<'_>,
    b: View<'_>,
    beta: f32,
    accumulate: bool,
    par: Parallelism,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "matmul: inner dimensions differ");
    assert!(a.fits() && b.fits(), "matmul: view out of bounds");
    assert!(
        m == 0 || n == 0 || (m - 1) * dst_stride + n <= dst.len(),
        "matmul: destination too small"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                dst[r * dst_stride..r * dst_stride + n].fill(0.0);
            }
        }
        return;
    }
    // SAFETY: the asserts above check that every element the strides reach lies inside
    // `a.data`, `b.data` and `dst`; `dst` is borrowed mutably, so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_stride as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            beta,
            false,
            false,
            false,
            par,
        );
    }
}

/// `a·b` as a new row-major matrix.
pub fn matmul(a: View<'_>, b: View<'_>) -> Vec<f32> {
    let mut out = vec![0f32; a.rows * b.cols];
    matmul_into(&mut out, b.cols, a, b, 1.0, false);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        out
    }

    #[test]
    fn products_and_transposes_match_the_naive_loop() {
        let (m, k, n) = (7, 5, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let want = naive(&a, &b, m, k, n);
        let got = matmul(View::rows(&a, m, k), View::rows(&b, k, n));
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5);
        }
        // (bᵀ aᵀ)ᵀ = a b, through transposed views.
        let bt_at = matmul(View::rows(&b, k, n).t(), View::rows(&a, m, k).t());
        for i in 0..m {
            for j in 0..n {
                assert!((bt_at[j * m + i] - want[i * n + j]).abs() < 1e-5);
            }
        }
        let mut acc = want.clone();
        matmul_into(
            &mut acc,
            n,
            View::rows(&a, m, k),
            View::rows(&b, k, n),
            2.0,
            true,
        );
        for (g, w) in acc.iter().zip(&want) {
            assert!((g - 3.0 * w).abs() < 1e-4);
        }
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn a_view_past_its_slice_is_refused() {
        let a = vec![0f32; 5];
        let b = vec![0f32; 4];
        matmul(View::rows(&a, 2, 3), View::rows(&b, 3, 1));
    }
}
