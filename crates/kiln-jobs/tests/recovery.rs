//! Boot recovery, store details, and an unwritable log dir.

mod common;

use common::*;
use kiln_jobs::{JobHost, JobPaths, JobStatus, SCHEMA_VERSION, Store, procinfo};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_left_unfinished_become_zombies_unless_their_child_lives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (queued, running, alive, done) = {
        let store = Store::open(JobPaths::new(dir.path())).expect("store");
        let queued = store.create("noop", &json!({})).expect("create");
        let running = store.create("noop", &json!({})).expect("create");
        assert!(store.set_running(&running.id).expect("set running"));
        // A dead pid: a child from an earlier process that is gone.
        store
            .set_pid(&running.id, 999_999_999, Some(1))
            .expect("pid");
        // A live "child": this very process, with its real start time.
        let alive = store.create("noop", &json!({})).expect("create");
        assert!(store.set_running(&alive.id).expect("set running"));
        let me = std::process::id();
        store
            .set_pid(&alive.id, me, procinfo::start_time(me))
            .expect("pid");
        let done = store.create("noop", &json!({})).expect("create");
        assert!(
            store
                .finish(&done.id, JobStatus::Done, None)
                .expect("finish")
        );
        (queued.id, running.id, alive.id, done.id)
    };
    let host = JobHost::open(config(dir.path())).expect("reopen");
    assert_eq!(row(&host, &queued).status, JobStatus::Zombie);
    assert_eq!(row(&host, &running).status, JobStatus::Zombie);
    assert_eq!(
        row(&host, &alive).status,
        JobStatus::Running,
        "its child still runs"
    );
    assert_eq!(row(&host, &done).status, JobStatus::Done);
    assert_eq!(
        host.store().recent(10, None).expect("recent").len(),
        4,
        "no row is lost"
    );
}

#[test]
fn store_is_wal_migrated_and_ids_are_distinct() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(JobPaths::new(dir.path())).expect("store");
    drop(store);
    let conn = rusqlite_conn(dir.path());
    let (mode, version) = conn;
    assert_eq!(mode, "wal");
    assert_eq!(version, SCHEMA_VERSION as i64);
    // Reopening applies nothing twice.
    let store = Store::open(JobPaths::new(dir.path())).expect("reopen");
    let a = store.create("noop", &json!({"x": 1})).expect("create");
    let b = store.create("noop", &json!({})).expect("create");
    assert_ne!(a.id, b.id);
    assert_eq!(std::fs::metadata(&a.log_path).expect("log exists").len(), 0);
    let recent = store.recent(1, Some("noop")).expect("recent");
    assert_eq!(recent.len(), 1);
    assert!(store.recent(5, Some("other")).expect("recent").is_empty());
}

fn rusqlite_conn(dir: &std::path::Path) -> (String, i64) {
    let store = Store::open(JobPaths::new(dir)).expect("store");
    (
        store.journal_mode().expect("mode"),
        store.schema_version().expect("version"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwritable_log_dir_fails_the_job_clearly_and_the_host_stays_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Running as root defeats permissions; a file where the log dir should be cannot be bypassed.
    std::fs::write(dir.path().join("jobs"), b"not a directory").expect("write");
    let host = JobHost::open(config(dir.path())).expect("open despite the bad log dir");
    for kind in ["noop", "noop-inproc"] {
        let r = host.submit(kind, json!({})).expect("submit");
        assert_eq!(r.status, JobStatus::Failed);
        let error = r.error.unwrap_or_default();
        assert!(error.contains("cannot create the job log"), "{error}");
    }
    assert!(host.status().lease_holder.is_none());
    assert_eq!(host.store().recent(10, None).expect("list").len(), 2);
    std::fs::remove_file(dir.path().join("jobs")).expect("rm");
    std::fs::create_dir(dir.path().join("jobs")).expect("mkdir");
    let ok = host.submit("noop-inproc", json!({})).expect("submit");
    assert_eq!(
        wait_terminal(&host, &ok.id, 10).await.status,
        JobStatus::Done
    );
}
