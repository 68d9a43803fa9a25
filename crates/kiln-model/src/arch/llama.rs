//! Llama (1/2/3, SmolLM, Mistral-style): pre-norm blocks, no biases, no q/k norms.

use super::decoder::LayerSpec;

/// Llama's block.
pub(crate) const SPEC: LayerSpec = LayerSpec {
    biases: false,
    qk_norm: false,
    sandwich_norms: false,
};
