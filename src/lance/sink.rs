//! The Lance sink: streams record batches into a dataset and commits one new version at the end.
//!
//! Nothing is collected: batches go from the query to Lance's writer as they are made. Lance writes
//! data files first and the manifest last, so a write that fails halfway leaves the dataset at its
//! old version; the orphaned data files are never referenced by any manifest.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::Result;
use datafusion::datasource::sink::DataSink;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType};
use futures::TryStreamExt;
use lance::dataset::{InsertBuilder, WriteMode, WriteParams};

use crate::error::Error;
use crate::metrics::{RunMetrics, WriteReport};

/// Writes a query's output into a Lance dataset, creating it or appending a new version.
#[derive(Debug)]
pub struct LanceSink {
    uri: String,
    schema: SchemaRef,
    metrics: Arc<RunMetrics>,
}

impl LanceSink {
    /// A sink into the dataset at `uri` (see [`super::dataset_uri`]).
    pub fn new(uri: String, schema: SchemaRef, metrics: Arc<RunMetrics>) -> Self {
        Self { uri, schema, metrics }
    }
}

impl DisplayAs for LanceSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "LanceSink: uri={}", self.uri)
    }
}

#[async_trait]
impl DataSink for LanceSink {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(&self, data: SendableRecordBatchStream, _context: &Arc<TaskContext>) -> Result<u64> {
        let started = Instant::now();
        let rows = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&rows);
        let schema = data.schema();
        let counted = data.inspect_ok(move |b| {
            counter.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
        });
        let stream: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(schema, counted));
        // Append on a location with no dataset creates it.
        let params = WriteParams { mode: WriteMode::Append, ..Default::default() };
        let dataset = InsertBuilder::new(self.uri.as_str())
            .with_params(&params)
            .execute_stream(stream)
            .await
            .map_err(|e| Error::Lance { uri: self.uri.clone(), message: e.to_string() })?;
        let rows = rows.load(Ordering::Relaxed);
        self.metrics.record_write(WriteReport {
            uri: self.uri.clone(),
            rows,
            version: dataset.version().version,
            elapsed: started.elapsed(),
        });
        Ok(rows)
    }
}
