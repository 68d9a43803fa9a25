//! How a job host is set up.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::child::CHILD_VERB;
use crate::error::{JobError, Result};
use crate::lease::{ExecutionLease, JobPolicy};
use crate::paths::JobPaths;
use crate::runner::Registry;
use crate::status::JobRow;
use crate::store::Store;

/// How a [`JobHost`](crate::JobHost) is set up.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Where the store lives.
    pub paths: JobPaths,
    /// The runners by kind.
    pub registry: Registry,
    /// The program heavy jobs run as (default: this executable).
    pub child_program: PathBuf,
    /// Arguments before the job id (default: `["__job"]`).
    pub child_args: Vec<String>,
    /// How heavy jobs and inference share the machine.
    pub policy: JobPolicy,
    /// The execution lease (default: the process-wide one).
    pub lease: Arc<ExecutionLease>,
    /// Time between SIGTERM and SIGKILL of a cancelled child.
    pub kill_grace: Duration,
    /// Called with the final row of every job that started and ended here
    /// (after a heavy job's lease is released), e.g. to drop a model-list cache.
    pub on_complete: Option<OnComplete>,
}

/// A completion hook; panics in it are caught and logged.
#[derive(Clone)]
pub struct OnComplete(pub Arc<dyn Fn(&JobRow) + Send + Sync>);

impl std::fmt::Debug for OnComplete {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnComplete(..)")
    }
}

impl OnComplete {
    /// Runs the hook for job `id`'s current row.
    pub(crate) fn call(&self, store: &Store, id: &str) {
        let Ok(Some(row)) = store.get(id) else { return };
        let hook = std::panic::AssertUnwindSafe(|| (self.0)(&row));
        if std::panic::catch_unwind(hook).is_err() {
            tracing::error!(job = %id, "the job completion hook panicked");
        }
    }
}

impl HostConfig {
    /// Defaults: this executable as `<exe> __job <id>`, the global lease, exclusive policy.
    pub fn new(paths: JobPaths, registry: Registry) -> Result<Self> {
        let exe =
            std::env::current_exe().map_err(|e| JobError::io("locating", "current_exe", e))?;
        Ok(HostConfig {
            paths,
            registry,
            child_program: exe,
            child_args: vec![CHILD_VERB.to_string()],
            policy: JobPolicy::Exclusive,
            lease: ExecutionLease::global(),
            kill_grace: Duration::from_secs(3),
            on_complete: None,
        })
    }
}
