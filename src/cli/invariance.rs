//! `pipeline check-invariance job.sql [--sample N]`: [`embedding_pipeline::ops::checks::check_invariance`], printed.

use anyhow::bail;

use embedding_pipeline::ops::checks::{SampleSource, check_invariance};

/// Run the check, print it, fail when a vector depends on its batch neighbours.
pub async fn check(source: &SampleSource, sample: usize, max_diff: f64, json: bool) -> anyhow::Result<()> {
    let report = check_invariance(source, sample, max_diff).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
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
    Ok(())
}
