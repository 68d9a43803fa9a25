//! Continuous batching through the HTTP API on the real starter model: eight identical greedy
//! chats sent at once answer exactly what one sent alone does, while sharing forwards.

mod common;

use axum::http::StatusCode;
use common::*;
use kiln_engine::{Engine, EngineOptions, load_model};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_server::ServerConfig;
use serde_json::{Value, json};

fn engine_with_slots(slots: usize) -> Engine<CpuBackend> {
    let path = kiln_hub::ensure_starter_model(false).expect("starter model");
    let backend = CpuBackend::new(CpuOptions { dense: false });
    let model = load_model(&backend, &path).expect("load");
    let options = EngineOptions {
        context_len: 512,
        prefill_chunk: 128,
        slots,
        ..EngineOptions::default()
    };
    Engine::new(backend, model, options).expect("engine")
}

fn content(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).expect("json");
    v["choices"][0]["message"]["content"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_chats_answer_as_one_alone() {
    let req = json!({
        "messages": [{"role": "user", "content": "Describe a lighthouse."}],
        "max_tokens": 24, "temperature": 0,
    })
    .to_string();
    let alone = app_with(engine_with_slots(1), ServerConfig::default(), 4);
    let (s, one) = post(&alone, "/v1/chat/completions", &req).await;
    assert_eq!(s, StatusCode::OK, "{one}");

    let app = app_with(engine_with_slots(8), ServerConfig::default(), 8);
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (app, req) = (app.clone(), req.clone());
            tokio::spawn(async move { post(&app, "/v1/chat/completions", &req).await })
        })
        .collect();
    for h in handles {
        let (s, body) = h.await.expect("join");
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(content(&body), content(&one));
    }
    let (_, stats) = send(&app, "GET", "/stats", "", &[]).await;
    let v: Value = serde_json::from_str(&stats).expect("stats");
    let batch = &v["batch"];
    assert_eq!(batch["batched"], true, "{batch}");
    assert_eq!(batch["configured"], 8, "{batch}");
    assert!(
        batch["avg_batch_sequences"].as_f64().unwrap_or(0.0) > 1.0,
        "requests shared forwards: {batch}"
    );
    assert_eq!(v["requests"]["finished"], 8);
}
