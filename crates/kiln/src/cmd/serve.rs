//! `kiln serve` (and `kiln` with no arguments): the HTTP server.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, FromArgMatches};
use kiln_jobs::{HostConfig, JobHost, JobPaths, JobPolicy};
use kiln_model::backend::Backend;
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_server::{Extensions, Gateway, ModelInfo, ServerConfig, StartGate};

use crate::cli::RuntimeArgs;
use crate::common::{load_engine_with, set_threads};

/// `kiln serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model: a name (`smollm2`), a .gguf file, a Hugging Face folder or an `org/name` in the HF cache.
    #[arg(default_value = "smollm2")]
    pub model: String,
    /// Address to bind (loopback by default; anything else exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 picks a free one; the URL is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require this key as `Authorization: Bearer` or `x-api-key` (also `KILN_API_KEY`).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Default `max_tokens` when a request sets none (capped by the context left).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Default temperature (after the request's, before generation_config.json's).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Default top-p.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Default top-k.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Byte cap of the prompt cache: KV snapshots of earlier conversations, LRU (0 disables
    /// every prefix reuse).
    #[arg(long, default_value_t = 2_000_000_000)]
    pub prompt_cache_bytes: u64,
    /// Allow cross-origin requests from this origin (`*` for any); CORS is off without it.
    #[arg(long)]
    pub cors_origin: Option<String>,
    /// Requests that may wait beyond the running batch before new ones get 503.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Most sequences generating at once, each in its own KV slot (continuous batching).
    /// Default: as many full-context sequences as the memory budget holds, at most 32.
    #[arg(long)]
    pub parallel: Option<usize>,
    /// Most tokens one forward computes: every running sequence's next token, then prompt
    /// chunks up to this (prompt chunks are never longer).
    #[arg(long, default_value_t = DEFAULT_BATCH_TOKENS)]
    pub batch_tokens: usize,
    /// How heavy lab jobs share the CPU with inference: `exclusive` makes new generations wait
    /// while a heavy job runs (the cores are the same); `shared` lets both run.
    #[arg(long, default_value = "exclusive")]
    pub job_policy: JobPolicy,
    /// Memory the server may use, in GB (10^9 bytes): a model that cannot serve one token in it
    /// is refused at load, and requests beyond the safe context it leaves get a 400. Default:
    /// what this process may use (cgroup limit and MemAvailable, the smaller).
    #[arg(long)]
    pub memory_budget: Option<f64>,
    /// Seconds a connection has to send a complete request head, on a new connection and
    /// between requests on a kept-alive one; a slow or idle connection is closed after it.
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's whole body once its head has arrived (408).
    #[arg(long, default_value_t = 60.0)]
    pub body_timeout: f64,
    /// Connections served at once; a connection beyond them is answered 503 and closed.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Mount a LoRA adapter folder at start, as NAME (or, given a bare PATH, as the folder's
    /// name); repeatable. Requests pick one with their `adapter` field; the first given is the
    /// default of requests that name none (see --default-adapter). A folder that does not load
    /// or fit the model stops the server from starting.
    #[arg(long = "adapter", value_name = "NAME=PATH", value_parser = parse_adapter_arg)]
    pub adapters: Vec<(String, std::path::PathBuf)>,
    /// The adapter requests without an `adapter` field run with: an id, several joined with
    /// `+`, or `none` for the base model. Default: the first --adapter, else none.
    #[arg(long, value_name = "ID|none")]
    pub default_adapter: Option<String>,
    /// The folder whose adapter subfolders `GET /v1/adapters/available` lists. Default:
    /// `<cache>/adapters`, where fine-tune jobs write theirs.
    #[arg(long, value_name = "DIR")]
    pub adapters_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

impl ServeArgs {
    /// The arguments of a bare `kiln serve`.
    pub fn defaults() -> Result<Self> {
        let cmd = <Self as Args>::augment_args(clap::Command::new("serve"));
        Ok(Self::from_arg_matches(
            &cmd.try_get_matches_from(["serve"])?,
        )?)
    }
}

