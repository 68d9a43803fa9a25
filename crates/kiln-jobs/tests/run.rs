//! Running jobs: noop, crash, kill -9, FIFO one-at-a-time.

mod common;

use std::time::Duration;

use common::*;
use kiln_jobs::{JobStatus, procinfo};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noop_child_runs_to_done_with_stages() {
    let (_dir, host) = host();
    let job = host.submit("noop", json!({})).expect("submit");
    assert!(
        job.id.starts_with("job_") && job.id.len() == 20,
        "{}",
        job.id
    );
    assert!(
        job.id[4..]
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    let done = wait_terminal(&host, &job.id, 20).await;
    assert_eq!(done.status, JobStatus::Done, "{done:?}");
    assert_eq!(done.progress, 1.0);
    assert!(done.ended_at.is_some() && done.pid.is_some());
    let evs = final_events(&done).await;
    let t = types(&evs);
    assert_eq!(t.first().map(String::as_str), Some("started"), "{t:?}");
    let stages: Vec<_> = evs.iter().filter_map(|e| e["stage"].as_str()).collect();
    assert_eq!(stages, ["warmup", "work"]);
    assert_eq!(t.last().map(String::as_str), Some("done"), "{t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noop_in_process_runs_to_done() {
    let (_dir, host) = host();
    let job = host.submit("noop-inproc", json!({})).expect("submit");
    assert_ne!(
        job.status,
        JobStatus::Queued,
        "in-process jobs start at once"
    );
    let done = wait_terminal(&host, &job.id, 10).await;
    assert_eq!(done.status, JobStatus::Done);
    assert_eq!(done.progress, 1.0);
    let evs = final_events(&done).await;
    assert_eq!(types(&evs), ["started", "stage", "stage", "done"]);
    // An output path given at submit is reported by `done`.
    let out = host
        .submit_with_output("noop-inproc", json!({}), Some("/tmp/out-dir"))
        .expect("submit");
    let r = wait_terminal(&host, &out.id, 10).await;
    assert_eq!(r.output_path.as_deref(), Some("/tmp/out-dir"));
    let evs = final_events(&r).await;
    let last = evs.last().map(|e| e["output_dir"].clone());
    assert_eq!(last, Some(json!("/tmp/out-dir")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_fails_with_exit_code_and_logs_its_output() {
    let (_dir, host) = host();
    let job = host.submit("crash", json!({})).expect("submit");
    let r = wait_terminal(&host, &job.id, 20).await;
    assert_eq!(r.status, JobStatus::Failed);
    assert_eq!(r.error.as_deref(), Some("exited 1"));
    let evs = final_events(&r).await;
    assert!(
        evs.iter()
            .any(|e| e["type"] == "log" && e["line"].as_str().unwrap_or("").contains("crash"))
    );
    assert_eq!(evs.last().map(|e| e["type"].clone()), Some(json!("failed")));
    // The host keeps working.
    let next = host.submit("noop", json!({})).expect("submit after crash");
    assert_eq!(
        wait_terminal(&host, &next.id, 20).await.status,
        JobStatus::Done
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_fails_the_job_releases_the_lease_and_starts_the_next() {
    let (_dir, host) = host();
    let slow = host
        .submit("noop", json!({"delay_ms": 20000}))
        .expect("submit");
    let next = host.submit("noop", json!({})).expect("submit");
    let running = wait_row(&host, &slow.id, 20, |r| {
        r.status == JobStatus::Running && r.pid.is_some()
    })
    .await;
    assert_eq!(
        host.status().lease_holder.as_deref(),
        Some(slow.id.as_str())
    );
    assert_eq!(row(&host, &next.id).status, JobStatus::Queued);
    let pid = u32::try_from(running.pid.expect("pid")).expect("pid fits");
    assert!(procinfo::send_signal(pid, procinfo::SIGKILL));
    let r = wait_terminal(&host, &slow.id, 10).await;
    assert_eq!(r.status, JobStatus::Failed);
    assert_eq!(r.error.as_deref(), Some("killed by signal 9"));
    assert_eq!(
        wait_terminal(&host, &next.id, 20).await.status,
        JobStatus::Done
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(host.status().lease_holder, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_heavy_jobs_run_one_at_a_time_in_order() {
    let (_dir, host) = host();
    let ids: Vec<String> = (0..5)
        .map(|_| {
            host.submit("noop", json!({"delay_ms": 30}))
                .expect("submit")
                .id
        })
        .collect();
    assert_eq!(
        host.status().queued.len() + usize::from(host.status().lease_holder.is_some()),
        5
    );
    let mut spans = Vec::new();
    for id in &ids {
        let r = wait_terminal(&host, id, 30).await;
        assert_eq!(r.status, JobStatus::Done, "{r:?}");
        let evs = final_events(&r).await;
        let ts = |t: &str| {
            evs.iter()
                .find(|e| e["type"] == t)
                .and_then(|e| e["ts"].as_u64())
                .expect(t)
        };
        spans.push((ts("started"), ts("done")));
    }
    for w in spans.windows(2) {
        assert!(
            w[1].0 >= w[0].1,
            "a job started before the previous one ended: {spans:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_spawn_fails_the_job_and_the_queue_keeps_draining() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.child_program = dir.path().join("no-such-program");
    let host = kiln_jobs::JobHost::open(cfg).expect("open");
    let ids: Vec<String> = (0..3)
        .map(|_| host.submit("noop", json!({})).expect("submit").id)
        .collect();
    for id in &ids {
        let r = wait_terminal(&host, id, 10).await;
        assert_eq!(r.status, JobStatus::Failed);
        let error = r.error.unwrap_or_default();
        assert!(
            error.starts_with("spawning ") && error.contains("no-such-program"),
            "{error}"
        );
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(host.status().lease_holder, None);
    assert!(host.status().queued.is_empty());
    // In-process kinds are unaffected.
    let ok = host.submit("noop-inproc", json!({})).expect("submit");
    assert_eq!(
        wait_terminal(&host, &ok.id, 10).await.status,
        JobStatus::Done
    );
}

#[test]
fn stage_and_metric_events_update_the_row_and_emit_never_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = std::sync::Arc::new(
        kiln_jobs::Store::open(kiln_jobs::JobPaths::new(dir.path())).expect("store"),
    );
    let r = store.create("noop", &json!({})).expect("create");
    let emit = kiln_jobs::Emitter::new(store.clone(), &r.id, &r.log_path);
    emit.emit(&json!({"type": "metric", "kind": "train", "step": 3, "loss": 1.5, "progress": 0.4, "message": "step 3"}));
    let got = store.get(&r.id).expect("get").expect("row");
    assert_eq!(
        (got.progress, got.message.as_deref()),
        (0.4, Some("step 3"))
    );
    emit.emit(&json!({"type": "stage", "stage": "x", "message": "only a message"}));
    let got = store.get(&r.id).expect("get").expect("row");
    assert_eq!(
        (got.progress, got.message.as_deref()),
        (0.4, Some("only a message"))
    );
    emit.emit(&json!({"type": "log", "line": "no row change", "progress": 0.9}));
    assert_eq!(store.get(&r.id).expect("get").expect("row").progress, 0.4);
    assert_eq!(events(&got).len(), 3);
    // A vanished log: emit swallows the error, the row still updates.
    std::fs::remove_file(&r.log_path).expect("rm");
    emit.emit(&json!({"type": "stage", "stage": "y", "progress": 0.5}));
    assert_eq!(store.get(&r.id).expect("get").expect("row").progress, 0.5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_completion_hook_sees_each_final_row() {
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = config(dir.path());
    let sink = seen.clone();
    cfg.on_complete = Some(kiln_jobs::OnComplete(Arc::new(
        move |r: &kiln_jobs::JobRow| {
            sink.lock().expect("lock").push((r.kind.clone(), r.status));
            panic!("a hook that panics must not hurt the host");
        },
    )));
    let host = kiln_jobs::JobHost::open(cfg).expect("open");
    let a = host.submit("crash", json!({})).expect("submit").id;
    let b = host.submit("noop-inproc", json!({})).expect("submit").id;
    wait_terminal(&host, &a, 20).await;
    wait_terminal(&host, &b, 20).await;
    for _ in 0..100 {
        if seen.lock().expect("lock").len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut got = seen.lock().expect("lock").clone();
    got.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        got,
        [
            ("crash".to_string(), JobStatus::Failed),
            ("noop-inproc".to_string(), JobStatus::Done)
        ]
    );
    let next = host
        .submit("noop", json!({}))
        .expect("submit after hook panics");
    assert_eq!(
        wait_terminal(&host, &next.id, 20).await.status,
        JobStatus::Done
    );
}
