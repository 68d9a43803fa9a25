//! Architectures, each written once against [`crate::backend::Backend`]. The transformer block
//! that Llama, Qwen2, Qwen3 and Gemma 3 share lives in `decoder`; each architecture's file says
//! which tensors it has and how its block differs.

mod decoder;
mod encoder;
mod gemma3;
mod llama;
mod model;
mod qwen2;
mod qwen3;

pub use model::{LAYER_MATRICES, LogitsWanted, Model, Resume, matrix_role};
