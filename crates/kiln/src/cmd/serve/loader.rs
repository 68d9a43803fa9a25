//! How `kiln serve` loads a model for its pool: names resolved inside kiln's and the Hugging
//! Face caches only, the memory model's fit in the room the other models leave, the engine with
//! its slots and KV reservation, its adapters, and its gateway.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use kiln_model::backend::Backend;
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_server::models::{Candidate, Listed, LoadError, Loader};
use kiln_server::{Gateway, ModelInfo, ServedModel, StartGate};

use crate::cli::RuntimeArgs;
use crate::common::load_engine_with;

/// What every model the server loads shares: the command line's engine flags, the budget, the
/// job gate, and the model named on the command line (with its adapters).
pub struct ServeLoader {
    pub runtime: RuntimeArgs,
    pub batch_tokens: usize,
    pub parallel: Option<usize>,
    pub queue: usize,
    pub prompt_cache_bytes: u64,
    /// The whole budget and where it came from (`None`: memory admission is off).
    pub budget: Option<(u64, &'static str)>,
    /// Whether several models share the budget (`--models-max` above 1): each then reserves
    /// only its slots' KV and its prompt cache, not all the room.
    pub shared: bool,
    pub gate: Arc<dyn StartGate>,
    /// The model named on the command line.
    pub startup: Candidate,
    /// What the command line called it (`smollm2`, a path…), also accepted in requests.
    pub startup_spec: String,
    pub adapters: Vec<(String, PathBuf)>,
    pub default_adapter: Option<String>,
}

/// The id a model file is served under: its file stem (a folder: its name).
pub fn model_id(path: &Path, fallback: &str) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| fallback.to_string())
}

impl ServeLoader {
    fn startup_named(&self, name: &str) -> bool {
        name == self.startup.id
            || name == self.startup_spec
            || kiln_hub::Hub::from_env()
                .known(name)
                .is_some_and(|k| k.matches(&self.startup_spec) || self.is_startup_file(k))
    }

    fn is_startup_file(&self, k: &kiln_hub::KnownModel) -> bool {
        self.startup
            .path
            .file_name()
            .is_some_and(|f| f == k.file_name.as_str())
    }

    /// The engine, its gateway and its bill, for `c` within `room`.
    fn build(&self, c: &Candidate, room: Option<u64>) -> Result<ServedModel, LoadError> {
        let failed = |e: anyhow::Error| LoadError::Failed(format!("{e:#}"));
        let spec = c.path.to_string_lossy().into_owned();
        let memory = match (room, self.budget) {
            (Some(room), Some((total, source))) => {
                let a = crate::cmd::fit::admission_in(&spec, &self.runtime, room, source)
                    .map_err(failed)?;
                check_room(&a.fit, room, total)?;
                Some(a)
            }
            _ => None,
        };
        let threads = self
            .runtime
            .threads
            .unwrap_or_else(crate::common::available_threads);
        let figures = CpuBackend::new(CpuOptions {
            dense: self.runtime.dense,
        });
        let mut reserved = Reservation::default();
        let mut engine = load_engine_with(&spec, &self.runtime, |o, cfg| {
            o.batch_tokens = self.batch_tokens;
            // A prompt chunk larger than a step's budget would make every prefill step overrun it.
            o.prefill_chunk = o.prefill_chunk.min(self.batch_tokens);
            let shape = o.clone();
            let room_for = |n: usize| {
                memory
                    .as_ref()
                    .map(|m| kv_room(&figures, &m.fit, cfg, &shape, self.batch_tokens, n, threads))
            };
            o.slots = parallel(&figures, self.parallel, &room_for, cfg, &shape);
            let room = room_for(o.slots);
            o.kv_budget_bytes = match (room, self.shared) {
                (Some(room), true) => {
                    let per_sequence = sequence_peak(&figures, cfg, &shape);
                    Some(room.min(o.slots as u64 * per_sequence + self.prompt_cache_bytes))
                }
                (room, _) => room,
            };
            reserved = Reservation {
                fixed: memory
                    .as_ref()
                    .zip(room)
                    .map_or(0, |(m, r)| m.fit.budget_bytes.saturating_sub(r)),
                kv: o.kv_budget_bytes.unwrap_or(0),
            };
            Ok(())
        })
        .map_err(failed)?;
        // The prompt cache lives inside the KV room.
        let cache_cap = self
            .prompt_cache_bytes
            .min(engine.options().kv_budget_bytes.unwrap_or(u64::MAX));
        engine.set_prompt_cache_bytes(usize::try_from(cache_cap).unwrap_or(usize::MAX));
        let lane = engine.lane().clone();
        eprintln!(
            "kiln: {}: {} sequences at once, {} tokens per step{}",
            c.id,
            engine.scheduler_stats().max_sequences,
            self.batch_tokens,
            lane.solo_reason
                .map(|r| format!(" (one at a time: {r})"))
                .unwrap_or_default()
        );
        let mut info = ModelInfo::from_engine(&engine, c.id.clone());
        if let Some(m) = &memory {
            eprintln!(
                "kiln: {}: {:.2} GB of the memory budget ({}), max safe context {} tokens",
                c.id,
                (reserved.fixed + reserved.kv) as f64 / 1e9,
                m.budget_source,
                m.fit.max_safe_context
            );
        }
        info.memory = memory;
        let registry = Arc::new(kiln_engine::AdapterRegistry::new(
            engine.model().config.clone(),
        ));
        if c.path == self.startup.path {
            mount_startup_adapters(&registry, &self.adapters, self.default_adapter.as_deref())
                .map_err(failed)?;
        }
        let gateway = Arc::new(Gateway::start_with(
            engine,
            self.queue,
            Some(self.gate.clone()),
            self.prompt_cache_bytes > 0,
        ));
        let mut served = ServedModel::new(info, gateway).with_adapters(registry);
        served.bill_bytes = reserved.fixed + reserved.kv;
        Ok(served)
    }
}

