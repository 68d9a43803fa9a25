//! Error type shared by every kernel entry point.

use crate::format::types::GgmlType;

/// Everything that can go wrong when a kernel is handed data; sizes come from files, so
/// they are checked and reported instead of panicking.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A GGUF type id this crate does not know.
    #[error("unknown ggml type id {0}")]
    UnknownTypeId(u32),
    /// An element count that is not a whole number of blocks.
    #[error("{n} elements is not a multiple of the {ty} block size {block}")]
    NotBlockMultiple {
        /// The type whose block size was violated.
        ty: GgmlType,
        /// The element count given.
        n: usize,
        /// The type's block size in elements.
        block: usize,
    },
    /// A size computation overflowed `usize`.
    #[error("size overflow computing {0}")]
    Overflow(&'static str),
    /// A buffer had the wrong length.
    #[error("{what}: expected length {expected}, got {actual}")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// The length it needed to have.
        expected: usize,
        /// The length it had.
        actual: usize,
    },
    /// The operation is not implemented for this type (e.g. a dot product with Q8_K weights).
    #[error("{op} is not supported for {ty}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The type.
        ty: GgmlType,
    },
    /// A codec parameter chosen by the caller (bit width, group size, dimension) is outside
    /// the supported set.
    #[error("unsupported parameter: {0}")]
    UnsupportedParam(String),
    /// The activations were quantized for a different weight type than the one used.
    #[error("activations quantized as {have:?} but weight type {weight} needs {need:?}")]
    ActivationMismatch {
        /// The weight type of the dot product.
        weight: GgmlType,
        /// The activation format the weight type pairs with.
        need: crate::quantize::ActFormat,
        /// The activation format the buffer holds.
        have: crate::quantize::ActFormat,
    },
}

/// Result alias for kernel operations.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;
