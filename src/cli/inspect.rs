//! `pipeline inspect DATASET [--json]`.

use crate::lance::inspect::inspect as report;

/// Print the dataset report.
pub async fn inspect(dataset: &str, id_column: &str, json: bool) -> anyhow::Result<()> {
    let r = report(&crate::lance::dataset_uri(dataset), id_column).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.to_text());
    }
    Ok(())
}
