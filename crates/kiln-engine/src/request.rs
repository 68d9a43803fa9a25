//! The value types of one request: what is asked (`GenerateRequest`) and what came out
//! (`GenerateOutput`). A leaf module: the engine, the scheduler and the sequences all use it,
//! and it uses none of them.

use std::sync::Arc;

use kiln_model::lora::AdapterStack;

use crate::sampler::SamplingParams;
use crate::stats::GenerationStats;

/// One generation request, already tokenized.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerateRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampler settings.
    pub sampling: SamplingParams,
    /// Stop strings, matched on decoded text.
    pub stop: Vec<String>,
    /// Keep going past EOS tokens (benchmarks).
    pub ignore_eos: bool,
    /// The LoRA adapters it runs with (`None`: the base model), resolved when the request was
    /// made: the sequence keeps them to its end even if they are unmounted meanwhile.
    pub adapters: Option<Arc<AdapterStack>>,
    /// Constrains the output to a grammar (structured output); `None`: free text.
    pub grammar: Option<crate::structured::Grammar>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An EOS token or a stop string.
    Stop,
    /// `max_tokens` or the context was reached.
    #[default]
    Length,
    /// The caller asked to stop.
    Cancelled,
}

/// Log-probabilities of one generated token.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    /// The token.
    pub id: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely alternatives, descending.
    pub top: Vec<(u32, f32)>,
}

/// The result of a generation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerateOutput {
    /// Generated ids (EOS excluded; tokens after a stop-string match included).
    pub tokens: Vec<u32>,
    /// Generated text, up to (not including) a matched stop string.
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Index of the stop string that matched, if one did.
    pub stop_index: Option<usize>,
    /// Per-token log-probabilities, when asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// Timings and memory.
    pub stats: GenerationStats,
}
