//! The `kiln` command line.

mod cli;
mod cmd;
mod common;
mod kv;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    common::init_logging(cli.verbose);
    let result = match cli.command {
        Some(cli::Command::Generate(args)) => cmd::generate::run(args),
        Some(cli::Command::Bench(args)) => cmd::bench::run(args),
        Some(cli::Command::Embed(args)) => cmd::embed::run(args),
        Some(cli::Command::Models(args)) => cmd::models::run(args),
        Some(cli::Command::Pull(args)) => cmd::pull::run(args),
        Some(cli::Command::Fit(args)) => cmd::fit::run(args),
        Some(cli::Command::Eval(args)) => cmd::eval::run(args),
        Some(cli::Command::Quantize(args)) => cmd::quantize::run(args),
        Some(cli::Command::Train(args)) => cmd::train::run(args),
        Some(cli::Command::Dataset(args)) => cmd::dataset::run(args),
        Some(cli::Command::Fuse(args)) => cmd::fuse::run(args),
        Some(cli::Command::Serve(args)) => cmd::serve::run(args),
        Some(cli::Command::Jobs(args)) => cmd::jobs::run(args),
        Some(cli::Command::Job(args)) => return cmd::jobs::child(args),
        // `kiln` alone serves the starter model.
        None => cmd::serve::ServeArgs::defaults().and_then(cmd::serve::run),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
