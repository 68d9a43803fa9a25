//! Lloyd–Max (MSE-optimal scalar) quantizers for the standard normal distribution, computed
//! once per bit width in f64 and cached as f32.
//!
//! The optimum satisfies two conditions: every boundary is the midpoint of its neighbouring
//! centroids, and every centroid is the conditional mean of its cell,
//! `(φ(lo) − φ(hi)) / (Φ(hi) − Φ(lo))`. Plain Lloyd iteration of these converges linearly and
//! very slowly at high bit widths (about 90 000 iterations at 8 bits), so this solves the same
//! fixed point with Newton's method: the Jacobian is tridiagonal (a centroid only depends on its
//! two boundaries), which makes each step O(levels). From equiprobable quantiles it converges in
//! about six steps; a plain Lloyd step is the fallback whenever a Newton step would break the
//! ordering.

use std::sync::OnceLock;

use super::check_param;
use crate::error::Result;

/// The standard normal density at `x`.
fn pdf(x: f64) -> f64 {
    const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;
    INV_SQRT_2PI * (-0.5 * x * x).exp()
}

/// `1 − Φ(x)`, with full relative precision in the upper tail (where the cells at high bit
/// widths live and `1 − Φ` would cancel).
fn upper_tail(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        return 1.0 - upper_tail(-x);
    }
    if x < 2.5 {
        // Φ(x) − ½ = φ(x) · Σ x^(2k+1) / (2k+1)!!; all terms positive, so no cancellation.
        let x2 = x * x;
        let (mut term, mut sum, mut k) = (x, x, 0u32);
        while term > 1e-17 * sum {
            k += 1;
            term *= x2 / f64::from(2 * k + 1);
            sum += term;
        }
        return 0.5 - pdf(x) * sum;
    }
    // Continued fraction for the Mills ratio, evaluated backwards; 80 terms reach f64
    // precision for x ≥ 2.5 (it converges faster the larger x is).
    let mut t = 0.0;
    for k in (1..=80).rev() {
        t = f64::from(k) / (x + t);
    }
    pdf(x) / (x + t)
}

