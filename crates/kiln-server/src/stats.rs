//! `GET /stats`: what the server holds and has done, as JSON.

use std::sync::atomic::Ordering::Relaxed;

use axum::extract::State;
use serde_json::{Value, json};

use kiln_engine::SchedulerStats;

use crate::models::ServedModel;
use crate::state::SharedState;

/// Fraction of the KV slots' positions holding data (running sequences and kept prefixes).
pub(crate) fn kv_usage(model: &ServedModel, sched: Option<&SchedulerStats>) -> f64 {
    let m = &model.gateway.metrics;
    let positions = m
        .kv_report
        .lock()
        .ok()
        .and_then(|r| r.as_ref().map(|r| r.positions))
        .unwrap_or_else(|| m.kv_used.load(Relaxed));
    let slots = sched.map_or(1, |s| s.slots.max(1));
    positions as f64 / (model.info.context_len.max(1) * slots) as f64
}

/// The scheduler's last counters (none in a solo lane).
pub(crate) fn scheduler(model: &ServedModel) -> Option<SchedulerStats> {
    model
        .gateway
        .metrics
        .scheduler
        .lock()
        .ok()
        .and_then(|s| s.clone())
}

/// The `batch` section: the lane, limits and what the steps did.
fn batch_json(model: &ServedModel, sched: Option<&SchedulerStats>) -> Value {
    let m = &model.gateway.metrics;
    let Some(s) = sched else {
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

/// One model's sections of `/stats`: its prompt cache, KV, admission, queue, requests,
/// tokens, batching and adapters.
fn model_json(state: &SharedState, model: &ServedModel) -> Value {
    let m = &model.gateway.metrics;
    let info = &model.info;
    let sched = scheduler(model);
    let kv_used = m.kv_used.load(Relaxed);
    let generated = m.generated_tokens.load(Relaxed);
    let decode_secs = m.decode_micros.load(Relaxed) as f64 / 1e6;
    let mut body = json!({
        "model": info.id, "load_secs": info.load_secs, "memory_bytes": model.bill_bytes,
        "prompt_cache": {
            // Saved snapshots plus free slots' kept prefixes.
            "entries": m.cache_entries.load(Relaxed) + usize::from(kv_used > 0),
            "bytes": m.cache_bytes.load(Relaxed) as u64 + kv_used as u64 * info.kv_bytes_per_token,
            "max_bytes": state.config.prompt_cache_bytes,
            "hits": m.cache_hits.load(Relaxed),
            "misses": m.cache_misses.load(Relaxed),
            "evictions": m.cache_evictions.load(Relaxed),
            "cached_tokens": m.cached_tokens.load(Relaxed),
        },
        "kv": {"scheme": info.kv_scheme, "context_len": info.context_len,
               "used_tokens": kv_used, "usage": kv_usage(model, sched.as_ref()),
               "bytes_per_token": info.kv_bytes_per_token},
        "admission": match &info.memory {
            Some(a) => json!(a),
            None => Value::Null,
        },
        "queue": {"running": m.running.load(Relaxed), "waiting": m.waiting.load(Relaxed),
                  "capacity": model.gateway.capacity()},
        "requests": {"finished": m.finished.load(Relaxed), "cancelled": m.cancelled.load(Relaxed),
                     "failed": m.failed.load(Relaxed), "rejected": m.rejected.load(Relaxed)},
        "tokens": {"prompt": m.prompt_tokens.load(Relaxed), "generated": generated,
                   "decode_tokens_per_sec": if decode_secs > 0.0 { generated as f64 / decode_secs } else { 0.0 }},
        "batch": batch_json(model, sched.as_ref()),
        "adapters": crate::adapters::section_of(model),
    });
    if let Some(kv) = body.get_mut("kv").and_then(Value::as_object_mut)
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
    body
}

/// The `/stats` body: the server, the default model's sections at the top level (or the
/// most recently used model's while the default is unloaded), every loaded model under
/// `models`, the budget they share under `memory`, and the extensions' sections.
pub fn stats_json(state: &SharedState) -> Value {
    let (loaded, loading) = state.models.loaded();
    let primary = loaded
        .iter()
        .find(|e| e.model.info.id == state.models.default_id())
        .or(loaded.last());
    let settings = state.models.settings();
    let mut body = json!({
        "server": {"owner": "serve", "model": primary.map(|e| e.model.info.id.clone()),
                   "default_model": state.models.default_id(), "started_at": state.started_at,
                   "load_secs": primary.map(|e| e.model.info.load_secs)},
        "memory": {"budget_bytes": settings.budget_bytes, "billed_bytes": state.models.billed_bytes(),
                   "models_max": settings.models_max, "loading": loading},
        "responses_store": state.responses.stats(),
        "models": loaded.iter().map(|e| {
            let mut v = model_json(state, &e.model);
            if let Some(o) = v.as_object_mut() {
                o.insert("keep_alive".into(), json!(e.keep_alive.to_string()));
            }
            v
        }).collect::<Vec<_>>(),
    });
    if let Some(obj) = body.as_object_mut() {
        if let Some(Value::Object(sections)) = primary.map(|e| model_json(state, &e.model)) {
            for (k, v) in sections {
                if !matches!(k.as_str(), "model" | "load_secs" | "memory_bytes") {
                    obj.insert(k, v);
                }
            }
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
