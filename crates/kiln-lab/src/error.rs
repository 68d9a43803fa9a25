//! The lab's errors.

use std::path::PathBuf;

/// Why a lab operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A config field is out of range or of the wrong type; `field` names it.
    #[error("{field}: {reason}")]
    Config {
        /// The offending field (snake_case, as in the job config).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The model could not be read or run.
    #[error(transparent)]
    Model(#[from] kiln_model::ModelError),
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] kiln_engine::EngineError),
    /// A kernel (quantizer) failed.
    #[error(transparent)]
    Kernel(#[from] kiln_kernels::KernelError),
    /// The job was cancelled.
    #[error("cancelled")]
    Cancelled,
}

impl LabError {
    /// A config error for `field`.
    pub fn config(field: &str, reason: impl Into<String>) -> Self {
        LabError::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// An I/O error about `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LabError::Io {
            path: path.into(),
            source,
        }
    }
}
