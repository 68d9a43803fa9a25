//! Heavy jobs: a child process under the execution lease.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use crate::cancel::CancelToken;
use crate::event::{self, Emitter};
use crate::finish;
use crate::host::{Finished, Inner};
use crate::lease::{JobPolicy, Reservation};
use crate::paths::DATA_DIR_ENV;
use crate::procinfo;
use crate::status::JobRow;

/// Runs one heavy job while holding the lease `res`: waits for the execution
/// permit (exclusive policy), spawns the child, pumps its output into the log,
/// reconciles its exit, and only then releases the permit and the lease.
pub(crate) async fn supervise(
    inner: Arc<Inner>,
    row: JobRow,
    res: Reservation,
    cancel: CancelToken,
    fin: Finished,
) {
    let emitter = inner.emitter(&row);
    let permit = if inner.cfg.policy == JobPolicy::Exclusive {
        tokio::select! {
            p = inner.cfg.lease.acquire_permit() => Some(p),
            _ = cancel.cancelled() => None,
        }
    } else {
        None
    };
    if cancel.is_cancelled() {
        finish_cancel(&inner, &emitter, &cancel);
    } else {
        run_child(&inner, &row, &emitter, &cancel).await;
    }
    // Order matters: the process is gone, then the permit, then the lease.
    drop(permit);
    drop(res);
    if let Some(hook) = &inner.cfg.on_complete {
        hook.call(&inner.store, &row.id);
    }
    drop(fin);
}

async fn run_child(inner: &Inner, row: &JobRow, emitter: &Emitter, cancel: &CancelToken) {
    let cfg = &inner.cfg;
    let mut cmd = Command::new(&cfg.child_program);
    cmd.args(&cfg.child_args)
        .arg(&row.id)
        .env(DATA_DIR_ENV, cfg.paths.root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so cancel reaches anything the child started.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let error = format!("spawning {}: {e}", cfg.child_program.display());
            return finish::failed(&inner.store, emitter, &error);
        }
    };
    if let Some(pid) = child.id() {
        let start = procinfo::start_time(pid);
        if let Err(e) = inner.store.set_pid(&row.id, pid, start) {
            tracing::warn!(job = %row.id, error = %e, "child pid not recorded");
        }
    }
    let pumps = [
        child
            .stdout
            .take()
            .map(|s| tokio::spawn(pump(s, emitter.clone()))),
        child
            .stderr
            .take()
            .map(|s| tokio::spawn(pump(s, emitter.clone()))),
    ];
    let status = tokio::select! {
        s = child.wait() => s,
        _ = cancel.cancelled() => terminate(&mut child, cfg.kill_grace).await,
    };
    for pump in pumps.into_iter().flatten() {
        // A grandchild holding the pipes open must not hold the lease forever.
        let _ = tokio::time::timeout(Duration::from_secs(2), pump).await;
    }
    match status {
        _ if cancel.is_cancelled() => finish_cancel(inner, emitter, cancel),
        Ok(s) if s.success() => {
            // Trust the child's own terminal status; catch one that never wrote it.
            finish::failed(&inner.store, emitter, "exited 0 without finishing the job");
        }
        Ok(s) => finish::failed(&inner.store, emitter, &describe(s)),
        Err(e) => finish::failed(&inner.store, emitter, &format!("waiting for the job: {e}")),
    }
}

fn finish_cancel(inner: &Inner, emitter: &Emitter, cancel: &CancelToken) {
    let reason = cancel.reason().unwrap_or_else(|| "cancelled".into());
    finish::cancelled(&inner.store, emitter, &reason);
}

/// SIGTERM, then SIGKILL after `grace`; returns once the child is reaped.
async fn terminate(child: &mut Child, grace: Duration) -> std::io::Result<ExitStatus> {
    let pid = child.id();
    if let Some(pid) = pid {
        procinfo::signal_group(pid, procinfo::SIGTERM);
    }
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            if let Err(e) = child.start_kill() {
                tracing::warn!(error = %e, "SIGKILL of a job child failed");
            }
            child.wait().await
        }
    };
    if let Some(pid) = pid {
        // Whatever the child left behind in its group goes too.
        procinfo::signal_group(pid, procinfo::SIGKILL);
    }
    status
}

/// `exited <code>` or `killed by signal <n>`.
pub(crate) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => format!("ended: {status}"),
    }
}

/// Turns each line of a child stream into a `log` event.
async fn pump(stream: impl AsyncRead + Unpin, emitter: Emitter) {
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches(['\n', '\r']);
                if !line.is_empty() {
                    emitter.emit(&event::log(line));
                }
            }
        }
    }
}
