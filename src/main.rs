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
    let result = runtime.block_on(cli::main(cli));
    // Do not wait for blocking work nobody needs any more (a model call or token count started before a
    // stop): its results are never used, and nothing it does is written.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", cli::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
