//! `kiln embed`: embeddings of texts on the same code the server runs.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::cli::RuntimeArgs;
use crate::common::{load_engine_with, set_threads};

/// `kiln embed`.
#[derive(Debug, Args)]
pub struct EmbedArgs {
    /// An embedding model (a sentence-transformers folder or a GGUF with a pooling type).
    pub model: String,
    /// Texts to embed (each one input).
    pub texts: Vec<String>,
    /// Also embed each non-empty line of this file.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Keep the first N dimensions (Matryoshka models), then normalize.
    #[arg(long)]
    pub dimensions: Option<usize>,
    /// Normalization, as llama-server numbers it: -1 none, 0 max-abs to int16, 1 taxicab,
    /// 2 euclidean, p > 2 p-norm.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
    pub embd_normalize: i32,
    /// Print JSON (`{"model", "embeddings": [[…]], "tokens"}`) instead of one line per input.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// Runs `kiln embed`.
pub fn run(args: EmbedArgs) -> Result<()> {
    set_threads(args.runtime.threads)?;
    let mut texts = args.texts.clone();
    if let Some(f) = &args.file {
        let body =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        texts.extend(
            body.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from),
        );
    }
    if texts.is_empty() {
        bail!("nothing to embed: give texts or --file");
    }
    if let Some(i) = texts.iter().position(String::is_empty) {
        bail!("text {i} is empty");
    }
    let mut engine = load_engine_with(&args.model, &args.runtime, |o, _| {
        o.slots = 8;
        Ok(())
    })?;
    let Some(embedding) = engine.model().embedding.clone() else {
        bail!(
            "{} is not an embedding model (it declares no pooling: a sentence-transformers folder or a GGUF with pooling_type)",
            args.model
        );
    };
    let hidden = embedding.width(engine.model().config.hidden_size);
    if args.dimensions.is_some_and(|d| d == 0 || d > hidden) {
        bail!("--dimensions must be from 1 to {hidden}");
    }
    let ctx = engine.options().context_len;
    let ids = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let ids = engine.model().tokenizer.encode(t, true)?;
            if ids.len() > ctx {
                bail!(
                    "text {i} has {} tokens but the context holds {ctx} (--ctx)",
                    ids.len()
                );
            }
            Ok(ids)
        })
        .collect::<Result<Vec<_>>>()?;
    let tokens: usize = ids.iter().map(Vec::len).sum();
    let mut vectors = engine.embed(&ids)?;
    for v in &mut vectors {
        if let Some(d) = args.dimensions {
            v.truncate(d);
        }
        kiln_engine::embed::normalize(v, args.embd_normalize);
    }
    if args.json {
        let model = engine.model().path.display().to_string();
        let out = serde_json::json!({"model": model, "embeddings": vectors, "tokens": tokens});
        println!("{out}");
        return Ok(());
    }
    for v in &vectors {
        let line: Vec<String> = v.iter().map(|x| format!("{x:.6}")).collect();
        println!("{}", line.join(" "));
    }
    Ok(())
}
