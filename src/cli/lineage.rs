//! `pipeline lineage DATASET[@VERSION] [--json] [--verify]`: the chain [`embedding_pipeline::ops::lineage`] reads of a
//! dataset's version, printed; with `--verify`, a failure when a link is broken.

use super::ExitStatus;
use super::printer::{Printer, out, out_text};
use embedding_pipeline::ops::lineage::report;

/// `pipeline lineage`'s arguments.
#[derive(Debug, clap::Args)]
pub struct LineageArgs {
    /// The Lance dataset: `path`, `path@version` or `path@tag`.
    dataset: String,
    /// Re-check the links: model files, checkpoint weights, the training data's version, the plan's corpus.
    #[arg(long)]
    verify: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Print the lineage of the dataset's version; with `--verify`, check it and fail when a link is broken.
pub async fn run(args: LineageArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let report = report(&args.dataset, args.verify).await?;
    if args.json {
        out!(printer, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        out_text!(printer, "{}", report.to_text());
    }
    let broken = report.broken();
    if !broken.is_empty() {
        anyhow::bail!("lineage broken at: {}", broken.join(", "));
    }
    Ok(ExitStatus::Success)
}
