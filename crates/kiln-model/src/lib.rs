//! Model files (GGUF, safetensors), configs, tokenizers, chat templates, and the architectures,
//! written once against the [`backend::Backend`] operations.

pub mod arch;
pub mod backend;
pub mod chat_template;
pub mod config;
pub mod embedding;
pub mod error;
pub mod files;
pub mod gguf;
pub mod lora;
pub mod mlx;
pub mod tokenizer;
pub mod weights;

pub use error::ModelError;
