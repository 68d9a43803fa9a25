//! Qwen3: Llama's block with a per-head RMSNorm on queries and keys, applied before RoPE.

use super::decoder::LayerSpec;

/// Qwen3's block.
pub(crate) const SPEC: LayerSpec = LayerSpec {
    biases: false,
    qk_norm: true,
    sandwich_norms: false,
};
