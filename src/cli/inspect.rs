//! `pipeline inspect DATASET [--json]`, and `pipeline inspect <output>.plan` for a plan directory.

use std::path::Path;

use super::ExitStatus;
use super::printer::{Printer, out, out_text};
use embedding_pipeline::ops::inspect::inspect as report;

/// `pipeline inspect`'s arguments.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The Lance dataset.
    dataset: String,
    /// Print the stable JSON form (see docs/guides/checking.md).
    #[arg(long)]
    json: bool,
    /// The id column (default: the one the dataset was written with, else `id`).
    #[arg(long)]
    id_column: Option<String>,
}

/// Print the dataset report, or a plan directory's summary.
pub async fn run(args: InspectArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let InspectArgs { dataset, json, id_column } = args;
    let plan_files =
        [embedding_pipeline::campaign::work_plan::PLAN_FILE, embedding_pipeline::ops::image_plan::IMAGES_FILE];
    if plan_files.iter().any(|f| Path::new(&dataset).join(f).is_file()) {
        return super::plan::inspect_plan(Path::new(&dataset), json, printer).await;
    }
    let r = report(&embedding_pipeline::lance::dataset_uri(&dataset), id_column.as_deref()).await?;
    if json {
        out!(printer, "{}", serde_json::to_string_pretty(&r)?);
    } else {
        out_text!(printer, "{}", r.to_text());
    }
    Ok(ExitStatus::Success)
}
