//! The Lance sink: streams record batches into a dataset, committing a new version every
//! `embed.commit_rows` rows or `embed.commit_seconds` seconds, whichever comes first.
//!
//! Before anything is written it takes the dataset's write lock, checks that the output's campaign
//! fingerprint matches the dataset's, and that a requested tag is free. It holds at most one commit's
//! rows. Each commit writes data files first and the manifest last (with the run record as
//! transaction properties), so a reader sees whole commits only, and a write that fails or is killed
//! leaves the dataset at its last commit; the data files of an unfinished commit are never referenced
//! by any manifest. A stop request (ctrl-C) commits the rows held and ends the write with an error
//! that says how to resume.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::{Result, exec_datafusion_err};
use datafusion::datasource::sink::DataSink;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType};
use futures::StreamExt;
use lance::Dataset;
use lance::dataset::{CommitBuilder, InsertBuilder, WriteMode, WriteParams};

use crate::campaign::{FINGERPRINT_KEY, Fingerprint, RUN_RECORD_KEY, RunRecord, interrupt};
use crate::error::Error;
use crate::metrics::{RunMetrics, WriteReport};
use crate::options::EmbedOptions;

/// Writes a query's output into a Lance dataset, creating it or appending a new version.
#[derive(Debug)]
pub struct LanceSink {
    uri: String,
    schema: SchemaRef,
    fingerprint: Option<Fingerprint>,
    metrics: Arc<RunMetrics>,
}

impl LanceSink {
    /// A sink into the dataset at `uri` (see [`super::dataset_uri`]) of vectors made under `fingerprint`.
    pub fn new(uri: String, schema: SchemaRef, fingerprint: Option<Fingerprint>, metrics: Arc<RunMetrics>) -> Self {
        Self { uri, schema, fingerprint, metrics }
    }

    fn lance_err(&self, e: impl fmt::Display) -> datafusion::error::DataFusionError {
        Error::Lance { uri: self.uri.clone(), message: e.to_string() }.into()
    }
}

impl DisplayAs for LanceSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "LanceSink: uri={}", self.uri)
    }
}

/// The fingerprint the `embed` output columns of a logical `schema` carry, if any. Two different ones
/// are an error.
///
/// NOTE: DataFusion 54 keeps a function's field metadata in the logical plan but drops it in
/// `AsyncFuncExec`, so this must read the logical schema (COPY's `FileSinkConfig::output_schema`).
pub fn fingerprint_of_columns(schema: &Schema) -> Result<Option<Fingerprint>> {
    let mut found: Option<(String, Fingerprint)> = None;
    for field in schema.fields() {
        let Some(json) = field.metadata().get(FINGERPRINT_KEY) else { continue };
        let fp = Fingerprint::from_json(json)
            .map_err(|e| exec_datafusion_err!("column {}: unreadable fingerprint: {e}", field.name()))?;
        match &found {
            Some((other, seen)) if *seen != fp => {
                return Err(exec_datafusion_err!(
                    "columns {other} and {} were embedded under different settings; write them to separate datasets",
                    field.name()
                ));
            }
            Some(_) => {}
            None => found = Some((field.name().clone(), fp)),
        }
    }
    Ok(found.map(|(_, fp)| fp))
}

/// The fingerprint stored in a dataset, if any.
pub fn fingerprint_of_dataset(ds: &Dataset) -> Result<Option<Fingerprint>> {
    ds.schema()
        .metadata
        .get(FINGERPRINT_KEY)
        .map(|json| Fingerprint::from_json(json).map_err(|e| exec_datafusion_err!("unreadable fingerprint: {e}")))
        .transpose()
}

