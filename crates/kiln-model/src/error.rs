//! Errors of model loading: every one names the file, and where it can, the field.

use std::path::{Path, PathBuf};

/// Anything that can go wrong while reading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A GGUF header is malformed.
    #[error("{}: {source}", path.display())]
    Gguf {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        source: crate::gguf::GgufError,
    },
    /// A safetensors file is malformed.
    #[error("{}: {reason}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A configuration value is missing or wrong (config.json or GGUF metadata).
    #[error("{}: {field}: {reason}", path.display())]
    Config {
        /// The file it came from.
        path: PathBuf,
        /// The key.
        field: String,
        /// What was wrong.
        reason: String,
    },
    /// A tensor the architecture needs is missing or has the wrong shape or type.
    #[error("{}: tensor {name}: {reason}", path.display())]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// What was wrong.
        reason: String,
    },
    /// The architecture is not one kiln implements.
    #[error("{}: unsupported architecture {arch:?} (supported: llama, mistral, qwen2, qwen3, gemma3)", path.display())]
    UnsupportedArchitecture {
        /// The file.
        path: PathBuf,
        /// The name found.
        arch: String,
    },
    /// The tokenizer could not be built or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to compile or render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A kernel refused its inputs.
    #[error(transparent)]
    Kernel(#[from] kiln_kernels::KernelError),
    /// A forward pass was asked for something impossible (bad token id, cache overflow…).
    #[error("{0}")]
    Forward(String),
    /// A matrix could not be quantized as asked (bits, group size, shape, non-finite values).
    #[error("quantization: {0}")]
    Quantization(String),
    /// A LoRA adapter module does not fit the model it is checked against, or an adapter in
    /// memory is inconsistent and cannot be saved (errors reading adapter files name the file
    /// instead, through the variants above).
    #[error("LoRA adapter module {module}: {reason}")]
    Adapter {
        /// The module path, e.g. `model.layers.3.self_attn.q_proj` (or `adapter` for the whole).
        module: String,
        /// What was wrong.
        reason: String,
    },
}

impl ModelError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
