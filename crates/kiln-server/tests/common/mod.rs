//! Test harness: the real tokenizer/template of the starter model, with either the real engine
//! or a scripted generator behind the gateway, driven in-process through the router.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use kiln_engine::stats::GenerationStats;
use kiln_engine::{
    Engine, EngineError, EngineOptions, FinishReason, GenerateOutput, GenerateRequest, load_model,
};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_server::{
    AppState, Gateway, Generator, ModelInfo, Models, OneAtATime, Serial, ServedModel, ServerConfig,
};
use serde_json::Value;
use tower::ServiceExt;

/// Loads the starter model.
pub fn engine() -> Engine<CpuBackend> {
    let path = kiln_hub::ensure_starter_model(false).expect("starter model");
    let backend = CpuBackend::new(CpuOptions { dense: false });
    let model = load_model(&backend, &path).expect("load");
    Engine::new(
        backend,
        model,
        EngineOptions {
            context_len: 512,
            prefill_chunk: 128,
            ..EngineOptions::default()
        },
    )
    .expect("engine")
}

/// The starter model's facts (tokenizer, template), loaded once.
pub fn info() -> ModelInfo {
    static INFO: OnceLock<ModelInfo> = OnceLock::new();
    INFO.get_or_init(|| ModelInfo::from_engine(&engine(), "test-model"))
        .clone()
}

/// Replays fixed text pieces, ignoring the prompt; optionally slow.
pub struct Scripted {
    pub pieces: Vec<String>,
    pub delay: Duration,
    pub seen: Arc<Mutex<Vec<GenerateRequest>>>,
}

impl OneAtATime for Scripted {
    fn generate(
        &mut self,
        req: &GenerateRequest,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerateOutput, EngineError> {
        self.seen.lock().unwrap().push(req.clone());
        let mut text = String::new();
        let mut finish = FinishReason::Stop;
        for p in &self.pieces {
            std::thread::sleep(self.delay);
            text.push_str(p);
            if !on_text(p) {
                finish = FinishReason::Cancelled;
                break;
            }
        }
        Ok(GenerateOutput {
            tokens: vec![1; self.pieces.len()],
            text,
            finish_reason: finish,
            stop_index: None,
            logprobs: vec![],
            stats: GenerationStats {
                prompt_tokens: req.prompt.len(),
                ..Default::default()
            },
        })
    }
}

impl Scripted {
    /// Behind the gateway's step interface.
    pub fn serial(self) -> Serial<Self> {
        Serial::new(self)
    }
}

/// A router over `generator`.
pub fn app_with<G: Generator>(generator: G, config: ServerConfig, queue: usize) -> Router {
    app_with_info(generator, config, queue, info())
}

/// A router over `generator` serving a model described by `info`.
pub fn app_with_info<G: Generator>(
    generator: G,
    config: ServerConfig,
    queue: usize,
    info: ModelInfo,
) -> Router {
    let gateway = Arc::new(Gateway::start(generator, queue, None));
    app_over(
        Models::single(ServedModel::new(info, gateway), None),
        config,
    )
}

/// A router over the models of `pool`.
pub fn app_over(pool: Models, config: ServerConfig) -> Router {
    let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
    let config = ServerConfig {
        body_limit: kiln_server::DEFAULT_BODY_LIMIT,
        ..config
    };
    let state = Arc::new(AppState::new(Arc::new(pool), config, addr));
    kiln_server::routes::router(state)
}

/// A router over `generator` whose model has the adapters of `registry`.
pub fn app_with_adapters<G: Generator>(
    generator: G,
    config: ServerConfig,
    queue: usize,
    registry: Arc<kiln_engine::AdapterRegistry>,
) -> Router {
    let gateway = Arc::new(Gateway::start(generator, queue, None));
    let model = ServedModel::new(info(), gateway).with_adapters(registry);
    app_over(Models::single(model, None), config)
}

/// A router over the starter model's engine that loads it again (with `make`) after a panic
/// broke it.
pub fn app_reloading(
    make: impl Fn() -> Engine<CpuBackend> + Send + Sync + 'static,
    queue: usize,
) -> Router {
    let make = Arc::new(make);
    let build = {
        let make = make.clone();
        move || ServedModel::new(info(), Arc::new(Gateway::start(make(), queue, None)))
    };
    let first = build();
    let remake: Box<dyn Fn() -> Result<ServedModel, String> + Send + Sync> =
        Box::new(move || Ok(build()));
    app_over(Models::single(first, Some(remake)), ServerConfig::default())
}

/// A scripted generator replaying `pieces`.
pub fn script(pieces: &[&str]) -> Scripted {
    Scripted {
        pieces: pieces.iter().map(|s| s.to_string()).collect(),
        delay: Duration::ZERO,
        seen: Arc::default(),
    }
}

/// A router whose generator replays `pieces`.
pub fn scripted(pieces: &[&str]) -> Router {
    app_with(script(pieces).serial(), ServerConfig::default(), 8)
}

/// Sends a request; returns status and body text.
pub async fn send(
    app: &Router,
    method: &str,
    path: &str,
    body: impl Into<Body>,
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1:8080");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(body.into()).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// POSTs JSON.
pub async fn post(app: &Router, path: &str, body: &str) -> (StatusCode, String) {
    send(
        app,
        "POST",
        path,
        body.to_string(),
        &[("content-type", "application/json")],
    )
    .await
}

/// Parses the `data:` frames of an SSE body; also says whether `[DONE]` came last.
pub fn data_frames(body: &str) -> (Vec<Value>, bool) {
    let mut out = vec![];
    let mut done = false;
    for frame in body.split("\n\n").filter(|f| !f.is_empty()) {
        let d = frame.strip_prefix("data: ").expect("data frame");
        if d == "[DONE]" {
            done = true;
        } else {
            assert!(!done, "frame after [DONE]");
            out.push(serde_json::from_str(d).unwrap());
        }
    }
    (out, done)
}

/// `(event, data)` pairs of an Anthropic SSE body.
pub fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let mut lines = f.lines();
            let ev = lines.next().unwrap().strip_prefix("event: ").unwrap();
            let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
            (ev.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}
