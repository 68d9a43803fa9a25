//! LoRA adapters through the HTTP API on the real starter model (spec §3.7): mount, list and
//! unmount with their error cases, the per-request `adapter` field on all three generation
//! endpoints, and mounting and unmounting under concurrent load without losing a request.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use common::*;
use kiln_engine::{AdapterRegistry, Engine, EngineOptions, load_model};
use kiln_model::arch::LAYER_MATRICES;
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::config::ModelConfig;
use kiln_model::lora::{AdapterInfo, LoraAdapter, LoraWeights};
use kiln_server::ServerConfig;
use serde_json::{Value, json};

fn engine(slots: usize) -> Engine<CpuBackend> {
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

/// A random rank-8 adapter on every projection, written as kiln writes adapters. `widen`
/// makes q_proj of layer 3 one input too wide (a shape mismatch).
fn write_adapter(cfg: &ModelConfig, name: &str, seed: u64, widen: bool) -> PathBuf {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let mut modules = BTreeMap::new();
    for layer in 0..cfg.num_layers {
        for m in LAYER_MATRICES {
            let (mut n_in, n_out) = cfg.layer_matrix_shape(m).expect("a layer matrix");
            if widen && layer == 3 && m == "self_attn.q_proj" {
                n_in += 1;
            }
            let bound = 1.0 / (n_in as f32).sqrt();
            modules.insert(
                format!("model.layers.{layer}.{m}"),
                LoraWeights {
                    in_features: n_in,
                    out_features: n_out,
                    rank: 8,
                    a: (0..n_in * 8).map(|_| next() * bound).collect(),
                    b: (0..8 * n_out).map(|_| next() * 0.2).collect(),
                    scale: 2.0,
                },
            );
        }
    }
    let adapter = LoraAdapter {
        modules,
        base_model: Some("SmolLM2-135M-Instruct".into()),
        info: AdapterInfo {
            rank: 8,
            scale: 2.0,
            ..AdapterInfo::default()
        },
    };
    // One folder per call: the tests of this binary run at once, and each removes its own
    // folders when it ends (a shared name let one test delete another's adapter mid-test).
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "kiln-http-adapter-{}-{n}-{name}",
        std::process::id()
    ));
    adapter.save(&dir).expect("save");
    dir
}

struct Setup {
    app: Router,
    registry: Arc<AdapterRegistry>,
    dirs: BTreeMap<&'static str, PathBuf>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for d in self.dirs.values() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn setup(slots: usize, api_key: Option<&str>) -> Setup {
    let e = engine(slots);
    let cfg = e.model().config.clone();
    let registry = Arc::new(AdapterRegistry::new(cfg.clone()));
    let dirs: BTreeMap<&'static str, PathBuf> =
        [("a", 1, false), ("b", 2, false), ("wide", 3, true)]
            .into_iter()
            .map(|(n, seed, widen)| (n, write_adapter(&cfg, n, seed, widen)))
            .collect();
    let config = ServerConfig {
        api_key: api_key.map(String::from),
        prompt_cache_bytes: 1 << 30,
        ..ServerConfig::default()
    };
    Setup {
        app: app_with_adapters(e, config, 64, registry.clone()),
        registry,
        dirs,
    }
}

fn mount_body(id: &str, path: &Path) -> String {
    json!({"id": id, "path": path.display().to_string()}).to_string()
}