/// The bytes a model holds of the budget: weights, runtime and step transients (`fixed`),
/// and its KV reservation.
#[derive(Default)]
struct Reservation {
    fixed: u64,
    kv: u64,
}

/// Whether a model whose fit in `room` is `fit` may load there: it must serve its whole
/// context, except when it has the whole budget (`room >= total`) and serves at least one
/// token (its requests are then held to the safe context). `DoesNotFit` names the least it
/// needs: its full-context peak, or, when that exceeds the whole budget, what one token takes.
fn check_room(
    fit: &kiln_engine::kv_scheme::memory::FitReport,
    room: u64,
    total: u64,
) -> Result<(), LoadError> {
    let alone = room >= total;
    if fit.fits || (alone && fit.max_safe_context >= 1) {
        return Ok(());
    }
    let least = (fit.weights_bytes
        + fit.runtime_overhead_bytes
        + fit.transient_bytes
        + fit.kv_dense_bytes_per_token)
        .max(fit.load_peak_bytes);
    let needed = if fit.peak_bytes <= total {
        fit.peak_bytes
    } else {
        least
    };
    Err(LoadError::DoesNotFit { needed, room })
}

impl Loader<ServedModel> for ServeLoader {
    fn find(&self, name: &str) -> Option<Candidate> {
        if self.startup_named(name) {
            return Some(self.startup.clone());
        }
        let hub = kiln_hub::Hub::from_env();
        if let Some(k) = hub.known(name) {
            let path = hub.models_dir().join(&k.file_name);
            return path.is_file().then(|| Candidate {
                id: model_id(&path, name),
                path,
            });
        }
        let cached = hub.list_cached();
        let hit = cached.iter().find(|m| m.name == name).or_else(|| {
            cached
                .iter()
                .find(|m| m.name.strip_suffix(".gguf") == Some(name))
        })?;
        let id = if hit.path.starts_with(hub.models_dir()) {
            model_id(&hit.path, name)
        } else {
            hit.name.trim_end_matches(".gguf").to_string()
        };
        Some(Candidate {
            id,
            path: hit.path.clone(),
        })
    }

    fn available(&self) -> Vec<Listed> {
        let mut out: Vec<Listed> = kiln_hub::list_cached()
            .into_iter()
            .map(|m| Listed {
                name: m.name.strip_suffix(".gguf").unwrap_or(&m.name).to_string(),
                path: m.path,
                size_bytes: m.size_bytes,
            })
            .collect();
        if !out.iter().any(|l| l.path == self.startup.path) {
            out.push(Listed {
                name: self.startup.id.clone(),
                path: self.startup.path.clone(),
                size_bytes: std::fs::metadata(&self.startup.path).map_or(0, |m| m.len()),
            });
        }
        out
    }

    fn load(&self, c: &Candidate, room: Option<u64>) -> Result<ServedModel, LoadError> {
        self.build(c, room)
    }
}