/// Loads the model, then serves until SIGINT/SIGTERM, draining in-flight streams.
pub fn run(args: ServeArgs) -> Result<()> {
    if args.queue == 0 {
        bail!("--queue must be at least 1");
    }
    if args.parallel == Some(0) || args.parallel.is_some_and(|n| n > MAX_PARALLEL) {
        bail!("--parallel must be between 1 and {MAX_PARALLEL}");
    }
    if !(1..=65_536).contains(&args.batch_tokens) {
        bail!("--batch-tokens must be between 1 and 65536");
    }
    let limits = connection_limits(&args)?;
    // Bad sampling defaults would fail every request; refuse them up front.
    let defaults = kiln_engine::sampler::SamplingParams {
        temperature: args.temperature.unwrap_or(0.0),
        top_p: args.top_p.unwrap_or(0.0),
        ..Default::default()
    };
    defaults
        .validate()
        .map_err(|e| anyhow::anyhow!("--{}", e.to_string().replace('_', "-")))?;
    if args.max_tokens == Some(0) {
        bail!("--max-tokens must be at least 1");
    }
    let started = Instant::now();
    set_threads(args.runtime.threads)?;
    // Admission is decided from file headers, before any weight is read.
    let memory = crate::cmd::fit::admission(&args.model, &args.runtime, args.memory_budget)?;
    let threads = args
        .runtime
        .threads
        .unwrap_or_else(crate::common::available_threads);
    let mut cache_cap = args.prompt_cache_bytes;
    // What the memory model bills for the backend the engine will run on.
    let figures = CpuBackend::new(CpuOptions {
        dense: args.runtime.dense,
    });
    let mut engine = load_engine_with(&args.model, &args.runtime, |o, cfg| {
        o.batch_tokens = args.batch_tokens;
        // A prompt chunk larger than a step's budget would make every prefill step overrun it.
        o.prefill_chunk = o.prefill_chunk.min(args.batch_tokens);
        let shape = o.clone();
        let room_for = |n: usize| {
            memory
                .as_ref()
                .map(|m| kv_room(&figures, &m.fit, cfg, &shape, args.batch_tokens, n, threads))
        };
        o.slots = parallel(&figures, args.parallel, &room_for, cfg, &shape);
        o.kv_budget_bytes = room_for(o.slots);
        // The prompt cache lives inside the same room.
        cache_cap = cache_cap.min(o.kv_budget_bytes.unwrap_or(u64::MAX));
        Ok(())
    })?;
    engine.set_prompt_cache_bytes(usize::try_from(cache_cap).unwrap_or(usize::MAX));
    let lane = engine.lane().clone();
    eprintln!(
        "kiln: {} sequences at once, {} tokens per step{}",
        engine.scheduler_stats().max_sequences,
        args.batch_tokens,
        lane.solo_reason
            .map(|r| format!(" (one at a time: {r})"))
            .unwrap_or_default()
    );
    let path = engine.model().path.clone();
    let id = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| args.model.clone());
    let mut info = ModelInfo::from_engine(&engine, id);
    if let Some(m) = &memory {
        eprintln!(
            "kiln: memory budget {:.2} GB ({}): max safe context {} tokens",
            m.fit.budget_bytes as f64 / 1e9,
            m.budget_source,
            m.fit.max_safe_context
        );
    }
    info.memory = memory;
    eprintln!(
        "kiln: loaded {} in {:.2}s (weights {:.2}s), context {} tokens",
        path.display(),
        started.elapsed().as_secs_f64(),
        info.load_secs,
        info.context_len
    );
    let config = ServerConfig {
        api_key: args
            .api_key
            .clone()
            .or_else(|| std::env::var("KILN_API_KEY").ok())
            .filter(|k| !k.is_empty()),
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        prompt_cache_bytes: args.prompt_cache_bytes,
        cors_origin: args.cors_origin.clone(),
        body_limit: kiln_server::DEFAULT_BODY_LIMIT,
        limits,
        adapters: None,
        adapter_dirs: vec![
            args.adapters_dir
                .clone()
                .unwrap_or_else(|| kiln_hub::cache_dir().join("adapters")),
        ],
    };
    let registry = mount_adapters(&args, &engine.model().config)?;
    let config = ServerConfig {
        adapters: Some(registry),
        ..config
    };
    let reuse_prefix = args.prompt_cache_bytes > 0;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let loopback = kiln_lab::dataset::job::LoopbackCell::default();
    let jobs = {
        let _guard = rt.enter();
        let mut cfg = HostConfig::new(
            JobPaths::from_env()?,
            super::jobs::registry(loopback.clone()),
        )?;
        cfg.policy = args.job_policy;
        JobHost::open(cfg).context("opening the job store")?
    };
    let admission: Arc<dyn StartGate> = Arc::new(JobGate { jobs: jobs.clone() });
    let gateway = Arc::new(Gateway::start_with(
        engine,
        args.queue,
        Some(admission),
        reuse_prefix,
    ));
    let served = served_entry(&path, &info.id);
    let extensions = job_extensions(&jobs, served);
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        let _ = loopback.set(kiln_lab::dataset::Loopback {
            url: format!("http://{}", loopback_addr(addr)),
            api_key: config.api_key.clone(),
        });
        if !addr.ip().is_loopback() && config.api_key.is_none() {
            eprintln!("kiln: warning: serving on {addr} without --api-key; anyone who can reach it can use it");
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}")?;
        writeln!(out, "chat page: http://{addr}/  (ready in {:.2}s)", started.elapsed().as_secs_f64())?;
        out.flush()?;
        drop(out);
        // The job host closes inside the shutdown future: an open SSE tail of a running job
        // would otherwise keep connection draining waiting.
        let shutdown = async move {
            kiln_server::shutdown_signal().await;
            jobs.close().await;
        };
        kiln_server::serve_with(listener, info, gateway, config, extensions, shutdown)
            .await
            .context("serving")?;
        eprintln!("kiln: stopped");
        Ok(())
    })
}

