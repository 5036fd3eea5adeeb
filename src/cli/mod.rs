//! The `pipeline` command line: argument parsing and the subcommands.

pub mod display;
pub mod run;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Embedding campaigns over text corpora with SQL, into versioned Lance datasets.
#[derive(Debug, Parser)]
#[command(name = "pipeline", version, about)]
pub struct Cli {
    /// ONNX Runtime shared library to load (libonnxruntime.so). Without it: ORT_DYLIB_PATH, then
    /// where scripts/setup installs it.
    #[arg(long, global = true, value_name = "PATH")]
    pub ort_lib: Option<PathBuf>,

    /// Print only results and errors.
    #[arg(long, short, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the SQL statements of a job file in order, printing each query's result.
    Run {
        /// The job file.
        file: PathBuf,
    },
}

/// Run the parsed command line.
pub async fn main(cli: Cli) -> anyhow::Result<()> {
    if let Some(lib) = &cli.ort_lib {
        crate::model::runtime::set_library_path(lib);
    }
    match cli.command {
        Command::Run { file } => run::run_file(&file, cli.quiet).await,
    }
}
