//! The SQL surface as sqllogictest files (`tests/slt/*.slt`, DataFusion's own habit): each file's statements
//! run in one session on the default model, one at a time, exactly as a job's statements run (through
//! `ops::run::run_labelled`: the same checks, resume and error text), and their results are compared with the
//! file's. `${DIR}` in a file is a fresh directory of its own; paths under it are shown as `${DIR}` in results.
//!
//! `EMBED_PIPELINE_SLT_COMPLETE=1 cargo test --test it slt` writes the results the engine gives into the files
//! (sqllogictest's completion mode): read the diff before keeping it.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use embedding_pipeline::ops::run::run_labelled;
use embedding_pipeline::ops::script::JobStatement;
use embedding_pipeline::ops::{Reporter, WorkPlanChoice};
use embedding_pipeline::{EmbedSession, Error};
use sqllogictest::{DBOutput, DefaultColumnType};

use crate::common::session;

/// A session the runner sends statements to, and the directory `${DIR}` names.
struct Pipeline {
    session: EmbedSession,
    dir: PathBuf,
    json_sources: Vec<String>,
}

/// A statement's result, as the reporter is given it.
#[derive(Default)]
struct Collected {
    batches: Mutex<Vec<RecordBatch>>,
    schema: Mutex<Option<SchemaRef>>,
}

impl Reporter for Collected {
    fn query_rows(&self, batch: &RecordBatch) -> embedding_pipeline::Result<ControlFlow<()>> {
        self.batches.lock().unwrap().push(batch.clone());
        Ok(ControlFlow::Continue(()))
    }

    fn query_finished(&self, schema: &SchemaRef) -> embedding_pipeline::Result<()> {
        *self.schema.lock().unwrap() = Some(schema.clone());
        Ok(())
    }
}

impl Pipeline {
    async fn run_async(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, Error> {
        let collected = Collected::default();
        for s in JobStatement::all_of("", sql).map_err(Error::Refused)? {
            run_labelled(&self.session, &s, &WorkPlanChoice::Beside, &mut self.json_sources, &collected).await?;
        }
        let Some(schema) = collected.schema.into_inner().unwrap() else { return Ok(DBOutput::StatementComplete(0)) };
        let types = schema.fields().iter().map(|f| column_type(f.data_type())).collect();
        let mut rows = Vec::new();
        for batch in collected.batches.into_inner().unwrap() {
            rows.extend(self.rows_of(&batch)?);
        }
        Ok(DBOutput::Rows { types, rows })
    }

    /// The batch's rows as text: NULL as `NULL`, an empty string as `(empty)`, `${DIR}` in place of the
    /// directory, and a cell of several lines (EXPLAIN's plans) as one row per line.
    fn rows_of(&self, batch: &RecordBatch) -> Result<Vec<Vec<String>>, Error> {
        let options = FormatOptions::default().with_null("NULL");
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        // The directory as given and as its links resolve (a temporary folder under a linked /tmp).
        let real = std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone()).display().to_string();
        let dir = self.dir.display().to_string();
        let mut rows = Vec::new();
        for r in 0..batch.num_rows() {
            let cells: Vec<String> = formatters
                .iter()
                .map(|f| match f.value(r).to_string() {
                    s if s.is_empty() => "(empty)".to_string(),
                    // Plans show file paths without their leading `/`.
                    s => [&real, &dir]
                        .iter()
                        .fold(s, |s, d| s.replace(d.as_str(), "${DIR}").replace(d.trim_start_matches('/'), "${DIR}")),
                })
                .collect();
            match cells.iter().position(|c| c.contains('\n')) {
                None => rows.push(cells),
                Some(k) => {
                    for line in cells[k].lines().filter(|l| !l.trim().is_empty()) {
                        let mut row = cells.clone();
                        row[k] = line.to_string();
                        rows.push(row);
                    }
                }
            }
        }
        Ok(rows)
    }
}

impl sqllogictest::DB for Pipeline {
    type Error = Error;
    type ColumnType = DefaultColumnType;

    fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, Error> {
        // The runner's trait is synchronous here; the statement runs on the test's runtime.
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(self.run_async(sql)))
    }

    fn engine_name(&self) -> &str {
        "embedding-pipeline"
    }
}

/// `I` for integers, `R` for floating point, `T` for text, `?` for the rest (booleans, vectors).
fn column_type(t: &DataType) -> DefaultColumnType {
    match t {
        t if t.is_integer() => DefaultColumnType::Integer,
        t if t.is_floating() || matches!(t, DataType::Decimal128(..) | DataType::Decimal256(..)) => {
            DefaultColumnType::FloatingPoint
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DefaultColumnType::Text,
        _ => DefaultColumnType::Any,
    }
}

fn slt_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slt");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    files
}

/// Each file in its own session and directory, all at once (DataFusion's runner runs its files in parallel too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_surface_is_as_its_slt_files_say() {
    let files = slt_files();
    assert!(files.len() >= 4, "tests/slt holds {} files", files.len());
    let failed: Vec<String> =
        futures::future::join_all(files.iter().map(|f| run_file(f))).await.into_iter().flatten().collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// Run one file (or, with EMBED_PIPELINE_SLT_COMPLETE set, write the engine's results into it); its failure.
async fn run_file(file: &Path) -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let mut runner = sqllogictest::Runner::new(move || {
        let db = Pipeline { session: session(), dir: path.clone(), json_sources: Vec::new() };
        async move { Ok::<_, Error>(db) }
    });
    runner.set_var("DIR".into(), dir.path().display().to_string());
    runner.with_column_validator(sqllogictest::strict_column_validator);
    let mut failed = None;
    if std::env::var_os("EMBED_PIPELINE_SLT_COMPLETE").is_some() {
        runner
            .update_test_file(
                file,
                " ",
                sqllogictest::default_validator,
                sqllogictest::default_normalizer,
                sqllogictest::strict_column_validator,
            )
            .await
            .unwrap();
    } else if let Err(e) = runner.run_file_async(file).await {
        failed = Some(format!("{}: {}", file.display(), e.display(false)));
    }
    runner.shutdown_async().await;
    failed
}
