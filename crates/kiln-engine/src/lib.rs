//! Inference engine: model loading for generation, the scheduler that batches sequences
//! (`sched`: continuous batching over KV slots), sampling and the text side of generation (stop
//! strings, incremental detokenisation), structured-output constraints (`structured`, on
//! llguidance), benchmarks. The KV storage itself belongs to the
//! backend and is owned by [`engine::Engine`], never by model code.

pub mod adapters;
pub mod bench;
pub mod detok;
pub mod embed;
pub mod engine;
pub mod error;
pub mod eval;
pub mod kv_scheme;
pub mod load;
pub mod prompt_cache;
pub mod request;
pub mod sampler;
pub mod sched;
mod sequence;
pub mod stats;
pub mod stop;
pub mod structured;

pub use adapters::{AdapterError, AdapterRegistry};
pub use engine::{Engine, EngineOptions, KvReport};
pub use error::EngineError;
pub use load::{LoadedModel, load_model};
pub use request::{FinishReason, GenerateOutput, GenerateRequest, TokenLogprob};
pub use sched::{SchedulerStats, SequenceSink, StartGate, StepReport};