fn message(body: &str) -> String {
    let v: Value = serde_json::from_str(body).expect("json");
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn chat(adapter: Option<&str>, max_tokens: usize) -> String {
    let mut v = json!({
        "messages": [{"role": "user", "content": "Name three kitchen tools."}],
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true,
    });
    if let Some(a) = adapter {
        v["adapter"] = json!(a);
    }
    v.to_string()
}

fn content(body: &str) -> String {
    let v: Value = serde_json::from_str(body).expect("json");
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_list_unmount_and_the_adapter_field() {
    let s = setup(2, None);
    let app = &s.app;
    let (st, body) = send(app, "GET", "/v1/adapters", "", &[]).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["adapters"],
        json!([])
    );

    let (st, body) = post(app, "/v1/adapters", &mount_body("a", &s.dirs["a"])).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v,
        json!({"id": "a", "mounted_layers": 210, "rank": 8, "scale": 2.0})
    );
    let (st, body) = post(app, "/v1/adapters", &mount_body("b", &s.dirs["b"])).await;
    assert_eq!(st, StatusCode::OK, "{body}");

    // Each refusal says why.
    for (req, want) in [
        (json!({"path": "/x"}).to_string(), "id is required"),
        (json!({"id": "c"}).to_string(), "path is required"),
        (
            mount_body("a", &s.dirs["b"]),
            "adapter a is already mounted",
        ),
        (
            mount_body("c", Path::new("/nonexistent/kiln-adapter")),
            "is not a folder",
        ),
        (
            mount_body("c", Path::new("/tmp")),
            "neither adapters.safetensors nor adapter_model.safetensors",
        ),
        (
            mount_body("c", &s.dirs["wide"]),
            "model.layers.3.self_attn.q_proj",
        ),
        (mount_body("c+d", &s.dirs["a"]), "'+'"),
        (mount_body("none", &s.dirs["a"]), "base model"),
        (
            json!({"id": 3, "path": "/x"}).to_string(),
            "id: invalid type",
        ),
    ] {
        let (st, body) = post(app, "/v1/adapters", &req).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{req}: {body}");
        assert!(message(&body).contains(want), "{req}: {body}");
    }
    assert!(
        s.registry.get("c").is_none(),
        "a refused mount leaves nothing behind"
    );

    let (_, body) = send(app, "GET", "/v1/adapters", "", &[]).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let list = v["adapters"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["id"], "a");
    assert_eq!(list[0]["path"], s.dirs["a"].display().to_string());
    assert_eq!(list[0]["mounted_layers"], 210);
    assert_eq!(list[0]["rank"], 8);
    assert_eq!(list[0]["scale"], 2.0);
    assert_eq!(
        list[0]["size_bytes"],
        s.registry.get("a").unwrap().size_bytes()
    );
    assert_eq!(v["default"], "none");

    // The adapter changes the greedy answer; "none" and no field are the base model.
    let (st, base) = post(app, "/v1/chat/completions", &chat(Some("none"), 20)).await;
    assert_eq!(st, StatusCode::OK, "{base}");
    let (_, plain) = post(app, "/v1/chat/completions", &chat(None, 20)).await;
    assert_eq!(content(&plain), content(&base));
    let (st, with_a) = post(app, "/v1/chat/completions", &chat(Some("a"), 20)).await;
    assert_eq!(st, StatusCode::OK, "{with_a}");
    assert_ne!(content(&with_a), content(&base));
    let (_, with_ab) = post(app, "/v1/chat/completions", &chat(Some("a+b"), 20)).await;
    assert_ne!(content(&with_ab), content(&with_a));
    // Again: deterministic, and a's cached prefix does not leak into the base.
    let (_, again) = post(app, "/v1/chat/completions", &chat(Some("a"), 20)).await;
    assert_eq!(content(&again), content(&with_a));
    let (_, base2) = post(app, "/v1/chat/completions", &chat(Some("none"), 20)).await;
    assert_eq!(content(&base2), content(&base));

    // Completions and Anthropic messages take the field too.
    let comp = |a: &str| {
        json!({"prompt": "The sky is", "max_tokens": 12, "temperature": 0, "adapter": a})
            .to_string()
    };
    let (st, c_none) = post(app, "/v1/completions", &comp("none")).await;
    assert_eq!(st, StatusCode::OK, "{c_none}");
    let (st, c_a) = post(app, "/v1/completions", &comp("a")).await;
    assert_eq!(st, StatusCode::OK, "{c_a}");
    let text = |b: &str| serde_json::from_str::<Value>(b).unwrap()["choices"][0]["text"].clone();
    assert_ne!(text(&c_a), text(&c_none));
    let msg = |a: &str| {
        json!({"max_tokens": 12, "temperature": 0, "adapter": a,
        "messages": [{"role": "user", "content": "Name three kitchen tools."}]})
        .to_string()
    };
    let (st, m_none) = post(app, "/v1/messages", &msg("none")).await;
    assert_eq!(st, StatusCode::OK, "{m_none}");
    let (st, m_a) = post(app, "/v1/messages", &msg("a")).await;
    assert_eq!(st, StatusCode::OK, "{m_a}");
    let mtext = |b: &str| serde_json::from_str::<Value>(b).unwrap()["content"][0]["text"].clone();
    assert_ne!(mtext(&m_a), mtext(&m_none));

    // An unknown adapter is a 400 naming it, on every endpoint, never ignored.
    let (st, body) = post(app, "/v1/chat/completions", &chat(Some("zz"), 5)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(message(&body), "adapter zz not mounted (mounted: a, b)");
    let (st, body) = post(app, "/v1/completions", &comp("a+zz")).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(message(&body).contains("adapter zz not mounted"), "{body}");
    let (st, body) = post(app, "/v1/messages", &msg("zz")).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["type"], "error", "Anthropic's error shape: {body}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("adapter zz not mounted")
    );
    let bad = json!({"messages": [{"role": "user", "content": "x"}], "adapter": 5}).to_string();
    let (st, body) = post(app, "/v1/chat/completions", &bad).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(
        message(&body).starts_with("adapter must be a string"),
        "{body}"
    );
    let (st, body) = post(app, "/v1/chat/completions", &chat(Some("a+a"), 5)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(message(&body).contains("names a twice"), "{body}");

    // /stats shows what is mounted.
    let (_, stats) = send(app, "GET", "/stats", "", &[]).await;
    let v: Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(
        v["adapters"]["adapters"].as_array().unwrap().len(),
        2,
        "{}",
        v["adapters"]
    );

    // Unmount, then it is gone.
    let (st, body) = send(app, "DELETE", "/v1/adapters/a", "", &[]).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"id": "a", "removed_layers": 210})
    );
    let (st, body) = send(app, "DELETE", "/v1/adapters/a", "", &[]).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(message(&body), "adapter a not mounted");
    let (st, body) = post(app, "/v1/chat/completions", &chat(Some("a"), 5)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(message(&body), "adapter a not mounted (mounted: b)");
    // Mounted again from the same folder: the same answer (a fresh namespace, same weights).
    let (st, body) = post(app, "/v1/adapters", &mount_body("a", &s.dirs["a"])).await;
    assert_eq!(st, StatusCode::OK, "remount: {body}");
    let (_, again) = post(app, "/v1/chat/completions", &chat(Some("a"), 20)).await;
    assert_eq!(content(&again), content(&with_a));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adapter_routes_need_the_api_key() {
    let s = setup(1, Some("sekrit"));
    let app = &s.app;
    for (method, path, body) in [
        ("GET", "/v1/adapters", String::new()),
        ("POST", "/v1/adapters", mount_body("a", &s.dirs["a"])),
        ("DELETE", "/v1/adapters/a", String::new()),
    ] {
        let (st, _) = send(
            app,
            method,
            path,
            body.clone(),
            &[("content-type", "application/json")],
        )
        .await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{method} {path}");
        let auth = [
            ("content-type", "application/json"),
            ("authorization", "Bearer sekrit"),
        ];
        let (st, text) = send(app, method, path, body, &auth).await;
        assert_eq!(st, StatusCode::OK, "{method} {path}: {text}");
    }
}

/// Streamed requests with adapter b (and some with the base) are accepted — each has resolved
/// its adapter once its response has begun — then b is unmounted and another adapter is mounted
/// and unmounted over and over while they run: every one is answered 200 with the text it gets
/// alone, and no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounting_and_unmounting_under_load_loses_no_request() {
    use axum::body::{Body, to_bytes};
    use axum::http::Request;
    use tower::ServiceExt;

    let s = setup(4, None);
    let app = s.app.clone();
    let (st, _) = post(&app, "/v1/adapters", &mount_body("b", &s.dirs["b"])).await;
    assert_eq!(st, StatusCode::OK);
    let (_, want_b) = post(&app, "/v1/chat/completions", &chat(Some("b"), 24)).await;
    let (_, want_none) = post(&app, "/v1/chat/completions", &chat(Some("none"), 24)).await;
    assert_ne!(content(&want_b), content(&want_none));

    let n = 12;
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (app, started_tx) = (app.clone(), started_tx.clone());
            let adapter = if i % 3 == 2 { "none" } else { "b" };
            tokio::spawn(async move {
                let mut body: Value = serde_json::from_str(&chat(Some(adapter), 24)).unwrap();
                body["stream"] = json!(true);
                let req = Request::builder()
                    .method("POST")
                    .uri("/v1/chat/completions")
                    .header("host", "127.0.0.1:8080")
                    .header("content-type", "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap();
                let resp = app.oneshot(req).await.unwrap();
                let status = resp.status();
                let _ = started_tx.send(());
                let bytes = to_bytes(resp.into_body(), usize::MAX).await.unwrap();
                (
                    adapter,
                    status,
                    String::from_utf8_lossy(&bytes).into_owned(),
                )
            })
        })
        .collect();
    for _ in 0..n {
        started.recv().await.expect("a request started");
    }
    // Every request holds its adapter now; take b away and churn the registry meanwhile.
    let (st, body) = send(&app, "DELETE", "/v1/adapters/b", "", &[]).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    for _ in 0..5 {
        let (st, body) = post(&app, "/v1/adapters", &mount_body("a", &s.dirs["a"])).await;
        assert_eq!(st, StatusCode::OK, "{body}");
        let (st, body) = send(&app, "DELETE", "/v1/adapters/a", "", &[]).await;
        assert_eq!(st, StatusCode::OK, "{body}");
    }
    let (st, body) = post(&app, "/v1/chat/completions", &chat(Some("b"), 4)).await;
    assert_eq!(
        st,
        StatusCode::BAD_REQUEST,
        "a new request cannot use b: {body}"
    );
    for h in handles {
        let (adapter, st, body) = h.await.expect("join");
        assert_eq!(st, StatusCode::OK, "{adapter}: {body}");
        let (frames, done) = data_frames(&body);
        assert!(done, "{adapter}: the stream ended with [DONE]: {body}");
        let text: String = frames
            .iter()
            .filter_map(|f| f["choices"][0]["delta"]["content"].as_str())
            .collect();
        let want = if adapter == "b" { &want_b } else { &want_none };
        assert_eq!(text, content(want), "{adapter}");
    }
    let (_, stats) = send(&app, "GET", "/stats", "", &[]).await;
    let v: Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(v["requests"]["failed"], 0, "{}", v["requests"]);
    assert_eq!(v["requests"]["cancelled"], 0, "{}", v["requests"]);
}
