//! Inference engine: model loading for generation, the scheduler that batches sequences
//! (`sched`: continuous batching over KV slots), sampling and the text side of generation (stop
//! strings, incremental detokenisation), structured-output constraints (`structured`, on
//! llguidance), benchmarks. The KV storage itself belongs to the
//! backend and is owned by [`generate::Engine`], never by model code.

pub mod adapters;
pub mod bench;
pub mod detok;
pub mod error;
pub mod eval;
pub mod generate;
pub mod kv_scheme;
pub mod load;
pub mod prompt_cache;
pub mod sampler;
pub mod sched;
mod sequence;
pub mod stats;
pub mod stop;
pub mod structured;

pub use adapters::{AdapterError, AdapterRegistry};
pub use error::EngineError;
pub use generate::{
    Engine, EngineOptions, FinishReason, GenerateOutput, GenerateRequest, KvReport,
};
pub use load::{LoadedModel, load_model};
pub use sched::{SchedulerStats, SequenceSink, StartGate, StepReport};
