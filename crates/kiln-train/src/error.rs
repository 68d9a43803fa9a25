//! The trainer's errors.

/// Why a training operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Shapes or recorded state disagree (a forward that cannot be differentiated).
    #[error("training: {0}")]
    Shape(String),
    /// The model could not be loaded or run.
    #[error(transparent)]
    Model(#[from] kiln_model::ModelError),
    /// A kernel failed (an unsupported storage type).
    #[error(transparent)]
    Kernel(#[from] kiln_kernels::KernelError),
    /// A loss input is out of range (a target outside the vocabulary, an empty loss mask).
    #[error("loss: {0}")]
    Loss(String),
}
