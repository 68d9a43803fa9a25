//! Command-line grammar.

use clap::{Args, Parser, Subcommand};

/// kiln: run local language models fast, exactly and within your memory.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about, long_about = None)]
pub struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate text from a prompt.
    Generate(GenerateArgs),
    /// Embed texts with an embedding model (one line of numbers per text, or --json).
    Embed(crate::cmd::embed::EmbedArgs),
    /// Measure prompt processing (ppN) and generation (tgN) speed, llama-bench style.
    Bench(BenchArgs),
    /// List the models in kiln's cache and the Hugging Face cache.
    Models(ModelsArgs),
    /// Download a model (default: the starter model, SmolLM2-135M-Instruct Q4_1).
    Pull(PullArgs),
    /// Will a model fit in memory: weights, KV cache, transient, max safe context, est. tok/s.
    Fit(crate::cmd::fit::FitArgs),
    /// Quantize a model to GGUF or MLX, uniformly or by measured per-layer sensitivity.
    Quantize(crate::cmd::quantize::QuantizeArgs),
    /// Fine-tune a LoRA adapter (SFT, DPO or ORPO) on a JSONL dataset.
    Train(crate::cmd::train::TrainArgs),
    /// Build a training dataset from a template (spec §9); without a template, list them.
    Dataset(crate::cmd::dataset::DatasetArgs),
    /// Merge a LoRA adapter into its base model, in the base's quantization layout.
    Fuse(crate::cmd::fuse::FuseArgs),
    /// Evaluate a model: under another KV scheme (`eval kv`) or against a reference model (`eval kl`).
    Eval(crate::cmd::eval::EvalArgs),
    /// Serve the model over OpenAI- and Anthropic-compatible HTTP with a chat page (the default verb).
    Serve(crate::cmd::serve::ServeArgs),
    /// List, show, follow, cancel and submit lab jobs on a running server.
    Jobs(crate::cmd::jobs::JobsArgs),
    /// Run one heavy job (internal: the server's job host starts `kiln __job <id>`).
    #[command(name = "__job", hide = true)]
    Job(crate::cmd::jobs::ChildArgs),
}

/// Options shared by every verb that runs a model.
#[derive(Debug, Args, Clone)]
pub struct RuntimeArgs {
    /// Worker threads (default: all available cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Context length: positions the KV cache holds (default: the model's, at most 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Dequantize every weight to f32 at load (exact but slower; for checking accuracy).
    #[arg(long)]
    pub dense: bool,
    #[command(flatten)]
    pub kv: crate::kv::KvArgs,
}

/// `kiln generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model: a name (`smollm2`), a .gguf file, a Hugging Face folder or an `org/name` in the HF cache.
    pub model: String,
    /// The prompt (raw text, or the user message with --chat).
    pub prompt: String,
    /// Render the prompt as a user message through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy). Default: generation_config.json, else 0.7.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Nucleus sampling threshold (0 or 1 = off).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Drop tokens below min_p × the best probability (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Repetition penalty (1 or 0 = off).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// Presence penalty.
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty.
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed; the same seed reproduces a run.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop generating at this string (repeatable); it is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Generate with this LoRA adapter folder (PEFT or mlx-lm layout) beside the base weights;
    /// repeat to stack adapters (their deltas add in order).
    #[arg(long = "adapter", value_name = "PATH")]
    pub adapters: Vec<std::path::PathBuf>,
    /// Constrain the output to JSON matching the JSON schema in this file (structured output).
    #[arg(long, value_name = "PATH")]
    pub json_schema: Option<std::path::PathBuf>,
    /// Print timing and memory to stderr.
    #[arg(long)]
    pub stats: bool,
    /// Print one JSON object (text, tokens, finish reason, stats) instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// `kiln bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Model (as for `generate`).
    #[arg(default_value = "smollm2")]
    pub model: String,
    /// Prompt tokens of the prefill test (0 skips it).
    #[arg(short = 'p', long = "prompt-tokens", default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens of the generation test (0 skips it).
    #[arg(short = 'n', long = "gen-tokens", default_value_t = 128)]
    pub gen_tokens: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// Thread counts to test, comma-separated (default: all cores).
    #[arg(long, short = 't', value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Dequantize every weight to f32 at load.
    #[arg(long)]
    pub dense: bool,
    /// Cache positions filled before each test (llama-bench's -d): decode speed at depth.
    #[arg(short = 'd', long = "depth", default_value_t = 0)]
    pub depth: usize,
    /// Sequences decoding together in each generation step (`tgN xB`: B rows per forward,
    /// one KV slot each), comma-separated for several runs; tokens per second count all rows.
    #[arg(
        short = 'b',
        long = "batch",
        value_delimiter = ',',
        default_value = "1"
    )]
    pub batch: Vec<usize>,
    #[command(flatten)]
    pub kv: crate::kv::KvArgs,
    /// Run every forward with this LoRA adapter folder (PEFT or mlx-lm layout), beside the
    /// base weights as `kiln serve --adapter` does.
    #[arg(long, value_name = "PATH")]
    pub adapter: Option<std::path::PathBuf>,
    /// Embedding throughput instead (an embedding model): embed this many inputs of
    /// `--prompt-tokens` random tokens per request, `--repetitions` times; reports inputs/s.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub embed_inputs: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `kiln models`.
#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `kiln pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// What to download: `smollm2` (default), `org/repo/file.gguf`, or a URL.
    #[arg(default_value = "smollm2")]
    pub model: String,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}