/// Refuse to mix vectors of two campaigns, listing each field that differs.
fn check_fingerprint(uri: &str, stored: Option<&Fingerprint>, new: Option<&Fingerprint>) -> Result<()> {
    let refuse = |detail: String| {
        Err(exec_datafusion_err!(
            "refusing to append to {uri}: its vectors were made under another campaign fingerprint, and mixing \
             them would make vectors that are not comparable.\n{detail}\nWrite to a new dataset, or go back to the \
             dataset's settings (pipeline inspect {uri} shows them)."
        ))
    };
    match (stored, new) {
        (Some(a), Some(b)) if !a.differences(b).is_empty() => {
            let lines: Vec<String> = a
                .differences(b)
                .into_iter()
                .map(|(k, old, new)| format!("  {k}: dataset {old}, this run {new}"))
                .collect();
            refuse(lines.join("\n"))
        }
        (Some(_), None) => {
            refuse("  this write carries no embed() fingerprint (its vectors were not made by embed())".into())
        }
        (None, Some(_)) => refuse("  the dataset holds no fingerprint (it was not written by embed())".into()),
        _ => Ok(()),
    }
}

/// The device in the run record of the dataset's latest version written by this tool.
async fn latest_device(ds: &Dataset) -> Option<crate::model::DeviceInfo> {
    let transaction = ds.read_transaction().await.ok()??;
    let json = transaction.transaction_properties?.get(RUN_RECORD_KEY)?.clone();
    serde_json::from_str::<RunRecord>(&json).ok()?.device
}

#[async_trait]
impl DataSink for LanceSink {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(&self, data: SendableRecordBatchStream, context: &Arc<TaskContext>) -> Result<u64> {
        let options = context.session_config().options().extensions.get::<EmbedOptions>().cloned().unwrap_or_default();
        let _lock = WriteLock::acquire(&self.uri)?;
        let existing = match Dataset::open(&self.uri).await {
            Ok(ds) => Some(ds),
            Err(lance::Error::DatasetNotFound { .. }) => None,
            Err(e) => return Err(self.lance_err(e)),
        };
        let mut previous_device = None;
        if let Some(ds) = &existing {
            previous_device = latest_device(ds).await;
            if !options.restart {
                check_fingerprint(&self.uri, fingerprint_of_dataset(ds)?.as_ref(), self.fingerprint.as_ref())?;
            }
            if !options.tag.is_empty()
                && let Ok(v) = ds.tags().get_version(&options.tag).await
            {
                return Err(exec_datafusion_err!(
                    "embed.tag '{}' already marks version {v} of {}; choose another tag",
                    options.tag,
                    self.uri
                ));
            }
        }

        let mut schema = data.schema().as_ref().clone();
        if let Some(fp) = &self.fingerprint {
            schema.metadata.insert(FINGERPRINT_KEY.to_string(), fp.to_json());
        }
        let mut writer = Committer {
            sink: self,
            schema: Arc::new(schema),
            // --restart: the first commit replaces the rows (older versions stay readable).
            mode: if options.restart { WriteMode::Overwrite } else { WriteMode::Append },
            previous_device,
            embed_before: self.metrics.embed_stats(),
            since: Instant::now(),
            rows: 0,
            version: existing.as_ref().map(|d| d.version().version),
        };
        let commit_rows = options.commit_rows.max(1);
        let commit_every = Duration::from_secs(options.commit_seconds.max(1));
        let (mut buffer, mut buffered) = (Vec::new(), 0usize);
        let mut data = data;
        loop {
            // Wake at least every 200 ms to honour a stop request and the commit clock.
            let next = tokio::time::timeout(Duration::from_millis(200), data.next()).await;
            let finished = match next {
                Ok(Some(batch)) => {
                    let mut batch = batch?;
                    while buffered + batch.num_rows() > commit_rows {
                        let take = commit_rows - buffered;
                        buffer.push(batch.slice(0, take));
                        batch = batch.slice(take, batch.num_rows() - take);
                        writer.commit(std::mem::take(&mut buffer), false).await?;
                        buffered = 0;
                    }
                    buffered += batch.num_rows();
                    if batch.num_rows() > 0 {
                        buffer.push(batch);
                    }
                    false
                }
                Ok(None) => true,
                Err(_elapsed) => false,
            };
            if finished {
                writer.commit(std::mem::take(&mut buffer), true).await?;
                if !options.tag.is_empty()
                    && let Some(v) = writer.version
                {
                    let ds = Dataset::open(&self.uri).await.map_err(|e| self.lance_err(e))?;
                    ds.tags().create(&options.tag, v).await.map_err(|e| self.lance_err(e))?;
                }
                return Ok(writer.rows);
            }
            if interrupt::stop_requested() {
                writer.commit(std::mem::take(&mut buffer), true).await?;
                return Err(
                    Error::Interrupted { uri: self.uri.clone(), rows: writer.rows, version: writer.version }.into()
                );
            }
            if buffered > 0 && writer.since.elapsed() >= commit_every {
                writer.commit(std::mem::take(&mut buffer), false).await?;
                buffered = 0;
            }
        }
    }
}

