//! Sampling parameters and their validation (spec §3.1, §10).

use serde::{Deserialize, Serialize};

use super::SamplerError;

/// Default window, in tokens, for the repetition/presence/frequency penalties (spec §3.1).
pub const DEFAULT_PENALTY_CONTEXT: usize = 20;

/// Largest `top_logprobs` the API accepts (spec §3.1: "at most 11").
pub const MAX_TOP_LOGPROBS: usize = 11;

/// Everything that shapes one request's token choice.
///
/// Defaults follow the sampler's own defaults (spec §10: temperature 0, filters off, seed 0,
/// penalty windows 20); request-level fallbacks such as temperature 0.7 are resolved by the
/// caller before building this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; 0 selects greedy argmax and disables every filter.
    pub temperature: f32,
    /// Nucleus mass in (0, 1); 0 or 1 means off.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 means off.
    pub top_k: usize,
    /// Drop tokens whose probability is below `min_p` times the best one; 0 means off.
    pub min_p: f32,
    /// Number of top tokens `min_p` never removes; must be at least 1.
    pub min_tokens_to_keep: usize,
    /// Chance, per step, that XTC removes the top choices; 0 means off.
    pub xtc_probability: f32,
    /// Probability above which XTC considers a token a "top choice"; in [0, 0.5].
    pub xtc_threshold: f32,
    /// Seed of the per-step random streams; the same seed reproduces a run.
    pub seed: u64,
    /// Additive per-token biases, applied before any penalty.
    pub logit_bias: Vec<(u32, f32)>,
    /// Multiplicative repetition penalty; 0 (or 1) means off.
    pub repetition_penalty: f32,
    /// Window of the repetition penalty in tokens; 0 means the whole history.
    pub repetition_context_size: usize,
    /// Subtracted once from every distinct token in the window; 0 means off.
    pub presence_penalty: f32,
    /// Window of the presence penalty in tokens; 0 means the whole history.
    pub presence_context_size: usize,
    /// Subtracted once per occurrence of a token in the window; 0 means off.
    pub frequency_penalty: f32,
    /// Window of the frequency penalty in tokens; 0 means the whole history.
    pub frequency_context_size: usize,
    /// Report the chosen token's log-probability.
    pub logprobs: bool,
    /// Report this many most likely tokens with their log-probabilities (0..=11).
    pub top_logprobs: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 0.0,
            top_k: 0,
            min_p: 0.0,
            min_tokens_to_keep: 1,
            xtc_probability: 0.0,
            xtc_threshold: 0.0,
            seed: 0,
            logit_bias: Vec::new(),
            repetition_penalty: 0.0,
            repetition_context_size: DEFAULT_PENALTY_CONTEXT,
            presence_penalty: 0.0,
            presence_context_size: DEFAULT_PENALTY_CONTEXT,
            frequency_penalty: 0.0,
            frequency_context_size: DEFAULT_PENALTY_CONTEXT,
            logprobs: false,
            top_logprobs: 0,
        }
    }
}

fn invalid(msg: impl Into<String>) -> SamplerError {
    SamplerError::InvalidParam(msg.into())
}

fn check_range(name: &str, v: f32, lo: f32, hi: f32) -> Result<(), SamplerError> {
    // `contains` is false for NaN, so NaN is rejected with the same message.
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(invalid(format!("{name} must be in [{lo}, {hi}]")))
    }
}

impl SamplingParams {
    /// Checks every field against the ranges the sampler supports.
    ///
    /// Messages name the offending field so they can be returned verbatim as a 400.
    pub fn validate(&self) -> Result<(), SamplerError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(invalid("temperature must be a finite number >= 0"));
        }
        check_range("top_p", self.top_p, 0.0, 1.0)?;
        check_range("min_p", self.min_p, 0.0, 1.0)?;
        if self.min_tokens_to_keep < 1 {
            return Err(invalid("min_tokens_to_keep must be at least 1"));
        }
        check_range("xtc_probability", self.xtc_probability, 0.0, 1.0)?;
        check_range("xtc_threshold", self.xtc_threshold, 0.0, 0.5)?;
        if !self.repetition_penalty.is_finite() || self.repetition_penalty < 0.0 {
            return Err(invalid("repetition_penalty must be a finite number >= 0"));
        }
        if !self.presence_penalty.is_finite() {
            return Err(invalid("presence_penalty must be a finite number"));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(invalid("frequency_penalty must be a finite number"));
        }
        if let Some((id, _)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite()) {
            return Err(invalid(format!(
                "logit_bias for token {id} must be a finite number"
            )));
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(invalid(format!(
                "top_logprobs must be at most {MAX_TOP_LOGPROBS}"
            )));
        }
        Ok(())
    }

    /// [`validate`](Self::validate) plus checks that need the model's vocabulary size.
    pub fn validate_for_vocab(&self, vocab_size: usize) -> Result<(), SamplerError> {
        self.validate()?;
        if let Some((id, _)) = self
            .logit_bias
            .iter()
            .find(|(id, _)| *id as usize >= vocab_size)
        {
            return Err(invalid(format!(
                "logit_bias token {id} is out of range for a vocabulary of {vocab_size}"
            )));
        }
        Ok(())
    }

    /// Whether any logits processor (bias or penalty) is active, i.e. whether the caller must
    /// keep a token history for [`Sampler::sample`](super::Sampler::sample).
    pub fn needs_history(&self) -> bool {
        self.repetition_penalty != 0.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Whether the caller asked for any log-probability output.
    pub fn wants_logprobs(&self) -> bool {
        self.logprobs || self.top_logprobs > 0
    }
}
