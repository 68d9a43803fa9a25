//! Block layouts: typed `#[repr(C)]` structs for the activation formats this crate produces,
//! and byte-offset readers for weight blocks (which stay as raw little-endian bytes because
//! they come straight from a possibly unaligned mmap).

use half::f16;

/// Bytes of a Q4_0 block: `{ d: f16, qs: [u8; 16] }`.
pub const Q4_0_BYTES: usize = 18;
/// Bytes of a Q4_1 block: `{ d: f16, m: f16, qs: [u8; 16] }`.
pub const Q4_1_BYTES: usize = 20;
/// Bytes of a Q5_0 block: `{ d: f16, qh: [u8; 4], qs: [u8; 16] }`.
pub const Q5_0_BYTES: usize = 22;
/// Bytes of a Q5_1 block: `{ d: f16, m: f16, qh: [u8; 4], qs: [u8; 16] }`.
pub const Q5_1_BYTES: usize = 24;
/// Bytes of a Q8_0 block: `{ d: f16, qs: [i8; 32] }`.
pub const Q8_0_BYTES: usize = 34;
/// Bytes of a Q8_1 block: `{ d: f16, s: f16, qs: [i8; 32] }`.
pub const Q8_1_BYTES: usize = 36;
/// Bytes of a Q2_K block: `{ scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16 }`.
pub const Q2_K_BYTES: usize = 84;
/// Bytes of a Q3_K block: `{ hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16 }`.
pub const Q3_K_BYTES: usize = 110;
/// Bytes of a Q4_K block: `{ d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128] }`.
pub const Q4_K_BYTES: usize = 144;
/// Bytes of a Q5_K block: `{ d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }`.
pub const Q5_K_BYTES: usize = 176;
/// Bytes of a Q6_K block: `{ ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }`.
pub const Q6_K_BYTES: usize = 210;
/// Bytes of a Q8_K block: `{ d: f32, qs: [i8; 256], bsums: [i16; 16] }`.
pub const Q8_K_BYTES: usize = 292;

/// Q8_0 block: 32 int8 values sharing one f16 scale (`x = d * q`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quantized values.
    pub qs: [i8; 32],
}

/// Q8_1 block: like Q8_0 plus `s = d * sum(qs)` (taken with the f32 `d` before rounding to
/// f16, as ggml does), which lets Q4_1/Q5_1 fold their minimum in with one multiply.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d * sum(qs)`.
    pub s: f16,
    /// Quantized values.
    pub qs: [i8; 32],
}

/// Q8_K super-block: 256 int8 values, an f32 scale and per-16 sums (for the K-quant mins).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8K {
    /// Scale.
    pub d: f32,
    /// Quantized values.
    pub qs: [i8; 256],
    /// Sum of each run of 16 `qs`.
    pub bsums: [i16; 16],
}

impl Default for BlockQ8_0 {
    fn default() -> Self {
        Self {
            d: f16::ZERO,
            qs: [0; 32],
        }
    }
}

impl Default for BlockQ8_1 {
    fn default() -> Self {
        Self {
            d: f16::ZERO,
            s: f16::ZERO,
            qs: [0; 32],
        }
    }
}

impl Default for BlockQ8K {
    fn default() -> Self {
        Self {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16],
        }
    }
}

// The structs must have ggml's sizes so that a byte view of them is a valid ggml row.
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == Q8_0_BYTES);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == Q8_1_BYTES);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == Q8_K_BYTES);

impl BlockQ8_0 {
    /// The block as ggml's byte layout.
    pub fn to_bytes(&self) -> [u8; Q8_0_BYTES] {
        let mut b = [0u8; Q8_0_BYTES];
        b[0..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        for (o, &q) in b[2..].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        b
    }
}

impl BlockQ8_1 {
    /// The block as ggml's byte layout.
    pub fn to_bytes(&self) -> [u8; Q8_1_BYTES] {
        let mut b = [0u8; Q8_1_BYTES];
        b[0..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        b[2..4].copy_from_slice(&self.s.to_bits().to_le_bytes());
        for (o, &q) in b[4..].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        b
    }
}

impl BlockQ8K {
    /// The block as ggml's byte layout.
    pub fn to_bytes(&self) -> [u8; Q8_K_BYTES] {
        let mut b = [0u8; Q8_K_BYTES];
        b[0..4].copy_from_slice(&self.d.to_le_bytes());
        for (o, &q) in b[4..260].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        for (o, s) in b[260..].chunks_exact_mut(2).zip(&self.bsums) {
            o.copy_from_slice(&s.to_le_bytes());
        }
        b
    }
}

/// Reads the little-endian f16 at `off` and widens it (exactly) to f32.
#[inline(always)]
pub(crate) fn f16_at<const N: usize>(b: &[u8; N], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Reads the little-endian u32 at `off`.
#[inline(always)]
pub(crate) fn u32_at<const N: usize>(b: &[u8; N], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Unpacks the eight 6-bit (scale, min) pairs of a Q4_K/Q5_K block from its 12 scale bytes.
/// Pairs 0..4 sit in the low 6 bits of bytes 0..4 / 4..8; pairs 4..8 take their low nibble
/// from bytes 8..12 and their top two bits from the spare high bits of bytes 0..8.
#[inline(always)]
pub(crate) fn k4_scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
    }
    for j in 4..8 {
        sc[j] = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        mn[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    (sc, mn)
}

/// Unpacks the sixteen 6-bit Q3_K scales (still offset by 32) from its 12 scale bytes:
/// low nibbles from bytes 0..8 (low then high nibble), top two bits from bytes 8..12.
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let lo = if i < 8 { s[i] & 0xF } else { s[i - 8] >> 4 };
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = ((lo | (hi << 4)) as i8) - 32;
    }
    out
}
