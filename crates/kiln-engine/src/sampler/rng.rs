//! Per-step random streams (spec §10 "RNG").
//!
//! Each step derives a fresh key from the seed instead of advancing one global stream, so a step
//! can be replayed in isolation (e.g. after a retry) and the result depends only on
//! `(seed, step)`. Bit-equality with MLX's threefry is not attempted (the spec recommends only
//! the determinism contract).

use rand_chacha::ChaCha12Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// Weyl increment used to spread consecutive step numbers across the key space.
pub const STEP_MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// ChaCha stream id of the XTC coin flip.
const XTC_STREAM: u64 = 1;
/// ChaCha stream id of the categorical draw.
const CATEGORICAL_STREAM: u64 = 2;

/// The key of step `step` (0-based) for `seed`: `seed XOR ((step+1)·0x9e3779b97f4a7c15) mod 2⁶⁴`.
pub fn step_key(seed: u64, step: u64) -> u64 {
    seed ^ step.wrapping_add(1).wrapping_mul(STEP_MIX)
}

/// The two independent uniform sources of one step.
pub struct StepRng {
    xtc: ChaCha12Rng,
    categorical: ChaCha12Rng,
}

impl StepRng {
    /// Derives both sub-streams of step `step`.
    pub fn new(seed: u64, step: u64) -> Self {
        let key = step_key(seed, step);
        // Same key, different ChaCha nonce: the streams never overlap, so enabling XTC does not
        // change which uniform the categorical draw sees.
        let mut xtc = ChaCha12Rng::seed_from_u64(key);
        xtc.set_stream(XTC_STREAM);
        let mut categorical = ChaCha12Rng::seed_from_u64(key);
        categorical.set_stream(CATEGORICAL_STREAM);
        Self { xtc, categorical }
    }

    /// A uniform in [0, 1) for the XTC coin flip.
    pub fn xtc_uniform(&mut self) -> f64 {
        unit_f64(self.xtc.next_u64())
    }

    /// A uniform in [0, 1) for the categorical draw.
    pub fn categorical_uniform(&mut self) -> f64 {
        unit_f64(self.categorical.next_u64())
    }
}

/// Top 53 bits → an exactly representable uniform in [0, 1).
fn unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_key_matches_spec_formula() {
        assert_eq!(step_key(0, 0), STEP_MIX);
        assert_eq!(step_key(5, 1), 5 ^ STEP_MIX.wrapping_mul(2));
        // Wraps mod 2^64 instead of overflowing.
        assert_eq!(step_key(0, u64::MAX), 0);
    }

    #[test]
    fn streams_are_deterministic_and_independent() {
        let mut a = StepRng::new(42, 3);
        let mut b = StepRng::new(42, 3);
        let (ax, ac) = (a.xtc_uniform(), a.categorical_uniform());
        assert_eq!(ax, b.xtc_uniform());
        assert_eq!(ac, b.categorical_uniform());
        assert_ne!(ax, ac);
        assert!((0.0..1.0).contains(&ax) && (0.0..1.0).contains(&ac));
        let mut c = StepRng::new(42, 4);
        assert_ne!(ac, c.categorical_uniform());
    }
}
