//! `kiln quantize`: the quantize job's code run in the foreground, with a progress bar.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_lab::LabError;
use kiln_lab::Report;
use kiln_lab::quantize::config::parse_gguf_type;
use kiln_lab::quantize::{OutputFormat, QuantizeConfig, quantize};

use crate::common::{resolve, set_threads};

/// `kiln quantize`.
#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// The model to quantize: a name, a .gguf file or a Hugging Face / MLX folder.
    pub source: String,
    /// The output: a .gguf file or a folder (must not exist).
    #[arg(long)]
    pub out: PathBuf,
    /// Output format.
    #[arg(long, default_value = "gguf", value_parser = ["gguf", "mlx"])]
    pub format: String,
    /// Uniform code width (4 or 8); in a mixed run, the width of modules left out.
    #[arg(long, default_value_t = 4)]
    pub bits: u32,
    /// MLX group size: 32, 64 or 128.
    #[arg(long, default_value_t = 64)]
    pub group_size: usize,
    /// GGUF type of a uniform run (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
    /// Q6_K); default Q4_K for 4 bits, Q8_0 for 8.
    #[arg(long = "type")]
    pub gguf_type: Option<String>,
    /// Mixed precision: stored bits per weight (scales included) not to exceed, chosen per
    /// module by measured KL sensitivity.
    #[arg(long)]
    pub target_bpw: Option<f64>,
    /// Mixed precision: the widths to choose from (default 2,3,4,5,6,8).
    #[arg(long, value_delimiter = ',')]
    pub candidate_bits: Option<Vec<u32>>,
    /// Calibration text or JSONL (`text` / `messages` records); default: built in.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Calibration chunks.
    #[arg(long, default_value_t = 2)]
    pub n_calibration: usize,
    /// Tokens per calibration chunk.
    #[arg(long, default_value_t = 128)]
    pub seq_len: usize,
    /// Mixed precision: reuse the sensitivity of an earlier run (its `--json` report or
    /// `optiq_metadata.json`) instead of measuring.
    #[arg(long)]
    pub sensitivity_from: Option<PathBuf>,
    /// Mixed precision: give the first and last blocks optiq's priority (true/false; default:
    /// when they are at most a quarter of the blocks).
    #[arg(long)]
    pub protect_boundary_blocks: Option<bool>,
    /// Worker threads (default: all available cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

struct BarReporter {
    bar: ProgressBar,
}

impl Report for BarReporter {
    fn stage(&mut self, name: &str, progress: f64, message: &str) -> Result<(), LabError> {
        self.bar.set_position((progress * 1000.0) as u64);
        self.bar.set_message(format!("{name}: {message}"));
        Ok(())
    }

    fn warn(&mut self, message: &str) {
        self.bar.suspend(|| eprintln!("warning: {message}"));
    }
}

/// A config error in command-line terms: the flag, not the job-config field.
fn cli_error(e: LabError) -> anyhow::Error {
    match e {
        LabError::Config { field, reason } => anyhow::anyhow!("{}: {reason}", flag_of(&field)),
        other => anyhow::anyhow!(other),
    }
}

/// The command-line spelling of a config field.
fn flag_of(field: &str) -> String {
    match field {
        "model_id" => "SOURCE".into(),
        "out_dir" => "--out".into(),
        "gguf_type" => "--type".into(),
        other => format!("--{}", other.replace('_', "-")),
    }
}

/// Runs `kiln quantize`.
pub fn run(args: QuantizeArgs) -> Result<()> {
    set_threads(args.threads)?;
    let format = match args.format.as_str() {
        "mlx" => OutputFormat::Mlx,
        _ => OutputFormat::Gguf,
    };
    if args.gguf_type.is_some() && format != OutputFormat::Gguf {
        bail!("--type applies to --format gguf");
    }
    let source = resolve(&args.source)?;
    let mut cfg = QuantizeConfig::new(source, args.out.clone(), format);
    cfg.bits = args.bits;
    cfg.group_size = args.group_size;
    cfg.gguf_type =
        (args.gguf_type.as_deref().map(parse_gguf_type).transpose()).map_err(cli_error)?;
    cfg.target_bpw = args.target_bpw;
    cfg.candidate_bits = args.candidate_bits.clone();
    cfg.calibration = args.calibration.clone();
    cfg.n_calibration = args.n_calibration;
    cfg.seq_len = args.seq_len;
    cfg.sensitivity_from = args.sensitivity_from.clone();
    cfg.protect_boundary_blocks = args.protect_boundary_blocks;
    cfg.validate().map_err(cli_error)?;
    let bar = ProgressBar::new(1000);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {percent:>3}% {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut rep = BarReporter { bar };
    let report = quantize(&cfg, &mut rep);
    rep.bar.finish_and_clear();
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("wrote            {}", report.output.display());
    println!("format           {}", report.format);
    println!(
        "bits per weight  {:.3} (quantized tensors, scales included)",
        report.achieved_bpw
    );
    println!("size             {} bytes", report.file_bytes);
    if let Some(a) = &report.allocation {
        let mut counts = std::collections::BTreeMap::new();
        for (_, b) in a {
            *counts.entry(*b).or_insert(0usize) += 1;
        }
        let parts: Vec<String> = counts.iter().map(|(b, n)| format!("{n}×{b}-bit")).collect();
        println!("allocation       {}", parts.join(", "));
        println!("sensitivity      {:.1} s", report.sensitivity_secs);
    }
    println!("time             {:.1} s", report.total_secs);
    Ok(())
}
