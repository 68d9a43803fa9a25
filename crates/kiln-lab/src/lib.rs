//! kiln's lab: job kinds that produce models. Today: `quantize` (uniform and mixed precision,
//! GGUF and MLX output).

pub mod error;
pub mod finetune;
pub mod quantize;

pub use error::LabError;
