//! The child side of a heavy job: `kiln __job <id>`.

use std::sync::Arc;

use serde_json::Value;

use crate::cancel::CancelToken;
use crate::event::{self, Emitter};
use crate::paths::JobPaths;
use crate::runner::{JobContext, Registry};
use crate::status::JobStatus;
use crate::store::Store;

static SIGTERM_SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    // Only an atomic store: anything more is not async-signal-safe.
    SIGTERM_SEEN.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Turns SIGTERM into a cancellation the runner sees at its next check, so that a cancelled
/// heavy job can remove what it was writing before the parent's SIGKILL (3 s later) arrives.
fn watch_sigterm(cancel: CancelToken) {
    let handler = on_sigterm as extern "C" fn(libc::c_int);
    // SAFETY: installs a handler that only stores to an atomic, which is async-signal-safe;
    // `signal` has no other precondition.
    unsafe {
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
    let spawned = std::thread::Builder::new()
        .name("sigterm-watch".into())
        .spawn(move || {
            while !SIGTERM_SEEN.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            cancel.cancel("terminated by the job host");
        });
    if let Err(e) = spawned {
        eprintln!("kiln {CHILD_VERB}: no SIGTERM watcher ({e}); a cancel kills at once");
    }
}

/// The verb the parent passes before the job id.
pub const CHILD_VERB: &str = "__job";

/// Exit status of a usage error (missing id, unknown job).
pub const EXIT_USAGE: i32 = 2;

/// Parses `[__job] <id>` and runs the job; returns the process exit status.
pub fn child_main(args: impl IntoIterator<Item = String>, registry: &Registry) -> i32 {
    let mut args = args.into_iter().peekable();
    if args.peek().map(String::as_str) == Some(CHILD_VERB) {
        args.next();
    }
    match (args.next(), args.next()) {
        (Some(id), None) if !id.starts_with('-') => run_child(&id, registry),
        _ => {
            eprintln!("usage: kiln {CHILD_VERB} <job-id>");
            EXIT_USAGE
        }
    }
}

/// Runs job `id` in this process against the store named by `$KILN_DATA_DIR`:
/// sets running, emits started, runs, sets done/failed. Returns 0 (done),
/// 1 (failed) or 2 (unknown job).
pub fn run_child(id: &str, registry: &Registry) -> i32 {
    let store = match JobPaths::from_env().and_then(Store::open) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("kiln {CHILD_VERB}: {e}");
            return 1;
        }
    };
    let row = match store.get(id) {
        Ok(Some(row)) => row,
        Ok(None) => {
            eprintln!("kiln {CHILD_VERB}: job {id} not found");
            return EXIT_USAGE;
        }
        Err(e) => {
            eprintln!("kiln {CHILD_VERB}: {e}");
            return 1;
        }
    };
    let emitter = Emitter::new(store.clone(), id, &row.log_path);
    let fail = |error: &str| {
        eprintln!("kiln {CHILD_VERB}: {error}");
        if matches!(store.finish(id, JobStatus::Failed, Some(error)), Ok(true)) {
            emitter.emit(&event::failed(error));
        }
        1
    };
    // The parent records the pid too, but one that dies right after the spawn
    // must not leave a running child's row without it: set both at once.
    let me = std::process::id();
    match store.set_running_as(id, me, crate::procinfo::start_time(me)) {
        Ok(true) => {}
        Ok(false) => return fail(&format!("job {id} is {}, not queued", row.status)),
        Err(e) => return fail(&e.to_string()),
    }
    emitter.emit(&event::started());
    let Some(runner) = registry.get(&row.kind) else {
        return fail(&format!("no runner registered for kind {:?}", row.kind));
    };
    let config = match serde_json::from_str::<Value>(&row.config_json) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return fail("bad config_json: not an object"),
        Err(e) => return fail(&format!("bad config_json: {e}")),
    };
    let cancel = CancelToken::new();
    watch_sigterm(cancel.clone());
    let ctx = JobContext::new(emitter.clone(), cancel.clone());
    let outcome = runner.run(&ctx, &config);
    if cancel.is_cancelled() && outcome.is_err() {
        // The parent sent SIGTERM because the job was cancelled (or the host is closing): the
        // runner has stopped at a boundary and cleaned up; the parent records the outcome. A
        // runner that finished anyway records done below, so its output is not orphaned.
        eprintln!("kiln {CHILD_VERB}: stopped on SIGTERM");
        return 1;
    }
    match outcome {
        Ok(out) => {
            if let Some(path) = &out.output_path
                && let Err(e) = store.set_output_path(id, path)
            {
                eprintln!("kiln {CHILD_VERB}: recording the output path: {e}");
            }
            let output = out.output_path.or(row.output_path);
            match store.finish(id, JobStatus::Done, None) {
                Ok(true) => emitter.emit(&event::done(output.as_deref(), out.summary.as_ref())),
                Ok(false) => {}
                Err(e) => return fail(&format!("recording done: {e}")),
            }
            0
        }
        Err(e) => fail(&e.to_string()),
    }
}
