//! The gated MLP activation `act(gate) · up`.

use kiln_model::config::Activation;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

fn act(a: Activation, g: f32) -> f32 {
    match a {
        Activation::Silu => g / (1.0 + (-g).exp()),
        Activation::GeluTanh => {
            0.5 * g * (1.0 + (SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g)).tanh())
        }
    }
}

fn act_grad(a: Activation, g: f32) -> f32 {
    match a {
        Activation::Silu => {
            let s = 1.0 / (1.0 + (-g).exp());
            s * (1.0 + g * (1.0 - s))
        }
        Activation::GeluTanh => {
            let u = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
            let th = u.tanh();
            let du = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044_715 * g * g);
            0.5 * (1.0 + th) + 0.5 * g * (1.0 - th * th) * du
        }
    }
}

/// `act(gate) · up`, elementwise.
pub fn forward(gate: &[f32], up: &[f32], a: Activation) -> Vec<f32> {
    let mut y = vec![0f32; gate.len()];
    super::par_rows(&mut y, CHUNK, |c, ys| {
        let (g, u) = (&gate[c * CHUNK..], &up[c * CHUNK..]);
        for ((yv, gv), uv) in ys.iter_mut().zip(g).zip(u) {
            *yv = act(a, *gv) * uv;
        }
    });
    y
}

/// Elements per parallel piece.
const CHUNK: usize = 4096;

/// `(∂L/∂gate, ∂L/∂up)` from `∂L/∂y`.
pub fn backward(gate: &[f32], up: &[f32], dy: &[f32], a: Activation) -> (Vec<f32>, Vec<f32>) {
    let mut dgate = vec![0f32; gate.len()];
    super::par_rows(&mut dgate, CHUNK, |c, out| {
        let (g, u, d) = (&gate[c * CHUNK..], &up[c * CHUNK..], &dy[c * CHUNK..]);
        for (((o, gv), uv), dv) in out.iter_mut().zip(g).zip(u).zip(d) {
            *o = dv * uv * act_grad(a, *gv);
        }
    });
    let mut dup = vec![0f32; gate.len()];
    super::par_rows(&mut dup, CHUNK, |c, out| {
        let (g, d) = (&gate[c * CHUNK..], &dy[c * CHUNK..]);
        for ((o, gv), dv) in out.iter_mut().zip(g).zip(d) {
            *o = dv * act(a, *gv);
        }
    });
    (dgate, dup)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fd;

    #[test]
    fn backward_matches_finite_differences() {
        for a in [Activation::Silu, Activation::GeluTanh] {
            let gate: Vec<f32> = fd::input(12, 6).iter().map(|v| v * 3.0).collect();
            let up = fd::input(12, 7);
            let dy = fd::input(12, 8);
            let (dg, du) = backward(&gate, &up, &dy, a);
            fd::check(&gate, &dy, &dg, |g| forward(g, &up, a));
            fd::check(&up, &dy, &du, |u| forward(&gate, u, a));
        }
    }
}
