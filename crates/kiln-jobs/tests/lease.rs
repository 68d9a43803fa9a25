//! The execution lease and the inference gate; a child that outlives its server.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kiln_jobs::{JobHost, JobPaths, JobPolicy, JobStatus, Store, procinfo};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_job_waits_for_inference_then_gates_new_inference() {
    let (_dir, host) = host();
    // A generation in flight: the queue head reserves the lease but does not spawn.
    let generation = host.inference_gate().await;
    assert_eq!(generation.waited_for, None);
    let first = host
        .submit("noop", json!({"delay_ms": 400}))
        .expect("submit")
        .id;
    let second = host.submit("noop", json!({})).expect("submit").id;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st = host.status();
    assert_eq!(st.lease_holder.as_deref(), Some(first.as_str()), "{st:?}");
    assert_eq!(st.queued, vec![second.clone()]);
    assert!(st.inference_gated);
    assert_eq!(
        row(&host, &first).status,
        JobStatus::Queued,
        "spawned during inference"
    );
    drop(generation);
    // Now the job runs, and a new generation waits for it.
    wait_row(&host, &first, 20, |r| r.status == JobStatus::Running).await;
    let t = Instant::now();
    let next = host.inference_gate().await;
    assert!(next.waited_for.is_some(), "did not wait for the job");
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    drop(next);
    assert_eq!(
        wait_terminal(&host, &first, 20).await.status,
        JobStatus::Done
    );
    assert_eq!(
        wait_terminal(&host, &second, 20).await.status,
        JobStatus::Done
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_policy_never_gates_inference() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.policy = JobPolicy::Shared;
    let host = JobHost::open(cfg).expect("open");
    let _generation = host.inference_gate().await;
    let job = host
        .submit("noop", json!({"delay_ms": 300}))
        .expect("submit")
        .id;
    wait_row(&host, &job, 20, |r| r.status == JobStatus::Running).await;
    let t = Instant::now();
    let p = host.inference_gate().await;
    assert!(t.elapsed() < Duration::from_millis(50) && p.waited_for.is_none());
    assert!(!host.status().inference_gated);
    assert_eq!(wait_terminal(&host, &job, 20).await.status, JobStatus::Done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_while_waiting_for_the_permit_passes_the_lease_on() {
    let (_dir, host) = host();
    let generation = host.inference_gate().await;
    let first = host.submit("noop", json!({})).expect("submit").id;
    let second = host.submit("noop", json!({})).expect("submit").id;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = host.cancel(&first).await.expect("cancel");
    assert_eq!((r.status, r.pid), (JobStatus::Cancelled, None));
    drop(generation);
    assert_eq!(
        wait_terminal(&host, &second, 20).await.status,
        JobStatus::Done
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_outlives_its_server_finishes_its_own_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(JobPaths::new(dir.path())).expect("store");
    let id = store
        .create("noop", &json!({"delay_ms": 400}))
        .expect("create")
        .id;
    // What a server does, then dies (kill -9): the child keeps going.
    let mut child = std::process::Command::new(CHILD)
        .args(["__job", &id])
        .env(kiln_jobs::DATA_DIR_ENV, dir.path())
        .spawn()
        .expect("spawn child");
    store
        .set_pid(&id, child.id(), procinfo::start_time(child.id()))
        .expect("pid");
    drop(store);
    let host = JobHost::open(config(dir.path())).expect("restart");
    assert!(
        !row(&host, &id).status.is_terminal(),
        "a live child's row was zombied"
    );
    let r = wait_terminal(&host, &id, 20).await;
    assert_eq!(r.status, JobStatus::Done);
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_child_that_dies_leaves_a_zombie() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(JobPaths::new(dir.path())).expect("store");
    let id = store.create("noop", &json!({})).expect("create").id;
    assert!(store.set_running(&id).expect("running"));
    let mut sleeper = std::process::Command::new("sleep")
        .arg("0.3")
        .spawn()
        .expect("spawn");
    store
        .set_pid(&id, sleeper.id(), procinfo::start_time(sleeper.id()))
        .expect("pid");
    drop(store);
    let host = JobHost::open(config(dir.path())).expect("restart");
    assert_eq!(row(&host, &id).status, JobStatus::Running);
    let _ = sleeper.wait();
    let r = wait_terminal(&host, &id, 5).await;
    assert_eq!(r.status, JobStatus::Zombie);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_an_adopted_child() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(JobPaths::new(dir.path())).expect("store");
    let id = store
        .create("noop", &json!({"delay_ms": 20000}))
        .expect("create")
        .id;
    let mut child = std::process::Command::new(CHILD)
        .args(["__job", &id])
        .env(kiln_jobs::DATA_DIR_ENV, dir.path())
        .spawn()
        .expect("spawn child");
    for _ in 0..500 {
        if store.get(&id).expect("get").expect("row").status == JobStatus::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(store);
    let host = JobHost::open(config(dir.path())).expect("open");
    assert_eq!(row(&host, &id).status, JobStatus::Running, "adopted");
    let host2 = host.clone();
    let id2 = id.clone();
    let cancel = tokio::spawn(async move { host2.cancel(&id2).await });
    // Reap it here (the test spawned it), so "gone" means gone.
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(!status.success());
    let r = cancel.await.expect("join").expect("cancel");
    assert_eq!(r.status, JobStatus::Cancelled);
}
