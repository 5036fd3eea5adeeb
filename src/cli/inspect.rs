//! `pipeline inspect DATASET [--json]`, and `pipeline inspect <output>.plan` for a plan directory.

use embedding_pipeline::lance::inspect::inspect as report;

/// Print the dataset report, or a plan directory's summary.
pub async fn inspect(dataset: &str, id_column: Option<&str>, json: bool) -> anyhow::Result<()> {
    let plan_file = std::path::Path::new(dataset).join(embedding_pipeline::campaign::plan::PLAN_FILE);
    if plan_file.is_file() {
        return super::plan::inspect_plan(std::path::Path::new(dataset), json).await;
    }
    let r = report(&embedding_pipeline::lance::dataset_uri(dataset), id_column).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.to_text());
    }
    Ok(())
}
