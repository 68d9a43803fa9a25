//! Each operation of the shared decoder block, forward and backward, on row-major f32 slices.
//! The forwards compute what the inference backends compute; every backward is checked against
//! finite differences of its forward (`tests` in each file).

pub mod attention;
pub mod glu;
pub mod norm;
pub mod rope;

#[cfg(test)]
pub(crate) mod fd;
