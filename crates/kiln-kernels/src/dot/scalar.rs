//! Scalar reference dot products. Integer parts are exact; the float combination per block
//! follows ggml's generic C code (e.g. Q4_1: `(dx*dy)*sumi + mx*sy`), accumulated in f32 in
//! block order. Float-weight dots accumulate in f64 (as ggml's `ggml_float`) and round once.

use crate::format::blocks::*;

#[inline(always)]
fn nib_dot(qs: &[u8], y: &[i8], off: i32) -> i32 {
    let mut s0 = 0i32;
    let mut s1 = 0i32;
    for j in 0..16 {
        s0 += ((qs[j] & 0xF) as i32 - off) * y[j] as i32;
        s1 += ((qs[j] >> 4) as i32 - off) * y[j + 16] as i32;
    }
    s0 + s1
}

/// Q4_0 weights × Q8_0 activations.
pub fn q4_0_q8_0(w: &[[u8; Q4_0_BYTES]], a: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        let sumi = nib_dot(&b[2..18], &y.qs, 8);
        sumf += sumi as f32 * f16_at(b, 0) * y.d.to_f32();
    }
    sumf
}

/// Q4_1 weights × Q8_1 activations.
pub fn q4_1_q8_1(w: &[[u8; Q4_1_BYTES]], a: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        let sumi = nib_dot(&b[4..20], &y.qs, 0);
        sumf += (f16_at(b, 0) * y.d.to_f32()) * sumi as f32 + f16_at(b, 2) * y.s.to_f32();
    }
    sumf
}

#[inline(always)]
fn q5_dot(qh: u32, qs: &[u8], y: &[i8], off: i32) -> i32 {
    let mut s0 = 0i32;
    let mut s1 = 0i32;
    for j in 0..16 {
        let h0 = (((qh >> j) & 1) << 4) as i32;
        let h1 = (((qh >> (j + 16)) & 1) << 4) as i32;
        s0 += (((qs[j] & 0xF) as i32 | h0) - off) * y[j] as i32;
        s1 += (((qs[j] >> 4) as i32 | h1) - off) * y[j + 16] as i32;
    }
    s0 + s1
}

/// Q5_0 weights × Q8_0 activations.
pub fn q5_0_q8_0(w: &[[u8; Q5_0_BYTES]], a: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        let sumi = q5_dot(u32_at(b, 2), &b[6..22], &y.qs, 16);
        sumf += sumi as f32 * f16_at(b, 0) * y.d.to_f32();
    }
    sumf
}

/// Q5_1 weights × Q8_1 activations.
pub fn q5_1_q8_1(w: &[[u8; Q5_1_BYTES]], a: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        let sumi = q5_dot(u32_at(b, 4), &b[8..24], &y.qs, 0);
        sumf += (f16_at(b, 0) * y.d.to_f32()) * sumi as f32 + f16_at(b, 2) * y.s.to_f32();
    }
    sumf
}

/// Q8_0 weights × Q8_0 activations.
pub fn q8_0_q8_0(w: &[[u8; Q8_0_BYTES]], a: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        let sumi: i32 = b[2..]
            .iter()
            .zip(&y.qs)
            .map(|(&x, &y)| (x as i8) as i32 * y as i32)
            .sum();
        sumf += sumi as f32 * (f16_at(b, 0) * y.d.to_f32());
    }
    sumf
}

/// Integer dot of 16-element groups: `out[g] = sum(q[16g..16g+16] * y[16g..16g+16])`.
#[inline(always)]
fn group16_dots(q: &[i8; 256], y: &[i8; 256]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (g, o) in out.iter_mut().enumerate() {
        *o = q[g * 16..g * 16 + 16]
            .iter()
            .zip(&y[g * 16..g * 16 + 16])
            .map(|(&a, &b)| a as i32 * b as i32)
            .sum();
    }
    out
}

