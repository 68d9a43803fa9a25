//! `GET /metrics`: Prometheus text with kiln's own names and the vLLM names the inference
//! gateways read (Gateway API Inference Extension's endpoint picker, llm-d): requests running
//! and waiting, KV-cache usage, LoRA adapters in use, the cache configuration and prefix-cache
//! hits. Every sample carries `model_name`. Rendering reads counters and one short-held lock
//! each, so scraping every 50 ms costs nothing measurable.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use kiln_engine::SchedulerStats;

use crate::models::ServedModel;
use crate::state::SharedState;
use crate::stats::{kv_usage, scheduler};

/// The accounting unit of `vllm:cache_config_info`: kiln's KV is not paged, so its capacity in
/// positions is reported in blocks of vLLM's default size.
pub const BLOCK_SIZE: usize = 16;

/// One metric family: its header and one sample per model (and label set).
struct Family {
    name: String,
    header: String,
    samples: String,
}

/// A Prometheus text exposition under construction: families in first-seen order, each
/// with the samples of every model written under it.
struct Exposition {
    families: Vec<Family>,
    model: String,
}

impl Exposition {
    fn new(model: &str) -> Self {
        Self {
            families: Vec::new(),
            model: label_value(model),
        }
    }

    /// Labels the samples that follow with `model`.
    fn set_model(&mut self, model: &str) {
        self.model = label_value(model);
    }

    fn gauge(&mut self, name: &str, help: &str, v: f64) {
        self.sample(name, "gauge", help, &[], v);
    }

    fn counter(&mut self, name: &str, help: &str, v: f64) {
        self.sample(name, "counter", help, &[], v);
    }

    /// One sample of family `name`, labelled with the model and `labels`.
    fn sample(&mut self, name: &str, kind: &str, help: &str, labels: &[(&str, String)], v: f64) {
        let i = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    header: format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"),
                    samples: String::new(),
                });
                self.families.len() - 1
            }
        };
        let out = &mut self.families[i].samples;
        let _ = write!(out, "{name}{{model_name=\"{}\"", self.model);
        for (k, val) in labels {
            let _ = write!(out, ",{k}=\"{}\"", label_value(val));
        }
        let _ = writeln!(out, "}} {v}");
    }

    fn render(self) -> String {
        let mut out = String::new();
        for f in self.families {
            out.push_str(&f.header);
            out.push_str(&f.samples);
        }
        out
    }
}

/// `v` escaped for a label value (backslash, quote and newline, as the format says).
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The fraction of the KV memory in use by running sequences: of the budget's room when the
/// server has a memory budget, else of the slots' positions. Kept prefixes are not in use (a
/// new request reclaims them), as vLLM does not count its evictable cached blocks.
fn kv_in_use(model: &ServedModel, sched: Option<&SchedulerStats>) -> f64 {
    let Some(s) = sched else {
        return kv_usage(model, None);
    };
    if let (Some(bytes), Some(bill)) = (s.running_kv_bytes, &s.kv_bill)
        && bill.room_bytes > 0
    {
        return (bytes as f64 / bill.room_bytes as f64).min(1.0);
    }
    let capacity = model.info.context_len.max(1) * s.slots.max(1);
    (s.running_positions as f64 / capacity as f64).min(1.0)
}

/// KV capacity in positions: the slots' positions, or fewer when the budget's room holds fewer.
fn kv_capacity_positions(model: &ServedModel, sched: Option<&SchedulerStats>) -> usize {
    let positions = model.info.context_len * sched.map_or(1, |s| s.slots.max(1));
    let per_token = model.info.kv_bytes_per_token.max(1);
    match sched.and_then(|s| s.kv_bill.as_ref()) {
        Some(bill) => positions.min((bill.room_bytes / per_token) as usize),
        None => positions,
    }
}

fn unix_now_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `(name, help, value)` of one unlabelled sample.
type Plain = (&'static str, &'static str, f64);

/// The vLLM names the gateways read.
fn gateway_contract(e: &mut Exposition, model: &ServedModel, sched: Option<&SchedulerStats>) {
    let m = &model.gateway.metrics;
    let usage = kv_in_use(model, sched);
    let gauges: [Plain; 4] = [
        (
            "vllm:num_requests_running",
            "Requests generating now.",
            m.running.load(Relaxed) as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "Requests waiting in the queue.",
            m.waiting.load(Relaxed) as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage by running requests (1 = full).",
            usage,
        ),
        (
            "vllm:gpu_cache_usage_perc",
            "KV-cache usage by running requests (1 = full; the older vLLM name).",
            usage,
        ),
    ];
    for (name, help, v) in gauges {
        e.gauge(name, help, v);
    }
    let adapters = |ids: Option<&Vec<String>>| ids.map(|a| a.join(",")).unwrap_or_default();
    e.sample(
        "vllm:lora_requests_info",
        "gauge",
        "LoRA adapters of running and waiting requests; the value is the time of this update.",
        &[
            ("max_lora", sched.map_or(1, |s| s.max_sequences).to_string()),
            (
                "running_lora_adapters",
                adapters(sched.map(|s| &s.running_adapters)),
            ),
            (
                "waiting_lora_adapters",
                adapters(sched.map(|s| &s.waiting_adapters)),
            ),
        ],
        unix_now_f64(),
    );
    let blocks = kv_capacity_positions(model, sched) / BLOCK_SIZE;
    e.sample(
        "vllm:cache_config_info",
        "gauge",
        "KV-cache configuration (capacity = block_size x num_gpu_blocks positions).",
        &[
            ("block_size", BLOCK_SIZE.to_string()),
            ("num_gpu_blocks", blocks.to_string()),
            ("cache_dtype", model.info.kv_scheme.clone()),
        ],
        1.0,
    );
    let prompt = m.prompt_tokens.load(Relaxed) as f64;
    let counters: [Plain; 4] = [
        (
            "vllm:prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.",
            prompt,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache.",
            m.cached_tokens.load(Relaxed) as f64,
        ),
        (
            "vllm:prompt_tokens_total",
            "Prompt tokens processed.",
            prompt,
        ),
        (
            "vllm:generation_tokens_total",
            "Tokens generated.",
            m.generated_tokens.load(Relaxed) as f64,
        ),
    ];
    for (name, help, v) in counters {
        e.counter(name, help, v);
    }
    if let Some(s) = sched {
        e.counter(
            "vllm:num_preemptions_total",
            "Sequences preempted for memory and recomputed.",
            s.preempted_total as f64,
        );
    }
}

