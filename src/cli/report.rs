//! `pipeline report DATASET[@VERSION] -o report.html [--trial trial.json …] [--prices FILE]`: the page of
//! [`embedding_pipeline::ops::report`], written to a file.

use std::path::PathBuf;

use anyhow::Context;

use super::ExitStatus;
use super::printer::{Printer, out};
use embedding_pipeline::ops::report::report;

/// `pipeline report`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The Lance dataset: `path`, `path@version` or `path@tag`.
    dataset: String,
    /// The page to write.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
    /// trial.json files from pipeline trial, shown with their costs (repeatable).
    #[arg(long = "trial", value_name = "FILE")]
    trials: Vec<PathBuf>,
    /// Hourly prices for the trials (see examples/prices.toml).
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,
}

/// Write the dataset's page to `--output`.
pub async fn run(args: ReportArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let ReportArgs { dataset, output, trials, prices } = args;
    let page = report(&dataset, &trials, prices.as_deref()).await?;
    std::fs::write(&output, page).with_context(|| format!("cannot write {}", output.display()))?;
    out!(printer, "report of {dataset}: {}", output.display());
    Ok(ExitStatus::Success)
}
