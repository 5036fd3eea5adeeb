//! `pipeline report DATASET[@VERSION] -o report.html [--trial trial.json …] [--prices FILE]`: the page of
//! [`embedding_pipeline::ops::report`], written to a file.

use std::path::{Path, PathBuf};

use anyhow::Context;

use embedding_pipeline::ops::report::report;

/// Write the page for `location` to `out`.
pub async fn report_command(
    location: &str,
    out: &Path,
    trials: &[PathBuf],
    prices: Option<&Path>,
) -> anyhow::Result<()> {
    let page = report(location, trials, prices).await?;
    std::fs::write(out, page).with_context(|| format!("cannot write {}", out.display()))?;
    println!("report of {location}: {}", out.display());
    Ok(())
}
