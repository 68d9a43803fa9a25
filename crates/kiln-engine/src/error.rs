//! Engine errors.

use crate::sampler::SamplerError;
use crate::stop::StopError;

/// What can go wrong while loading a model or generating.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Loading or running the model failed.
    #[error(transparent)]
    Model(#[from] kiln_model::ModelError),
    /// A sampling parameter is invalid.
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    /// A stop string is invalid.
    #[error(transparent)]
    Stop(#[from] StopError),
    /// The request cannot be served as asked (empty prompt, context overflow…).
    #[error("{0}")]
    Request(String),
    /// The output constraint failed mid-generation.
    #[error(transparent)]
    Grammar(#[from] crate::structured::GrammarError),
    /// Turning tokens into text failed.
    #[error("detokenization: {0}")]
    Detok(String),
}
