//! In-process jobs: run on the host's runtime (blocking pool) with cooperative cancel.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::cancel::CancelToken;
use crate::event;
use crate::finish;
use crate::host::{Finished, Inner};
use crate::runner::{JobContext, JobRunner};
use crate::status::JobRow;

/// Sets running, emits `started` (before returning), then runs the job in the background.
pub(crate) fn start(
    handle: &tokio::runtime::Handle,
    inner: &Arc<Inner>,
    row: &JobRow,
    runner: Arc<dyn JobRunner>,
    cancel: CancelToken,
    fin: Finished,
) {
    let store = inner.store.clone();
    let emitter = inner.emitter(row);
    if let Err(e) = store.set_running(&row.id) {
        tracing::warn!(job = %row.id, error = %e, "status running not recorded");
    }
    emitter.emit(&event::started());
    let config: Map<String, Value> = match serde_json::from_str(&row.config_json) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let run_handle = handle.clone();
    let hook = inner.cfg.on_complete.clone();
    handle.spawn(async move {
        let _fin = fin;
        let ctx = JobContext::new(emitter.clone(), cancel.clone());
        let result = run_handle
            .spawn_blocking(move || {
                // The task client: check before the run, around every emit, and after.
                ctx.check()?;
                let out = runner.run(&ctx, &config)?;
                ctx.check()?;
                Ok::<_, crate::runner::RunError>(out)
            })
            .await;
        match result {
            Ok(_) if cancel.is_cancelled() => {
                let reason = cancel.reason().unwrap_or_else(|| "cancelled".into());
                finish::cancelled(&store, &emitter, &reason);
            }
            Ok(Ok(out)) => finish::done(&store, &emitter, &out),
            Ok(Err(e)) => finish::failed(&store, &emitter, &e.to_string()),
            Err(e) => finish::failed(&store, &emitter, &format!("runner panicked: {e}")),
        }
        if let Some(hook) = &hook {
            hook.call(&store, emitter.job_id());
        }
    });
}
