//! `kiln pull`.

use anyhow::{Context, Result};

use crate::cli::PullArgs;

/// Downloads (or verifies) a model and prints its path.
pub fn run(args: PullArgs) -> Result<()> {
    let path = kiln_hub::pull(&args.model, !args.quiet)
        .with_context(|| format!("pulling {:?}", args.model))?;
    println!("{}", path.display());
    Ok(())
}
