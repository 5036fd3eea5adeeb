//! Sources: JSON lines folders. DataFusion reads a `STORED AS JSON` folder as its `*.json` files only, so a
//! folder of `.jsonl` or `.ndjson` files (the usual names for JSON lines) read as empty, and
//! `OPTIONS ('format.file_extension' '.jsonl')` was refused as an unknown JSON option. This factory
//! picks the folder's JSON lines extension, or takes the option, and hands DataFusion a glob.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::common::plan_datafusion_err;
use datafusion::datasource::listing_table_factory::ListingTableFactory;
use datafusion::error::Result;
use datafusion::logical_expr::CreateExternalTable;

/// The extensions JSON lines files go by.
const JSON_LINES: [&str; 3] = ["json", "jsonl", "ndjson"];

/// `CREATE EXTERNAL TABLE … STORED AS JSON` through DataFusion's listing tables, with JSON lines folders.
#[derive(Debug, Default)]
pub struct JsonTableFactory(ListingTableFactory);

#[async_trait]
impl TableProviderFactory for JsonTableFactory {
    async fn create(&self, state: &dyn Session, cmd: &CreateExternalTable) -> Result<Arc<dyn TableProvider>> {
        let mut cmd = cmd.clone();
        let asked = ["format.file_extension", "file_extension"].iter().filter_map(|k| cmd.options.remove(*k)).next();
        let local = !cmd.location.contains("://") || cmd.location.starts_with("file://");
        // A folder named without its slash is read as one with it (DataFusion would read only its `.json` files).
        if local && !cmd.location.ends_with('/') && is_folder(&cmd.location) {
            cmd.location.push('/');
        }
        let folder = cmd.location.ends_with('/') && local;
        if folder && !cmd.location.contains(['*', '?', '[']) {
            let ext = match asked {
                Some(ext) => ext.trim_start_matches('.').to_string(),
                None => folder_extension(&cmd.location)?,
            };
            cmd.location = format!("{}*.{ext}", cmd.location);
        }
        let table = self.0.create(state, &cmd).await?;
        // Columns are read from the rows: none means no rows (DataFusion would fail later on "No field named id").
        if table.schema().fields().is_empty() && cmd.schema.fields().is_empty() {
            return Err(plan_datafusion_err!(
                "{}: the corpus is empty: there are no JSON lines to read its columns from; check the location, or \
                 add rows",
                cmd.location.strip_prefix("file://").unwrap_or(&cmd.location)
            ));
        }
        Ok(table)
    }
}

fn is_folder(location: &str) -> bool {
    std::path::Path::new(location.strip_prefix("file://").unwrap_or(location)).is_dir()
}

/// The one JSON lines extension a local folder's files have (`json` when it has none of them).
fn folder_extension(location: &str) -> Result<String> {
    let path = location.strip_prefix("file://").unwrap_or(location);
    let Ok(entries) = std::fs::read_dir(path) else { return Ok("json".into()) };
    let found: BTreeSet<String> = entries
        .filter_map(|e| e.ok()?.path().extension()?.to_str().map(str::to_ascii_lowercase))
        .filter(|ext| JSON_LINES.contains(&ext.as_str()))
        .collect();
    match found.len() {
        0 => Ok("json".into()),
        1 => Ok(found.into_iter().next().unwrap_or_default()),
        _ => {
            let kinds: Vec<String> = found.iter().map(|e| format!(".{e}")).collect();
            let first = found.iter().next().cloned().unwrap_or_default();
            Err(plan_datafusion_err!(
                "the folder {location} holds {} files; read one kind, with LOCATION '{location}*.{first}' or \
                 OPTIONS ('format.file_extension' '.{first}')",
                kinds.join(" and ")
            ))
        }
    }
}
