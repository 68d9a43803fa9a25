//! `kiln fit`: will this model run in this much memory, at what context, and how fast — from
//! file headers only (no tensor is read).

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln_engine::kv_scheme::memory::{self, FitParams, FitReport, MemoryBudget};
use kiln_model::files::ModelFiles;
use serde::Serialize;

/// `kiln fit`.
#[derive(Debug, Args)]
pub struct FitArgs {
    /// Model (as for `generate`).
    pub model: String,
    /// Context to evaluate (default: the model's, at most 4096, as `generate` uses).
    #[arg(long)]
    pub ctx: Option<usize>,
    #[command(flatten)]
    pub kv: crate::kv::KvArgs,
    /// Memory budget in GB (10^9 bytes); default: what this process may use (cgroup limit and
    /// MemAvailable, the smaller).
    #[arg(long)]
    pub memory_budget: Option<f64>,
    /// Worker threads the model will run with (each keeps its own attention buffers); default:
    /// every available core, as `generate` and `serve` use.
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Output<'a> {
    model: String,
    kv_scheme_label: String,
    #[serde(flatten)]
    report: &'a FitReport,
    budget_source: &'static str,
    default_budget: Option<MemoryBudget>,
}

/// A fit computed from file headers.
struct Computed {
    path: std::path::PathBuf,
    scheme: kiln_engine::kv_scheme::KvScheme,
    report: FitReport,
    budget_source: &'static str,
    default_budget: Option<MemoryBudget>,
}

/// Resolves the model and scheme and runs the memory model at `ctx` under the budget (`None`:
/// the process's room; `Ok(None)` when that cannot be read and no budget was given).
fn compute(
    model: &str,
    ctx: Option<usize>,
    kv: &crate::kv::KvArgs,
    budget: Option<(u64, &'static str)>,
    threads: usize,
) -> Result<Option<Computed>> {
    let path = crate::common::resolve(model)?;
    let files = ModelFiles::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let cfg = &files.config;
    let scheme = kv.resolve(&path, cfg)?;
    let ctx = match ctx {
        Some(0) => bail!("--ctx must be positive"),
        Some(n) => n,
        None => cfg.max_position_embeddings.min(4096),
    };
    let default_budget = memory::default_memory_budget();
    let Some((budget_bytes, budget_source)) = budget else {
        return Ok(None);
    };
    let backend = kiln_model::backend::cpu::CpuBackend::new(Default::default());
    let report = memory::fit(
        &backend,
        cfg,
        &scheme,
        FitParams {
            weight_bytes: files.tensors().total_tensor_bytes(),
            largest_tensor_bytes: files.tensors().largest_tensor_bytes(),
            ctx,
            chunk: memory::DEFAULT_PREFILL_CHUNK,
            budget_bytes,
            threads,
        },
    );
    Ok(Some(Computed {
        path,
        scheme,
        report,
        budget_source,
        default_budget,
    }))
}

/// `--memory-budget` in bytes with where it came from, else the process's room (`None` when
/// that cannot be read).
pub fn resolve_budget(budget_gb: Option<f64>) -> Result<Option<(u64, &'static str)>> {
    match budget_gb {
        Some(gb) if gb.is_finite() && gb > 0.0 => Ok(Some(((gb * 1e9) as u64, "--memory-budget"))),
        Some(gb) => bail!("--memory-budget must be a positive number of GB, got {gb}"),
        None => Ok(memory::default_memory_budget()
            .map(|b| (b.bytes, "process (cgroup room and MemAvailable)"))),
    }
}

/// The fit of `model` (with the server's runtime flags) in `room` bytes of a budget from
/// `source`, without refusing: the server's model pool decides what a short room means.
pub fn admission_in(
    model: &str,
    rt: &crate::cli::RuntimeArgs,
    room: u64,
    source: &'static str,
) -> Result<kiln_server::MemoryAdmission> {
    let threads = rt.threads.unwrap_or_else(crate::common::available_threads);
    let c = compute(model, rt.ctx, &rt.kv, Some((room, source)), threads)?
        .context("the memory model gave no fit")?;
    Ok(kiln_server::MemoryAdmission {
        budget_source: source.to_string(),
        fit: c.report,
    })
}

/// The server's memory admission (spec §6.7): with `--memory-budget`, a model that cannot
/// serve one token is refused here, before loading, with the numbers; the safe context bounds
/// every request.
pub fn admission(
    model: &str,
    rt: &crate::cli::RuntimeArgs,
    budget_gb: Option<f64>,
) -> Result<Option<kiln_server::MemoryAdmission>> {
    let threads = rt.threads.unwrap_or_else(crate::common::available_threads);
    let Some(c) = compute(model, rt.ctx, &rt.kv, resolve_budget(budget_gb)?, threads)? else {
        tracing::warn!("cannot read this machine's available memory: memory admission is off");
        return Ok(None);
    };
    let r = &c.report;
    if budget_gb.is_some() && r.max_safe_context < 1 {
        let gb = |b: u64| b as f64 / 1e9;
        bail!(
            "model does not fit the memory budget of {:.3} GB: weights {:.3} GB + runtime {:.3} GB + prefill transient {:.3} GB leave no room for one token of KV ({} B per token under {}); loading peaks at {:.3} GB",
            gb(r.budget_bytes),
            gb(r.weights_bytes),
            gb(r.runtime_overhead_bytes),
            gb(r.transient_bytes),
            r.kv_dense_bytes_per_token,
            r.kv_scheme,
            gb(r.load_peak_bytes),
        );
    }
    Ok(Some(kiln_server::MemoryAdmission {
        budget_source: c.budget_source.to_string(),
        fit: c.report,
    }))
}

/// Runs `kiln fit`.
pub fn run(args: FitArgs) -> Result<()> {
    let threads = args
        .threads
        .unwrap_or_else(crate::common::available_threads);
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    let budget = resolve_budget(args.memory_budget)?;
    let Some(c) = compute(&args.model, args.ctx, &args.kv, budget, threads)? else {
        bail!("cannot read this machine's available memory; pass --memory-budget GB");
    };
    let (path, scheme, report, budget_source, default_budget) = (
        c.path,
        c.scheme,
        c.report,
        c.budget_source,
        c.default_budget,
    );
    let out = Output {
        model: path.display().to_string(),
        kv_scheme_label: scheme.label(),
        report: &report,
        budget_source,
        default_budget,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    let r = &report;
    println!("model              {}", out.model);
    println!(
        "kv scheme          {} ({})",
        out.kv_scheme_label, r.kv_scheme
    );
    println!("weights            {}", mb(r.weights_bytes));
    println!(
        "kv per token       {} B (dense {} B)",
        r.kv_bytes_per_token, r.kv_dense_bytes_per_token
    );
    println!("kv at ctx {:<8} {}", r.ctx, mb(r.kv_bytes));
    println!("prefill transient  {}", mb(r.transient_bytes));
    println!("runtime overhead   {}", mb(r.runtime_overhead_bytes));
    println!("load peak          {}", mb(r.load_peak_bytes));
    println!("total at ctx       {}", mb(r.total_bytes));
    println!(
        "budget             {} ({budget_source})",
        mb(r.budget_bytes)
    );
    println!("fits               {}", if r.fits { "yes" } else { "no" });
    println!(
        "max safe context   {} (model trained for {}; the memory alone allows {})",
        r.max_safe_context, r.max_position_embeddings, r.memory_context_limit
    );
    println!("decode (estimate)  {:.0} tok/s", r.predicted_decode_tok_s);
    Ok(())
}
