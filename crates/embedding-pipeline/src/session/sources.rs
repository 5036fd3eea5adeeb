//! Sources: JSON lines folders. DataFusion reads a `STORED AS JSON` folder as its `*.json` files only, so a
//! folder of `.jsonl` or `.ndjson` files (the usual names for JSON lines) read as empty, and
//! `OPTIONS ('format.file_extension' '.jsonl')` was refused as an unknown JSON option. This factory
//! picks the folder's JSON lines extension, or takes the option, and hands DataFusion a glob.
//!
//! CSV with line breaks in quoted values (what Python's `csv` module and pandas write for texts): DataFusion's
//! schema inference reads a file in chunks cut by object_store 0.13's line splitter, which tracks quotes
//! back to front and so cuts inside a quoted value ("Encountered unequal lengths between records … at line
//! 1" on files past 8 KiB). The CSV factory infers a local file's columns itself, with arrow's CSV reader
//! over the whole file, and reads quoted line breaks by default.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::Schema;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::common::{DFSchema, plan_datafusion_err};
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

/// `CREATE EXTERNAL TABLE … STORED AS CSV` through DataFusion's listing tables, with line breaks in quoted values.
#[derive(Debug, Default)]
pub struct CsvTableFactory(ListingTableFactory);

#[async_trait]
impl TableProviderFactory for CsvTableFactory {
    async fn create(&self, state: &dyn Session, cmd: &CreateExternalTable) -> Result<Arc<dyn TableProvider>> {
        let mut cmd = cmd.clone();
        // Texts hold line breaks; without this DataFusion cuts a large file into byte ranges at any line break.
        if csv_option(&cmd, "newlines_in_values").is_none() {
            cmd.options.insert("format.newlines_in_values".into(), "true".into());
        }
        if cmd.schema.fields().is_empty()
            && let Some(schema) = infer_local_csv(state, &cmd)?
        {
            cmd.schema = Arc::new(DFSchema::try_from(schema)?);
        }
        self.0.create(state, &cmd).await
    }
}

/// A CSV option as given in `OPTIONS`, with or without its `format.` prefix.
fn csv_option<'a>(cmd: &'a CreateExternalTable, key: &str) -> Option<&'a String> {
    cmd.options.get(&format!("format.{key}")).or_else(|| cmd.options.get(key))
}

/// The columns of a local, uncompressed CSV file or folder (its `.csv` files), read as DataFusion would
/// (header, delimiter, quote, escape, comment, the first 1,000 records) but over each file whole; None where
/// DataFusion's own inference is left to run (a store, a glob, compression, partitions, a NULL pattern).
fn infer_local_csv(state: &dyn Session, cmd: &CreateExternalTable) -> Result<Option<Schema>> {
    let local = !cmd.location.contains("://") || cmd.location.starts_with("file://");
    let compressed = csv_option(cmd, "compression").is_some_and(|c| !c.is_empty() && c != "uncompressed");
    if !local
        || compressed
        || cmd.location.contains(['*', '?', '['])
        || !cmd.table_partition_cols.is_empty()
        || csv_option(cmd, "null_regex").is_some()
    {
        return Ok(None);
    }
    let path = std::path::Path::new(cmd.location.strip_prefix("file://").unwrap_or(&cmd.location));
    let files = if path.is_dir() {
        let ext = csv_option(cmd, "file_extension").map_or(".csv", String::as_str).trim_start_matches('.');
        let mut files: Vec<_> = std::fs::read_dir(path)?
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e.eq_ignore_ascii_case(ext)))
            .collect();
        files.sort();
        files
    } else if path.is_file() {
        vec![path.to_path_buf()]
    } else {
        return Ok(None);
    };
    let byte = |key: &str| csv_option(cmd, key).and_then(|v| v.as_bytes().first().copied());
    let has_header = csv_option(cmd, "has_header").map_or(state.config_options().catalog.has_header, |v| v == "true");
    let mut format = datafusion::arrow::csv::reader::Format::default()
        .with_header(has_header)
        .with_delimiter(byte("delimiter").unwrap_or(b','))
        .with_quote(byte("quote").unwrap_or(b'"'))
        .with_truncated_rows(csv_option(cmd, "truncated_rows").is_some_and(|v| v == "true"));
    if let Some(escape) = byte("escape") {
        format = format.with_escape(escape);
    }
    if let Some(comment) = byte("comment") {
        format = format.with_comment(comment);
    }
    let mut left: usize = csv_option(cmd, "schema_infer_max_rec").and_then(|v| v.parse().ok()).unwrap_or(1000);
    let mut schemas = Vec::new();
    for file in &files {
        if left == 0 {
            break;
        }
        let reader = std::io::BufReader::new(std::fs::File::open(file)?);
        let (schema, read) = format
            .infer_schema(reader, Some(left))
            .map_err(|e| plan_datafusion_err!("{}: cannot read its columns: {e}", file.display()))?;
        left = left.saturating_sub(read);
        schemas.push(schema);
    }
    if schemas.is_empty() {
        return Ok(None);
    }
    Ok(Some(Schema::try_merge(schemas)?))
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