/// kiln's batching counters.
fn batching(e: &mut Exposition, sched: Option<&SchedulerStats>) {
    let Some(s) = sched else {
        return;
    };
    let gauges: [Plain; 2] = [
        (
            "kiln_batch_sequences",
            "Sequences in the last forward.",
            s.last_batch_sequences as f64,
        ),
        (
            "kiln_batch_step_tokens",
            "Tokens in the last forward.",
            s.last_step_tokens as f64,
        ),
    ];
    for (name, help, v) in gauges {
        e.gauge(name, help, v);
    }
    let counters: [Plain; 3] = [
        (
            "kiln_batch_steps_total",
            "Forwards run by the scheduler.",
            s.steps as f64,
        ),
        (
            "kiln_batch_tokens_total",
            "Tokens over all forwards (divide by steps for tokens per step).",
            s.step_tokens_total as f64,
        ),
        (
            "kiln_requests_preempted_total",
            "Sequences preempted for memory and recomputed.",
            s.preempted_total as f64,
        ),
    ];
    for (name, help, v) in counters {
        e.counter(name, help, v);
    }
}

/// kiln's request, token and prompt-cache counters.
fn requests(e: &mut Exposition, model: &ServedModel, sched: Option<&SchedulerStats>) {
    let m = &model.gateway.metrics;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed) as f64;
    let gauges: [Plain; 3] = [
        (
            "kiln_requests_running",
            "Requests generating now.",
            m.running.load(Relaxed) as f64,
        ),
        (
            "kiln_requests_waiting",
            "Requests waiting in the queue.",
            m.waiting.load(Relaxed) as f64,
        ),
        (
            "kiln_kv_cache_usage_ratio",
            "KV positions holding data, kept prefixes included (1 = full).",
            kv_usage(model, sched),
        ),
    ];
    for (name, help, v) in gauges {
        e.gauge(name, help, v);
    }
    let counters: [Plain; 9] = [
        (
            "kiln_requests_finished_total",
            "Requests finished.",
            load(&m.finished),
        ),
        (
            "kiln_requests_cancelled_total",
            "Requests cancelled by clients.",
            load(&m.cancelled),
        ),
        (
            "kiln_requests_failed_total",
            "Requests failed in the engine.",
            load(&m.failed),
        ),
        (
            "kiln_requests_rejected_total",
            "Requests turned away (queue full).",
            load(&m.rejected),
        ),
        (
            "kiln_prompt_tokens_total",
            "Prompt tokens processed.",
            load(&m.prompt_tokens),
        ),
        (
            "kiln_prompt_cached_tokens_total",
            "Prompt tokens reused from the cache.",
            load(&m.cached_tokens),
        ),
        (
            "kiln_generated_tokens_total",
            "Tokens generated.",
            load(&m.generated_tokens),
        ),
        (
            "kiln_prompt_cache_hits_total",
            "Requests that reused a cached prefix.",
            load(&m.cache_hits),
        ),
        (
            "kiln_prompt_cache_misses_total",
            "Requests that reused nothing.",
            load(&m.cache_misses),
        ),
    ];
    for (name, help, v) in counters {
        e.counter(name, help, v);
    }
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<SharedState>) -> Response {
    let mut e = Exposition::new(state.models.default_id());
    let (loaded, _) = state.models.loaded();
    for entry in &loaded {
        let model = &entry.model;
        e.set_model(&model.info.id);
        // One snapshot of the scheduler per model and scrape: its numbers agree.
        let sched = scheduler(model);
        gateway_contract(&mut e, model, sched.as_ref());
        batching(&mut e, sched.as_ref());
        requests(&mut e, model, sched.as_ref());
    }
    e.set_model(state.models.default_id());
    let settings = state.models.settings();
    e.gauge(
        "kiln_models_loaded",
        "Models loaded now.",
        loaded.len() as f64,
    );
    e.gauge(
        "kiln_models_memory_bytes",
        "Bytes of the memory budget the loaded models hold.",
        state.models.billed_bytes() as f64,
    );
    if let Some(b) = settings.budget_bytes {
        e.gauge("kiln_memory_budget_bytes", "The memory budget.", b as f64);
    }
    let mut resp = e.render().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_escape_label_values_and_carry_the_model() {
        let mut e = Exposition::new("a\"b");
        e.sample(
            "x_info",
            "gauge",
            "Help.",
            &[("k", "v\\1\n".to_string())],
            1.0,
        );
        assert_eq!(
            e.render(),
            "# HELP x_info Help.\n# TYPE x_info gauge\nx_info{model_name=\"a\\\"b\",k=\"v\\\\1\\n\"} 1\n"
        );
    }
}
