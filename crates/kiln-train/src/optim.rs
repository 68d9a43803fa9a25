//! AdamW with decoupled weight decay, the warmup-cosine schedule, global-norm clipping and
//! LoRA+ (spec §8.3).

use crate::lora::LoraParam;

/// `warmupCosineSchedule`: a linear warmup to `peak`, then a cosine decay to 10% of it.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// Peak learning rate.
    pub peak: f64,
    /// Warmup steps.
    pub warmup: u64,
    /// Total optimizer steps.
    pub total: u64,
    /// Decay along a cosine after warmup (else hold the peak).
    pub cosine: bool,
}

impl Schedule {
    /// The learning rate at optimizer step `step` (from 0).
    pub fn lr(&self, step: u64) -> f64 {
        let w = self.warmup.max(1);
        if step < w {
            return self.peak.min(self.peak * (step + 1) as f64 / w as f64);
        }
        if !self.cosine {
            return self.peak;
        }
        let decay = self.total.saturating_sub(self.warmup).max(1) as f64;
        let progress = ((step - self.warmup) as f64 / decay).min(1.0);
        let floor = 0.1 * self.peak;
        floor + (self.peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// Scales every gradient so that their global L2 norm is at most `max_norm`; returns the norm
/// before clipping.
pub fn clip_grad_norm(params: &mut [LoraParam], max_norm: f64) -> f64 {
    let sq: f64 = params
        .iter()
        .flat_map(|p| p.grad_a.iter().chain(&p.grad_b))
        .map(|g| (*g as f64) * (*g as f64))
        .sum();
    let norm = sq.sqrt();
    if max_norm > 0.0 && norm > max_norm {
        let k = (max_norm / norm) as f32;
        for p in params.iter_mut() {
            p.grad_a
                .iter_mut()
                .chain(p.grad_b.iter_mut())
                .for_each(|g| *g *= k);
        }
    }
    norm
}

/// AdamW's hyper-parameters.
#[derive(Debug, Clone, Copy)]
pub struct AdamWConfig {
    /// β₁.
    pub beta1: f64,
    /// β₂.
    pub beta2: f64,
    /// ε.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// LoRA+: B's learning rate is this times A's.
    pub lora_plus_ratio: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            lora_plus_ratio: 1.0,
        }
    }
}

/// AdamW's moments for every LoRA parameter.
pub struct AdamW {
    config: AdamWConfig,
    moments: Vec<[Vec<f32>; 4]>,
    t: i32,
}

impl AdamW {
    /// An optimizer for `params` (moments start at zero).
    pub fn new(config: AdamWConfig, params: &[LoraParam]) -> Self {
        let moments = params
            .iter()
            .map(|p| {
                let (a, b) = (p.a.len(), p.b.len());
                [vec![0.0; a], vec![0.0; a], vec![0.0; b], vec![0.0; b]]
            })
            .collect();
        Self {
            config,
            moments,
            t: 0,
        }
    }

    /// One update at learning rate `lr` from the accumulated gradients.
    pub fn step(&mut self, params: &mut [LoraParam], lr: f64) {
        self.t += 1;
        let c = self.config;
        let (bc1, bc2) = (1.0 - c.beta1.powi(self.t), 1.0 - c.beta2.powi(self.t));
        for (p, m) in params.iter_mut().zip(&mut self.moments) {
            let [ma, va, mb, vb] = m;
            update(&mut p.a, &p.grad_a, ma, va, lr, bc1, bc2, &c);
            update(
                &mut p.b,
                &p.grad_b,
                mb,
                vb,
                lr * c.lora_plus_ratio,
                bc1,
                bc2,
                &c,
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn update(
    w: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    lr: f64,
    bc1: f64,
    bc2: f64,
    c: &AdamWConfig,
) {
    let (b1, b2) = (c.beta1 as f32, c.beta2 as f32);
    let decay = (1.0 - lr * c.weight_decay) as f32;
    for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        *m = b1 * *m + (1.0 - b1) * g;
        *v = b2 * *v + (1.0 - b2) * g * g;
        let mhat = *m as f64 / bc1;
        let vhat = *v as f64 / bc2;
        *w = *w * decay - (lr * mhat / (vhat.sqrt() + c.eps)) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_a_tenth() {
        let s = Schedule {
            peak: 1.0,
            warmup: 4,
            total: 104,
            cosine: true,
        };
        assert_eq!(s.lr(0), 0.25);
        assert_eq!(s.lr(3), 1.0);
        assert!((s.lr(4) - 1.0).abs() < 1e-12);
        assert!((s.lr(54) - 0.55).abs() < 1e-9);
        assert!((s.lr(104) - 0.1).abs() < 1e-12);
        assert!((s.lr(500) - 0.1).abs() < 1e-12);
        let none = Schedule {
            peak: 2e-4,
            warmup: 0,
            total: 10,
            cosine: false,
        };
        assert_eq!(none.lr(0), 2e-4);
        assert_eq!(none.lr(9), 2e-4);
    }

    fn param(grad: f32) -> LoraParam {
        LoraParam {
            path: "p".into(),
            in_features: 2,
            out_features: 1,
            rank: 1,
            scale: 1.0,
            a: vec![1.0, -1.0],
            b: vec![0.5],
            grad_a: vec![grad, grad],
            grad_b: vec![grad],
        }
    }

    #[test]
    fn clipping_caps_the_global_norm() {
        let mut ps = vec![param(3.0), param(4.0)];
        let norm = clip_grad_norm(&mut ps, 1.0);
        assert!((norm - (3.0f64 * 9.0 + 3.0 * 16.0).sqrt()).abs() < 1e-6);
        assert!((clip_grad_norm(&mut ps, 1.0) - 1.0).abs() < 1e-5);
    }

    #[test]
    fn adamw_first_step_moves_each_weight_by_lr_against_its_gradient() {
        let mut ps = vec![param(0.3)];
        let mut opt = AdamW::new(
            AdamWConfig {
                weight_decay: 0.0,
                lora_plus_ratio: 2.0,
                ..Default::default()
            },
            &ps,
        );
        opt.step(&mut ps, 0.01);
        assert!((ps[0].a[0] - 0.99).abs() < 1e-6);
        assert!((ps[0].a[1] + 1.01).abs() < 1e-6);
        assert!((ps[0].b[0] - 0.48).abs() < 1e-6, "LoRA+ doubles B's step");
    }
}
