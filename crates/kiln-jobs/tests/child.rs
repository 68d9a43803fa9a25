//! The child entry (`kiln __job <id>`): exit statuses and its own failures.

mod common;

use std::process::Command;

use common::CHILD;
use kiln_jobs::{DATA_DIR_ENV, JobPaths, JobStatus, Store};
use serde_json::json;

fn run(dir: &std::path::Path, args: &[&str]) -> i32 {
    let out = Command::new(CHILD)
        .args(args)
        .env(DATA_DIR_ENV, dir)
        .output()
        .expect("run child");
    out.status.code().unwrap_or(-1)
}

#[test]
fn usage_errors_and_unknown_jobs_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(run(dir.path(), &["__job"]), 2);
    assert_eq!(run(dir.path(), &["__job", "a", "b"]), 2);
    assert_eq!(run(dir.path(), &["__job", "job_0000000000000000"]), 2);
}

#[test]
fn child_runs_noop_and_records_its_own_failures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(JobPaths::new(dir.path())).expect("store");
    let ok = store.create("noop", &json!({})).expect("create");
    assert_eq!(run(dir.path(), &["__job", &ok.id]), 0);
    assert_eq!(
        store.get(&ok.id).expect("get").expect("row").status,
        JobStatus::Done
    );

    let unknown = store.create("quantize-later", &json!({})).expect("create");
    assert_eq!(run(dir.path(), &["__job", &unknown.id]), 1);
    let r = store.get(&unknown.id).expect("get").expect("row");
    assert_eq!(r.status, JobStatus::Failed);
    assert!(r.error.unwrap_or_default().contains("no runner registered"));

    let bad = store.create("noop", &json!([1])).expect("create");
    assert_eq!(run(dir.path(), &["__job", &bad.id]), 1);
    let r = store.get(&bad.id).expect("get").expect("row");
    assert!(r.error.unwrap_or_default().starts_with("bad config_json"));

    // A row that is no longer queued (e.g. cancelled meanwhile) is not run again.
    assert_eq!(run(dir.path(), &["__job", &ok.id]), 1);
    assert_eq!(
        store.get(&ok.id).expect("get").expect("row").status,
        JobStatus::Done
    );
}
