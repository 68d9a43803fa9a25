//! `kiln train`: the `finetune` job's code run in the foreground, printing each metric.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln_lab::LabError;
use kiln_lab::Report;
use kiln_lab::finetune::config::FinetuneConfig;
use kiln_lab::finetune::run::finetune;
use serde_json::{Map, Value, json};

use crate::common::{resolve, set_threads};

/// `kiln train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The data: a folder with train.jsonl (and valid.jsonl), or one .jsonl file.
    pub data: PathBuf,
    /// The base model: a name, a .gguf file or a folder.
    #[arg(long, short = 'm')]
    pub model: String,
    /// The adapter folder to write.
    #[arg(long)]
    pub out: PathBuf,
    /// sft, dpo or orpo.
    #[arg(long)]
    pub method: Option<String>,
    /// LoRA rank.
    #[arg(long)]
    pub rank: Option<usize>,
    /// LoRA scale.
    #[arg(long)]
    pub scale: Option<f32>,
    /// Optimizer steps.
    #[arg(long)]
    pub iters: Option<u64>,
    /// Peak learning rate.
    #[arg(long)]
    pub learning_rate: Option<f64>,
    /// Examples per micro-batch.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Longest sequence kept.
    #[arg(long)]
    pub max_seq_length: Option<usize>,
    /// Seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// A JSON object with any other field of the job config (spec §8.3 names); the flags win.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Worker threads (default: all available cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

struct PrintReporter;

impl Report for PrintReporter {
    fn stage(&mut self, name: &str, _progress: f64, message: &str) -> Result<(), LabError> {
        eprintln!("{name}: {message}");
        Ok(())
    }

    fn metric(&mut self, m: Value) -> Result<(), LabError> {
        let f = |k: &str| m.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
        match m.get("kind").and_then(Value::as_str) {
            Some("train") => eprintln!(
                "step {:>5}  loss {:.4}  lr {:.2e}  grad_norm {:.3}  {:.1} tok/s",
                m["step"],
                f("loss"),
                f("learning_rate"),
                f("grad_norm"),
                f("tokens_per_sec")
            ),
            _ => eprintln!("step {:>5}  val_loss {:.4}", m["step"], f("loss")),
        }
        Ok(())
    }

    fn warn(&mut self, message: &str) {
        eprintln!("warning: {message}");
    }
}

/// The job config the flags and `--config` describe.
fn config_map(args: &TrainArgs) -> Result<Map<String, Value>> {
    let mut map = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            match serde_json::from_str(&text)
                .with_context(|| format!("--config {}", path.display()))?
            {
                Value::Object(m) => m,
                _ => bail!("--config {}: expected a JSON object", path.display()),
            }
        }
        None => Map::new(),
    };
    map.insert("model_dir".into(), json!(args.model));
    map.insert("data_dir".into(), json!(args.data));
    map.insert("adapter_path".into(), json!(args.out));
    let flags = [
        ("method", args.method.as_ref().map(|v| json!(v))),
        ("rank", args.rank.map(|v| json!(v))),
        ("scale", args.scale.map(|v| json!(v))),
        ("iters", args.iters.map(|v| json!(v))),
        ("learning_rate", args.learning_rate.map(|v| json!(v))),
        ("batch_size", args.batch_size.map(|v| json!(v))),
        ("max_seq_length", args.max_seq_length.map(|v| json!(v))),
        ("seed", args.seed.map(|v| json!(v))),
    ];
    for (k, v) in flags {
        if let Some(v) = v {
            map.insert(k.into(), v);
        }
    }
    Ok(map)
}

/// Runs `kiln train`.
pub fn run(args: TrainArgs) -> Result<()> {
    set_threads(args.threads)?;
    let cfg = FinetuneConfig::from_json(&config_map(&args)?).map_err(|e| match e {
        LabError::Config { field, reason } => anyhow::anyhow!("{}: {reason}", flag_of(&field)),
        other => anyhow::anyhow!(other),
    })?;
    if cfg.adapter_path.join("adapter_config.json").exists() {
        bail!(
            "--out: {} already holds an adapter",
            cfg.adapter_path.display()
        );
    }
    let model = resolve(&args.model)?;
    let report = finetune(&cfg, &model, &mut PrintReporter)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("wrote            {}", report.adapter_path.display());
    println!(
        "steps            {}{}",
        report.steps,
        if report.stopped { " (stopped)" } else { "" }
    );
    if let Some(l) = report.final_train_loss {
        println!("train loss       {l:.4}");
    }
    if let Some(l) = report.final_val_loss {
        println!(
            "val loss         {l:.4} (best {:.4})",
            report.best_val_loss.unwrap_or(l)
        );
    }
    println!("throughput       {:.1} tokens/s", report.tokens_per_sec);
    if let Some(b) = report.peak_rss_bytes {
        println!("peak RSS         {:.0} MiB", b as f64 / (1 << 20) as f64);
    }
    println!("time             {:.1} s", report.wall_secs);
    Ok(())
}

/// The command-line spelling of a config field.
fn flag_of(field: &str) -> String {
    match field {
        "model_dir" => "--model".into(),
        "data_dir" => "DATA".into(),
        "adapter_path" => "--out".into(),
        "method" | "rank" | "scale" | "iters" | "learning_rate" | "batch_size"
        | "max_seq_length" | "seed" => {
            format!("--{}", field.replace('_', "-"))
        }
        other => format!("--config field {other}"),
    }
}