/// Q2_K weights × Q8_K activations.
pub fn q2_k_q8_k(w: &[[u8; Q2_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        let scales = &b[0..16];
        let qs = &b[16..80];
        let mut q = [0i8; 256];
        for half in 0..2 {
            for shift in 0..4 {
                for l in 0..32 {
                    q[half * 128 + shift * 32 + l] = ((qs[half * 32 + l] >> (2 * shift)) & 3) as i8;
                }
            }
        }
        let g = group16_dots(&q, &y.qs);
        let mut isum = 0i32;
        let mut summs = 0i32;
        for j in 0..16 {
            isum += (scales[j] & 0xF) as i32 * g[j];
            summs += (scales[j] >> 4) as i32 * y.bsums[j] as i32;
        }
        let dall = y.d * f16_at(b, 80);
        let dmin = y.d * f16_at(b, 82);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// Q3_K weights × Q8_K activations.
pub fn q3_k_q8_k(w: &[[u8; Q3_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        let hmask = &b[0..32];
        let qs = &b[32..96];
        let scales = q3k_scales(&b[96..108]);
        let mut q = [0i8; 256];
        for half in 0..2 {
            for shift in 0..4 {
                let hbit = half * 4 + shift;
                for l in 0..32 {
                    let lo = ((qs[half * 32 + l] >> (2 * shift)) & 3) as i8;
                    let off = if (hmask[l] >> hbit) & 1 == 1 { 0 } else { 4 };
                    q[half * 128 + shift * 32 + l] = lo - off;
                }
            }
        }
        let g = group16_dots(&q, &y.qs);
        let isum: i32 = (0..16).map(|j| scales[j] as i32 * g[j]).sum();
        sumf += f16_at(b, 108) * y.d * isum as f32;
    }
    sumf
}

/// Shared Q4_K/Q5_K combination: `q` holds unsigned codes, scales/mins per 32 elements.
#[inline(always)]
fn k4_combine(q: &[i8; 256], b_scales: &[u8], d: f32, dmin: f32, y: &BlockQ8K) -> f32 {
    let (sc, mn) = k4_scales_mins(b_scales);
    let g = group16_dots(q, &y.qs);
    let mut isum = 0i32;
    let mut summs = 0i32;
    for j in 0..16 {
        isum += sc[j / 2] as i32 * g[j];
        summs += mn[j / 2] as i32 * y.bsums[j] as i32;
    }
    (d * y.d) * isum as f32 - (dmin * y.d) * summs as f32
}

/// Q4_K weights × Q8_K activations.
pub fn q4_k_q8_k(w: &[[u8; Q4_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        let qs = &b[16..144];
        let mut q = [0i8; 256];
        for j in 0..4 {
            for l in 0..32 {
                q[j * 64 + l] = (qs[j * 32 + l] & 0xF) as i8;
                q[j * 64 + 32 + l] = (qs[j * 32 + l] >> 4) as i8;
            }
        }
        sumf += k4_combine(&q, &b[4..16], f16_at(b, 0), f16_at(b, 2), y);
    }
    sumf
}

/// Q5_K weights × Q8_K activations.
pub fn q5_k_q8_k(w: &[[u8; Q5_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        let qh = &b[16..48];
        let qs = &b[48..176];
        let mut q = [0i8; 256];
        for j in 0..4 {
            for l in 0..32 {
                let h1 = ((qh[l] >> (2 * j)) & 1) << 4;
                let h2 = ((qh[l] >> (2 * j + 1)) & 1) << 4;
                q[j * 64 + l] = ((qs[j * 32 + l] & 0xF) | h1) as i8;
                q[j * 64 + 32 + l] = ((qs[j * 32 + l] >> 4) | h2) as i8;
            }
        }
        sumf += k4_combine(&q, &b[4..16], f16_at(b, 0), f16_at(b, 2), y);
    }
    sumf
}

/// Q6_K weights × Q8_K activations.
pub fn q6_k_q8_k(w: &[[u8; Q6_K_BYTES]], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, y) in w.iter().zip(a) {
        let mut q = [0i8; 256];
        for half in 0..2 {
            let ql = &b[half * 64..half * 64 + 64];
            let qh = &b[128 + half * 32..128 + half * 32 + 32];
            let o = half * 128;
            for l in 0..32 {
                let h = qh[l];
                q[o + l] = ((ql[l] & 0xF) | ((h & 3) << 4)) as i8 - 32;
                q[o + l + 32] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32;
                q[o + l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                q[o + l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        let g = group16_dots(&q, &y.qs);
        let isum: i32 = (0..16).map(|j| (b[192 + j] as i8) as i32 * g[j]).sum();
        sumf += f16_at(b, 208) * y.d * isum as f32;
    }
    sumf
}

/// f32 weights × f32 activations.
pub fn f32_f32(w: &[[u8; 4]], x: &[f32]) -> f32 {
    let mut s = 0.0f64;
    for (b, &v) in w.iter().zip(x) {
        s += f32::from_le_bytes(*b) as f64 * v as f64;
    }
    s as f32
}

/// f32 weights (already typed) × f32 activations.
pub fn f32s_f32(w: &[f32], x: &[f32]) -> f32 {
    let mut s = 0.0f64;
    for (&a, &v) in w.iter().zip(x) {
        s += a as f64 * v as f64;
    }
    s as f32
}

/// f16 weights × f32 activations.
pub fn f16_f32(w: &[[u8; 2]], x: &[f32]) -> f32 {
    let mut s = 0.0f64;
    for (b, &v) in w.iter().zip(x) {
        s += half::f16::from_bits(u16::from_le_bytes(*b)).to_f64() * v as f64;
    }
    s as f32
}

/// bf16 weights × f32 activations.
pub fn bf16_f32(w: &[[u8; 2]], x: &[f32]) -> f32 {
    let mut s = 0.0f64;
    for (b, &v) in w.iter().zip(x) {
        s += f32::from_bits((u16::from_le_bytes(*b) as u32) << 16) as f64 * v as f64;
    }
    s as f32
}
