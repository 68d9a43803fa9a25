//! Each operation of the shared decoder block, forward and backward, on row-major f32 slices.
//! The forwards compute what the inference backends compute; every backward is checked against
//! finite differences of its forward (`tests` in each file).

pub mod attention;
pub mod glu;
pub mod norm;
pub mod rope;

#[cfg(test)]
pub(crate) mod fd;

/// Runs `f(row, out_row)` over the `width`-wide rows of `out` on the kernel pool (elementwise
/// steps are memory-bound; one thread leaves half the bandwidth of two cores unused).
pub(crate) fn par_rows(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    kiln_kernels::pool::for_each_chunk_mut(out, width.max(1), 16, f);
}
