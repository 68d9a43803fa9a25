//! Dot products: every SIMD level against the scalar reference (exact on integer-valued
//! inputs, relative tolerance 1e-5 of Σ|terms| on random scales), and the scalar reference
//! against an f64 dot of the dequantized rows.

mod common;

use common::*;
use kiln_kernels::*;

const QUANT_TYPES: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Owned activation row of whichever format a weight type needs.
enum Act {
    F32(Vec<f32>),
    Q8_0(Vec<BlockQ8_0>),
    Q8_1(Vec<BlockQ8_1>),
    Q8K(Vec<BlockQ8K>),
}

impl Act {
    fn random(rng: &mut Rng, ty: GgmlType, n: usize, unit: bool) -> Act {
        match ActFormat::for_weight(ty).unwrap() {
            ActFormat::F32 => Act::F32((0..n).map(|_| rng.sym()).collect()),
            ActFormat::Q8_0 => Act::Q8_0(random_q8_0(rng, n / 32, unit)),
            ActFormat::Q8_1 => Act::Q8_1(random_q8_1(rng, n / 32, unit)),
            ActFormat::Q8K => Act::Q8K(random_q8k(rng, n / 256, unit)),
        }
    }
    fn row(&self) -> ActRow<'_> {
        match self {
            Act::F32(v) => ActRow::F32(v),
            Act::Q8_0(v) => ActRow::Q8_0(v),
            Act::Q8_1(v) => ActRow::Q8_1(v),
            Act::Q8K(v) => ActRow::Q8K(v),
        }
    }
    /// Dequantized values, as the dot product sees them.
    fn values(&self) -> Vec<f32> {
        match self {
            Act::F32(v) => v.clone(),
            Act::Q8_0(v) => v
                .iter()
                .flat_map(|b| b.qs.map(|q| b.d.to_f32() * q as f32))
                .collect(),
            Act::Q8_1(v) => v
                .iter()
                .flat_map(|b| b.qs.map(|q| b.d.to_f32() * q as f32))
                .collect(),
            Act::Q8K(v) => v
                .iter()
                .flat_map(|b| b.qs.map(|q| b.d * q as f32))
                .collect(),
        }
    }
    /// ggml folds Q4_1/Q5_1 minimums in through `s`, an f16 of `d * sum(q)`; the exact
    /// reference must use that rounded value too.
    fn min_correction(&self, ty: GgmlType, w: &[u8]) -> f64 {
        let Act::Q8_1(v) = self else { return 0.0 };
        let bb = ty.block_bytes();
        let mut c = 0.0f64;
        for (b, y) in w.chunks_exact(bb).zip(v) {
            let m = half::f16::from_bits(u16::from_le_bytes([b[2], b[3]])).to_f64();
            let sum: i32 = y.qs.iter().map(|&q| q as i32).sum();
            let exact = y.d.to_f64() * sum as f64;
            c += m * (y.s.to_f64() - exact);
        }
        c
    }
}

fn block_counts(ty: GgmlType) -> Vec<usize> {
    if ty.block_elems() == 256 {
        vec![1, 2, 3, 5]
    } else if ty.is_float() {
        vec![1, 7, 8, 31, 33, 64, 100, 577]
    } else {
        vec![1, 2, 3, 5, 17, 18, 19, 48]
    }
}

/// Σ|w_i a_i| over the dequantized values: the scale for float tolerances.
fn abs_terms(ty: GgmlType, w: &[u8], act: &Act) -> (f64, f64) {
    let a = act.values();
    let mut wd = vec![0.0f32; a.len()];
    dequantize_row(ty, w, &mut wd).unwrap();
    let exact: f64 = wd.iter().zip(&a).map(|(&x, &y)| x as f64 * y as f64).sum();
    let mag: f64 = wd
        .iter()
        .zip(&a)
        .map(|(&x, &y)| (x as f64 * y as f64).abs())
        .sum();
    (exact + act.min_correction(ty, w), mag)
}

