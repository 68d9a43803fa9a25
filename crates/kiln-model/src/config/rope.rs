//! Rotary position embedding settings and their inverse frequencies.

/// How RoPE frequencies are stretched for long contexts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor` (`rope_type: linear`).
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling (`rope_type: llama3`).
    Llama3 {
        /// Overall stretch.
        factor: f32,
        /// Low-frequency boundary factor.
        low_freq_factor: f32,
        /// High-frequency boundary factor.
        high_freq_factor: f32,
        /// Context the base model was trained for.
        original_max_position_embeddings: f32,
    },
}

/// RoPE settings for one kind of layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    /// Base of the frequency ladder.
    pub theta: f32,
    /// Long-context scaling.
    pub scaling: RopeScaling,
}

impl RopeConfig {
    /// Plain RoPE with base `theta`.
    pub fn plain(theta: f32) -> Self {
        Self {
            theta,
            scaling: RopeScaling::None,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if !(self.theta.is_finite() && self.theta > 1.0) {
            return Err(format!(
                "rope_theta {} must be a finite number above 1",
                self.theta
            ));
        }
        let factor_ok = |f: f32| f.is_finite() && f > 0.0;
        match self.scaling {
            RopeScaling::None => Ok(()),
            RopeScaling::Linear { factor } if factor_ok(factor) => Ok(()),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } if factor_ok(factor)
                && factor_ok(low_freq_factor)
                && high_freq_factor > low_freq_factor
                && factor_ok(original_max_position_embeddings) =>
            {
                Ok(())
            }
            other => Err(format!("rope scaling {other:?} has invalid parameters")),
        }
    }

    /// The `head_dim / 2` inverse frequencies, computed the way transformers does (in f32 from
    /// an f64 exponent would differ in the last bit; transformers uses float32 arange math).
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f32> {
        let half = head_dim / 2;
        let mut freqs: Vec<f32> = (0..half)
            .map(|i| {
                let exponent = (2 * i) as f32 / head_dim as f32;
                1.0 / self.theta.powf(exponent)
            })
            .collect();
        match self.scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => freqs.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let low_wavelen = original_max_position_embeddings / low_freq_factor;
                let high_wavelen = original_max_position_embeddings / high_freq_factor;
                for f in freqs.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (original_max_position_embeddings / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
        }
        freqs
    }
}
