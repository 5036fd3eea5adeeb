//! `pipeline lineage DATASET[@VERSION] [--json] [--verify]`: the chain [`embedding_pipeline::ops::lineage`] reads of a
//! dataset's version, printed; with `--verify`, a failure when a link is broken.

use embedding_pipeline::ops::lineage::report;

/// Print the lineage of `location` (`path`, `path@version` or `path@tag`); with `verify`, check it and
/// fail when a link is broken.
pub async fn lineage(location: &str, json: bool, verify: bool) -> anyhow::Result<()> {
    let report = report(location, verify).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    let broken = report.broken();
    if !broken.is_empty() {
        anyhow::bail!("lineage broken at: {}", broken.join(", "));
    }
    Ok(())
}
