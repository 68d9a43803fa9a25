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
    /// A data file (fine-tune JSONL) is malformed; `line` is 1-based, 0 for the file as a whole.
    #[error("{path}:{line}: {reason}")]
    Data {
        /// The file.
        path: PathBuf,
        /// The offending line (1-based), or 0 when the problem is the whole file.
        line: usize,
        /// What is wrong.
        reason: String,
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
    /// Training failed.
    #[error(transparent)]
    Train(#[from] kiln_train::TrainError),
    /// A dataset template could not produce its rows; the message says why.
    #[error("{0}")]
    Generate(String),
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

    /// A data-file error at `line` of `path` (0: the whole file).
    pub fn data(path: impl Into<PathBuf>, line: usize, reason: impl Into<String>) -> Self {
        LabError::Data {
            path: path.into(),
            line,
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
