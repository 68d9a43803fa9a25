//! Fine-tuning (spec §8): the training data, the job's config, the LoRA plan, the run on
//! `kiln-train`'s recording backend, the adapter files and the `finetune` job kind.

pub mod adapter_out;
pub mod config;
pub mod data;
pub mod fuse;
pub mod job;
pub mod plan;
pub mod run;
