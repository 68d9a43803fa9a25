//! `kiln serve` (and `kiln` with no arguments): the HTTP server.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, FromArgMatches};
use kiln_jobs::{HostConfig, JobHost, JobPaths, JobPolicy};
use kiln_server::models::{Candidate, KeepAlive, Loader, PoolSettings};
use kiln_server::{Extensions, Models, ServerConfig, StartGate};

use crate::cli::RuntimeArgs;
use crate::common::set_threads;

mod loader;
use loader::ServeLoader;

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
    /// Most models loaded at once: a request for another model unloads the least recently used
    /// idle one first. Requests name models by their `model` field (`GET /v1/models`).
    #[arg(long, default_value_t = 3)]
    pub models_max: usize,
    /// How long a model loaded by a request stays loaded once idle (`5m`, `1h`, `30s`, seconds;
    /// 0 unloads after each request, negative keeps it). A request's `keep_alive` overrides it.
    /// The model named here stays loaded unless evicted for room or a request sets its
    /// keep_alive.
    #[arg(long, default_value = "5m", value_parser = parse_keep_alive)]
    pub keep_alive: KeepAlive,
    /// How embeddings are normalized, as llama-server numbers it: -1 none, 0 max-abs to int16,
    /// 1 taxicab, 2 euclidean, p > 2 p-norm.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
    pub embd_normalize: i32,
    /// Most inputs one embeddings request may carry; more is a 400.
    #[arg(long, default_value_t = kiln_server::embeddings::DEFAULT_MAX_BATCH_INPUTS)]
    pub max_batch_inputs: usize,
    /// Seconds a request for a model waits for busy models to free the room or seat it needs
    /// before it gets a 503.
    #[arg(long, default_value_t = 120.0)]
    pub model_wait: f64,
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
    if args.max_batch_inputs == 0 {
        bail!("--max-batch-inputs must be at least 1");
    }
    if args.models_max == 0 {
        bail!("--models-max must be at least 1");
    }
    if !(args.model_wait >= 0.0 && args.model_wait <= 86_400.0) {
        bail!("--model-wait must be a number of seconds in [0, 86400]");
    }
    let started = Instant::now();
    set_threads(args.runtime.threads)?;
    // Admission is decided from file headers, before any weight is read: a model that cannot
    // serve one token in --memory-budget stops the server here, with the numbers.
    crate::cmd::fit::admission(&args.model, &args.runtime, args.memory_budget)?;
    let budget = crate::cmd::fit::resolve_budget(args.memory_budget)?;
    if budget.is_none() {
        tracing::warn!("cannot read this machine's available memory: memory admission is off");
    }
    let path = crate::common::resolve(&args.model)?;
    let id = loader::model_id(&path, &args.model);
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
        embd_normalize: Some(args.embd_normalize),
        max_batch_inputs: args.max_batch_inputs,
        adapter_dirs: vec![
            args.adapters_dir
                .clone()
                .unwrap_or_else(|| kiln_hub::cache_dir().join("adapters")),
        ],
    };
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
    let gate: Arc<dyn StartGate> = Arc::new(JobGate { jobs: jobs.clone() });
    let startup = Candidate {
        id: id.clone(),
        path: path.clone(),
    };
    let serve_loader = ServeLoader {
        runtime: args.runtime.clone(),
        batch_tokens: args.batch_tokens,
        parallel: args.parallel,
        queue: args.queue,
        prompt_cache_bytes: args.prompt_cache_bytes,
        budget,
        shared: args.models_max > 1,
        gate,
        startup: startup.clone(),
        startup_spec: args.model.clone(),
        adapters: args.adapters.clone(),
        default_adapter: args.default_adapter.clone(),
    };
    let model = serve_loader
        .load(&startup, budget.map(|(b, _)| b))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!(
        "kiln: loaded {} in {:.2}s (weights {:.2}s), context {} tokens",
        path.display(),
        started.elapsed().as_secs_f64(),
        model.info.load_secs,
        model.info.context_len
    );
    let settings = PoolSettings {
        budget_bytes: budget.map(|(b, _)| b),
        models_max: args.models_max,
        keep_alive: args.keep_alive,
        room_wait: Duration::from_secs_f64(args.model_wait),
    };
    let models = Arc::new(Models::new(Arc::new(serve_loader), settings, id.clone()));
    let aliases = (args.model != id).then(|| args.model.clone());
    models.insert(
        model,
        path.clone(),
        aliases.into_iter().collect(),
        KeepAlive::Forever,
    );
    let served = served_entry(&path, &id);
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
        kiln_server::serve_with(listener, models, config, extensions, shutdown)
            .await
            .context("serving")?;
        eprintln!("kiln: stopped");
        Ok(())
    })
}

/// `--keep-alive`'s value.
fn parse_keep_alive(v: &str) -> std::result::Result<KeepAlive, String> {
    KeepAlive::parse(v).map_err(|e| e.to_string().replacen("keep_alive", "--keep-alive", 1))
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

/// `--batch-tokens`' default: prefill runs as fast per token in forwards of 64 to 512 tokens,
/// and smaller steps let running sequences decode sooner; 256 had the best TTFT p90 at 8 and 32
/// clients (docs/benchmarks.md, "Continuous batching").
const DEFAULT_BATCH_TOKENS: usize = 256;

/// The most `--parallel` accepts: each slot reserves (not commits) a full context of KV.
const MAX_PARALLEL: usize = 1024;

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
