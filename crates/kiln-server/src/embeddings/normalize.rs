//! `--embd-normalize`, as llama-server numbers it.

/// Normalizes `v` in place: `p` < 0 leaves it, 0 scales the largest magnitude to 32760 (the
/// int16 range), 1 divides by the sum of magnitudes, 2 by the Euclidean norm, a larger `p` by
/// the p-norm. A zero vector stays zero.
pub fn apply(v: &mut [f32], p: i32) {
    let norm = match p {
        p if p < 0 => return,
        0 => v.iter().fold(0f64, |m, x| m.max(f64::from(x.abs()))) / 32760.0,
        1 => v.iter().map(|x| f64::from(x.abs())).sum(),
        2 => v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt(),
        p => v
            .iter()
            .map(|x| f64::from(x.abs()).powi(p))
            .sum::<f64>()
            .powf(1.0 / f64::from(p)),
    };
    if norm > 0.0 {
        v.iter_mut()
            .for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::apply;

    #[test]
    fn each_norm() {
        let v = [3.0f32, -4.0];
        let norm = |p| {
            let mut x = v;
            apply(&mut x, p);
            x
        };
        assert_eq!(norm(-1), v);
        assert_eq!(norm(2), [0.6, -0.8]);
        assert_eq!(norm(1), [3.0 / 7.0, -4.0 / 7.0]);
        assert_eq!(norm(0), [24570.0, -32760.0]);
        let p3 = norm(3);
        assert!((p3[0].abs().powi(3) + p3[1].abs().powi(3) - 1.0).abs() < 1e-5);
        let mut zero = [0.0f32; 3];
        apply(&mut zero, 2);
        assert_eq!(zero, [0.0; 3]);
    }
}
