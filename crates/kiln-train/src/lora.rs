//! The trainable LoRA parameters: which matrices get them, their initialisation (spec §8.4),
//! and the dropout mask keyed by step and module.

/// Which projections are adapted and how.
#[derive(Debug, Clone)]
pub struct LoraPlan {
    /// Module suffixes adapted (`q_proj`, `down_proj`, …).
    pub targets: Vec<String>,
    /// Adapt only blocks from this index on (the last `num_layers`).
    pub first_layer: usize,
    /// The rank of a module not listed in `ranks`.
    pub rank: usize,
    /// Per-module ranks (rank scaling), keyed by module path.
    pub ranks: std::collections::BTreeMap<String, usize>,
    /// The configured scale.
    pub scale: f32,
    /// Divide the scale by √rank (rs-LoRA).
    pub rs_lora: bool,
    /// Seeds A's initialisation and the dropout masks.
    pub seed: u64,
    /// Probability of dropping a LoRA input element.
    pub dropout: f32,
    /// Scale a module's rank by its storage bits (`by_bits`, spec §8.5) when `ranks` does not
    /// name it.
    pub by_bits: bool,
}

/// The code width of a storage type, for `by_bits` (none for float storage).
pub fn storage_bits(ty: kiln_kernels::GgmlType) -> Option<u32> {
    use kiln_kernels::GgmlType as T;
    Some(match ty {
        T::Q2_K => 2,
        T::Q3_K => 3,
        T::Q4_0 | T::Q4_1 | T::Q4_K => 4,
        T::Q5_0 | T::Q5_1 | T::Q5_K => 5,
        T::Q6_K => 6,
        T::Q8_0 | T::Q8_1 | T::Q8_K => 8,
        T::F32 | T::F16 | T::BF16 => return None,
    })
}

impl LoraPlan {
    /// The rank module `path` (`model.layers.3.self_attn.q_proj`), stored with `bits`-wide
    /// codes, is adapted with, if any: `ranks`' entry, else `max(2, ⌈rank·bits/4⌉)` under
    /// `by_bits` when the bits are known, else the base rank.
    pub fn rank_for(&self, path: &str, bits: Option<u32>) -> Option<usize> {
        let layer = layer_index(path)?;
        let short = path.rsplit('.').next()?;
        if layer < self.first_layer || !self.targets.iter().any(|t| t == short) {
            return None;
        }
        if let Some(r) = self.ranks.get(path) {
            return Some((*r).max(1));
        }
        Some(match bits.filter(|_| self.by_bits) {
            Some(b) => (self.rank * b as usize).div_ceil(4).max(2),
            None => self.rank.max(1),
        })
    }

    /// The multiplier `s` of `(x·A)·B` for a module of rank `rank`.
    pub fn scale_for(&self, rank: usize) -> f32 {
        if self.rs_lora {
            self.scale / (rank as f32).sqrt()
        } else {
            self.scale
        }
    }
}

