//! `kiln fuse`: merge a LoRA adapter into its base, keeping the base's quantization layout.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use kiln_lab::LabError;

use crate::common::resolve;

/// `kiln fuse`.
#[derive(Debug, Args)]
pub struct FuseArgs {
    /// The base model: a name or a .gguf file.
    pub model: String,
    /// The adapter folder (PEFT or mlx-lm layout).
    pub adapter: PathBuf,
    /// The merged model to write (must not exist).
    #[arg(long)]
    pub out: PathBuf,
}

/// Runs `kiln fuse`.
pub fn run(args: FuseArgs) -> Result<()> {
    let model = resolve(&args.model)?;
    let report =
        kiln_lab::finetune::fuse::fuse(&model, &args.adapter, &args.out).map_err(|e| match e {
            LabError::Config { field, reason } => anyhow::anyhow!(
                "{}: {reason}",
                if field == "out" { "--out" } else { "MODEL" }
            ),
            other => anyhow::anyhow!(other),
        })?;
    println!("wrote            {}", report.output.display());
    println!("fused modules    {}", report.fused_modules);
    println!("size             {} bytes", report.data_bytes);
    Ok(())
}
