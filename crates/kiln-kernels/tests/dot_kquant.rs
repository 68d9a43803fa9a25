//! K-quant dot products (Q2_K..Q6_K × Q8_K): every SIMD level against the scalar reference,
//! on several rows per type, including extreme codes, scales and mins and -128 activations.
//!
//! - Integer data (every f16/f32 scale 1, so the dot product is an integer): every level must
//!   return bit-for-bit the scalar result, and that must be the exact i64 sum of the
//!   dequantized products. The partial sums the kernels convert to f32 are exactly
//!   representable on these cases (random codes keep them far below 2^24; the extreme patterns
//!   flip the activation sign so that they cancel, and the few Q6_K lanes that pass 2^24 are
//!   even), so this checks the integer arithmetic of every super-block exactly: unpacking,
//!   scales, mins, offsets and the absence of i16 saturation.
//! - Random float scales (tiny subnormal to large f16, either sign): every level is within
//!   1e-5 · M of the scalar result, where M is the sum of |terms| of both parts a kernel adds
//!   up separately: the scale part and the min part (Q2_K/Q4_K/Q5_K), or the unsigned codes
//!   and the offset of 32 (Q6_K). That is ~100× the f32 rounding of the summation orders.
//!
//! The ignored `bench_kquant_dots` prints each kernel's speed at every level.

mod common;

use common::*;
use half::f16;
use kiln_kernels::*;

const K_TYPES: [GgmlType; 5] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Q8_K blocks with codes over the whole i8 range (-128 included) and consistent bsums.
fn q8k_full(rng: &mut Rng, n_blocks: usize, d: impl Fn(&mut Rng) -> f32) -> Vec<BlockQ8K> {
    (0..n_blocks)
        .map(|_| q8k_from(std::array::from_fn(|_| rng.byte() as i8), d(rng)))
        .collect()
}

fn q8k_from(qs: [i8; 256], d: f32) -> BlockQ8K {
    let bsums = std::array::from_fn(|g| qs[g * 16..g * 16 + 16].iter().map(|&q| q as i16).sum());
    BlockQ8K { d, qs, bsums }
}

/// Writes `v` into every scale field of every block (f16 fields; Q8_K's f32 is not a weight).
fn set_scales(ty: GgmlType, w: &mut [u8], v: impl Fn(usize, usize) -> f32) {
    for (i, blk) in w.chunks_exact_mut(ty.block_bytes()).enumerate() {
        for (k, &(off, _)) in scale_fields(ty).iter().enumerate() {
            let h = f16::from_f32(v(i, k)).to_bits().to_le_bytes();
            blk[off..off + 2].copy_from_slice(&h);
        }
    }
}

fn dequant(ty: GgmlType, w: &[u8]) -> Vec<f32> {
    let n = w.len() / ty.block_bytes() * 256;
    let mut out = vec![0.0f32; n];
    dequantize_row(ty, w, &mut out).unwrap();
    out
}

fn act_values(a: &[BlockQ8K]) -> Vec<f64> {
    a.iter()
        .flat_map(|b| b.qs.map(|q| b.d as f64 * q as f64))
        .collect()
}

/// Σ|w_i · a_i| over the dequantized row.
fn abs_dot(w: &[f32], a: &[f64]) -> f64 {
    w.iter().zip(a).map(|(&x, &y)| (x as f64 * y).abs()).sum()
}

