//! Terminal transitions: the row first (only if still unfinished), then the event.
//! Tails end on a terminal row, and wait briefly for the terminal event.

use crate::event::{self, Emitter};
use crate::runner::RunOutput;
use crate::status::JobStatus;
use crate::store::Store;

/// Records success: output path, progress 1, `done`, then the `done` event.
pub(crate) fn done(store: &Store, emitter: &Emitter, out: &RunOutput) {
    let id = emitter.job_id();
    if let Some(path) = &out.output_path
        && let Err(e) = store.set_output_path(id, path)
    {
        tracing::warn!(job = %id, error = %e, "output path not recorded");
    }
    let output = match &out.output_path {
        Some(p) => Some(p.clone()),
        None => store.get(id).ok().flatten().and_then(|r| r.output_path),
    };
    if transition(store, id, JobStatus::Done, None) {
        emitter.emit(&event::done(output.as_deref(), out.summary.as_ref()));
    }
}

/// Records a failure with `error`, then the `failed` event.
pub(crate) fn failed(store: &Store, emitter: &Emitter, error: &str) {
    if transition(store, emitter.job_id(), JobStatus::Failed, Some(error)) {
        emitter.emit(&event::failed(error));
    }
}

/// Records a cancellation for `reason`, then the `cancelled` event.
pub(crate) fn cancelled(store: &Store, emitter: &Emitter, reason: &str) {
    let id = emitter.job_id();
    if transition(store, id, JobStatus::Cancelled, None) {
        if let Err(e) = store.set_message(id, reason) {
            tracing::warn!(job = %id, error = %e, "cancel reason not recorded");
        }
        emitter.emit(&event::cancelled(reason));
    }
}

fn transition(store: &Store, id: &str, status: JobStatus, error: Option<&str>) -> bool {
    match store.finish(id, status, error) {
        Ok(changed) => changed,
        Err(e) => {
            tracing::error!(job = %id, error = %e, "failed to record status {status}");
            false
        }
    }
}
