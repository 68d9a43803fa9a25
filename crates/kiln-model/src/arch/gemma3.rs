//! Gemma 3 (text): four norms per block (input, post-attention, pre- and post-feed-forward),
//! q/k RMSNorm, `x * (1 + w)` norms, embeddings scaled by `sqrt(hidden)`, GELU-tanh, and
//! interleaved sliding-window and global layers with their own RoPE bases. The norm offset,
//! embedding scale, per-layer windows and RoPE bases come from [`crate::config::ModelConfig`].

use super::decoder::LayerSpec;

/// Gemma 3's block.
pub(crate) const SPEC: LayerSpec = LayerSpec {
    biases: false,
    qk_norm: true,
    sandwich_norms: true,
};
