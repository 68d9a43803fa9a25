//! kiln's LoRA trainer. The shared architectures (`kiln_model::arch`) run on [`TapeBackend`],
//! which records each operation; a backward through the recording fills the gradients of the
//! LoRA parameters only (the base stays frozen, in its file's storage type). The losses of
//! spec §8.1 ([`loss`]), AdamW with the warmup-cosine schedule ([`optim`]) and one optimizer
//! step over a batch ([`trainer`]) sit on top.

pub mod error;
pub mod gemm;
pub mod lora;
pub mod loss;
pub mod memory;
pub mod ops;
pub mod optim;
pub mod profile;
pub mod tape;
pub mod trainer;

pub use error::TrainError;
pub use tape::{TapeBackend, TapeOptions};
