//! Qwen2 / Qwen2.5: Llama's block with biases on the q, k and v projections (always present;
//! Qwen2 configs have no flag for them).

use super::decoder::LayerSpec;

/// Qwen2's block.
pub(crate) const SPEC: LayerSpec = LayerSpec {
    biases: true,
    qk_norm: false,
    sandwich_norms: false,
};
