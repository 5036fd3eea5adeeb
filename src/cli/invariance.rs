//! `pipeline check-invariance job.sql [--sample N]`: does a vector depend on its batch neighbours?
//! Some exported or quantised models change a text's vector with the padding and rows around it;
//! a campaign needs to know before it starts.

use std::path::Path;

use anyhow::bail;
use datafusion::arrow::array::AsArray;
use serde::Serialize;

use crate::campaign::Fingerprint;
use crate::lance::compare::cosine_and_max_diff;
use crate::model::TextEmbedder;
use crate::options::EmbedOptions;

/// What the check found.
#[derive(Debug, Serialize)]
pub struct InvarianceReport {
    pub table: String,
    pub sample: usize,
    /// Model calls the batched pass made.
    pub batched_calls: u64,
    pub max_abs_diff: f64,
    pub min_cosine: f64,
    /// The start of the text with the largest difference.
    pub worst_text: String,
    pub max_diff_threshold: f64,
    pub passed: bool,
}

/// Run the job's set-up statements, draw the sample, embed it both ways and report.
pub async fn check(
    file: &Path,
    sample: usize,
    table: Option<&str>,
    column: &str,
    max_diff: f64,
    json: bool,
) -> anyhow::Result<()> {
    let (session, table) = super::job::prepare(file, table).await?;
    let ctx = session.context();
    let sql =
        format!("SELECT CAST(\"{column}\" AS VARCHAR) FROM {table} WHERE \"{column}\" IS NOT NULL LIMIT {sample}");
    let batches = ctx.sql(&sql).await?.collect().await?;
    let texts: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            b.column(0).as_string_view().iter().map(|s| s.unwrap_or_default().to_string()).collect::<Vec<_>>()
        })
        .collect();
    if texts.is_empty() {
        bail!("table {table} has no non-NULL {column} to sample");
    }

    let options = EmbedOptions::from_config(ctx.state().config_options());
    let (settings, _) = Fingerprint::for_options(&options)?;
    let embedder = options.embedder()?;
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<InvarianceReport> {
        let all: Vec<Option<&str>> = texts.iter().map(|t| Some(t.as_str())).collect();
        let batched = embedder.embed(&all, &settings)?;
        let dim = settings.out_dim(embedder.spec());
        let (mut worst, mut worst_row, mut min_cos) = (0f64, 0usize, f64::INFINITY);
        for (i, t) in texts.iter().enumerate() {
            let alone = embedder.embed(&[Some(t.as_str())], &settings)?;
            let (c, d) = cosine_and_max_diff(&alone.vectors, &batched.vectors[i * dim..(i + 1) * dim]);
            min_cos = min_cos.min(c);
            if d > worst || i == 0 {
                (worst, worst_row) = (d, i);
            }
        }
        Ok(InvarianceReport {
            table,
            sample: texts.len(),
            batched_calls: batched.stats.model_calls,
            max_abs_diff: worst,
            min_cosine: min_cos,
            worst_text: texts[worst_row].chars().take(60).collect(),
            max_diff_threshold: max_diff,
            passed: worst <= max_diff,
        })
    })
    .await??;
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