/// `--adapter`'s value: `NAME=PATH`, or a bare `PATH` named by its last component.
fn parse_adapter_arg(v: &str) -> std::result::Result<(String, std::path::PathBuf), String> {
    let (name, path) = match v.split_once('=') {
        Some((name, path)) => (name.to_string(), path),
        None => {
            let p = std::path::Path::new(v.trim_end_matches('/'));
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| format!("{v:?} has no folder name; write NAME=PATH"))?;
            (name, v)
        }
    };
    if path.is_empty() {
        return Err(format!("no path after {name}= (expected NAME=PATH)"));
    }
    kiln_model::lora::check_adapter_id(&name).map_err(|e| format!("{e} (expected NAME=PATH)"))?;
    Ok((name, kiln_engine::adapters::expand_path(path)))
}

/// The adapter registry of the served model with every `--adapter` mounted (a failure names
/// the flag) and the default of `--default-adapter` (else the first `--adapter`).
fn mount_adapters(
    args: &ServeArgs,
    cfg: &kiln_model::config::ModelConfig,
) -> Result<Arc<kiln_engine::AdapterRegistry>> {
    let registry = Arc::new(kiln_engine::AdapterRegistry::new(cfg.clone()));
    for (i, (id, path)) in args.adapters.iter().enumerate() {
        if args.adapters[..i].iter().any(|(other, _)| other == id) {
            bail!("--adapter {id}: the name is given twice");
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
    let default = match (&args.default_adapter, args.adapters.first()) {
        (Some(spec), _) => Some(spec.clone()),
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
    Ok(registry)
}

/// `--batch-tokens`' default: prefill runs as fast per token in forwards of 64 to 512 tokens,
/// and smaller steps let running sequences decode sooner; 256 had the best TTFT p90 at 8 and 32
/// clients (docs/benchmarks.md, "Continuous batching").
const DEFAULT_BATCH_TOKENS: usize = 256;

/// The most `--parallel` accepts: each slot reserves (not commits) a full context of KV.
const MAX_PARALLEL: usize = 1024;

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
    let geo = kiln_engine::kv_scheme::memory::KvGeometry::new(
        cfg,
        &o.kv_scheme,
        backend.memory_profile().caps_sliding,
    );
    let per_sequence = geo.peak_bytes_at(o.context_len, o.prefill_chunk).max(1);
    (1..=DEFAULT_PARALLEL_CAP)
        .rev()
        .find(|&n| room_for(n).is_none_or(|room| room >= n as u64 * per_sequence))
        .unwrap_or(1)
}

/// `--job-policy exclusive`: no new generation starts while a heavy job holds or waits for
/// the execution lease; running ones finish, then the job runs.
struct JobGate {
    jobs: JobHost,
}

impl StartGate for JobGate {
    fn try_start(&self) -> Option<Box<dyn Send>> {
        self.jobs
            .try_inference_gate()
            .map(|p| Box::new(p) as Box<dyn Send>)
    }
}

/// Where this process reaches its own listener: the bound address, or loopback for a
/// wildcard bind.
fn loopback_addr(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            (std::net::Ipv4Addr::LOCALHOST, addr.port()).into()
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            (std::net::Ipv6Addr::LOCALHOST, addr.port()).into()
        }
        _ => addr,
    }
}

