//! `kiln dataset TEMPLATE --input k=v … --out DIR`: the `dataset` job's templates run here;
//! the LLM templates call a running `kiln serve` (`--url`, `--api-key`).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln_lab::LabError;
use kiln_lab::Report;
use kiln_lab::dataset::{self, HttpChat, Loopback};
use serde_json::{Map, Value};

/// `kiln dataset`.
#[derive(Debug, Args)]
pub struct DatasetArgs {
    /// The template id; without one, the templates are listed.
    pub template: Option<String>,
    /// An input, `NAME=VALUE`; `NAME=@FILE` reads the value from a file. Repeat for each.
    #[arg(long = "input", short = 'i', value_name = "NAME=VALUE")]
    pub inputs: Vec<String>,
    /// The folder to write `train.jsonl` and `valid.jsonl` into.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The server the LLM templates call.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// That server's API key (default: `KILN_API_KEY`).
    #[arg(long, env = "KILN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// `model` of the LLM templates' requests.
    #[arg(long, default_value = "local")]
    pub model_name: String,
    /// `max_tokens` of each LLM request.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: u32,
    /// `temperature` of each LLM request.
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f64,
    /// Print JSON (the template list, or what was written).
    #[arg(long)]
    pub json: bool,
}

/// Progress lines on stderr.
struct Console;

impl Report for Console {
    fn stage(&mut self, name: &str, _progress: f64, message: &str) -> Result<(), LabError> {
        eprintln!("{name}: {message}");
        Ok(())
    }

    fn step(&mut self, done: usize, total: usize, what: &str) -> Result<(), LabError> {
        eprintln!("[{done}/{total}] {what}");
        Ok(())
    }

    fn warn(&mut self, message: &str) {
        eprintln!("warning: {message}");
    }
}

/// Runs `kiln dataset`.
pub fn run(args: DatasetArgs) -> Result<()> {
    let Some(template) = &args.template else {
        return list(args.json);
    };
    let Some(out) = &args.out else {
        bail!("--out DIR is required: the folder train.jsonl and valid.jsonl go into");
    };
    let inputs = parse_inputs(&args.inputs)?;
    let (def, inputs) = dataset::check(template, &inputs)?;
    for name in ["train.jsonl", "valid.jsonl"] {
        if out.join(name).exists() {
            bail!(
                "{} already holds {name}; choose another --out",
                out.display()
            );
        }
    }
    if !(1..=32768).contains(&args.max_tokens) || !(0.0..=2.0).contains(&args.temperature) {
        bail!("--max-tokens must be in 1..=32768 and --temperature in [0, 2]");
    }
    let mut client = HttpChat::new(Loopback {
        url: args.url.clone(),
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
    });
    client.model = args.model_name.clone();
    client.max_tokens = args.max_tokens;
    client.temperature = args.temperature;
    let llm = def.llm.then_some(&client as &dyn dataset::ChatClient);
    let written = dataset::build(&def, &inputs, out, llm, &mut Console)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&written)?);
    } else {
        println!(
            "Wrote {} rows to {} (train.jsonl {}, valid.jsonl {}).",
            written.rows,
            written.output_dir.display(),
            written.n_train,
            written.n_valid
        );
    }
    Ok(())
}

/// `NAME=VALUE` / `NAME=@FILE` pairs as the inputs object (every value a string; the
/// template's checks convert numbers).
fn parse_inputs(pairs: &[String]) -> Result<Map<String, Value>> {
    let mut map = Map::new();
    for pair in pairs {
        let Some((name, value)) = pair.split_once('=') else {
            bail!("--input {pair:?}: expected NAME=VALUE or NAME=@FILE");
        };
        let value = match value.strip_prefix('@') {
            Some(file) => std::fs::read_to_string(file)
                .with_context(|| format!("--input {name}=@{file}: reading the file"))?,
            None => value.to_string(),
        };
        if map
            .insert(name.trim().to_string(), Value::String(value))
            .is_some()
        {
            bail!("--input {name} is given twice");
        }
    }
    Ok(map)
}

fn list(json: bool) -> Result<()> {
    let templates = dataset::templates::all();
    if json {
        println!("{}", serde_json::to_string_pretty(&templates)?);
        return Ok(());
    }
    for t in templates {
        let llm = if t.llm {
            " (calls the served model)"
        } else {
            ""
        };
        println!("{:<22} {}{llm}", t.id, t.description);
        for f in &t.fields {
            let req = if f.required { " (required)" } else { "" };
            let default = f
                .default
                .as_ref()
                .map(|d| format!(" [default {d}]"))
                .unwrap_or_default();
            println!("    --input {}=…{req}{default}  {}", f.name, f.label);
        }
    }
    Ok(())
}