/// The block index of `model.layers.N.…`.
pub fn layer_index(path: &str) -> Option<usize> {
    path.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// One adapted matrix: `y += s · (drop(x)·A)·B`, `A: [in, r]`, `B: [r, out]`, with gradients.
#[derive(Debug, Clone)]
pub struct LoraParam {
    /// Module path (`model.layers.3.self_attn.q_proj`).
    pub path: String,
    /// Input features.
    pub in_features: usize,
    /// Output features.
    pub out_features: usize,
    /// Rank.
    pub rank: usize,
    /// The multiplier `s`.
    pub scale: f32,
    /// `[in, r]`, row-major.
    pub a: Vec<f32>,
    /// `[r, out]`, row-major.
    pub b: Vec<f32>,
    /// Accumulated `∂L/∂A`.
    pub grad_a: Vec<f32>,
    /// Accumulated `∂L/∂B`.
    pub grad_b: Vec<f32>,
}

impl LoraParam {
    /// A uniform in `(−1/√in, 1/√in)` from a generator keyed by `seed` and the path (so the
    /// init does not depend on load order), B zero.
    pub fn init(
        path: &str,
        in_features: usize,
        out_features: usize,
        rank: usize,
        plan: &LoraPlan,
    ) -> Self {
        let mut rng = SplitMix::new(plan.seed ^ fnv1a(path));
        let bound = 1.0 / (in_features as f32).sqrt();
        let a = (0..in_features * rank)
            .map(|_| (rng.next_unit() * 2.0 - 1.0) * bound)
            .collect();
        Self {
            path: path.into(),
            in_features,
            out_features,
            rank,
            scale: plan.scale_for(rank),
            a,
            b: vec![0.0; rank * out_features],
            grad_a: vec![0.0; in_features * rank],
            grad_b: vec![0.0; rank * out_features],
        }
    }

    /// Sets both gradients to zero.
    pub fn zero_grad(&mut self) {
        self.grad_a.fill(0.0);
        self.grad_b.fill(0.0);
    }
}

/// FNV-1a of a string, to key generators by module path.
pub fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A small seeded generator (splitmix64): reproducible across platforms and runs.
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// The dropout multipliers (`0` or `1/(1−p)`) of one module's input at one step: keyed by
/// seed, step and module, so a recomputation draws the same mask.
pub fn dropout_mask(len: usize, p: f32, seed: u64, step: u64, path: &str) -> Vec<f32> {
    let mut rng = SplitMix::new(seed ^ fnv1a(path) ^ step.wrapping_mul(0xd1b5_4a32_d192_ed03));
    let keep = 1.0 / (1.0 - p);
    (0..len)
        .map(|_| if rng.next_unit() < p { 0.0 } else { keep })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> LoraPlan {
        LoraPlan {
            targets: vec!["q_proj".into(), "down_proj".into()],
            first_layer: 1,
            rank: 4,
            ranks: [("model.layers.2.mlp.down_proj".to_string(), 8)].into(),
            scale: 2.0,
            rs_lora: false,
            seed: 3,
            dropout: 0.0,
            by_bits: true,
        }
    }

    #[test]
    fn targets_ranks_and_layers() {
        let p = plan();
        assert_eq!(p.rank_for("model.layers.0.self_attn.q_proj", None), None);
        assert_eq!(p.rank_for("model.layers.1.self_attn.q_proj", None), Some(4));
        assert_eq!(
            p.rank_for("model.layers.1.self_attn.q_proj", Some(8)),
            Some(8)
        );
        assert_eq!(
            p.rank_for("model.layers.1.self_attn.q_proj", Some(2)),
            Some(2)
        );
        assert_eq!(
            p.rank_for("model.layers.1.self_attn.q_proj", Some(5)),
            Some(5)
        );
        assert_eq!(p.rank_for("model.layers.1.self_attn.k_proj", None), None);
        assert_eq!(p.rank_for("model.layers.2.mlp.down_proj", Some(4)), Some(8));
        assert_eq!(p.rank_for("lm_head", None), None);
        let constant = LoraPlan {
            by_bits: false,
            ..plan()
        };
        assert_eq!(
            constant.rank_for("model.layers.1.self_attn.q_proj", Some(8)),
            Some(4)
        );
        let rs = LoraPlan { rs_lora: true, ..p };
        assert_eq!(rs.scale_for(4), 1.0);
    }

    #[test]
    fn init_is_bounded_keyed_and_b_is_zero() {
        let p = plan();
        let a = LoraParam::init("model.layers.1.self_attn.q_proj", 16, 8, 4, &p);
        let b = LoraParam::init("model.layers.1.self_attn.q_proj", 16, 8, 4, &p);
        let c = LoraParam::init("model.layers.2.self_attn.q_proj", 16, 8, 4, &p);
        assert_eq!(a.a, b.a);
        assert_ne!(a.a, c.a);
        assert!(a.a.iter().all(|v| v.abs() < 0.25));
        assert!(a.b.iter().all(|v| *v == 0.0));
    }

    #[test]
    fn dropout_is_keyed_by_step() {
        let m1 = dropout_mask(1000, 0.25, 1, 5, "x");
        assert_eq!(m1, dropout_mask(1000, 0.25, 1, 5, "x"));
        assert_ne!(m1, dropout_mask(1000, 0.25, 1, 6, "x"));
        let dropped = m1.iter().filter(|v| **v == 0.0).count();
        assert!((180..320).contains(&dropped), "{dropped}");
    }
}