/// The tolerance scale M described in the module docs.
fn magnitude(ty: GgmlType, w: &[u8], a: &[BlockQ8K]) -> f64 {
    let av = act_values(a);
    let bb = ty.block_bytes();
    let with = |edit: &dyn Fn(&mut [u8])| {
        let mut c = w.to_vec();
        c.chunks_exact_mut(bb).for_each(edit);
        abs_dot(&dequant(ty, &c), &av)
    };
    let zero_f16 = |blk: &mut [u8], off: usize| blk[off..off + 2].fill(0);
    match ty {
        // Scale part (dmin = 0) + min part (d = 0).
        GgmlType::Q2_K => with(&|b| zero_f16(b, 82)) + with(&|b| zero_f16(b, 80)),
        GgmlType::Q4_K | GgmlType::Q5_K => with(&|b| zero_f16(b, 2)) + with(&|b| zero_f16(b, 0)),
        // Signed codes + the offset alone (all codes 0, i.e. -32).
        GgmlType::Q6_K => abs_dot(&dequant(ty, w), &av) + with(&|b| b[..192].fill(0)),
        _ => abs_dot(&dequant(ty, w), &av),
    }
}

fn dot(level: CpuLevel, ty: GgmlType, w: &[u8], a: &[BlockQ8K]) -> f32 {
    vec_dot_at(level, ty, w, ActRow::Q8K(a)).unwrap()
}

/// Checks one integer case: scalar == exact i64, every level == scalar bit for bit.
fn check_exact(ty: GgmlType, w: &[u8], a: &[BlockQ8K], what: &str) {
    let wv = dequant(ty, w);
    let exact: i64 = wv
        .iter()
        .zip(a.iter().flat_map(|b| b.qs))
        .map(|(&x, q)| {
            assert_eq!(x, x.trunc(), "{ty} {what}: non-integer weight");
            x as i64 * q as i64
        })
        .sum();
    let reference = dot(CpuLevel::Scalar, ty, w, a);
    assert_eq!(reference as i64, exact, "{ty} {what}: scalar vs exact");
    for level in supported_levels() {
        let got = dot(level, ty, w, a);
        assert_eq!(
            got.to_bits(),
            reference.to_bits(),
            "{ty} {what} {level:?}: {got} vs scalar {reference}"
        );
    }
}

#[test]
fn kquant_levels_match_scalar_exactly_on_random_integer_data() {
    let mut rng = Rng::new(101);
    for ty in K_TYPES {
        for nb in [1, 2, 3, 4, 6] {
            for row in 0..6 {
                let n = nb * 256;
                let mut w = random_row(&mut rng, ty, n, true);
                set_scales(ty, &mut w, |_, _| 1.0);
                let a = q8k_full(&mut rng, nb, |_| 1.0);
                check_exact(ty, &w, &a, &format!("nb={nb} row={row}"));
            }
        }
    }
}

/// Activations at the extremes of the i8 range: +127 and -128, the sign flipping every
/// `period` elements (so the row's total stays far below 2^24 while every product is
/// as large as the format allows).
fn extreme_act(nb: usize, period: usize, phase: usize) -> Vec<BlockQ8K> {
    (0..nb)
        .map(|b| {
            let qs = std::array::from_fn(|i| {
                if ((b * 256 + i) / period + phase).is_multiple_of(2) {
                    127
                } else {
                    -128
                }
            });
            q8k_from(qs, 1.0)
        })
        .collect()
}

#[test]
fn kquant_levels_match_scalar_exactly_on_extreme_integer_data() {
    // Each weight block is one byte pattern repeated (codes all 0, all max, or mixed), with
    // its scale fields then set to 1: 0xFF gives Q4_K/Q5_K scales and mins of 63, Q2_K
    // scale/min 15, Q3_K scale 31 and codes +3, Q6_K codes +31 with scale -1; 0x80 gives
    // Q6_K scales of -128 and Q3_K's most negative scale -32; 0x00 gives Q3_K/Q6_K's most
    // negative codes (-4, -32).
    for ty in K_TYPES {
        for &pat in &[0x00u8, 0xFF, 0x80, 0x7F, 0xAA, 0x55, 0x0F, 0xF0] {
            for nb in [1, 3] {
                let mut w = vec![pat; nb * ty.block_bytes()];
                set_scales(ty, &mut w, |_, _| 1.0);
                for (period, phase) in [(16, 0), (16, 1), (32, 0), (8, 1), (64, 0)] {
                    let a = extreme_act(nb, period, phase);
                    let what = format!("pattern {pat:#04x} nb={nb} period={period}/{phase}");
                    check_exact(ty, &w, &a, &what);
                }
            }
        }
    }
}

