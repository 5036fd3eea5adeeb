//! The Lance sink: streams record batches into a dataset and commits one new version at the end.
//!
//! Before anything is written it checks that the output's campaign fingerprint matches the dataset's,
//! and that a requested tag is free. Nothing is collected: batches go from the query to Lance's
//! writer as they are made. Data files are written first and the manifest last (with the run record
//! as transaction properties), so a write that fails halfway leaves the dataset at its old version;
//! its orphaned data files are never referenced by any manifest.

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::{exec_datafusion_err, Result};
use datafusion::datasource::sink::DataSink;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType};
use futures::Stream;
use lance::dataset::{CommitBuilder, InsertBuilder, WriteMode, WriteParams};
use lance::Dataset;

use crate::campaign::{Fingerprint, RunRecord, FINGERPRINT_KEY, RUN_RECORD_KEY};
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
        let fp = Fingerprint::from_json(json).map_err(|e| exec_datafusion_err!("column {}: unreadable fingerprint: {e}", field.name()))?;
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
        (Some(a), Some(b)) if a != b => {
            let lines: Vec<String> =
                a.differences(b).into_iter().map(|(k, old, new)| format!("  {k}: dataset {old}, this run {new}")).collect();
            refuse(lines.join("\n"))
        }
        (Some(_), None) => refuse("  this write carries no embed() fingerprint (its vectors were not made by embed())".into()),
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
        let started = Instant::now();
        let options = context.session_config().options().extensions.get::<EmbedOptions>().cloned().unwrap_or_default();
        let fingerprint = self.fingerprint.clone();
        let existing = match Dataset::open(&self.uri).await {
            Ok(ds) => Some(ds),
            Err(lance::Error::DatasetNotFound { .. }) => None,
            Err(e) => return Err(self.lance_err(e)),
        };
        let mut previous_device = None;
        if let Some(ds) = &existing {
            previous_device = latest_device(ds).await;
            check_fingerprint(&self.uri, fingerprint_of_dataset(ds)?.as_ref(), fingerprint.as_ref())?;
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
        if let Some(fp) = &fingerprint {
            schema.metadata.insert(FINGERPRINT_KEY.to_string(), fp.to_json());
        }
        let schema = Arc::new(schema);
        let progress = Arc::new(Mutex::new(Progress::default()));
        let stream: SendableRecordBatchStream =
            Box::pin(CountingStream { inner: data, schema: Arc::clone(&schema), progress: Arc::clone(&progress), ready_at: None });
        let embed_before = self.metrics.embed_stats();

        // Append on a location with no dataset creates it.
        let params = WriteParams { mode: WriteMode::Append, ..Default::default() };
        let transaction = InsertBuilder::new(self.uri.as_str())
            .with_params(&params)
            .execute_uncommitted_stream(stream)
            .await
            .map_err(|e| self.lance_err(e))?;

        let commit_started = Instant::now();
        let (rows, consumer_time) = {
            let p = progress.lock().unwrap_or_else(|e| e.into_inner());
            (p.rows, p.consumer_time)
        };
        let stats = self.metrics.embed_stats().since(&embed_before);
        let device = if stats.docs + stats.nulls > 0 { self.metrics.device() } else { None };
        let mut record = RunRecord::new(&stats, rows, 0.0, 0.0, device);
        record.previous_device = previous_device.filter(|p| record.device.as_ref().is_some_and(|d| d != p));
        let properties = |r: &RunRecord| HashMap::from([(RUN_RECORD_KEY.to_string(), serde_json::to_string(r).unwrap_or_default())]);
        // The wall and write times include the commit, which has not happened yet; estimate them with
        // the time so far (the commit itself is a single small manifest write).
        record.wall_seconds = started.elapsed().as_secs_f64();
        record.write_seconds = consumer_time.as_secs_f64();
        record.useful_tokens_per_second = stats.useful_tokens as f64 / record.wall_seconds.max(1e-9);
        // NOTE: CommitBuilder::with_transaction_properties is never applied by lance 14.0.2's execute();
        // the properties must sit on the transaction itself.
        let mut transaction = transaction;
        transaction.transaction_properties = Some(Arc::new(properties(&record)));
        let dataset = CommitBuilder::new(self.uri.as_str())
            .execute(transaction)
            .await
            .map_err(|e| self.lance_err(e))?;
        let version = dataset.version().version;
        if !options.tag.is_empty() {
            dataset.tags().create(&options.tag, version).await.map_err(|e| self.lance_err(e))?;
        }
        record.write_seconds += commit_started.elapsed().as_secs_f64();
        record.wall_seconds = started.elapsed().as_secs_f64();
        self.metrics.record_write(WriteReport {
            uri: self.uri.clone(),
            rows,
            version,
            elapsed: started.elapsed(),
            record,
        });
        Ok(rows)
    }
}

#[derive(Debug, Default)]
struct Progress {
    rows: u64,
    /// Time the consumer (Lance's writer) spent between receiving a batch and asking for the next.
    consumer_time: Duration,
}

/// Passes batches through with the output schema (fingerprint in its metadata), counting rows and the
/// time the writer spends on each batch.
struct CountingStream {
    inner: SendableRecordBatchStream,
    schema: SchemaRef,
    progress: Arc<Mutex<Progress>>,
    ready_at: Option<Instant>,
}

impl Stream for CountingStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(at) = self.ready_at.take() {
            self.progress.lock().unwrap_or_else(|e| e.into_inner()).consumer_time += at.elapsed();
        }
        let poll = self.inner.as_mut().poll_next(cx);
        match poll {
            Poll::Ready(Some(Ok(batch))) => {
                self.ready_at = Some(Instant::now());
                self.progress.lock().unwrap_or_else(|e| e.into_inner()).rows += batch.num_rows() as u64;
                let schema = Arc::clone(&self.schema);
                Poll::Ready(Some(batch.with_schema(schema).map_err(Into::into)))
            }
            other => other,
        }
    }
}

impl RecordBatchStream for CountingStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
