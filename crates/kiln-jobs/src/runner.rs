//! Runners, the registry of kinds, and the context a runner reports through.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::cancel::{CancelToken, Cancelled};
use crate::event::Emitter;

/// Where a kind runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecMode {
    /// On the host's runtime (blocking pool), concurrently with everything.
    InProcess,
    /// In a child process (`kiln __job <id>`), one at a time under the execution lease.
    Child,
}

/// What a successful run produced.
#[derive(Debug, Clone, Default)]
pub struct RunOutput {
    /// The artifact directory or file, recorded as the row's `output_path`.
    pub output_path: Option<String>,
    /// Anything worth echoing in the `done` event.
    pub summary: Option<Value>,
}

/// A runner's failure; its `Display` becomes the row's `error`.
pub type RunError = Box<dyn std::error::Error + Send + Sync>;

/// The unit of work of one kind. Adding a kind = implementing this and registering it.
pub trait JobRunner: Send + Sync {
    /// Where jobs of this kind run.
    fn mode(&self) -> ExecMode;
    /// Checks a job's config before the job exists and fills in what the kind decides itself
    /// (such as a default output path). Returns the config to store and the output path to
    /// record; an `Err` (which should name the field) refuses the submit with a 400 and creates
    /// no row.
    fn prepare(
        &self,
        config: Map<String, Value>,
    ) -> Result<(Map<String, Value>, Option<String>), String> {
        Ok((config, None))
    }
    /// Runs one job. Report progress through `ctx`; return `Err` to fail the job.
    fn run(&self, ctx: &JobContext, config: &Map<String, Value>) -> Result<RunOutput, RunError>;
}

/// What a runner reports through: the emit sink plus cooperative cancellation.
#[derive(Debug)]
pub struct JobContext {
    emitter: Emitter,
    cancel: CancelToken,
}

impl JobContext {
    /// A context emitting through `emitter`, cancelled by `cancel`.
    pub fn new(emitter: Emitter, cancel: CancelToken) -> Self {
        JobContext { emitter, cancel }
    }

    /// The job's id.
    pub fn job_id(&self) -> &str {
        self.emitter.job_id()
    }

    /// Fails with [`Cancelled`] once the job is cancelled.
    pub fn check(&self) -> Result<(), Cancelled> {
        if self.cancel.is_cancelled() {
            let reason = self.cancel.reason().unwrap_or_else(|| "cancelled".into());
            return Err(Cancelled { reason });
        }
        Ok(())
    }

    /// Checks, reports `event`, checks again (the seed's task client). Writing never fails.
    pub fn emit(&self, event: Value) -> Result<(), Cancelled> {
        self.check()?;
        self.emitter.emit(&event);
        self.check()
    }

    /// `emit` of a `stage` event.
    pub fn stage(
        &self,
        name: &str,
        progress: Option<f64>,
        message: Option<&str>,
    ) -> Result<(), Cancelled> {
        self.emit(crate::event::stage(name, progress, message))
    }

    /// Whether a stop-and-save was requested ([`crate::JobHost::request_stop`]): a training
    /// job checks between steps, saves what it has and finishes as `done`.
    pub fn stop_requested(&self) -> bool {
        self.emitter.stop_path().exists()
    }

    /// The token, for runners that wait on something cancellable.
    pub fn cancel_token(&self) -> &CancelToken {
        &self.cancel
    }
}

/// The runners, by kind.
#[derive(Clone, Default)]
pub struct Registry {
    runners: BTreeMap<String, Arc<dyn JobRunner>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.runners.keys()).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The built-in kinds: `noop` and `crash`.
    pub fn with_builtins() -> Self {
        let mut r = Self::new();
        crate::builtin::register(&mut r);
        r
    }

    /// Registers (or replaces) the runner of `kind`.
    pub fn register(&mut self, kind: &str, runner: impl JobRunner + 'static) -> &mut Self {
        self.runners.insert(kind.to_string(), Arc::new(runner));
        self
    }

    /// The runner of `kind`.
    pub fn get(&self, kind: &str) -> Option<Arc<dyn JobRunner>> {
        self.runners.get(kind).cloned()
    }

    /// The registered kinds, sorted.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.runners.keys().map(String::as_str)
    }
}
