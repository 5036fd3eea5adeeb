//! `pipeline plan job.sql [--json] [--units N | --unit-tokens T]` and `pipeline inspect <output>.plan`: the
//! plans [`embedding_pipeline::ops::plan`] makes, printed.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::anyhow;

use embedding_pipeline::campaign::plan::{HISTOGRAM_FILE, Plan, WORK_LIST_FILE};
use embedding_pipeline::ops::plan::{UnitSize, plan_job_for, source_changes};

/// Plan every write into Lance of the job file, and print what was found.
pub async fn plan_file(
    file: &Path,
    vars: &BTreeMap<String, String>,
    json: bool,
    size: UnitSize,
    device: Option<&str>,
) -> anyhow::Result<()> {
    let plans = plan_job_for(file, vars, size, device).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&plans.iter().map(|(p, _)| p).collect::<Vec<_>>())?);
    } else {
        for (plan, dir) in &plans {
            print_summary(plan, dir);
        }
    }
    Ok(())
}

/// `pipeline inspect <output>.plan`: the plan's summary and its units, or with `json` its plan.json.
pub async fn inspect_plan(dir: &Path, json: bool) -> anyhow::Result<()> {
    let (plan, digest) = Plan::read(dir).map_err(|e| anyhow!(e))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
        return Ok(());
    }
    print_summary(&plan, dir);
    println!("  made {} by version {}; fingerprint: {}", plan.created, plan.tool_version, plan.fingerprint.model);
    println!("  plan.json sha256: {digest}");
    for source in &plan.sources {
        let what = match (&source.lance, &source.unchecked) {
            (Some(l), _) => format!("Lance {} at version {}", l.uri, l.version),
            (None, Some(why)) => format!("not checked: {why}"),
            (None, None) => {
                format!("{} file(s), {} bytes", source.files.len(), source.files.iter().map(|f| f.bytes).sum::<u64>())
            }
        };
        println!("  source {}: {what}", source.table);
    }
    match source_changes(&plan).await.as_slice() {
        [] => println!("  sources: unchanged since the plan"),
        changes => {
            println!("  sources: changed since the plan; run pipeline plan again:");
            changes.iter().for_each(|c| println!("    {c}"));
        }
    }
    println!("  unit   first row       rows   useful tokens   longest  shortest");
    for u in &plan.units {
        println!(
            "  {:>4} {:>11} {:>10} {:>15} {:>9} {:>9}",
            u.unit, u.first_row, u.rows, u.useful_tokens, u.longest, u.shortest
        );
    }
    Ok(())
}

fn print_summary(plan: &Plan, dir: &Path) {
    let t = &plan.totals;
    let pct = |a: u64, b: u64| if b > 0 { 100.0 * a as f64 / b as f64 } else { 0.0 };
    println!("plan for {}: {}", plan.output, dir.display());
    println!("  rows: {} ({} documents, {} NULL texts)", t.rows, t.documents, t.null_texts);
    println!(
        "  tokens: {} in the texts, {} fed to the model (embed.max_tokens = {})",
        t.tokens_before_truncation, t.useful_tokens, t.max_tokens
    );
    println!(
        "  truncation: {} documents ({:.1}%) cut, {} tokens ({:.1}%) dropped",
        t.truncated_documents,
        pct(t.truncated_documents, t.documents),
        t.dropped_tokens,
        pct(t.dropped_tokens, t.tokens_before_truncation)
    );
    println!("  units: {} of about {} useful tokens", plan.units.len(), plan.unit_tokens);
    println!("  work list: {}", dir.join(WORK_LIST_FILE).display());
    println!("  histogram: {}", dir.join(HISTOGRAM_FILE).display());
}
