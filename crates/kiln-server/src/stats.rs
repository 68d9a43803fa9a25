//! `GET /stats`: what the server holds and has done, as JSON.

use std::sync::atomic::Ordering::Relaxed;

use axum::extract::State;
use serde_json::{Value, json};

use kiln_engine::SchedulerStats;

use crate::state::SharedState;

/// Fraction of the KV slots' positions holding data (running sequences and kept prefixes).
pub(crate) fn kv_usage(state: &SharedState, sched: Option<&SchedulerStats>) -> f64 {
    let m = &state.gateway.metrics;
    let positions = m
        .kv_report
        .lock()
        .ok()
        .and_then(|r| r.as_ref().map(|r| r.positions))
        .unwrap_or_else(|| m.kv_used.load(Relaxed));
    let slots = sched.map_or(1, |s| s.slots.max(1));
    positions as f64 / (state.info.context_len.max(1) * slots) as f64
}

/// The scheduler's last counters (none in a solo lane).
pub(crate) fn scheduler(state: &SharedState) -> Option<SchedulerStats> {
    state
        .gateway
        .metrics
        .scheduler
        .lock()
        .ok()
        .and_then(|s| s.clone())
}

/// The `batch` section: the lane, limits and what the steps did.
fn batch_json(state: &SharedState, sched: Option<&SchedulerStats>) -> Value {
    let m = &state.gateway.metrics;
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

/// The `/stats` body.
pub fn stats_json(state: &SharedState) -> Value {
    let m = &state.gateway.metrics;
    let sched = scheduler(state);
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
               "used_tokens": kv_used, "usage": kv_usage(state, sched.as_ref()),
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
        "batch": batch_json(state, sched.as_ref()),
        "adapters": crate::adapters::section(state, &crate::adapters::mounted(state)),
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
