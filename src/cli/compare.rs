//! `pipeline compare A B [--min-cosine X] [--json]`.

use anyhow::bail;

/// Print the comparison; fail when it did not pass.
pub async fn compare(
    a: &str,
    b: &str,
    id_column: &str,
    column: &str,
    min_cosine: f64,
    json: bool,
) -> anyhow::Result<()> {
    let r = crate::lance::compare::compare(a, b, id_column, column, min_cosine).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.to_text());
    }
    if !r.passed {
        bail!("{a} and {b} differ (see above)");
    }
    Ok(())
}
