//! `pipeline compare A B [--min-cosine X] [--max-diff D] [--shared-ids] [--allow-different-fingerprints] [--json]`.

use super::ExitStatus;
use super::args::Columns;
use super::printer::{Printer, out, out_text};
use embedding_pipeline::ops::compare::Thresholds;

/// `pipeline compare`'s arguments.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The first dataset.
    a: String,
    /// The second dataset.
    b: String,
    /// Smallest acceptable cosine similarity between a pair of vectors.
    #[arg(long, default_value_t = 0.9999)]
    min_cosine: f64,
    /// Largest acceptable absolute difference of any element of a pair (cosine alone does not see
    /// length: a normalised and an unnormalised vector have cosine 1).
    #[arg(long, default_value_t = 0.01)]
    max_diff: f64,
    /// Compare only the ids both have: ids on one side only are reported, but do not fail.
    #[arg(long)]
    shared_ids: bool,
    /// Compare vectors made under different fingerprints (the differences are still reported).
    #[arg(long)]
    allow_different_fingerprints: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    columns: Columns,
}

/// Print the comparison. Exit 1 when it did not pass, 2 when the datasets cannot be compared at all.
pub async fn run(args: CompareArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let CompareArgs {
        a,
        b,
        min_cosine,
        max_diff,
        shared_ids,
        allow_different_fingerprints,
        json,
        columns: Columns { id_column, column },
    } = args;
    let thresholds = Thresholds { min_cosine, max_diff, shared_ids, allow_different_fingerprints };
    let r = match embedding_pipeline::ops::compare::compare(&a, &b, id_column.as_deref(), &column, thresholds).await {
        Ok(r) => r,
        Err(e) => return Ok(ExitStatus::Cannot.with_error(printer, e.into())),
    };
    if json {
        out!(printer, "{}", serde_json::to_string_pretty(&r)?);
    } else {
        out_text!(printer, "{}", r.to_text());
    }
    if !r.passed {
        let differ = anyhow::anyhow!("{a} and {b} differ: {}", r.failures.join("; "));
        return Ok(ExitStatus::Failure.with_error(printer, differ));
    }
    Ok(ExitStatus::Success)
}
