//! `kiln fit`: will this model run in this much memory, at what context, and how fast — from
//! file headers only (no tensor is read).

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln_engine::kv_scheme::memory::{self, FitParams, FitReport, MemoryBudget};
use kiln_engine::kv_scheme::{
    KvModelShape, KvQuantOverride, KvScheme, KvSchemeRequest, MissingConfig, TurboQuant,
    load_kv_config, resolve_kv_scheme,
};
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
    /// KV-cache scheme: off (dense f32), 4 or 8 (affine), config (the model's kv_config.json),
    /// turbo.
    #[arg(long, default_value = "off")]
    pub kv_quant: String,
    /// Affine group size for --kv-quant 4|8: 32, 64 (default) or 128.
    #[arg(long)]
    pub kv_group_size: Option<usize>,
    /// Cache length at which the cache is quantized (default 0).
    #[arg(long, allow_hyphen_values = true)]
    pub quantized_kv_start: Option<i64>,
    /// TurboQuant key bits (with --kv-quant turbo; default 8).
    #[arg(long)]
    pub turbo_k_bits: Option<u8>,
    /// TurboQuant value bits (with --kv-quant turbo; default 3).
    #[arg(long)]
    pub turbo_v_bits: Option<u8>,
    /// Memory budget in GB (10^9 bytes); default: what this process may use (cgroup limit and
    /// MemAvailable, the smaller).
    #[arg(long)]
    pub memory_budget: Option<f64>,
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

/// Parses `--kv-quant` and the options that go with it into a scheme request.
fn scheme_request<'a>(
    args: &FitArgs,
    config: Option<&'a [kiln_engine::kv_scheme::KvQuantSpec]>,
) -> Result<KvSchemeRequest<'a>> {
    let (kv_quant, turbo) = match args.kv_quant.as_str() {
        "off" => (KvQuantOverride::Off, None),
        "config" => (KvQuantOverride::Config, None),
        "turbo" => (
            KvQuantOverride::Off,
            Some(TurboQuant {
                k_bits: args.turbo_k_bits.unwrap_or(TurboQuant::DEFAULT.k_bits),
                v_bits: args.turbo_v_bits.unwrap_or(TurboQuant::DEFAULT.v_bits),
            }),
        ),
        other => match other.parse::<u8>() {
            Ok(bits) => (KvQuantOverride::Bits(bits), None),
            Err(_) => bail!("--kv-quant must be off, 4, 8, config or turbo, got {other:?}"),
        },
    };
    if turbo.is_none() && (args.turbo_k_bits.is_some() || args.turbo_v_bits.is_some()) {
        bail!("--turbo-k-bits and --turbo-v-bits apply only to --kv-quant turbo");
    }
    Ok(KvSchemeRequest {
        kv_quant: Some(kv_quant),
        turbo,
        config,
        // The user asked for `config` by name: a model without the file is an error.
        missing_config: MissingConfig::Error,
        quantized_kv_start: args.quantized_kv_start,
        kv_group_size: args.kv_group_size,
        ..KvSchemeRequest::default()
    })
}

/// Runs `kiln fit`.
pub fn run(args: FitArgs) -> Result<()> {
    let path = crate::common::resolve(&args.model)?;
    let files = ModelFiles::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let cfg = &files.config;
    let kv_config = load_kv_config(&path, cfg.num_layers)?;
    let scheme: KvScheme = resolve_kv_scheme(&scheme_request(&args, kv_config.as_deref())?)?;
    scheme.check_model(&KvModelShape::from_config(cfg), cfg.head_dim)?;
    let ctx = match args.ctx {
        Some(0) => bail!("--ctx must be positive"),
        Some(n) => n,
        None => cfg.max_position_embeddings.min(4096),
    };
    let default_budget = memory::default_memory_budget();
    let (budget_bytes, budget_source) = match args.memory_budget {
        Some(gb) if gb.is_finite() && gb > 0.0 => ((gb * 1e9) as u64, "--memory-budget"),
        Some(gb) => bail!("--memory-budget must be a positive number of GB, got {gb}"),
        None => match default_budget {
            Some(b) => (b.bytes, "process (cgroup room and MemAvailable)"),
            None => bail!("cannot read this machine's available memory; pass --memory-budget GB"),
        },
    };
    let report = memory::fit(
        cfg,
        &scheme,
        FitParams {
            weight_bytes: files.tensors().total_tensor_bytes(),
            ctx,
            chunk: memory::DEFAULT_PREFILL_CHUNK,
            budget_bytes,
            // `kiln generate`/`serve` run on every available core by default.
            threads: crate::common::available_threads(),
        },
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
        "max safe context   {} (model trained for {})",
        r.max_safe_context, r.max_position_embeddings
    );
    println!("decode (estimate)  {:.0} tok/s", r.predicted_decode_tok_s);
    Ok(())
}
