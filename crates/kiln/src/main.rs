//! The `kiln` command line.

mod cli;
mod cmd;
mod common;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    common::init_logging(cli.verbose);
    let result = match cli.command {
        Some(cli::Command::Generate(args)) => cmd::generate::run(args),
        Some(cli::Command::Bench(args)) => cmd::bench::run(args),
        Some(cli::Command::Models(args)) => cmd::models::run(args),
        Some(cli::Command::Pull(args)) => cmd::pull::run(args),
        None => {
            use clap::CommandFactory;
            let _ = cli::Cli::command().print_help();
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
