//! Errors of the job system.

use std::path::PathBuf;

/// Everything the job system can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The SQLite store failed.
    #[error("job store: {0}")]
    Db(#[from] rusqlite::Error),
    /// A file or directory of the store could not be used.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// No data directory could be found.
    #[error("no data directory: set KILN_DATA_DIR")]
    NoDataDir,
    /// No job has this id.
    #[error("job {0} not found")]
    NotFound(String),
    /// The job already reached a terminal status.
    #[error("the job is {status}, not running")]
    Terminal {
        /// Its terminal status.
        status: String,
    },
    /// No runner is registered for the kind.
    #[error("unknown job kind {0:?}")]
    UnknownKind(String),
    /// The submitted config is unusable.
    #[error("{0}")]
    BadConfig(String),
    /// The host no longer accepts jobs.
    #[error("job host is closed")]
    Closed,
    /// Submitting needs a tokio runtime.
    #[error("no tokio runtime to run the job on")]
    NoRuntime,
    /// A row held a value this version cannot read.
    #[error("bad job row: {0}")]
    BadRow(String),
}

impl JobError {
    /// An I/O error on `path` while doing `what`.
    pub fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        JobError::Io {
            what,
            path: path.into(),
            source,
        }
    }
}

/// Result with [`JobError`].
pub type Result<T, E = JobError> = std::result::Result<T, E>;
