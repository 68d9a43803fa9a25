//! Row dequantization for the K-quants (256-element super-blocks). Same rule as
//! [`crate::format::dequant`]: ggml's operation order, no FMA, so results are bit-identical.

use crate::format::blocks::*;

pub(crate) fn q2_k(src: &[[u8; Q2_K_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(256)) {
        let scales = &b[0..16];
        let qs = &b[16..80];
        let d = f16_at(b, 80);
        let dmin = f16_at(b, 82);
        // Each 128-element half uses 32 bytes of qs, read four times at shifts 0,2,4,6;
        // every 16 outputs switch to the next scale byte.
        for half in 0..2 {
            let q = &qs[half * 32..half * 32 + 32];
            for shift in 0..4 {
                for sub in 0..2 {
                    let is = half * 8 + shift * 2 + sub;
                    let sc = scales[is];
                    let dl = d * (sc & 0xF) as f32;
                    let ml = dmin * (sc >> 4) as f32;
                    let base = half * 128 + shift * 32 + sub * 16;
                    for l in 0..16 {
                        let v = (q[sub * 16 + l] >> (2 * shift)) & 3;
                        y[base + l] = dl * v as f32 - ml;
                    }
                }
            }
        }
    }
}

pub(crate) fn q3_k(src: &[[u8; Q3_K_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(256)) {
        let hmask = &b[0..32];
        let qs = &b[32..96];
        let scales = q3k_scales(&b[96..108]);
        let d = f16_at(b, 108);
        for half in 0..2 {
            let q = &qs[half * 32..half * 32 + 32];
            for shift in 0..4 {
                // The high-bit plane walks bits 0..8 of hmask across both halves.
                let hbit = half * 4 + shift;
                for sub in 0..2 {
                    let is = half * 8 + shift * 2 + sub;
                    let dl = d * scales[is] as f32;
                    let base = half * 128 + shift * 32 + sub * 16;
                    for l in 0..16 {
                        let idx = sub * 16 + l;
                        let lo = ((q[idx] >> (2 * shift)) & 3) as i32;
                        // A set high bit means "no offset": the stored value is q - 4 when clear.
                        let off = if (hmask[idx] >> hbit) & 1 == 1 { 0 } else { 4 };
                        y[base + l] = dl * (lo - off) as f32;
                    }
                }
            }
        }
    }
}

pub(crate) fn q4_k(src: &[[u8; Q4_K_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let (sc, mn) = k4_scales_mins(&b[4..16]);
        let qs = &b[16..144];
        for j in 0..4 {
            let q = &qs[j * 32..j * 32 + 32];
            let d1 = d * sc[2 * j] as f32;
            let m1 = dmin * mn[2 * j] as f32;
            let d2 = d * sc[2 * j + 1] as f32;
            let m2 = dmin * mn[2 * j + 1] as f32;
            for l in 0..32 {
                y[j * 64 + l] = d1 * (q[l] & 0xF) as f32 - m1;
                y[j * 64 + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

pub(crate) fn q5_k(src: &[[u8; Q5_K_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let (sc, mn) = k4_scales_mins(&b[4..16]);
        let qh = &b[16..48];
        let qs = &b[48..176];
        for j in 0..4 {
            let q = &qs[j * 32..j * 32 + 32];
            let d1 = d * sc[2 * j] as f32;
            let m1 = dmin * mn[2 * j] as f32;
            let d2 = d * sc[2 * j + 1] as f32;
            let m2 = dmin * mn[2 * j + 1] as f32;
            for l in 0..32 {
                let h1 = ((qh[l] >> (2 * j)) & 1) << 4;
                let h2 = ((qh[l] >> (2 * j + 1)) & 1) << 4;
                y[j * 64 + l] = d1 * ((q[l] & 0xF) | h1) as f32 - m1;
                y[j * 64 + 32 + l] = d2 * ((q[l] >> 4) | h2) as f32 - m2;
            }
        }
    }
}

pub(crate) fn q6_k(src: &[[u8; Q6_K_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b, 208);
        for half in 0..2 {
            let ql = &b[half * 64..half * 64 + 64];
            let qh = &b[128 + half * 32..128 + half * 32 + 32];
            let sc = &b[192 + half * 8..192 + half * 8 + 8];
            let yh = &mut y[half * 128..half * 128 + 128];
            for l in 0..32 {
                let is = l / 16;
                let h = qh[l];
                let q1 = ((ql[l] & 0xF) | ((h & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32 - 32;
                yh[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                yh[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                yh[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                yh[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
    }
}

pub(crate) fn q8_k(src: &[[u8; Q8_K_BYTES]], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(256)) {
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for (o, &q) in y.iter_mut().zip(&b[4..260]) {
            *o = d * (q as i8) as f32;
        }
    }
}