/// The served model as the lab pages list it.
fn served_entry(path: &std::path::Path, name: &str) -> kiln_lab::http::ModelEntry {
    kiln_lab::http::ModelEntry {
        name: name.to_string(),
        path: path.to_path_buf(),
        // A folder's size is the cache listing's business; the served file's is one stat.
        size_bytes: std::fs::metadata(path).map_or(0, |m| if m.is_file() { m.len() } else { 0 }),
        kind: if path.is_dir() { "folder" } else { "file" },
    }
}

/// The lab's view of the model cache.
fn cached_models() -> Vec<kiln_lab::http::ModelEntry> {
    kiln_hub::list_cached()
        .into_iter()
        .map(|m| kiln_lab::http::ModelEntry {
            kind: if m.path.is_dir() { "folder" } else { "file" },
            name: m.name,
            path: m.path,
            size_bytes: m.size_bytes,
        })
        .collect()
}

/// The jobs API, the lab's routes and pages, the `jobs` section of `/stats`, and the job-gate
/// response header.
fn job_extensions(jobs: &JobHost, served: kiln_lab::http::ModelEntry) -> Extensions {
    let (for_stats, for_note) = (jobs.clone(), jobs.clone());
    let lab = kiln_lab::http::router(kiln_lab::http::LabState {
        jobs: jobs.clone(),
        models: Arc::new(cached_models),
        served,
        resolve: Arc::new(|spec: &str| kiln_hub::resolve_model(spec, false).ok().map(|m| m.path)),
    });
    Extensions {
        open_paths: kiln_lab::http::OPEN_PATHS.to_vec(),
        router: Some(kiln_jobs::http::router(jobs.clone()).merge(lab)),
        routes: [kiln_jobs::http::ROUTES, kiln_lab::http::ROUTES].concat(),
        stats: vec![(
            "jobs".into(),
            Arc::new(move || serde_json::to_value(for_stats.status()).unwrap_or_default()),
        )],
        gate_note: Some(Arc::new(move || {
            let status = for_note.status();
            status.inference_gated.then(|| {
                format!(
                    "waiting for heavy job {}",
                    status.lease_holder.unwrap_or_default()
                )
            })
        })),
    }
}

/// The connection flags, checked: a timeout must be a positive number of seconds that a
/// `Duration` can hold, and at least one connection must be allowed.
fn connection_limits(args: &ServeArgs) -> Result<kiln_server::ConnectionLimits> {
    let secs = |flag: &str, v: f64| -> Result<Duration> {
        if !(v > 0.0 && v <= 86_400.0) {
            bail!("{flag} must be a number of seconds in (0, 86400], got {v}");
        }
        Ok(Duration::from_secs_f64(v))
    };
    if !(1..=1_000_000).contains(&args.max_connections) {
        bail!(
            "--max-connections must be between 1 and 1000000, got {}",
            args.max_connections
        );
    }
    Ok(kiln_server::ConnectionLimits {
        header_timeout: secs("--header-timeout", args.header_timeout)?,
        body_timeout: secs("--body-timeout", args.body_timeout)?,
        max_connections: args.max_connections,
    })
}
