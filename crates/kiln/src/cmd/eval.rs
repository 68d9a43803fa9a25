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
    }
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
    let text = if args.text.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(&args.text)
            .with_context(|| format!("reading {}", args.text.display()))?
    };
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
