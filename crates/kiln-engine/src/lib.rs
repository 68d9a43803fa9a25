//! Inference engine: sampling and the text side of generation (stop strings, incremental
//! detokenisation); KV cache and the generation loop live alongside.

pub mod detok;
pub mod sampler;
pub mod stop;
