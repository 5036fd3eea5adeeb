//! `pipeline check-invariance job.sql [--sample N]`: [`embedding_pipeline::ops::checks::check_invariance`], printed.

use std::path::PathBuf;

use anyhow::bail;

use super::ExitStatus;
use super::args::{JobVars, Runtime, SampleSource};
use super::printer::{Printer, out};
use embedding_pipeline::ops::checks::check_invariance;

/// `pipeline check-invariance`'s arguments.
#[derive(Debug, clap::Args)]
pub struct CheckInvarianceArgs {
    /// The job file: its SET and CREATE statements are run, then the sample is drawn.
    file: PathBuf,
    #[command(flatten)]
    vars: JobVars,
    /// Texts in the sample.
    #[arg(long, default_value_t = 64)]
    sample: usize,
    #[command(flatten)]
    source: SampleSource,
    /// Largest acceptable absolute difference of any vector element.
    #[arg(long, default_value_t = 1e-5)]
    max_diff: f64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    runtime: Runtime,
}

/// Run the check, print it, fail when a vector depends on its batch neighbours.
pub async fn run(args: CheckInvarianceArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    args.runtime.apply();
    let (source, sample, max_diff) = (args.source.of(args.file, &args.vars)?, args.sample, args.max_diff);
    let report = check_invariance(&source, sample, max_diff).await?;
    if args.json {
        out!(printer, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!(
            printer,
            "batch invariance on {} texts of {} ({} batched calls): max abs difference {:.3e}, min cosine {:.7}\n  worst: {:?}\n  {} (threshold {:.0e})",
            report.sample,
            report.table,
            report.batched_calls,
            report.max_abs_diff,
            report.min_cosine,
            report.worst_text,
            if report.passed { "PASS" } else { "FAIL: vectors depend on their batch neighbours" },
            report.max_diff_threshold
        );
    }
    if !report.passed {
        bail!("vectors differ between one-at-a-time and batched embedding by up to {:.3e}", report.max_abs_diff);
    }
    Ok(ExitStatus::Success)
}
