//! Q8_0 activations interleaved four blocks at a time for the AVX-512 token tiles.
//!
//! In the ggml layout each 32-element block comes with its own f16 scale, so a SIMD kernel
//! converts, multiplies and accumulates a scale for every 32 products, per token: that float
//! work, not the int8 products, bounds a Q8_0 / Q5_0 prefill. Interleaved, one 512-bit
//! register holds 16 elements of each of four blocks, 4 bytes of block `k` in every 32-bit
//! lane `j` with `j % 4 == k`, so two `vpdpbusd` leave each block's sum spread over its own
//! four lanes and one convert + multiply + FMA applies four blocks' scales at once. The f32
//! scales are stored in that lane order too, so they are one load.
//!
//! The codes are stored as unsigned `y + 128` (`vpdpbusd` multiplies unsigned by signed
//! bytes), so the weights keep their sign and the `128 · Σx` this adds is a property of the
//! weight row, subtracted once per row and tile rather than once per token.

use crate::format::blocks::BlockQ8_0;

/// Four Q8_0 activation blocks (fewer at the end of a row: the rest are zero), interleaved.
/// 192 bytes, 64-aligned, so that each 64-byte load is one cache line.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_0x4 {
    /// `y + 128` as unsigned bytes. Byte `64h + 16c + 4k + i` is element `16h + 4c + i` of
    /// block `k` (half `h` < 2, 4-byte chunk `c` < 4, block `k` < 4, byte `i` < 4).
    pub qs: [u8; 128],
    /// The f32 scale of block `j % 4` (exactly its f16 `d`) in lane `j`.
    pub d: [f32; 16],
}

impl Default for BlockQ8_0x4 {
    fn default() -> Self {
        Self {
            qs: [0x80; 128],
            d: [0.0; 16],
        }
    }
}

impl BlockQ8_0x4 {
    /// Interleaves up to four blocks; missing ones are zero (they add nothing to a dot).
    pub fn pack(blocks: &[BlockQ8_0]) -> Self {
        let mut out = Self::default();
        for (k, b) in blocks.iter().take(4).enumerate() {
            // 4-byte chunk e of the block (elements 4e..4e + 4) is chunk e % 4 of half e / 4.
            for (e, c) in b.qs.as_chunks::<4>().0.iter().enumerate() {
                let o = 64 * (e / 4) + 16 * (e % 4) + 4 * k;
                let u = u32::from_ne_bytes(c.map(|q| q as u8)) ^ 0x8080_8080;
                out.qs[o..o + 4].copy_from_slice(&u.to_ne_bytes());
            }
            for j in (k..16).step_by(4) {
                out.d[j] = b.d.to_f32();
            }
        }
        out
    }
}

/// Groups of four blocks needed for a row of `n_blocks` Q8_0 blocks.
pub fn x4_groups(n_blocks: usize) -> usize {
    n_blocks.div_ceil(4)
}

/// Interleaves a row of Q8_0 blocks into `out` (length [`x4_groups`] of the row's blocks).
pub fn pack_row_q8_0x4(row: &[BlockQ8_0], out: &mut [BlockQ8_0x4]) {
    for (o, c) in out.iter_mut().zip(row.chunks(4)) {
        *o = BlockQ8_0x4::pack(c);
    }
}
