//! `GET /stats` (JSON) and `GET /metrics` (Prometheus text, with the vLLM-style gauges routers
//! read: requests running and waiting, KV-cache usage).

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::state::SharedState;

/// Fraction of the KV slots' positions holding data (running sequences and kept prefixes).
fn kv_usage(state: &SharedState) -> f64 {
    let m = &state.gateway.metrics;
    let positions = m
        .kv_report
        .lock()
        .ok()
        .and_then(|r| r.as_ref().map(|r| r.positions))
        .unwrap_or_else(|| m.kv_used.load(Relaxed));
    let slots = scheduler(state).map_or(1, |s| s.slots.max(1));
    positions as f64 / (state.info.context_len.max(1) * slots) as f64
}

fn scheduler(state: &SharedState) -> Option<kiln_engine::SchedulerStats> {
    state
        .gateway
        .metrics
        .scheduler
        .lock()
        .ok()
        .and_then(|s| s.clone())
}

/// The `batch` section: the lane, limits and what the steps did.
fn batch_json(state: &SharedState) -> Value {
    let m = &state.gateway.metrics;
    let Some(s) = scheduler(state) else {
        return json!({"configured": 1, "batched": false, "active_rows": m.running.load(Relaxed)});
    };
    let per_step = |total: u64| {
        if s.steps > 0 {
            total as f64 / s.steps as f64
        } else {
            0.0
        }
    };
    json!({
        "configured": s.max_sequences, "batched": s.lane.batched,
        "solo_reason": s.lane.solo_reason, "active_rows": s.running, "waiting": s.waiting,
        "batch_tokens": s.batch_tokens, "steps": s.steps,
        "last_batch_sequences": s.last_batch_sequences, "last_step_tokens": s.last_step_tokens,
        "avg_batch_sequences": per_step(s.batch_sequences_total),
        "avg_step_tokens": per_step(s.step_tokens_total),
        "preempted": s.preempted_total, "parked_positions": s.parked_positions,
        "memory": s.kv_bill,
    })
}

/// The `/stats` body.
pub fn stats_json(state: &SharedState) -> Value {
    let m = &state.gateway.metrics;
    let kv_used = m.kv_used.load(Relaxed);
    let generated = m.generated_tokens.load(Relaxed);
    let decode_secs = m.decode_micros.load(Relaxed) as f64 / 1e6;
    let mut body = json!({
        "server": {"owner": "serve", "model": state.info.id, "started_at": state.started_at,
                   "load_secs": state.info.load_secs},
        "prompt_cache": {
            // Saved snapshots plus free slots' kept prefixes.
            "entries": m.cache_entries.load(Relaxed) + usize::from(kv_used > 0),
            "bytes": m.cache_bytes.load(Relaxed) as u64 + kv_used as u64 * state.info.kv_bytes_per_token,
            "max_bytes": state.config.prompt_cache_bytes,
            "hits": m.cache_hits.load(Relaxed),
            "misses": m.cache_misses.load(Relaxed),
            "evictions": m.cache_evictions.load(Relaxed),
            "cached_tokens": m.cached_tokens.load(Relaxed),
        },
        "kv": {"scheme": state.info.kv_scheme, "context_len": state.info.context_len,
               "used_tokens": kv_used, "usage": kv_usage(state),
               "bytes_per_token": state.info.kv_bytes_per_token},
        "admission": match &state.info.memory {
            Some(a) => json!(a),
            None => Value::Null,
        },
        "responses_store": state.responses.stats(),
        "queue": {"running": m.running.load(Relaxed), "waiting": m.waiting.load(Relaxed),
                  "capacity": state.gateway.capacity()},
        "requests": {"finished": m.finished.load(Relaxed), "cancelled": m.cancelled.load(Relaxed),
                     "failed": m.failed.load(Relaxed), "rejected": m.rejected.load(Relaxed)},
        "tokens": {"prompt": m.prompt_tokens.load(Relaxed), "generated": generated,
                   "decode_tokens_per_sec": if decode_secs > 0.0 { generated as f64 / decode_secs } else { 0.0 }},
        "batch": batch_json(state),
        "adapters": crate::adapters::section(state),
    });
    if let Some(obj) = body.as_object_mut() {
        if let Some(kv) = obj.get_mut("kv").and_then(Value::as_object_mut)
            && let Ok(report) = m.kv_report.lock()
            && let Some(r) = report.as_ref()
        {
            kv.insert("label".into(), json!(r.label));
            kv.insert("start".into(), json!(r.start));
            kv.insert("layers".into(), json!(r.layers));
            kv.insert("current".into(), json!(r.current));
            kv.insert("conversions".into(), json!(r.conversions));
            kv.insert("bytes".into(), json!(r.bytes));
            kv.insert("reserved_bytes".into(), json!(r.reserved_bytes));
        }
        for (key, hook) in &state.extra_stats {
            obj.insert(key.clone(), hook());
        }
    }
    body
}