#[test]
fn levels_agree_exactly_on_integer_data() {
    let mut rng = Rng::new(1);
    for ty in QUANT_TYPES {
        for nb in block_counts(ty) {
            let n = nb * ty.block_elems();
            let w = random_row(&mut rng, ty, n, true);
            let act = Act::random(&mut rng, ty, n, true);
            let reference = vec_dot_at(CpuLevel::Scalar, ty, &w, act.row()).unwrap();
            let (exact, _) = abs_terms(ty, &w, &act);
            if exact.abs() < (1 << 24) as f64 {
                assert_eq!(reference as f64, exact, "{ty} nb={nb} scalar vs exact");
            }
            for level in supported_levels() {
                let got = vec_dot_at(level, ty, &w, act.row()).unwrap();
                assert_eq!(got.to_bits(), reference.to_bits(), "{ty} nb={nb} {level:?}");
            }
        }
    }
}

#[test]
fn levels_agree_within_tolerance_on_random_data() {
    let mut rng = Rng::new(2);
    let types = QUANT_TYPES
        .iter()
        .copied()
        .chain([GgmlType::F32, GgmlType::F16, GgmlType::BF16]);
    for ty in types {
        for nb in block_counts(ty) {
            for _ in 0..3 {
                let n = nb * ty.block_elems();
                let w = random_row(&mut rng, ty, n, false);
                let act = Act::random(&mut rng, ty, n, false);
                let (exact, mag) = abs_terms(ty, &w, &act);
                let reference = vec_dot_at(CpuLevel::Scalar, ty, &w, act.row()).unwrap();
                // Scalar vs the exact f64 value: only f32 rounding of block partial sums.
                let tol_exact = 1e-5 * mag + 1e-30;
                assert!(
                    (reference as f64 - exact).abs() <= tol_exact,
                    "{ty} nb={nb}: scalar {reference} vs exact {exact} (mag {mag})"
                );
                for level in supported_levels() {
                    let got = vec_dot_at(level, ty, &w, act.row()).unwrap();
                    let tol = 1e-5 * mag + 1e-30;
                    assert!(
                        (got as f64 - reference as f64).abs() <= tol,
                        "{ty} nb={nb} {level:?}: {got} vs scalar {reference} (mag {mag})"
                    );
                }
            }
        }
    }
}

#[test]
fn vec_dot_validates_inputs() {
    let mut rng = Rng::new(3);
    let a = random_q8_1(&mut rng, 2, false);
    let w = random_row(&mut rng, GgmlType::Q4_1, 64, false);
    assert!(vec_dot(GgmlType::Q4_1, &w, ActRow::Q8_1(&a)).is_ok());
    assert!(matches!(
        vec_dot(GgmlType::Q4_1, &w[..39], ActRow::Q8_1(&a)),
        Err(KernelError::LengthMismatch { .. })
    ));
    let a0 = random_q8_0(&mut rng, 2, false);
    assert!(matches!(
        vec_dot(GgmlType::Q4_1, &w, ActRow::Q8_0(&a0)),
        Err(KernelError::ActivationMismatch { .. })
    ));
    assert!(matches!(
        vec_dot(GgmlType::Q8_K, &w, ActRow::Q8_1(&a)),
        Err(KernelError::Unsupported { .. })
    ));
}

#[test]
fn quantize_then_dot_tracks_float_dot() {
    // End-to-end sanity: quantized activations give nearly the float answer.
    let mut rng = Rng::new(4);
    for ty in QUANT_TYPES {
        let n = 1024;
        let w = random_row(&mut rng, ty, n, false);
        let x: Vec<f32> = (0..n).map(|_| rng.sym()).collect();
        let mut wd = vec![0.0f32; n];
        dequantize_row(ty, &w, &mut wd).unwrap();
        let exact: f64 = wd.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let mag: f64 = wd
            .iter()
            .zip(&x)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        let mut qa = QuantizedActivations::new();
        qa.quantize_into(ty, &x).unwrap();
        let got = vec_dot(ty, &w, qa.row(0).unwrap()).unwrap();
        assert!(
            (got as f64 - exact).abs() <= 0.02 * mag,
            "{ty}: {got} vs {exact} (mag {mag})"
        );
    }
}
