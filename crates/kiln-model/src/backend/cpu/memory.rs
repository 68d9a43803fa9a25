//! The CPU backend's memory and speed figures, as the engine's memory model (`fit`, the
//! scheduler's budget) bills them: its runtime overhead, the transient of a forward, the read
//! rates that predict decode speed, and whether its store caps sliding layers.

use crate::backend::MemoryProfile;
use crate::config::{Architecture, LayerAttention, ModelConfig};

/// Whether the CPU store caps sliding-window layers at their window. It does not: `CpuKv`
/// keeps every position of every layer (no ring buffer), so `fit` bills sliding layers for the
/// whole context.
pub const CPU_KV_CAPS_SLIDING: bool = false;

/// Process memory besides weights, KV and the prefill transient: code, the tokenizer, the
/// thread pool, allocator slack. Measured with the starter model (SmolLM2-135M Q4_1, 96,576,768
/// bytes of tensors, a 49,152-token vocabulary): `kiln generate MODEL Hi --max-tokens 1` peaks
/// at 127.6 MB after loading, whose own transients are a few hundred KB, so ~31 MB is the rest.
/// With 30 MB, 2,048-token generations measure 1.6% (dense) and 2.3% (kv4) under `fit` (the test
/// `crates/kiln/tests/kv_memory.rs` holds them within ±10%).
pub const RUNTIME_OVERHEAD_BYTES: u64 = 30_000_000;

/// Weight bytes a decoded token streams per second on the machine kiln was measured on (2
/// shared cores, AVX-512, weights on huge pages: SmolLM2-135M Q4_1, 96.6 MB of tensors,
/// decodes at ~305 tok/s at depth 0 with 2 threads ⇒ ~30 GB/s, the machine's read bandwidth;
/// 320–386 tok/s at 81d108e, as the machine's memory moved between ~34 and ~57 GB/s).
/// Only an estimate for `kiln fit`'s predicted tok/s: real speed depends on the cores, their
/// count, their instruction set and the memory system.
pub const DECODE_BYTES_PER_SEC: f64 = 30e9;

/// Cache bytes attention reads per second in decode on the same machine: after the 16-bit and
/// quantized tile decoders (commits 7b2453d–81d108e), the same model decodes at 134–143 tok/s
/// at depth 2,048 with a dense f32 cache (94.4 MB a token at that depth), of which the weights
/// take 3.1 ms ⇒ ~4.0 ms for the cache ⇒ ~23 GB/s.
pub const DECODE_KV_BYTES_PER_SEC: f64 = 23e9;

/// Attention's cost per cached key or value element in decode, whatever its storage: the floor
/// a compact cache meets however few bytes it holds (scoring and decoding are compute).
/// Measured on the same machine at depth 2,048 (2,048 × 30 layers × 384 elements): kv4
/// 169–173 tok/s ⇒ ~2.7 ms ⇒ ~0.12 ns each. kv8 (150–159) lands within 10% of the estimate;
/// a dense f16 cache (136–141, ~0.17 ns an element) runs ~20% under it.
pub const DECODE_KV_SECONDS_PER_ELEMENT: f64 = 0.12e-9;

/// The same floor for a TurboQuant cache, whose rows cost a centroid lookup per element and
/// a rotation per head: k8v3 at depth 2,048 decodes at 98–101 tok/s ⇒ ~0.29 ns an element.
pub const DECODE_TURBO_SECONDS_PER_ELEMENT: f64 = 0.29e-9;

/// The CPU backend's profile.
pub const PROFILE: MemoryProfile = MemoryProfile {
    runtime_overhead_bytes: RUNTIME_OVERHEAD_BYTES,
    caps_sliding: CPU_KV_CAPS_SLIDING,
    decode_weight_bytes_per_sec: DECODE_BYTES_PER_SEC,
    decode_kv_bytes_per_sec: DECODE_KV_BYTES_PER_SEC,
    decode_kv_seconds_per_element: DECODE_KV_SECONDS_PER_ELEMENT,
    decode_turbo_seconds_per_element: DECODE_TURBO_SECONDS_PER_ELEMENT,
};

