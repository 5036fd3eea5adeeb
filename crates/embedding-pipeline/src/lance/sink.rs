//! The Lance sink: streams record batches into a dataset, committing a new version every
//! `embed.commit_rows` rows, `embed.commit_seconds` seconds or `embed.commit_bytes` bytes, whichever
//! comes first. Each commit's run record counts exactly the rows it commits: their counters come with
//! them from the embedding stage ([`RunMetrics::receive_embedded`]).
//!
//! When the write is planned, before anything runs, it checks that the output is a Lance dataset or a
//! free path and takes the dataset's write lock, so that whatever the query decides from the dataset (the
//! ids already done) is read under the lock. Before anything is written it checks that the output's
//! campaign fingerprint matches the dataset's, and that a requested tag is free. It holds at most one commit's
//! rows. Each commit writes data files first and the manifest last (with the run record as
//! transaction properties), so a reader sees whole commits only, and a write that fails or is killed
//! leaves the dataset at its last commit; the data files of an unfinished commit are never referenced
//! by any manifest. At a stop request (ctrl-C), the write takes the rows of the model calls already
//! running, commits everything it holds and ends with an error that says how to resume.

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

use super::lock::{Holder, WriteLock};
use super::records::fingerprint_of_dataset;
use crate::campaign::metrics::{RunMetrics, WriteReport, batch_bytes};
use crate::campaign::{DeviceInfo, EmbedStats, FINGERPRINT_KEY, Fingerprint, RUN_RECORD_KEY, RunRecord};
use crate::error::Error;
use crate::options::EmbedOptions;

/// Writes a query's output into a Lance dataset, creating it or appending a new version.
#[derive(Debug)]
pub struct LanceSink {
    uri: String,
    schema: SchemaRef,
    fingerprint: Option<Fingerprint>,
    metrics: Arc<RunMetrics>,
    /// Held from planning until the sink is dropped with its plan.
    _lock: WriteLock,
}

impl LanceSink {
    /// The dataset written.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// A sink into the dataset at `uri` (see [`super::dataset_uri`]) of vectors made under `fingerprint`.
    /// Refuses an output that is neither a Lance dataset nor a free path, and one another run is writing.
    pub fn try_new(
        uri: String,
        schema: SchemaRef,
        fingerprint: Option<Fingerprint>,
        metrics: Arc<RunMetrics>,
    ) -> Result<Self> {
        check_output_location(&uri)?;
        let lock = WriteLock::acquire(&uri, Holder::Run)?;
        Ok(Self { uri, schema, fingerprint, metrics, _lock: lock })
    }

    /// The output as it stands (none before its first write), checked against this write; an output named
    /// by a link to a folder not made yet has the folder made.
    async fn open_output(&self, options: &EmbedOptions) -> Result<(Option<Dataset>, ExistingOutput)> {
        let existing = match Dataset::open(&self.uri).await {
            Ok(ds) => Some(ds),
            Err(lance::Error::DatasetNotFound { .. }) => None,
            Err(e) => return Err(self.lance_err(e)),
        };
        // An output named by a link to a folder not made yet (a bigger disk, say): Lance would try to make the
        // link's own path, and fail with "File exists". The folder it points to is made instead.
        if existing.is_none()
            && crate::uri::is_local(&self.uri)
            && let Some(target) = dangling_link(std::path::Path::new(&self.uri))
        {
            std::fs::create_dir(&target).map_err(|e| {
                let message = format!("cannot make {}, where it links to: {e}", target.display());
                datafusion::error::DataFusionError::from(Error::lance_because(self.uri.clone(), message, e))
            })?;
        }
        let found = match &existing {
            Some(ds) => check_existing(&self.uri, ds, self.fingerprint.as_ref(), options).await?,
            None => ExistingOutput::default(),
        };
        Ok((existing, found))
    }

    /// The schema the dataset is written with: the input's, the campaign's fingerprint and its id column (when the
    /// rows have it) in its metadata, so later commands find the ids without being told.
    fn schema_of(&self, data: &SendableRecordBatchStream, id_column: &str) -> SchemaRef {
        let mut schema = data.schema().as_ref().clone();
        if let Some(fp) = &self.fingerprint {
            schema.metadata.insert(FINGERPRINT_KEY.to_string(), fp.to_json());
        }
        if schema.field_with_name(id_column).is_ok() {
            schema.metadata.insert(super::records::ID_COLUMN_KEY.to_string(), id_column.to_string());
        }
        Arc::new(schema)
    }