/// Φ⁻¹(p) for p in (0, 1): Acklam's rational approximation (relative error 1.2e-9) refined
/// by one Newton step against the exact Φ.
fn inverse_cdf(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const P_LOW: f64 = 0.024_25;
    let tail = |p: f64| {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    let x = if p < P_LOW {
        tail(p)
    } else if p > 1.0 - P_LOW {
        -tail(1.0 - p)
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    };
    // Residual taken on the smaller tail so it keeps its precision far from the median.
    let residual = if x > 0.0 {
        (1.0 - p) - upper_tail(x)
    } else {
        upper_tail(-x) - p
    };
    x - residual / pdf(x)
}

/// Per cell: the conditional mean `m`, and `a = ∂m/∂lo`, `b = ∂m/∂hi`.
fn cells(c: &[f64]) -> Vec<(f64, f64, f64)> {
    let n = c.len();
    // (upper tail, density, position) of the boundary below cell i; cell 0 starts at −∞.
    let edge = |i: usize| -> (f64, f64, f64) {
        if i == 0 {
            (1.0, 0.0, f64::NEG_INFINITY)
        } else if i == n {
            (0.0, 0.0, f64::INFINITY)
        } else {
            let x = 0.5 * (c[i - 1] + c[i]);
            (upper_tail(x), pdf(x), x)
        }
    };
    let mut lo = edge(0);
    (0..n)
        .map(|i| {
            let hi = edge(i + 1);
            let p = lo.0 - hi.0;
            let cell = if p > 0.0 {
                let m = (lo.1 - hi.1) / p;
                // The infinite ends have zero density; skip them to avoid 0·∞.
                let a = if i > 0 { lo.1 * (m - lo.2) / p } else { 0.0 };
                let b = if i + 1 < n {
                    hi.1 * (hi.2 - m) / p
                } else {
                    0.0
                };
                (m, a, b)
            } else {
                (c[i], 0.0, 0.0)
            };
            lo = hi;
            cell
        })
        .collect()
}

/// Centroids of the `n`-level quantizer and the number of steps taken.
fn solve(n: usize) -> (Vec<f64>, usize) {
    const MAX_STEPS: usize = 1000;
    let mut c: Vec<f64> = (0..n)
        .map(|i| inverse_cdf((i as f64 + 0.5) / n as f64))
        .collect();
    let mut steps = 0;
    while steps < MAX_STEPS {
        steps += 1;
        let cells = cells(&c);
        // Newton on F(c) = c − m(c): J = I − ∂m/∂c is tridiagonal, with
        // ∂m_i/∂c_{i−1} = a_i/2, ∂m_i/∂c_i = (a_i + b_i)/2, ∂m_i/∂c_{i+1} = b_i/2.
        // Thomas algorithm for J·d = m − c.
        let mut fwd = Vec::with_capacity(n);
        let (mut cp, mut dp) = (0.0, 0.0);
        for (i, &(m, a, b)) in cells.iter().enumerate() {
            let (sub, sup) = (-0.5 * a, -0.5 * b);
            let den = 1.0 - 0.5 * (a + b) - sub * cp;
            cp = sup / den;
            dp = (m - c[i] - sub * dp) / den;
            fwd.push((cp, dp));
        }
        let mut next = vec![0.0; n];
        let mut d = 0.0;
        for i in (0..n).rev() {
            d = fwd[i].1 - fwd[i].0 * d;
            next[i] = c[i] + d;
        }
        let ordered = next.iter().all(|v| v.is_finite()) && next.windows(2).all(|w| w[0] < w[1]);
        if !ordered {
            next = cells.iter().map(|cell| cell.0).collect();
        }
        let moved = (1..n)
            .map(|i| (0.5 * (next[i - 1] + next[i] - c[i - 1] - c[i])).abs())
            .fold(0.0, f64::max);
        c = next;
        if moved < 1e-10 {
            break;
        }
    }
    // Exact symmetry, so a code and its mirror decode to exact negatives.
    for i in 0..n / 2 {
        let v = 0.5 * (c[n - 1 - i] - c[i]);
        c[i] = -v;
        c[n - 1 - i] = v;
    }
    (c, steps)
}

struct Tables {
    centroids: Vec<f32>,
    boundaries: Vec<f32>,
}

static TABLES: [OnceLock<Tables>; 9] = [const { OnceLock::new() }; 9];

fn tables(bits: u8) -> Result<&'static Tables> {
    check_param(matches!(bits, 1 | 2 | 3 | 4 | 5 | 8), || {
        format!("Lloyd-Max codebook for {bits} bits (supported: 1, 2, 3, 4, 5, 8)")
    })?;
    Ok(TABLES[usize::from(bits)].get_or_init(|| {
        let (c, _) = solve(1 << bits);
        Tables {
            centroids: c.iter().map(|&v| v as f32).collect(),
            boundaries: c.windows(2).map(|w| (0.5 * (w[0] + w[1])) as f32).collect(),
        }
    }))
}

/// The `2^bits` Lloyd–Max centroids for N(0, 1), ascending; `bits` ∈ {1, 2, 3, 4, 5, 8}.
pub fn codebook(bits: u8) -> Result<&'static [f32]> {
    Ok(&tables(bits)?.centroids)
}