/// Bytes the CPU backend allocates besides weights and KV while prefilling a chunk of
/// `min(chunk, ctx)` tokens — the term the seed's `sdpaFallbackBytes` plays for MLX. kiln's
/// attention keeps no `[chunk × keys]` score matrix (each worker scores one block of query rows
/// at a time, below), so the transient is the chunk's activations, all f32 `[c × width]`, as
/// `arch/decoder.rs::forward_layer` allocates them; each lives to the end of the layer:
///
/// - residual `x` and the attention norm's output: `2·hidden`;
/// - `q` and the attention output: `2·q_width`; `k`, `v`: `2·kv_width`;
/// - the output projection and the MLP norm's output: `2·hidden`;
/// - `gate`, `up` and the GLU product: `3·intermediate`; `down`: `hidden`;
/// - Gemma's sandwich norms produce one more `hidden` row while replacing `o`/`down`;
/// - the attention kernel's query list (`16` bytes per token) and positions (`8`);
/// - the matmul's reusable activation scratch, kept after the first prefill: for the widest
///   input, bounded by all its formats at once (f32 copy 4, Q8_0 34/32, Q8_1 36/32, Q8_K
///   292/256 bytes per element) plus the interleaved Q8_0 copy of the AVX-512 tiles (192/128)
///   and the Q8_1 block sums of the repacked kernels (4/32);
/// - the previous step's logits row (`vocab` f32), kept by the engine while the next forward
///   runs.
///
/// After the layers, the last row's norm, logits and their host copy (`3·vocab` with the
/// engine's previous row) replace the layer temporaries; the larger of the two phases counts.
///
/// The attention kernel's per-worker buffers (`backend/cpu/attention.rs`, thread-local
/// `Scratch`, kept between calls) add, with `v = QUERY_BLOCK · group` query vectors per
/// prefill task, `threads · 4 · (v · (keys + QUERY_BLOCK) + 2 · ATTENTION_TILE · head_dim +
/// 2 · v · head_dim + v)`: a row of scores per query vector over the block's keys (a block's
/// rows see up to `QUERY_BLOCK − 1` keys more than one row), a decoded tile and its transposed
/// copy, the block's (rotated) queries and unnormalised outputs, and their softmax sums; keys is
/// `ctx` (a sliding layer's window when every layer slides). Decode needs less of each.
pub fn forward_transient_bytes(cfg: &ModelConfig, chunk: usize, ctx: usize, threads: usize) -> u64 {
    let c = chunk.min(ctx).max(1) as u64;
    let keys = cfg
        .layer_attention
        .iter()
        .map(|a| match a {
            LayerAttention::Full => ctx,
            LayerAttention::Sliding { window } => ctx.min(*window),
        })
        .max()
        .unwrap_or(ctx) as u64;
    let group = (cfg.num_heads / cfg.num_kv_heads.max(1)) as u64;
    let hd = cfg.head_dim as u64;
    let block = super::QUERY_BLOCK as u64;
    let tile = super::ATTENTION_TILE as u64;
    let v = block * group;
    let per_thread = v * (keys + block) + 2 * tile * hd + 2 * v * hd + v;
    let scores = threads.max(1) as u64 * per_thread * 4;
    let (h, qw, kvw, inter) = (
        cfg.hidden_size as u64,
        cfg.q_width() as u64,
        cfg.kv_width() as u64,
        cfg.intermediate_size as u64,
    );
    let vocab = cfg.vocab_size as u64;
    let sandwich = if cfg.arch == Architecture::Gemma3 {
        h
    } else {
        0
    };
    let layer_floats = 5 * h + 2 * qw + 2 * kvw + 3 * inter + sandwich;
    let widest = h.max(qw).max(inter);
    let scratch = (c * widest * (1024 + 272 + 288 + 292 + 384 + 32)).div_ceil(256);
    let in_layer = c * layer_floats * 4 + c * 24 + vocab * 4;
    let after_layers = c * h * 4 + 2 * h * 4 + 3 * vocab * 4;
    scratch + scores + in_layer.max(after_layers)
}
