//! `kiln eval`: measurements of a model against itself under another setting.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use kiln_engine::kv_scheme::{DenseDtype, KvScheme};

use crate::cli::RuntimeArgs;
use crate::common::{load_engine, set_threads};

/// `kiln eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(subcommand)]
    pub what: EvalCommand,
}

/// What to evaluate.
#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// KV-cache scheme quality: teacher-forced top-1 agreement and KL against a dense cache
    /// (f32 unless `--reference` says otherwise) over a text, and bytes per token.
    Kv(EvalKvArgs),
    /// A model against a reference model (e.g. a quantized file against its f16 source):
    /// teacher-forced mean / p99 KL, top-1 agreement and perplexity over a text, scored like
    /// llama-perplexity's `--kl-divergence`.
    Kl(EvalKlArgs),
}

/// `kiln eval kl`.
#[derive(Debug, Args)]
pub struct EvalKlArgs {
    /// The model scored (as for `generate`); it runs as `--dense` and the KV flags say.
    pub model: String,
    /// The reference model; it always runs on exact f32 weights and a dense f32 cache.
    #[arg(long)]
    pub reference: String,
    /// The text to teacher-force (a UTF-8 file; `-` reads standard input).
    #[arg(long)]
    pub text: PathBuf,
    /// Tokens per window (each from an empty cache; its second half is scored).
    #[arg(long, default_value_t = 512)]
    pub window: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// `kiln eval kv`.
#[derive(Debug, Args)]
pub struct EvalKvArgs {
    /// Model (as for `generate`).
    pub model: String,
    /// The text to teacher-force (a UTF-8 file; `-` reads standard input).
    #[arg(long)]
    pub text: PathBuf,
    /// Tokens per forward. The first chunk runs before the cache converts and is not scored.
    #[arg(long, default_value_t = 32)]
    pub chunk: usize,
    /// The dense cache compared against: f32 (default: exactly the activations), f16 or bf16
    /// (f16 is what llama-perplexity's `--kl-divergence` runs compare against).
    #[arg(long, default_value = "f32")]
    pub reference: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// Runs `kiln eval`.
pub fn run(args: EvalArgs) -> Result<()> {
    match args.what {
        EvalCommand::Kv(a) => kv(a),
        EvalCommand::Kl(a) => kl(a),
    }
}

fn read_text(path: &std::path::Path) -> Result<String> {
    if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }
}

fn kl(args: EvalKlArgs) -> Result<()> {
    if args.window < 4 {
        bail!("--window must be at least 4");
    }
    set_threads(args.runtime.threads)?;
    let text = read_text(&args.text)?;
    let ctx = |rt: &RuntimeArgs| RuntimeArgs {
        ctx: Some(rt.ctx.unwrap_or(args.window + 1).max(args.window + 1)),
        ..rt.clone()
    };
    let mut reference_rt = ctx(&args.runtime);
    reference_rt.dense = true;
    reference_rt.kv = crate::kv::KvArgs {
        kv_quant: Some("off".into()),
        kv_dtype: "f32".into(),
        ..crate::kv::KvArgs::default()
    };
    let mut reference = load_engine(&args.reference, &reference_rt)?;
    let mut test = load_engine(&args.model, &ctx(&args.runtime))?;
    let tokens = reference.model().tokenizer.encode(&text, false)?;
    let report = kiln_engine::eval::eval_kl(&mut reference, &mut test, &tokens, args.window)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "text             {} tokens, windows of {}, {} positions scored",
        report.tokens, report.window, report.positions
    );
    println!(
        "mean KL          {:.5} nats (p99 {:.4}, max {:.4})",
        report.mean_kl, report.p99_kl, report.max_kl
    );
    println!("top-1 agreement  {:.2}%", 100.0 * report.top1_agreement);
    println!(
        "perplexity       {:.4} (reference {:.4})",
        report.perplexity, report.reference_perplexity
    );
    Ok(())
}

fn kv(args: EvalKvArgs) -> Result<()> {
    if args.chunk == 0 {
        bail!("--chunk must be positive");
    }
    let Some(reference) = DenseDtype::parse(&args.reference) else {
        bail!(
            "--reference must be f32, f16 or bf16, got {:?}",
            args.reference
        );
    };
    set_threads(args.runtime.threads)?;
    let text = read_text(&args.text)?;
    let mut engine = load_engine(&args.model, &args.runtime)?;
    let tokens = engine.model().tokenizer.encode(&text, false)?;
    if tokens.len() <= args.chunk {
        bail!(
            "the text has {} tokens; it needs more than one --chunk ({})",
            tokens.len(),
            args.chunk
        );
    }
    if tokens.len() >= engine.options().context_len {
        bail!(
            "the text has {} tokens; the context holds {} (raise --ctx)",
            tokens.len(),
            engine.options().context_len
        );
    }
    let scheme = engine.options().kv_scheme.clone();
    let report = engine.eval_kv(&tokens, KvScheme::dense(reference), scheme, args.chunk)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let c = &report.vs_dense;
    println!("kv scheme        {} ({})", report.label, report.kv_scheme);
    println!(
        "text             {} tokens, {} per forward, {} positions scored",
        report.tokens, report.chunk, c.positions
    );
    println!("top-1 agreement  {:.2}%", 100.0 * c.top1_agreement);
    println!(
        "mean KL          {:.5} nats (max {:.4})",
        c.mean_kl, c.max_kl
    );
    println!(
        "bytes per token  {:.0} (dense {} {:.0}, {:.2}x smaller)",
        report.bytes_per_token,
        reference.name(),
        report.dense_bytes_per_token,
        report.dense_bytes_per_token / report.bytes_per_token.max(1.0)
    );
    Ok(())
}