/// Commits finished rows as new versions, each with the run record of what happened since the last.
struct Committer<'a> {
    sink: &'a LanceSink,
    schema: SchemaRef,
    mode: WriteMode,
    previous_device: Option<crate::model::DeviceInfo>,
    embed_before: crate::model::EmbedStats,
    since: Instant,
    /// Rows committed so far by this write.
    rows: u64,
    /// The dataset's version after the last commit.
    version: Option<u64>,
}

impl Committer<'_> {
    async fn commit(&mut self, batches: Vec<RecordBatch>, last: bool) -> Result<()> {
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        if rows == 0 {
            return Ok(());
        }
        let started = Instant::now();
        let batches = batches
            .into_iter()
            .map(|b| b.with_schema(Arc::clone(&self.schema)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let params = WriteParams { mode: self.mode, ..Default::default() };
        let mut transaction = InsertBuilder::new(self.sink.uri.as_str())
            .with_params(&params)
            .execute_uncommitted(batches)
            .await
            .map_err(|e| self.sink.lance_err(e))?;
        let now = self.sink.metrics.embed_stats();
        let stats = now.since(&self.embed_before);
        let device = if stats.docs + stats.nulls > 0 { self.sink.metrics.device() } else { None };
        let mut record = RunRecord::new(&stats, rows as u64, self.since.elapsed().as_secs_f64(), 0.0, device);
        record.previous_device = self.previous_device.take().filter(|p| record.device.as_ref().is_some_and(|d| d != p));
        record.write_seconds = started.elapsed().as_secs_f64();
        record.last_commit = last;
        // NOTE: CommitBuilder::with_transaction_properties is never applied by lance 14.0.2's execute();
        // the properties must sit on the transaction itself.
        let json = serde_json::to_string(&record).unwrap_or_default();
        transaction.transaction_properties = Some(Arc::new(HashMap::from([(RUN_RECORD_KEY.to_string(), json)])));
        let dataset = CommitBuilder::new(self.sink.uri.as_str())
            .execute(transaction)
            .await
            .map_err(|e| self.sink.lance_err(e))?;
        let version = dataset.version().version;
        record.write_seconds = started.elapsed().as_secs_f64();
        self.sink.metrics.record_write(WriteReport {
            uri: self.sink.uri.clone(),
            rows: rows as u64,
            version,
            elapsed: self.since.elapsed(),
            record,
        });
        self.mode = WriteMode::Append;
        self.embed_before = now;
        self.since = Instant::now();
        self.rows += rows as u64;
        self.version = Some(version);
        Ok(())
    }
}

/// One writer per dataset at a time: an exclusive advisory lock on a file beside the dataset, held for
/// the whole write and released when the process ends, however it ends.
struct WriteLock {
    _file: std::fs::File,
}

impl WriteLock {
    fn acquire(uri: &str) -> Result<Self> {
        let path = lock_path(uri);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| exec_datafusion_err!("cannot create {}: {e}", dir.display()))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| exec_datafusion_err!("cannot open lock file {}: {e}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(exec_datafusion_err!(
                "another pipeline run is writing to {uri} (it holds {}); wait for it to finish, or stop it and rerun \
                 this job to resume",
                path.display()
            )),
            Err(std::fs::TryLockError::Error(e)) => Err(exec_datafusion_err!("cannot lock {}: {e}", path.display())),
        }
    }
}

/// `dir/.name.lance.lock` for the dataset `dir/name.lance`.
pub fn lock_path(uri: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(uri);
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "dataset".into());
    p.with_file_name(format!(".{name}.lock"))
}
