//! `pipeline compare-order job.sql [--sample N] [--json]`: [`embedding_pipeline::ops::checks::compare_order`], printed.

use std::path::PathBuf;

use anyhow::bail;

use super::ExitStatus;
use super::args::{JobVars, Runtime, SampleSource};
use super::printer::{Printer, out, out_text};
use embedding_pipeline::ops::checks::{OrderComparison, OrderRun, compare_order};

/// `pipeline compare-order`'s arguments.
#[derive(Debug, clap::Args)]
pub struct CompareOrderArgs {
    /// The job file: its SET and CREATE statements are run, then the sample is drawn.
    file: PathBuf,
    #[command(flatten)]
    vars: JobVars,
    /// Rows in the sample.
    #[arg(long, default_value_t = 2000)]
    sample: usize,
    #[command(flatten)]
    source: SampleSource,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    runtime: Runtime,
}

/// Embed a sample of the job's corpus in both orders, print the comparison, fail when the vectors differ.
pub async fn run(args: CompareOrderArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    args.runtime.apply();
    let report = compare_order(&args.source.of(args.file, &args.vars)?, args.sample).await?;
    if args.json {
        out!(printer, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        out_text!(printer, "{}", to_text(&report));
    }
    if !report.passed {
        bail!("vectors differ between the two orders by up to {:.3e}", report.max_abs_diff);
    }
    Ok(ExitStatus::Success)
}

/// The side-by-side table.
fn to_text(c: &OrderComparison) -> String {
    let r = |f: &dyn Fn(&OrderRun) -> String| format!("{:>14} {:>14}", f(&c.length), f(&c.original));
    let mut out = format!("{} rows of {}\n{:<22} {:>14} {:>14}\n", c.sample, c.table, "", "length", "original");
    out += &format!("{:<22} {}\n", "documents", r(&|x| x.documents.to_string()));
    out += &format!("{:<22} {}\n", "useful tokens", r(&|x| x.useful_tokens.to_string()));
    out += &format!("{:<22} {}\n", "processed tokens", r(&|x| x.processed_tokens.to_string()));
    out += &format!("{:<22} {}\n", "padding efficiency", r(&|x| format!("{:.3}", x.padding_efficiency)));
    out += &format!("{:<22} {}\n", "model calls", r(&|x| x.model_calls.to_string()));
    out += &format!("{:<22} {}\n", "useful tokens/s", r(&|x| format!("{:.0}", x.useful_tokens_per_second)));
    out += &format!("{:<22} {}\n", "wall s", r(&|x| format!("{:.2}", x.wall_seconds)));
    out += &format!("length order is {:.2}x the original order in useful tokens/s\n", c.speedup);
    out += &format!(
        "largest per-id vector difference: {:.3e} ({})\n",
        c.max_abs_diff,
        if c.passed { "PASS, at most 1e-5" } else { "FAIL, above 1e-5" }
    );
    out
}
