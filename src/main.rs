//! The `pipeline` binary; see [`embedding_pipeline::cli`].

use std::process::ExitCode;

use clap::Parser;
use embedding_pipeline::cli::{self, Cli};

/// Warnings only, less Lance's note that a COPY creates a new dataset.
const QUIET_LOGS: &str = "warn,lance::dataset::write::insert=error";

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| QUIET_LOGS.into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::main(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", cli::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
