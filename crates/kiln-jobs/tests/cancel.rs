//! Cancel (queued, in-process, child) and host close.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kiln_jobs::{JobError, JobStatus, procinfo};
use serde_json::json;

async fn assert_gone_within(pid: u32, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while procinfo::start_time(pid).is_some() {
        assert!(Instant::now() < deadline, "process {pid} still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_queued_running_child_and_in_process() {
    let (_dir, host) = host();
    let child = host
        .submit("noop", json!({"delay_ms": 20000}))
        .expect("submit");
    let queued = host.submit("noop", json!({})).expect("submit");
    let inproc = host
        .submit("noop-inproc", json!({"delay_ms": 20000}))
        .expect("submit");

    // Queued: cancelled at once, never spawned.
    let r = host.cancel(&queued.id).await.expect("cancel queued");
    assert_eq!(r.status, JobStatus::Cancelled);
    assert_eq!(r.pid, None);
    assert_eq!(
        types(&final_events(&r).await).last().map(String::as_str),
        Some("cancelled")
    );
    assert!(host.status().queued.is_empty());

    // In-process: cooperative, at the next boundary.
    wait_row(&host, &inproc.id, 10, |r| r.progress >= 0.25).await;
    let r = host.cancel(&inproc.id).await.expect("cancel in-process");
    assert_eq!(r.status, JobStatus::Cancelled);
    assert_eq!(
        types(&final_events(&r).await).last().map(String::as_str),
        Some("cancelled")
    );

    // Child: SIGTERM; gone within 4 s; the lease released after.
    let running = wait_row(&host, &child.id, 20, |r| {
        r.status == JobStatus::Running && r.progress >= 0.25
    })
    .await;
    let pid = u32::try_from(running.pid.expect("pid")).expect("pid fits");
    let started = Instant::now();
    let r = host.cancel(&child.id).await.expect("cancel child");
    assert_eq!(r.status, JobStatus::Cancelled);
    assert_gone_within(pid, 4).await;
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(
        types(&final_events(&r).await).last().map(String::as_str),
        Some("cancelled")
    );
    wait_until_free(&host).await;

    // Terminal and unknown ids.
    assert!(matches!(
        host.cancel(&child.id).await,
        Err(JobError::Terminal { .. })
    ));
    assert!(matches!(
        host.cancel("job_0000000000000000").await,
        Err(JobError::NotFound(_))
    ));
}

async fn wait_until_free(host: &kiln_jobs::JobHost) {
    for _ in 0..200 {
        if host.status().lease_holder.is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("lease still held: {:?}", host.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_ignoring_sigterm_is_killed_after_the_grace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    // A child that ignores SIGTERM (its short sleeps inherit that).
    cfg.child_program = "/bin/sh".into();
    cfg.child_args = vec![
        "-c".into(),
        "trap '' TERM; echo up; while :; do sleep 0.05; done".into(),
    ];
    cfg.kill_grace = Duration::from_millis(500);
    let host = kiln_jobs::JobHost::open(cfg).expect("open");
    let job = host.submit("noop", json!({})).expect("submit");
    let r = wait_row(&host, &job.id, 10, |r| r.pid.is_some()).await;
    let pid = u32::try_from(r.pid.expect("pid")).expect("pid fits");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = host.cancel(&job.id).await.expect("cancel");
    assert_eq!(r.status, JobStatus::Cancelled);
    assert_gone_within(pid, 2).await;
    wait_until_free(&host).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_fails_queued_cancels_running_and_refuses_new_jobs() {
    let (_dir, host) = host();
    let running = host
        .submit("noop", json!({"delay_ms": 20000}))
        .expect("submit");
    let queued = host.submit("noop", json!({})).expect("submit");
    let inproc = host
        .submit("noop-inproc", json!({"delay_ms": 20000}))
        .expect("submit");
    let r = wait_row(&host, &running.id, 20, |r| {
        r.status == JobStatus::Running && r.progress >= 0.25
    })
    .await;
    let pid = u32::try_from(r.pid.expect("pid")).expect("pid fits");

    tokio::time::timeout(Duration::from_secs(8), host.close())
        .await
        .expect("close in time");

    let q = row(&host, &queued.id);
    assert_eq!(
        (q.status, q.error.as_deref()),
        (JobStatus::Failed, Some("job host closed"))
    );
    assert_eq!(q.pid, None, "a queued job never spawns");
    for id in [&running.id, &inproc.id] {
        let r = row(&host, id);
        assert_eq!(r.status, JobStatus::Cancelled, "{r:?}");
        assert_eq!(r.message.as_deref(), Some("engine_closed"), "{r:?}");
        assert_eq!(
            types(&final_events(&r).await).last().map(String::as_str),
            Some("cancelled")
        );
    }
    assert!(
        procinfo::start_time(pid).is_none(),
        "child {pid} outlived close"
    );
    assert_eq!(host.status().lease_holder, None);
    assert!(matches!(
        host.submit("noop", json!({})),
        Err(JobError::Closed)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_request_ends_a_running_job_as_done() {
    let (_dir, host) = host();
    let job = host
        .submit("noop", json!({"delay_ms": 20000}))
        .expect("submit");
    wait_row(&host, &job.id, 20, |r| {
        r.status == JobStatus::Running && r.progress >= 0.25
    })
    .await;
    let started = Instant::now();
    host.request_stop(&job.id).expect("request stop");
    let r = wait_row(&host, &job.id, 10, |r| r.status.is_terminal()).await;
    assert_eq!(r.status, JobStatus::Done);
    assert!(started.elapsed() < Duration::from_secs(5));
    let events = final_events(&r).await;
    let done = events
        .iter()
        .find(|e| e["type"] == "done")
        .expect("done event");
    assert_eq!(done["summary"]["stopped"], true, "{done}");
    assert!(matches!(
        host.request_stop(&job.id),
        Err(JobError::Terminal { .. })
    ));
    assert!(matches!(
        host.request_stop("nope"),
        Err(JobError::NotFound(_))
    ));
}
