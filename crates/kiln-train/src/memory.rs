//! What a training step holds, for the job's memory check and `forward_transient_bytes`.

use kiln_model::config::ModelConfig;

/// Bytes the tape holds at the end of a recorded forward of `tokens` tokens in one sequence:
/// the activations each backward reads (per layer: the norm outputs, Q/K/V, the attention
/// output, the residuals, gate/up and their product) plus each head's probabilities, and the
/// logits twice (the host copy and its gradient).
pub fn tape_bytes(cfg: &ModelConfig, tokens: usize) -> usize {
    let (h, q, kv, i) = (
        cfg.hidden_size,
        cfg.q_width(),
        cfg.kv_width(),
        cfg.intermediate_size,
    );
    let per_token = 4 * h + 2 * q + 2 * kv + 3 * i;
    let per_layer = tokens * per_token + cfg.num_heads * tokens * tokens;
    4 * (cfg.num_layers * per_layer + 2 * tokens * cfg.vocab_size)
}