/// The `2^bits − 1` decision boundaries (midpoints of adjacent centroids), ascending.
pub fn boundaries(bits: u8) -> Result<&'static [f32]> {
    Ok(&tables(bits)?.boundaries)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_BITS: [u8; 6] = [1, 2, 3, 4, 5, 8];

    /// E[(X − Q(X))²] for X ~ N(0, 1) with the cached f32 tables.
    fn mse(bits: u8) -> f64 {
        let c = codebook(bits).unwrap();
        let b = boundaries(bits).unwrap();
        let edge = |i: usize| match i {
            0 => (1.0, 0.0),
            i if i == c.len() => (0.0, 0.0),
            i => (upper_tail(f64::from(b[i - 1])), pdf(f64::from(b[i - 1]))),
        };
        // ∫ (x − c)² φ over a cell = P − 2c·(φ(lo) − φ(hi)) + c²·P + [lo·φ(lo) − hi·φ(hi)],
        // and the bracketed terms telescope to zero across all cells.
        let mut sum = 1.0;
        for (i, &ci) in c.iter().enumerate() {
            let (ci, (qlo, plo), (qhi, phi)) = (f64::from(ci), edge(i), edge(i + 1));
            sum += -2.0 * ci * (plo - phi) + ci * ci * (qlo - qhi);
        }
        sum
    }

    #[test]
    fn tail_matches_reference_values() {
        // 0.5·erfc(x/√2) from CPython's math.erfc.
        let want = [
            (0.0, 0.5),
            (0.5, 0.308_537_538_725_986_9),
            (1.0, 0.158_655_253_931_457_07),
            (2.0, 0.022_750_131_948_179_22),
            (3.0, 0.001_349_898_031_630_095_7),
            (5.0, 2.866_515_718_791_946e-7),
            (8.0, 6.220_960_574_271_819e-16),
        ];
        for (x, q) in want {
            assert!(((upper_tail(x) - q) / q).abs() < 1e-13, "Q({x})");
            assert!(((1.0 - upper_tail(-x)) - q).abs() < 1e-15, "Q(-{x})");
        }
        assert!(((upper_tail(2.4999999) - upper_tail(2.5)) / upper_tail(2.5)).abs() < 1e-6);
    }

    #[test]
    fn inverse_cdf_inverts_the_cdf() {
        for p in [
            1e-12, 1e-6, 0.001, 0.024_25, 0.1, 0.3, 0.5, 0.7, 0.975_75, 0.999,
        ] {
            let x = inverse_cdf(p);
            let back = if p < 0.5 {
                upper_tail(-x)
            } else {
                1.0 - upper_tail(x)
            };
            assert!(((back - p) / p).abs() < 1e-12, "p {p} x {x} back {back}");
        }
    }

    #[test]
    fn known_centroids() {
        let one = (2.0 / std::f32::consts::PI).sqrt();
        assert!((codebook(1).unwrap()[1] - one).abs() < 1e-6);
        let two = codebook(2).unwrap();
        for (got, want) in two[2..].iter().zip([0.4528, 1.5104]) {
            assert!((got - want).abs() < 2e-4, "{two:?}");
        }
        let three = codebook(3).unwrap();
        for (got, want) in three[4..].iter().zip([0.24509, 0.75601, 1.34391, 2.15195]) {
            assert!((got - want).abs() < 2e-4, "{three:?}");
        }
    }

    #[test]
    fn tables_are_symmetric_ascending_midpoints() {
        for bits in ALL_BITS {
            let c = codebook(bits).unwrap();
            let b = boundaries(bits).unwrap();
            assert_eq!(c.len(), 1 << bits);
            assert_eq!(b.len(), c.len() - 1);
            assert!(c.windows(2).all(|w| w[0] < w[1]), "bits {bits}");
            assert!(b.windows(2).all(|w| w[0] < w[1]), "bits {bits}");
            for i in 0..c.len() {
                assert_eq!(c[i], -c[c.len() - 1 - i], "bits {bits}");
            }
            for (i, &bi) in b.iter().enumerate() {
                assert!((bi - 0.5 * (c[i] + c[i + 1])).abs() <= 1e-6, "bits {bits}");
            }
        }
    }

    #[test]
    fn mse_matches_theory_and_decreases() {
        // Published Lloyd–Max distortions for N(0, 1) (Max 1960), 8 bits from this solver.
        let want = [0.3634, 0.1175, 0.03455, 0.009501, 0.002505, 4.1185e-5];
        let mut prev = f64::INFINITY;
        for (bits, want) in ALL_BITS.into_iter().zip(want) {
            let d = mse(bits);
            assert!(((d - want) / want).abs() < 2e-3, "bits {bits}: {d}");
            assert!(d < prev);
            prev = d;
        }
    }

    #[test]
    fn newton_converges_in_a_few_steps() {
        // The cost bound: every width solves in a handful of O(levels) steps.
        for bits in ALL_BITS {
            let (c, steps) = solve(1 << bits);
            assert!(steps <= 12, "bits {bits}: {steps} steps");
            let cells = cells(&c);
            let worst = c
                .iter()
                .zip(&cells)
                .map(|(ci, cell)| (ci - cell.0).abs())
                .fold(0.0, f64::max);
            assert!(worst < 1e-9, "bits {bits}: not a fixed point ({worst})");
        }
    }

    #[test]
    fn unsupported_widths_are_errors() {
        for bits in [0, 6, 7, 9] {
            assert!(codebook(bits).is_err());
            assert!(boundaries(bits).is_err());
        }
    }
}
