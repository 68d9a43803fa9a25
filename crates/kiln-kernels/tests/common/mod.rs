//! Shared helpers for the integration tests: a tiny deterministic PRNG and random rows.
#![allow(dead_code)]

use half::f16;
use kiln_kernels::{BlockQ8_0, BlockQ8_1, BlockQ8K, GgmlType};

/// xorshift64* — deterministic, dependency-free.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in [-1, 1).
    pub fn sym(&mut self) -> f32 {
        self.unit() * 2.0 - 1.0
    }
    pub fn i8_127(&mut self) -> i8 {
        ((self.next_u64() % 255) as i32 - 127) as i8
    }
}

/// Byte offsets and kinds of the scale fields of each block type ("d" = positive f16,
/// "m" = signed f16, "f32" = f32).
pub fn scale_fields(ty: GgmlType) -> &'static [(usize, &'static str)] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 => &[(0, "d")],
        Q4_1 | Q5_1 | Q8_1 => &[(0, "d"), (2, "m")],
        Q2_K => &[(80, "d"), (82, "d")],
        Q3_K => &[(108, "d")],
        Q4_K | Q5_K => &[(0, "d"), (2, "d")],
        Q6_K => &[(208, "d")],
        Q8_K => &[(0, "f32")],
        F32 | F16 | BF16 => &[],
    }
}

/// A random weight row of `n_elems` elements. With `unit`, every scale is 1 and every
/// minimum 0 so that dot products are exact integers.
pub fn random_row(rng: &mut Rng, ty: GgmlType, n_elems: usize, unit: bool) -> Vec<u8> {
    let nbytes = ty.row_bytes(n_elems).unwrap();
    if ty.is_float() {
        let mut out = Vec::with_capacity(nbytes);
        for _ in 0..n_elems {
            let v = rng.sym() * 2.0;
            match ty {
                GgmlType::F32 => out.extend_from_slice(&v.to_le_bytes()),
                GgmlType::F16 => out.extend_from_slice(&f16::from_f32(v).to_bits().to_le_bytes()),
                _ => out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes()),
            }
        }
        return out;
    }
    let mut out: Vec<u8> = (0..nbytes).map(|_| rng.byte()).collect();
    let bb = ty.block_bytes();
    for blk in out.chunks_exact_mut(bb) {
        for &(off, kind) in scale_fields(ty) {
            let v = match (kind, unit) {
                ("m", true) => 0.0,
                (_, true) => 1.0,
                ("m", false) => rng.sym() * 0.05,
                _ => rng.unit() * 0.05 + 1e-4,
            };
            if kind == "f32" {
                blk[off..off + 4].copy_from_slice(&v.to_le_bytes());
            } else {
                blk[off..off + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
            }
        }
    }
    out
}

/// Random Q8_0 activation blocks (unit scale if `unit`).
pub fn random_q8_0(rng: &mut Rng, n_blocks: usize, unit: bool) -> Vec<BlockQ8_0> {
    (0..n_blocks)
        .map(|_| BlockQ8_0 {
            d: f16::from_f32(if unit { 1.0 } else { rng.unit() * 0.02 + 1e-4 }),
            qs: std::array::from_fn(|_| rng.i8_127()),
        })
        .collect()
}

/// Random Q8_1 activation blocks with consistent `s` (0 when `unit`).
pub fn random_q8_1(rng: &mut Rng, n_blocks: usize, unit: bool) -> Vec<BlockQ8_1> {
    (0..n_blocks)
        .map(|_| {
            let d = if unit { 1.0 } else { rng.unit() * 0.02 + 1e-4 };
            let qs: [i8; 32] = std::array::from_fn(|_| rng.i8_127());
            let sum: i32 = qs.iter().map(|&q| q as i32).sum();
            BlockQ8_1 {
                d: f16::from_f32(d),
                s: f16::from_f32(if unit { 0.0 } else { sum as f32 * d }),
                qs,
            }
        })
        .collect()
}

/// Random Q8_K activation blocks with correct bsums.
pub fn random_q8k(rng: &mut Rng, n_blocks: usize, unit: bool) -> Vec<BlockQ8K> {
    (0..n_blocks)
        .map(|_| {
            let qs: [i8; 256] = std::array::from_fn(|_| rng.i8_127());
            let bsums =
                std::array::from_fn(|g| qs[g * 16..g * 16 + 16].iter().map(|&q| q as i16).sum());
            BlockQ8K {
                d: if unit { 1.0 } else { rng.unit() * 0.02 + 1e-4 },
                qs,
                bsums,
            }
        })
        .collect()
}

/// Parses a hex string into bytes.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// Parses hex little-endian f32s.
pub fn unhex_f32(s: &str) -> Vec<f32> {
    unhex(s)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