    /// Mark `version` with `embed.tag` (none when the tag is empty).
    async fn tag(&self, tag: &str, version: u64) -> Result<()> {
        if tag.is_empty() {
            return Ok(());
        }
        let ds = Dataset::open(&self.uri).await.map_err(|e| self.lance_err(e))?;
        ds.tags().create(tag, version).await.map_err(|e| self.lance_err(e))?;
        Ok(())
    }

    fn lance_err(&self, e: lance::Error) -> datafusion::error::DataFusionError {
        crate::lance::lance_err(&self.uri)(e).into()
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

/// Refuse to mix vectors of two campaigns, listing each field that differs.
pub fn check_fingerprint(uri: &str, stored: Option<&Fingerprint>, new: Option<&Fingerprint>) -> Result<()> {
    let refuse = |detail: String| {
        Err(exec_datafusion_err!(
            "refusing to append to {uri}: its vectors were made under another campaign fingerprint, and mixing \
             them would make vectors that are not comparable.\n{detail}\nThree ways on: write to a new output; run \
             with --restart (SET embed.restart = true) to replace its rows with this campaign's (older versions stay \
             readable); or go back to the dataset's settings (pipeline inspect {uri} shows them)."
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

/// What a write learns from the dataset already at its output, before anything is embedded.
#[derive(Debug, Default)]
pub(crate) struct ExistingOutput {
    /// The device of the dataset's newest run record, recorded when this write's device differs.
    pub previous_device: Option<DeviceInfo>,
    /// The version `embed.tag` already marks when that is the current one (a finished job run again): fine while
    /// the write adds no rows.
    pub tag_is_current: Option<u64>,
}

/// The checks every write into an existing dataset makes before it embeds: the campaign fingerprint matches the
/// dataset's (unless `--restart` replaces its rows), and a requested tag is free or marks the current version.
pub(crate) async fn check_existing(
    uri: &str,
    ds: &Dataset,
    fingerprint: Option<&Fingerprint>,
    options: &EmbedOptions,
) -> Result<ExistingOutput> {
    if !options.restart {
        check_fingerprint(uri, fingerprint_of_dataset(ds)?.as_ref(), fingerprint)?;
        check_id_column(uri, ds, &options.id_column)?;
    }
    let mut tag_is_current = None;
    if !options.tag.is_empty()
        && let Ok(v) = ds.tags().get_version(&options.tag).await
    {
        if v != ds.version().version {
            return Err(exec_datafusion_err!(
                "embed.tag '{}' already marks version {v} of {uri}, not the current one; choose another tag",
                options.tag
            ));
        }
        tag_is_current = Some(v);
    }
    Ok(ExistingOutput { previous_device: latest_device(ds).await, tag_is_current })
}

/// A dataset keyed by one id column is not added to by a write keyed by another: its ids could not be checked,
/// and the rows already done would be embedded again.
pub(crate) fn check_id_column(uri: &str, ds: &Dataset, id_column: &str) -> Result<()> {
    match ds.schema().metadata.get(super::records::ID_COLUMN_KEY) {
        Some(recorded) if recorded != id_column => Err(exec_datafusion_err!(
            "refusing to append to {uri}: its rows are keyed by `{recorded}` (embed.id_column when it was written), \
             this write's by `{id_column}`. SET embed.id_column = '{recorded}' to add to it, or write to a new output"
        )),
        _ => Ok(()),
    }
}

/// The device in the newest run record of the dataset (an index or optimize commit after it has none).
pub(crate) async fn latest_device(ds: &Dataset) -> Option<DeviceInfo> {
    let found = super::records::newest_run_record(ds, ds.version().version, |r| r.device.is_some()).await.ok()??;
    found.1.device
}

impl LanceSink {
    /// The error of a write that stopped on request after `writer` committed its rows.
    fn interrupted(&self, writer: &Committer, restarted: bool) -> datafusion::error::DataFusionError {
        Error::Interrupted {
            uri: self.uri.clone(),
            rows: writer.rows,
            version: writer.version,
            restarted,
            resumable_by_restart: self.metrics.write_digest(&self.uri).is_some(),
        }
        .into()
    }
}

#[async_trait]
impl DataSink for LanceSink {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(&self, data: SendableRecordBatchStream, context: &Arc<TaskContext>) -> Result<u64> {
        let options = EmbedOptions::from_config(context.session_config().options());
        let (existing, ExistingOutput { previous_device, tag_is_current }) = self.open_output(&options).await?;

        let mut writer = Committer {
            sink: self,
            schema: self.schema_of(&data, &options.id_column),
            // --restart: the first commit replaces the rows (older versions stay readable).
            mode: if options.restart { WriteMode::Overwrite } else { WriteMode::Append },
            previous_device,
            since: Instant::now(),
            rows: 0,
            version: existing.as_ref().map(|d| d.version().version),
            restarted: options.restart,
            interrupted: false,
        };
        let commit_rows = options.commit_rows.max(1);
        let commit_bytes = options.commit_bytes.max(1);
        let commit_every = Duration::from_secs(options.commit_seconds.max(1));
        self.metrics.clear_in_transit();
        let mut held = Held::default();
        let mut data = data;
        // Set at a stop request: the write then takes the rows still coming (the embedding stage ends
        // after the model calls already running) and commits them, but waits no longer than this.
        let mut stop_by: Option<Instant> = None;
        // The rows held make a commit (by rows, bytes or time). It is made when the next rows arrive, or
        // when none came for a tick: so the commit that ends the write is known to be the last.
        let mut due = false;
        loop {
            // Wake at least every 200 ms to honour a stop request and the commit clock.
            let next = tokio::time::timeout(TICK, data.next()).await;
            let finished = matches!(next, Ok(None));
            if due && !finished && stop_by.is_none() {
                writer.commit(std::mem::take(&mut held), false).await?;
            }
            match next {
                Ok(Some(Ok(batch))) => {
                    if let Some(v) = tag_is_current.filter(|_| batch.num_rows() > 0) {
                        return Err(exec_datafusion_err!(
                            "embed.tag '{}' already marks version {v} of {}, and this write has rows to add, which \
                             would make a new version; nothing was written: choose another tag",
                            options.tag,
                            self.uri
                        ));
                    }
                    let stats = self.metrics.receive_embedded(batch.num_rows() as u64);
                    held.add(batch, &stats);
                }
                Ok(Some(Err(e))) => {
                    // The rows held were embedded before the failure: keep them, then report it.
                    writer.interrupted = true;
                    writer.commit(std::mem::take(&mut held), true).await?;
                    return Err(e);
                }
                Ok(None) | Err(_) => {}
            }
            if stop_by.is_none() && self.metrics.stop().requested() {
                // Only the embedding stage ends by itself at a stop; any other input is cut off at once.
                let wait = if self.metrics.embedding_active() { STOP_WAIT } else { Duration::ZERO };
                stop_by = Some(Instant::now() + wait);
            }
            if finished || stop_by.is_some_and(|t| Instant::now() >= t) {
                writer.interrupted = stop_by.is_some();
                writer.commit(std::mem::take(&mut held), true).await?;
                if stop_by.is_some() {
                    return Err(self.interrupted(&writer, options.restart));
                }
                // A finished, tagged job run again wrote nothing, and its tag already marks the version.
                if let (Some(v), None) = (writer.version, tag_is_current) {
                    self.tag(&options.tag, v).await?;
                }
                return Ok(writer.rows);
            }
            due = held.rows >= commit_rows
                || held.bytes >= commit_bytes
                || (held.rows > 0 && writer.since.elapsed() >= commit_every);
        }
    }
}

/// How often a write wakes, with or without rows, to check the commit clock and stop requests.
const TICK: Duration = Duration::from_millis(200);

/// The longest a stopping write waits for the rows still being embedded before it commits what it has.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// Rows received and not yet committed, with the counters of their embedding.
#[derive(Default)]
struct Held {
    batches: Vec<RecordBatch>,
    rows: usize,
    bytes: usize,
    stats: EmbedStats,
}

impl Held {
    fn add(&mut self, batch: RecordBatch, stats: &EmbedStats) {
        self.stats.add(stats);
        if batch.num_rows() > 0 {
            self.rows += batch.num_rows();
            self.bytes += batch_bytes(&batch);
            self.batches.push(batch);
        }
    }
}

/// Commits finished rows as new versions, each with the run record of exactly those rows.
struct Committer<'a> {
    sink: &'a LanceSink,
    schema: SchemaRef,
    mode: WriteMode,
    previous_device: Option<DeviceInfo>,
    /// When the last commit (or the write) began: the time the next commit's record covers.
    since: Instant,
    /// Rows committed so far by this write.
    rows: u64,
    /// The dataset's version after the last commit.
    version: Option<u64>,
    /// Whether the write replaces the output's rows (every commit's record says so).
    restarted: bool,
    /// Whether the write ends before its input does (set before its last commit).
    interrupted: bool,
}

impl Committer<'_> {
    async fn commit(&mut self, held: Held, last: bool) -> Result<()> {
        let Held { batches, rows, stats, .. } = held;
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
        let device = if stats.docs + stats.nulls > 0 { self.sink.metrics.device() } else { None };
        let mut record = RunRecord::new(&stats, rows as u64, self.since.elapsed().as_secs_f64(), 0.0, device);
        record.note_origin(self.sink.fingerprint.as_ref(), self.previous_device.take());
        record.write_seconds = started.elapsed().as_secs_f64();
        record.last_commit = last;
        record.interrupted = last && self.interrupted;
        // A restart's digest is noted for it, and for a run that resumes it (which goes on with the same restart).
        record.write_digest = self.sink.metrics.write_digest(&self.sink.uri);
        record.restarted = self.restarted || record.write_digest.is_some();
        record.peak_memory_bytes = crate::process::memory::peak().unwrap_or(0);
        record.plan = self.sink.metrics.plan_for(&self.sink.uri).map(|p| p.committed(rows as u64));
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
        self.since = Instant::now();
        self.rows += rows as u64;
        self.version = Some(version);
        Ok(())
    }
}

/// What a Lance dataset directory holds before its first manifest; anything else means the directory is
/// not one.
const LANCE_ENTRIES: [&str; 6] = ["_versions", "data", "_transactions", "_indices", "_deletions", "_refs"];

/// A local output must be a Lance dataset, a dataset whose first commit never finished (data files, no
/// manifest yet), an empty directory or a free path: never a file, nor a directory of other files,
/// which the dataset would be written among. An `s3://` output is left to Lance.
/// Where `path` points when it is a symbolic link to nothing yet (resolved, as the lock takes it).
fn dangling_link(path: &std::path::Path) -> Option<std::path::PathBuf> {
    let is_link = path.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink());
    (is_link && !path.exists()).then(|| super::lock::real_path(path))
}

pub(crate) fn check_output_location(uri: &str) -> Result<()> {
    let refuse = |message: String| Err(Error::lance(uri, message).into());
    if let Some((scheme, _)) = uri.split_once("://") {
        if crate::uri::is_supported(uri) {
            return Ok(());
        }
        // Checked before anything touches the disk: a gs:// path must not become a local ./gs: directory.
        return refuse(format!(
            "{scheme}:// outputs are not supported by this build; write to a local path, a mounted file system or \
             s3:// (an S3-compatible store)"
        ));
    }
    let path = std::path::Path::new(uri);
    if let Some(target) = dangling_link(path) {
        // Written through: the target folder is made when the first rows are (see [`LanceSink::write_all`]).
        return match target.parent() {
            Some(parent) if parent.is_dir() => Ok(()),
            _ => refuse(format!(
                "is a symbolic link to {}, whose folder does not exist; make it first, or write to another path",
                target.display()
            )),
        };
    }
    if let Some(file) = path.ancestors().skip(1).find(|a| a.exists() && !a.is_dir()) {
        return refuse(format!(
            "{} is a file, so nothing can be written under it; choose an output path in a directory",
            file.display()
        ));
    }
    let Ok(meta) = std::fs::metadata(path) else { return Ok(()) };
    if !meta.is_dir() {
        return refuse("is a file, not a Lance dataset directory; write to another path, or move the file away".into());
    }
    if path.join("_versions").is_dir() {
        return Ok(()); // a dataset, whatever else Lance keeps beside its versions
    }
    let entries = std::fs::read_dir(path).map_err(|e| exec_datafusion_err!("cannot read the output {uri}: {e}"))?;
    let mut foreign: Vec<String> = entries
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| !LANCE_ENTRIES.contains(&name.as_str()))
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    foreign.sort();
    let shown = foreign.iter().take(3).map(String::as_str).collect::<Vec<_>>().join(", ");
    let more = if foreign.len() > 3 { format!(" and {} more", foreign.len() - 3) } else { String::new() };
    refuse(format!(
        "is a directory that is not a Lance dataset (it holds {shown}{more}); write to a new path, or empty it"
    ))
}
