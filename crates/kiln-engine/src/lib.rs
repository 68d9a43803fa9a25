//! Inference engine: model loading for generation, the generation loop, sampling and the text
//! side of generation (stop strings, incremental detokenisation), benchmarks. The scheduler
//! for continuous batching will live here too; the KV storage itself belongs to the backend and
//! is owned by [`generate::Engine`], never by model code.

pub mod bench;
pub mod detok;
pub mod error;
pub mod eval;
pub mod generate;
pub mod kv_scheme;
pub mod load;
pub mod prompt_cache;
pub mod sampler;
pub mod stats;
pub mod stop;

pub use error::EngineError;
pub use generate::{
    Engine, EngineOptions, FinishReason, GenerateOutput, GenerateRequest, KvReport,
};
pub use load::{LoadedModel, load_model};
