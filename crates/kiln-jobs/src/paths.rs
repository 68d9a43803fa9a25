//! Where the job store lives.

use std::path::{Path, PathBuf};

use crate::error::{JobError, Result};

/// Environment variable naming kiln's data directory.
pub const DATA_DIR_ENV: &str = "KILN_DATA_DIR";

/// The files of one job store: `<root>/jobs.sqlite` and `<root>/jobs/<id>.log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPaths {
    root: PathBuf,
}

impl JobPaths {
    /// A store rooted at `root` (tests inject a temporary directory here).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        JobPaths { root: root.into() }
    }

    /// `$KILN_DATA_DIR`, else `<platform data dir>/kiln`.
    pub fn from_env() -> Result<Self> {
        if let Some(dir) = std::env::var_os(DATA_DIR_ENV).filter(|d| !d.is_empty()) {
            return Ok(JobPaths::new(dir));
        }
        let base = dirs::data_dir().ok_or(JobError::NoDataDir)?;
        Ok(JobPaths::new(base.join("kiln")))
    }

    /// The data directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The SQLite database.
    pub fn db(&self) -> PathBuf {
        self.root.join("jobs.sqlite")
    }

    /// The directory of the NDJSON logs.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("jobs")
    }

    /// The NDJSON log of job `id`.
    pub fn log(&self, id: &str) -> PathBuf {
        self.logs_dir().join(format!("{id}.log"))
    }
}