#[test]
fn kquant_levels_match_scalar_within_tolerance_on_random_scales() {
    let mut rng = Rng::new(102);
    // f16 weight scales from subnormal to near the f16 maximum, either sign.
    let f16_scale = |rng: &mut Rng| {
        let mag = match rng.byte() % 4 {
            0 => 6e-8,
            1 => rng.unit() * 0.05 + 1e-4,
            2 => rng.unit() * 100.0,
            _ => 6e4,
        };
        if rng.byte() & 1 == 0 { mag } else { -mag }
    };
    for ty in K_TYPES {
        for nb in [1, 2, 3, 5, 8] {
            for row in 0..8 {
                let n = nb * 256;
                let mut w = random_row(&mut rng, ty, n, false);
                let scales: Vec<f32> = (0..nb * 2).map(|_| f16_scale(&mut rng)).collect();
                set_scales(ty, &mut w, |i, k| scales[2 * i + k]);
                // Half the rows use saturated activations (every product near its maximum).
                let a = if row % 2 == 0 {
                    q8k_full(&mut rng, nb, |r| r.unit() * 0.02 + 1e-6)
                } else {
                    let mut a = extreme_act(nb, 256, 0);
                    a.iter_mut().for_each(|b| b.d = rng.unit() * 0.02 + 1e-6);
                    a
                };
                let mag = magnitude(ty, &w, &a);
                let reference = dot(CpuLevel::Scalar, ty, &w, &a);
                for level in supported_levels() {
                    let got = dot(level, ty, &w, &a);
                    assert!(
                        (got as f64 - reference as f64).abs() <= 1e-5 * mag,
                        "{ty} nb={nb} row={row} {level:?}: {got} vs scalar {reference} (M {mag})"
                    );
                }
            }
        }
    }
}

/// Kernel speed per type and level on a 576 × 1536-element (FFN-down shaped) matrix that
/// stays in L2, one row dot at a time as decode runs them; levels are interleaved over several
/// rounds and the fastest round is kept, which steadies the numbers on a shared machine. Run:
/// `cargo test -p kiln-kernels --release --test dot_kquant -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_kquant_dots() {
    let mut rng = Rng::new(103);
    let (rows, cols) = (576usize, 1536usize);
    let nb = cols / 256;
    let levels = supported_levels();
    for ty in K_TYPES {
        let rb = ty.row_bytes(cols).unwrap();
        let data: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(&mut rng, ty, cols, false))
            .collect();
        let a = q8k_full(&mut rng, nb, |r| r.unit() * 0.02 + 1e-4);
        let pass = |level: CpuLevel| {
            let mut s = 0.0f32;
            for r in 0..rows {
                s += dot(level, ty, &data[r * rb..(r + 1) * rb], &a);
            }
            s
        };
        let mut best = vec![f64::INFINITY; levels.len()];
        for _round in 0..7 {
            for (k, &level) in levels.iter().enumerate() {
                let iters = if level == CpuLevel::Scalar { 5 } else { 40 };
                std::hint::black_box(pass(level));
                let t0 = std::time::Instant::now();
                for _ in 0..iters {
                    std::hint::black_box(pass(level));
                }
                let ns = t0.elapsed().as_secs_f64() * 1e9 / (iters * rows * nb) as f64;
                best[k] = best[k].min(ns);
            }
        }
        let mut line = format!("{ty}:");
        for (k, level) in levels.iter().enumerate() {
            line += &format!(
                "  {} {:.1} ns/block ({:.1} GB/s, {:.1}x)",
                level.name(),
                best[k],
                ty.block_bytes() as f64 / best[k],
                best[0] / best[k]
            );
        }
        println!("{line}");
    }
}
