//! The ggml tensor types and their block geometry.

use crate::error::{KernelError, Result};
use std::fmt;

/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;
/// Elements per block of the legacy quants (Q4_0 .. Q8_1).
pub const QK: usize = 32;

/// A ggml tensor element type, numbered as in GGUF.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    /// IEEE binary32.
    F32 = 0,
    /// IEEE binary16.
    F16 = 1,
    /// 32 × 4-bit, one f16 scale, offset −8.
    Q4_0 = 2,
    /// 32 × 4-bit, f16 scale and f16 minimum.
    Q4_1 = 3,
    /// 32 × 5-bit, one f16 scale, offset −16.
    Q5_0 = 6,
    /// 32 × 5-bit, f16 scale and f16 minimum.
    Q5_1 = 7,
    /// 32 × int8, one f16 scale.
    Q8_0 = 8,
    /// 32 × int8, f16 scale and f16 `d * sum(q)`.
    Q8_1 = 9,
    /// 256 × 2-bit with 4-bit sub-block scales and mins.
    Q2_K = 10,
    /// 256 × 3-bit with 6-bit sub-block scales.
    Q3_K = 11,
    /// 256 × 4-bit with 6-bit sub-block scales and mins.
    Q4_K = 12,
    /// 256 × 5-bit with 6-bit sub-block scales and mins.
    Q5_K = 13,
    /// 256 × 6-bit with int8 sub-block scales.
    Q6_K = 14,
    /// 256 × int8, f32 scale, per-16 sums (activation format of the K-quants).
    Q8_K = 15,
    /// bfloat16.
    BF16 = 30,
}

impl GgmlType {
    /// Every supported type, in id order.
    pub const ALL: [GgmlType; 15] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::BF16,
    ];

    /// The type with GGUF id `id`, or `None` for ids this crate does not handle.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// Like [`GgmlType::from_id`] but with an error for unknown ids.
    pub fn try_from_id(id: u32) -> Result<Self> {
        Self::from_id(id).ok_or(KernelError::UnknownTypeId(id))
    }

    /// The GGUF numeric id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name ggml uses ("Q4_1", "F16", ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
        }
    }

    /// Elements per block (1 for float types).
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1 => QK,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K => QK_K,
        }
    }

    /// Bytes per block, as laid out in ggml-common.h.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 4 + 16,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q5_1 => 4 + 4 + 16,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q8_1 => 4 + 32,
            GgmlType::Q2_K => 16 + 64 + 4,
            GgmlType::Q3_K => 32 + 64 + 12 + 2,
            GgmlType::Q4_K => 4 + 12 + 128,
            GgmlType::Q5_K => 4 + 12 + 32 + 128,
            GgmlType::Q6_K => 128 + 64 + 16 + 2,
            GgmlType::Q8_K => 4 + 256 + 32,
        }
    }

    /// Whether this is a float (non-block) type.
    pub fn is_float(self) -> bool {
        matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }

    /// Number of blocks in `n_elems` elements; errors unless it divides exactly.
    pub fn n_blocks(self, n_elems: usize) -> Result<usize> {
        let be = self.block_elems();
        if !n_elems.is_multiple_of(be) {
            return Err(KernelError::NotBlockMultiple {
                ty: self,
                n: n_elems,
                block: be,
            });
        }
        Ok(n_elems / be)
    }

    /// Bytes taken by a row of `n_elems` elements (a whole number of blocks, overflow checked).
    pub fn row_bytes(self, n_elems: usize) -> Result<usize> {
        self.n_blocks(n_elems)?
            .checked_mul(self.block_bytes())
            .ok_or(KernelError::Overflow("row bytes"))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
