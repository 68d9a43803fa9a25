//! Shared test fixtures: a host on a temp dir with its own lease and the child helper binary.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_jobs::{
    ExecMode, ExecutionLease, HostConfig, JobHost, JobPaths, JobPolicy, JobRow, NoopRunner,
    Registry,
};
use serde_json::Value;

pub const CHILD: &str = env!("CARGO_BIN_EXE_kiln-job-child");

/// A config for a host rooted at `dir`: builtins plus `noop-inproc`, its own lease.
pub fn config(dir: &Path) -> HostConfig {
    let mut registry = Registry::with_builtins();
    registry.register("noop-inproc", NoopRunner::new(ExecMode::InProcess));
    HostConfig {
        paths: JobPaths::new(dir),
        registry,
        child_program: CHILD.into(),
        child_args: vec!["__job".into()],
        policy: JobPolicy::Exclusive,
        lease: ExecutionLease::new(),
        kill_grace: Duration::from_secs(3),
        on_complete: None,
    }
}

/// A temp dir and a host on it.
pub fn host() -> (tempfile::TempDir, JobHost) {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = JobHost::open(config(dir.path())).expect("open host");
    (dir, host)
}

pub fn row(host: &JobHost, id: &str) -> JobRow {
    host.store().get(id).expect("get").expect("row exists")
}

/// Polls until `pred` holds for the row, or panics after `secs`.
pub async fn wait_row(
    host: &JobHost,
    id: &str,
    secs: u64,
    pred: impl Fn(&JobRow) -> bool,
) -> JobRow {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let r = row(host, id);
        if pred(&r) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting on {id}: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn wait_terminal(host: &JobHost, id: &str, secs: u64) -> JobRow {
    wait_row(host, id, secs, |r| r.status.is_terminal()).await
}

/// The parsed events of a job's log.
pub fn events(row: &JobRow) -> Vec<Value> {
    std::fs::read_to_string(&row.log_path)
        .expect("read log")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("log line is JSON"))
        .collect()
}

pub fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// The log's events after waiting for the terminal one (it follows the row update).
pub async fn final_events(row: &JobRow) -> Vec<Value> {
    for _ in 0..100 {
        let evs = events(row);
        if evs.iter().any(kiln_jobs::event::is_terminal) {
            return evs;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    events(row)
}

pub fn arc_host(host: JobHost) -> Arc<JobHost> {
    Arc::new(host)
}
