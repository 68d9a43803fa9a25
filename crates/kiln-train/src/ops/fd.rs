//! Finite-difference checks shared by the operations' tests.

/// A deterministic input in about [-1, 1].
pub(crate) fn input(n: usize, salt: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + 1.0) * (0.7548 + salt as f32 * 0.131)).sin())
        .collect()
}

/// Checks `analytic` (∂L/∂x of `L = Σ f(x)·w`) against central differences of `f`, in f64 on
/// an f32 function, so the tolerance is loose enough for f32 rounding and tight enough to catch
/// any wrong term.
pub(crate) fn check(x: &[f32], weights: &[f32], analytic: &[f32], f: impl Fn(&[f32]) -> Vec<f32>) {
    let loss = |x: &[f32]| -> f64 {
        f(x).iter()
            .zip(weights)
            .map(|(a, b)| *a as f64 * *b as f64)
            .sum()
    };
    let h = 1e-2f32;
    for i in 0..x.len() {
        let mut plus = x.to_vec();
        let mut minus = x.to_vec();
        plus[i] += h;
        minus[i] -= h;
        let numeric = (loss(&plus) - loss(&minus)) / (2.0 * h as f64);
        let a = analytic[i] as f64;
        let tol = 2e-3 * (1.0 + numeric.abs());
        assert!(
            (a - numeric).abs() <= tol,
            "d/dx[{i}]: analytic {a}, numeric {numeric}"
        );
    }
}