/// `GET /stats`.
pub async fn stats(State(state): State<SharedState>) -> axum::Json<Value> {
    axum::Json(stats_json(&state))
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<SharedState>) -> Response {
    let m = &state.gateway.metrics;
    let model = state.info.id.replace(['"', '\\', '\n'], "_");
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, v: f64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{model_name=\"{model}\"}} {v}");
    };
    let running = m.running.load(Relaxed) as f64;
    let waiting = m.waiting.load(Relaxed) as f64;
    let usage = kv_usage(&state);
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Requests generating now.",
        running,
    );
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Requests waiting in the queue.",
        waiting,
    );
    metric(
        "vllm:gpu_cache_usage_perc",
        "gauge",
        "KV-cache usage (1 = full).",
        usage,
    );
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage (1 = full).",
        usage,
    );
    if let Some(s) = scheduler(&state) {
        metric(
            "kiln_batch_sequences",
            "gauge",
            "Sequences in the last forward.",
            s.last_batch_sequences as f64,
        );
        metric(
            "kiln_batch_step_tokens",
            "gauge",
            "Tokens in the last forward.",
            s.last_step_tokens as f64,
        );
        metric(
            "kiln_batch_steps_total",
            "counter",
            "Forwards run by the scheduler.",
            s.steps as f64,
        );
        metric(
            "kiln_batch_tokens_total",
            "counter",
            "Tokens over all forwards (divide by steps for tokens per step).",
            s.step_tokens_total as f64,
        );
        metric(
            "kiln_requests_preempted_total",
            "counter",
            "Sequences preempted for memory and recomputed.",
            s.preempted_total as f64,
        );
        metric(
            "vllm:num_preemptions_total",
            "counter",
            "Sequences preempted for memory and recomputed.",
            s.preempted_total as f64,
        );
    }
    let prompt = m.prompt_tokens.load(Relaxed) as f64;
    let generated = m.generated_tokens.load(Relaxed) as f64;
    metric(
        "vllm:prompt_tokens_total",
        "counter",
        "Prompt tokens processed.",
        prompt,
    );
    metric(
        "vllm:generation_tokens_total",
        "counter",
        "Tokens generated.",
        generated,
    );
    metric(
        "kiln_requests_running",
        "gauge",
        "Requests generating now.",
        running,
    );
    metric(
        "kiln_requests_waiting",
        "gauge",
        "Requests waiting in the queue.",
        waiting,
    );
    metric(
        "kiln_kv_cache_usage_ratio",
        "gauge",
        "KV-cache usage (1 = full).",
        usage,
    );
    metric(
        "kiln_requests_finished_total",
        "counter",
        "Requests finished.",
        m.finished.load(Relaxed) as f64,
    );
    metric(
        "kiln_requests_cancelled_total",
        "counter",
        "Requests cancelled by clients.",
        m.cancelled.load(Relaxed) as f64,
    );
    metric(
        "kiln_requests_failed_total",
        "counter",
        "Requests failed in the engine.",
        m.failed.load(Relaxed) as f64,
    );
    metric(
        "kiln_requests_rejected_total",
        "counter",
        "Requests turned away (queue full).",
        m.rejected.load(Relaxed) as f64,
    );
    metric(
        "kiln_prompt_tokens_total",
        "counter",
        "Prompt tokens processed.",
        prompt,
    );
    metric(
        "kiln_prompt_cached_tokens_total",
        "counter",
        "Prompt tokens reused from the cache.",
        m.cached_tokens.load(Relaxed) as f64,
    );
    metric(
        "kiln_generated_tokens_total",
        "counter",
        "Tokens generated.",
        generated,
    );
    metric(
        "kiln_prompt_cache_hits_total",
        "counter",
        "Requests that reused a cached prefix.",
        m.cache_hits.load(Relaxed) as f64,
    );
    metric(
        "kiln_prompt_cache_misses_total",
        "counter",
        "Requests that reused nothing.",
        m.cache_misses.load(Relaxed) as f64,
    );
    let mut resp = out.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}
