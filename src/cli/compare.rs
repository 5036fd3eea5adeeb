//! `pipeline compare A B [--min-cosine X] [--max-diff D] [--shared-ids] [--allow-different-fingerprints] [--json]`.

use super::Exit;
use embedding_pipeline::lance::compare::Thresholds;

/// Print the comparison. Exit 1 when it did not pass, 2 when the datasets cannot be compared at all.
pub async fn compare(
    a: &str,
    b: &str,
    id_column: Option<&str>,
    column: &str,
    thresholds: Thresholds,
    json: bool,
) -> anyhow::Result<()> {
    let r = embedding_pipeline::lance::compare::compare(a, b, id_column, column, thresholds)
        .await
        .map_err(|e| Exit::with(Exit::CANNOT, e.into()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.to_text());
    }
    if !r.passed {
        return Err(Exit::with(Exit::DIFFER, anyhow::anyhow!("{a} and {b} differ: {}", r.failures.join("; "))));
    }
    Ok(())
}
