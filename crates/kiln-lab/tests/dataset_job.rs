//! The `dataset` job kind on a real job host: submit checks, the loopback call with the
//! server's API key, cancellation between rows, and host close (`engine_closed`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_jobs::{HostConfig, JobHost, JobPaths, JobRow, JobStatus, Registry};
use kiln_lab::dataset::Loopback;
use kiln_lab::dataset::job::{DatasetRunner, LoopbackCell};
use serde_json::{Value, json};

mod fake_http;

/// Each request's Authorization header and body.
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// A fake `/v1/chat/completions` that answers after `delay`, recording each request.
fn fake_chat(delay: Duration) -> (String, Seen) {
    let seen = Seen::default();
    let log = seen.clone();
    let url = fake_http::serve(move |req| {
        let body = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        log.lock().unwrap().push((req.authorization, body));
        std::thread::sleep(delay);
        json!({"choices": [{"message": {"role": "assistant", "content": "Reasoned. Answer: 4"}}]})
            .to_string()
    });
    (url, seen)
}

fn host(dir: &std::path::Path, loopback: LoopbackCell) -> JobHost {
    let mut registry = Registry::new();
    registry.register(
        "dataset",
        DatasetRunner::new(dir.join("datasets"), loopback),
    );
    let cfg = HostConfig::new(JobPaths::new(dir.join("jobs")), registry).unwrap();
    JobHost::open(cfg).unwrap()
}

async fn wait(host: &JobHost, id: &str, secs: u64, pred: impl Fn(&JobRow) -> bool) -> JobRow {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let r = host.store().get(id).unwrap().unwrap();
        if pred(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "timed out: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ended(r: &JobRow) -> bool {
    !matches!(r.status, JobStatus::Queued | JobStatus::Running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_is_refused_before_any_row_exists() {
    let dir = tempfile::tempdir().unwrap();
    let host = host(dir.path(), LoopbackCell::default());
    let refuse = |config: Value| host.submit("dataset", config).unwrap_err().to_string();
    assert!(refuse(json!({})).contains("template_id: is required"));
    assert!(refuse(json!({"template_id": "nope"})).contains("unknown template \"nope\""));
    assert!(
        refuse(json!({"template_id": "sft_qa_pairs"})).contains("inputs.pairs_text: is required")
    );
    assert!(refuse(json!({"template_id": "sft_qa_pairs", "inputs": {"pairs_text": "Q: a\nA: b"}, "api_key": "x"})).contains("api_key: unknown field"));
    assert!(
        refuse(json!({"template_id": "cot_synthesis", "inputs": {"questions": "q"}}))
            .contains("needs the served model")
    );
    let e = refuse(json!({"template_id": "dpo_pref_pairs", "inputs": {"csv_text": "no header"}}));
    assert!(e.contains("inputs.csv_text: the header needs"), "{e}");
    let out = dir.path().join("taken");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("train.jsonl"), "{}\n").unwrap();
    let e = refuse(
        json!({"template_id": "sft_qa_pairs", "inputs": {"pairs_text": "Q: a\nA: b"}, "output_dir": out}),
    );
    assert!(e.contains("already holds train.jsonl"), "{e}");
    assert!(
        host.store().recent(10, None).unwrap().is_empty(),
        "no row for a refused submit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_template_calls_the_loopback_with_the_servers_key() {
    let dir = tempfile::tempdir().unwrap();
    let (url, seen) = fake_chat(Duration::ZERO);
    let cell = LoopbackCell::default();
    cell.set(Loopback {
        url,
        api_key: Some("sekrit".into()),
    })
    .unwrap();
    let host = host(dir.path(), cell);
    let job = host
        .submit("dataset", json!({"template_id": "cot_synthesis", "inputs": {"questions": "2+2?\n3+3?\n4+4?"}, "max_tokens": 32}))
        .unwrap();
    let r = wait(&host, &job.id, 20, ended).await;
    assert_eq!(
        (r.status, r.message.as_deref()),
        (JobStatus::Done, Some("Wrote 3 rows.")),
        "{r:?}"
    );
    assert!(
        !r.config_json.contains("sekrit"),
        "the key is never stored in the row"
    );
    let out = std::path::PathBuf::from(r.output_path.unwrap());
    assert!(
        out.starts_with(dir.path().join("datasets"))
            && out
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("dataset-cot_synthesis-")
    );
    assert_eq!(
        std::fs::read_to_string(out.join("train.jsonl"))
            .unwrap()
            .lines()
            .count(),
        2
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|(auth, _)| auth == "Bearer sekrit"));
    let body = &seen[0].1;
    assert_eq!(
        (
            body["model"].clone(),
            body["max_tokens"].clone(),
            body["temperature"].clone()
        ),
        // The default model (`local`) is the server's: no `model` is sent.
        (Value::Null, json!(32), json!(0.7))
    );
    assert_eq!(body["chat_template_kwargs"]["enable_thinking"], false);
    let log = std::fs::read_to_string(&r.log_path).unwrap();
    let last_stage = log
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "stage")
        .unwrap();
    assert_eq!(
        (last_stage["stage"].clone(), last_stage["progress"].clone()),
        (json!("done"), json!(1.0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_between_rows_and_close_cancels_with_engine_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (url, seen) = fake_chat(Duration::from_millis(300));
    let cell = LoopbackCell::default();
    cell.set(Loopback { url, api_key: None }).unwrap();
    let host = host(dir.path(), cell);
    let questions: String = (0..40).map(|i| format!("q{i}\n")).collect();
    let config = json!({"template_id": "cot_synthesis", "inputs": {"questions": questions}});
    let job = host.submit("dataset", config.clone()).unwrap();
    wait(&host, &job.id, 20, |r| r.progress > 0.06).await;
    host.cancel(&job.id).await.unwrap();
    let r = wait(&host, &job.id, 5, ended).await;
    assert_eq!(r.status, JobStatus::Cancelled, "{r:?}");
    assert!(
        seen.lock().unwrap().len() < 10,
        "stopped long before 40 calls"
    );
    assert!(
        !std::path::Path::new(&r.output_path.unwrap())
            .join("train.jsonl")
            .exists()
    );

    let second = host.submit("dataset", config).unwrap();
    wait(&host, &second.id, 20, |r| r.progress > 0.06).await;
    tokio::time::timeout(Duration::from_secs(5), host.close())
        .await
        .expect("close in time");
    let r = host.store().get(&second.id).unwrap().unwrap();
    assert_eq!(
        (r.status, r.message.as_deref()),
        (JobStatus::Cancelled, Some("engine_closed")),
        "{r:?}"
    );
}
