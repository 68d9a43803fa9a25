//! Pieces the verbs share: logging, thread pools, model resolution and loading.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use kiln_engine::{Engine, EngineOptions, load_model};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};

use crate::cli::RuntimeArgs;

/// Sets up `tracing` to stderr; `RUST_LOG` wins over `-v`.
pub fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Number of cores this process may use.
pub fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Sizes the kernels' worker pool to `threads` (default: every available core).
pub fn set_threads(threads: Option<usize>) -> Result<()> {
    let n = threads.unwrap_or_else(available_threads);
    if n == 0 || n > 1024 {
        bail!("--threads must be between 1 and 1024, got {n}");
    }
    kiln_kernels::pool::set_threads(n);
    Ok(())
}

/// Resolves a model name or path, downloading the starter model if needed.
pub fn resolve(spec: &str) -> Result<PathBuf> {
    let resolved =
        kiln_hub::resolve_model(spec, true).with_context(|| format!("resolving model {spec:?}"))?;
    Ok(resolved.path)
}

/// Loads a model into an engine on the CPU backend.
pub fn load_engine(spec: &str, rt: &RuntimeArgs) -> Result<Engine<CpuBackend>> {
    load_engine_with(spec, rt, |_, _| Ok(()))
}

/// [`load_engine`], letting `tweak` set the engine's options (slots, budget) once the model's
/// config is known.
pub fn load_engine_with(
    spec: &str,
    rt: &RuntimeArgs,
    tweak: impl FnOnce(&mut EngineOptions, &kiln_model::config::ModelConfig) -> Result<()>,
) -> Result<Engine<CpuBackend>> {
    let path = resolve(spec)?;
    let backend = CpuBackend::new(CpuOptions { dense: rt.dense });
    let model =
        load_model(&backend, &path).with_context(|| format!("loading {}", path.display()))?;
    tracing::info!(path = %path.display(), secs = model.load_secs, "model loaded");
    let ctx = match rt.ctx {
        Some(0) => bail!("--ctx must be positive"),
        Some(n) => n,
        None => model.config.max_position_embeddings.min(4096),
    };
    let kv_scheme = rt.kv.resolve(&path, &model.config)?;
    tracing::info!(scheme = %kv_scheme.cache_key(), "KV cache");
    let mut options = EngineOptions {
        context_len: ctx,
        kv_scheme,
        ..EngineOptions::default()
    };
    tweak(&mut options, &model.config)?;
    Ok(Engine::new(backend, model, options)?)
}
