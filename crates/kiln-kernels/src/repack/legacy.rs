//! The 16-row group layouts of the 32-value block types (Q4_0, Q4_1, Q8_0, Q5_0), which
//! [`crate::repack`] describes, and where a Q5_0 group block keeps its fifth bits.

use crate::format::types::GgmlType;

/// Where a Q5_0 group block keeps its codes' fifth bits, in the 64 bytes after the scales.
/// Chosen per matrix for the level that will run it; both layouts have kernels at both x86
/// levels, so a matrix gives the same results whichever it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FifthBits {
    /// Eight 64-bit masks, one per code vector: bit `4k + b` of mask `i` is row `k`'s bit of
    /// code `4i + b`. The AVX-512 kernel adds 16 under each mask in one instruction.
    Masks,
    /// One 64-byte plane lane-aligned with the code vectors: bit `i` of byte `4k + b` is row
    /// `k`'s bit of code `4i + b`. A 256-bit kernel moves bit `i` to bit 4 with one 16-bit
    /// shift, where expanding a mask to bytes costs four instructions.
    Planes,
}

impl FifthBits {
    /// The layout whose kernel is faster at `level` (clamped to the hardware).
    pub fn for_level(level: crate::CpuLevel) -> Self {
        if level.clamp_to_hardware() >= crate::CpuLevel::Avx512 {
            Self::Masks
        } else {
            Self::Planes
        }
    }

    /// Byte (in the group block) and bit holding row `k`'s fifth bit of code `e`.
    fn position(self, k: usize, e: usize) -> (usize, u8) {
        let (i, b) = (e / 4, e % 4);
        match self {
            Self::Masks => (32 + 8 * i + (4 * k + b) / 8, ((4 * k + b) % 8) as u8),
            Self::Planes => (32 + 4 * k + b, i as u8),
        }
    }
}

/// Writes row `k`'s file block `blk` into the group block `dst` (zeroed before its first row).
pub(super) fn pack(ty: GgmlType, bits: FifthBits, k: usize, blk: &[u8], dst: &mut [u8]) {
    dst[2 * k..2 * k + 2].copy_from_slice(&blk[0..2]);
    match ty {
        GgmlType::Q4_0 => {
            for j in 0..4 {
                let at = 32 + 64 * j + 4 * k;
                dst[at..at + 4].copy_from_slice(&blk[2 + 4 * j..6 + 4 * j]);
            }
        }
        GgmlType::Q4_1 => {
            dst[32 + 2 * k..32 + 2 * k + 2].copy_from_slice(&blk[2..4]);
            for j in 0..4 {
                let at = 64 + 64 * j + 4 * k;
                dst[at..at + 4].copy_from_slice(&blk[4 + 4 * j..8 + 4 * j]);
            }
        }
        GgmlType::Q8_0 => {
            for i in 0..8 {
                for b in 0..4 {
                    dst[32 + 64 * i + 4 * k + b] = blk[2 + 4 * i + b] ^ 0x80;
                }
            }
        }
        GgmlType::Q5_0 => {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            for e in 0..32 {
                if qh >> e & 1 == 1 {
                    let (byte, bit) = bits.position(k, e);
                    dst[byte] |= 1 << bit;
                }
            }
            for j in 0..4 {
                let at = 96 + 64 * j + 4 * k;
                dst[at..at + 4].copy_from_slice(&blk[6 + 4 * j..10 + 4 * j]);
            }
        }
        _ => unreachable!("only repackable types reach pack"),
    }
}

/// Writes row `k`'s file block, read back from the group block `src`, into `out` (one file
/// block's bytes).
pub(super) fn unpack(ty: GgmlType, bits: FifthBits, k: usize, src: &[u8], out: &mut [u8]) {
    out[0..2].copy_from_slice(&src[2 * k..2 * k + 2]);
    match ty {
        GgmlType::Q4_0 => {
            for j in 0..4 {
                let at = 32 + 64 * j + 4 * k;
                out[2 + 4 * j..6 + 4 * j].copy_from_slice(&src[at..at + 4]);
            }
        }
        GgmlType::Q4_1 => {
            out[2..4].copy_from_slice(&src[32 + 2 * k..32 + 2 * k + 2]);
            for j in 0..4 {
                let at = 64 + 64 * j + 4 * k;
                out[4 + 4 * j..8 + 4 * j].copy_from_slice(&src[at..at + 4]);
            }
        }
        GgmlType::Q8_0 => {
            for i in 0..8 {
                for b in 0..4 {
                    out[2 + 4 * i + b] = src[32 + 64 * i + 4 * k + b] ^ 0x80;
                }
            }
        }
        GgmlType::Q5_0 => {
            let qh = (0..32).fold(0u32, |qh, e| {
                let (byte, bit) = bits.position(k, e);
                qh | u32::from(src[byte] >> bit & 1) << e
            });
            out[2..6].copy_from_slice(&qh.to_le_bytes());
            for j in 0..4 {
                let at = 96 + 64 * j + 4 * k;
                out[6 + 4 * j..10 + 4 * j].copy_from_slice(&src[at..at + 4]);
            }
        }
        _ => unreachable!("only repackable types are built"),
    }
}