/// Mounts every `--adapter` on the startup model's registry (a failure names the flag) and
/// sets `--default-adapter` (else the first `--adapter`).
fn mount_startup_adapters(
    registry: &kiln_engine::AdapterRegistry,
    adapters: &[(String, PathBuf)],
    default_adapter: Option<&str>,
) -> Result<()> {
    for (i, (id, path)) in adapters.iter().enumerate() {
        if adapters[..i].iter().any(|(other, _)| other == id) {
            anyhow::bail!("--adapter {id}: the name is given twice");
        }
        let a = registry
            .mount(id, path)
            .map_err(|e| anyhow::anyhow!("--adapter {id}={}: {e}", path.display()))?;
        eprintln!(
            "kiln: adapter {id} mounted from {} ({} modules, rank {}, {:.1} MB)",
            path.display(),
            a.mounted_layers(),
            a.info().rank,
            a.size_bytes() as f64 / 1e6
        );
    }
    let default = match (default_adapter, adapters.first()) {
        (Some(spec), _) => Some(spec.to_string()),
        (None, Some((id, _))) => Some(id.clone()),
        (None, None) => None,
    };
    if let Some(spec) = default {
        registry
            .set_default(&spec)
            .map_err(|e| anyhow::anyhow!("--default-adapter {spec}: {e}"))?;
        if spec != kiln_model::lora::NO_ADAPTER {
            eprintln!("kiln: requests without `adapter` run with {spec}");
        }
    }
    Ok(())
}

/// The `--parallel` default's cap: beyond it a step's decode rows cost more than they share.
const DEFAULT_PARALLEL_CAP: usize = 32;

/// Bytes the memory budget leaves for KV (every slot plus the prompt cache): the budget less
/// weights, runtime and the transient of the largest step at full context — `batch_tokens`
/// of prompt chunks plus one decode row for each of `sequences`, each with its logits row (and
/// the host copy) and its split-attention partials (per KV head, one part per 256 positions:
/// the group's unnormalised heads plus their maxima and sums).
#[allow(clippy::too_many_arguments)]
fn kv_room(
    backend: &CpuBackend,
    fit: &kiln_engine::kv_scheme::memory::FitReport,
    cfg: &kiln_model::config::ModelConfig,
    o: &kiln_engine::EngineOptions,
    batch_tokens: usize,
    sequences: usize,
    threads: usize,
) -> u64 {
    let step_tokens = batch_tokens.max(o.prefill_chunk) + sequences;
    let activations = backend.forward_transient_bytes(cfg, step_tokens, o.context_len, threads);
    let n = sequences as u64;
    let logits = n * 2 * 4 * cfg.vocab_size as u64;
    let group = (cfg.num_heads / cfg.num_kv_heads.max(1)) as u64;
    let parts = cfg.num_kv_heads as u64 * o.context_len.div_ceil(256) as u64;
    let partials = n * parts * (group * cfg.head_dim as u64 + 2 * group) * 4;
    fit.budget_bytes.saturating_sub(
        fit.weights_bytes + fit.runtime_overhead_bytes + activations + logits + partials,
    )
}

/// One full-context sequence's peak KV bytes.
fn sequence_peak(
    backend: &CpuBackend,
    cfg: &kiln_model::config::ModelConfig,
    o: &kiln_engine::EngineOptions,
) -> u64 {
    kiln_engine::kv_scheme::memory::KvGeometry::new(
        cfg,
        &o.kv_scheme,
        backend.memory_profile().caps_sliding,
    )
    .peak_bytes_at(o.context_len, o.prefill_chunk)
    .max(1)
}

/// `--parallel`, or the most sequences (at most [`DEFAULT_PARALLEL_CAP`], at least 1) whose
/// full contexts fit the room the budget leaves with that many sequences' step transients
/// (`room_for(n)`; `None`: no budget).
fn parallel(
    backend: &CpuBackend,
    asked: Option<usize>,
    room_for: &dyn Fn(usize) -> Option<u64>,
    cfg: &kiln_model::config::ModelConfig,
    o: &kiln_engine::EngineOptions,
) -> usize {
    if let Some(n) = asked {
        return n;
    }
    let per_sequence = sequence_peak(backend, cfg, o);
    (1..=DEFAULT_PARALLEL_CAP)
        .rev()
        .find(|&n| room_for(n).is_none_or(|room| room >= n as u64 * per_sequence))
        .unwrap_or(1)
}
