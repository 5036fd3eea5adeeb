//! Keeping a campaign's dataset fast to search and small on disk: a vector index (`pipeline index`), and
//! compaction with the cleanup of old versions (`pipeline optimize`). Each commit carries a maintenance
//! record in its transaction properties (under [`crate::lance::records::MAINTENANCE_KEY`]), beside where writes keep their run
//! records, so the dataset's history says what was done to it, when, with which settings.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use lance::Dataset;
use lance::dataset::optimize::{CompactionOptions, compact_files};
use lance::dataset::transaction::{Operation, TransactionBuilder, UpdateMap, UpdateMapEntry};
use lance::dataset::{CommitBuilder, WriteDestination};
use lance::index::DatasetIndexExt;
use lance::index::vector::VectorIndexParams;
use lance_index::IndexType;
use lance_index::vector::hnsw::builder::HnswBuildParams;
use lance_index::vector::ivf::IvfBuildParams;
use lance_index::vector::pq::PQBuildParams;
use lance_index::vector::sq::builder::SQBuildParams;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::lance::lock::{Holder, WriteLock};
use crate::lance::records::{
    CleanupRecord, CompactionRecord, IndexRecord, LastRun, MaintenanceRecord, newest_run_record,
};
use crate::lance::{Metric, lance_err, no_vector_column};

/// The kinds of vector index `pipeline index` builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    /// IVF partitions of product-quantised vectors: small, fast, approximate; needs 256 rows to train.
    IvfPq,
    /// IVF partitions holding HNSW graphs over scalar-quantised vectors: more recall, more memory.
    IvfHnswSq,
}

impl IndexKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::IvfPq => "ivf_pq",
            Self::IvfHnswSq => "ivf_hnsw_sq",
        }
    }
}

/// PQ's rows to train on at 8 bits: below this Lance commits an untrained index that searches nothing.
pub const PQ_MIN_ROWS: u64 = 256;

/// What `pipeline index` built: the version that holds it, its record, and the index as Lance reports it (the
/// partitions it trained may be fewer than asked for).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct BuiltIndex {
    pub version: u64,
    pub record: MaintenanceRecord,
    pub index: Option<super::inspect::IndexReport>,
}

/// Build a vector index on the latest version of `dataset` (`pipeline index`), under the dataset's write lock:
/// refused for `path@version` or `path@tag`, and while another command writes to it.
pub async fn index(dataset: &str, request: &IndexOptions) -> Result<BuiltIndex> {
    let (mut ds, _lock) = open_locked(dataset, "index", Holder::Index).await?;
    let (version, record) = build_index(&mut ds, request).await?;
    let name = record.index.as_ref().map(|i| i.name.clone()).unwrap_or_default();
    let index = super::inspect::indices(&ds).await?.into_iter().find(|i| i.name == name);
    Ok(BuiltIndex { version, record, index })
}

/// Compact the latest version of `dataset` and remove versions older than `older_than` (a duration such as
/// `7d`, `36h`, `0s`), as `pipeline optimize` does, under the dataset's write lock; refused for `path@version`
/// or `path@tag`, and while another command writes to it.
pub async fn optimize(dataset: &str, older_than: &str) -> Result<OptimizeReport> {
    let age = humantime::parse_duration(older_than.trim()).map_err(|e| {
        Error::Refused(format!("--older-than {older_than}: {e}; give a duration such as 7d, 36h or 0s"))
    })?;
    let (mut ds, _lock) = open_locked(dataset, "optimize", Holder::Optimize).await?;
    optimize_open(&mut ds, age, older_than).await
}

/// The dataset's latest version under its write lock (taken once the dataset is known to be there; a write
/// may have committed between the open and the lock). `path@version` and `path@tag` are refused: maintenance
/// commits onto the latest version, not an older checkout.
async fn open_locked(dataset: &str, command: &str, holder: Holder) -> Result<(Dataset, WriteLock)> {
    if let Some((path, at)) = dataset.rsplit_once('@')
        && !at.is_empty()
        && !at.contains('/')
    {
        return Err(Error::Refused(format!("{dataset}: {command} works on a dataset's latest version; give {path}")));
    }
    let mut ds = crate::lance::open_dataset(dataset).await?;
    // The URI a write locks (see crate::lance::LanceSink).
    let lock = WriteLock::acquire(&crate::lance::dataset_uri(dataset), holder)?;
    let uri = ds.uri().to_string();
    ds.checkout_latest().await.map_err(lance_err(&uri))?;
    Ok((ds, lock))
}

/// What to build.
#[derive(Debug, Clone)]
pub struct IndexOptions {
    pub column: String,
    pub kind: IndexKind,
    pub metric: Metric,
    pub partitions: Option<usize>,
}

fn refuse(uri: &str, message: String) -> Error {
    Error::lance(uri, message)
}

/// Build (or rebuild) the vector index on `request.column`, in a new version carrying its record.
async fn build_index(ds: &mut Dataset, request: &IndexOptions) -> Result<(u64, MaintenanceRecord)> {
    let started = Instant::now();
    let uri = ds.uri().to_string();
    let metric_type = request.metric.lance();
    let field = ds
        .schema()
        .field(&request.column)
        .ok_or_else(|| refuse(&uri, no_vector_column(ds.schema(), &request.column)))?;
    let dim = match field.data_type() {
        datafusion::arrow::datatypes::DataType::FixedSizeList(_, d) => d as usize,
        other => return Err(refuse(&uri, format!("column `{}` holds no vectors ({other})", request.column))),
    };
    let rows =
        ds.count_rows(Some(format!("{} IS NOT NULL", quoted(&request.column)))).await.map_err(lance_err(&uri))? as u64;
    if rows == 0 {
        return Err(refuse(&uri, format!("column `{}` has no vectors to index", request.column)));
    }
    if request.kind == IndexKind::IvfPq && rows < PQ_MIN_ROWS {
        return Err(refuse(
            &uri,
            format!(
                "an ivf_pq index trains on at least {PQ_MIN_ROWS} vectors and there are {rows}; below that Lance would \
                 commit an index that covers nothing. Search is exact without one; or use --kind ivf_hnsw_sq"
            ),
        ));
    }
    let (index_type, params, sub_vectors) = index_params(request, metric_type, dim);
    let name = format!("{}_idx", request.column);
    let replaced = ds.load_index_by_name(&name).await.map_err(lance_err(&uri))?.is_some();
    let record = MaintenanceRecord {
        command: "index".into(),
        pipeline_version: env!("CARGO_PKG_VERSION").into(),
        seconds: None,
        index: Some(IndexRecord {
            name: name.clone(),
            column: request.column.clone(),
            kind: request.kind.name().into(),
            metric: request.metric.name().into(),
            partitions: request.partitions,
            sub_vectors,
            rows_indexed: rows,
            replaced,
        }),
        compaction: None,
        cleanup: None,
        last_run: None,
    };
    let columns = [request.column.as_str()];
    ds.create_index_builder(&columns, index_type, &params)
        .name(name)
        .replace(true)
        .transaction_properties(record.properties())
        .await
        .map_err(lance_err(&uri))?;
    let mut record = record;
    record.seconds = Some(started.elapsed().as_secs_f64());
    Ok((ds.version().version, record))
}

/// The index's type and build parameters for vectors of `dim` values, and its PQ sub-vectors (none for HNSW).
fn index_params(
    request: &IndexOptions,
    metric_type: lance_linalg::distance::MetricType,
    dim: usize,
) -> (IndexType, VectorIndexParams, Option<usize>) {
    let ivf = match request.partitions {
        Some(n) => IvfBuildParams::new(n),
        None => IvfBuildParams::default(),
    };
    match request.kind {
        IndexKind::IvfPq => {
            // LanceDB's choice: 16 dimensions a sub-vector, else 8; always a divisor of the dimension.
            let nsv = if dim.is_multiple_of(16) {
                dim / 16
            } else if dim.is_multiple_of(8) {
                dim / 8
            } else {
                1
            };
            let params = VectorIndexParams::with_ivf_pq_params(metric_type, ivf, PQBuildParams::new(nsv, 8));
            (IndexType::IvfPq, params, Some(nsv))
        }
        IndexKind::IvfHnswSq => {
            let params = VectorIndexParams::with_ivf_hnsw_sq_params(
                metric_type,
                ivf,
                HnswBuildParams::default(),
                SQBuildParams::default(),
            );
            (IndexType::IvfHnswSq, params, None)
        }
    }
}

/// What `pipeline optimize` did.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct OptimizeReport {
    /// The version compaction committed, if it had anything to do.
    pub compacted_version: Option<u64>,
    pub compaction: CompactionRecord,
    /// The version that records the cleanup (the dataset's latest after optimize).
    pub version: u64,
    pub cleanup: CleanupRecord,
    pub seconds: f64,
}

/// Compact small fragments into large ones (indices are remapped in the same commit), then remove versions
/// older than `older_than` except tagged ones and the latest, then commit a record of the cleanup (which
/// itself commits nothing in Lance) as a change of the dataset's config key `embedding_pipeline.optimized`.
async fn optimize_open(
    ds: &mut Dataset,
    older_than: std::time::Duration,
    older_than_text: &str,
) -> Result<OptimizeReport> {
    let started = Instant::now();
    let uri = ds.uri().to_string();
    let before = ds.version().version;
    let record = |command: &str, compaction: Option<CompactionRecord>, cleanup: Option<CleanupRecord>, seconds| {
        MaintenanceRecord {
            command: command.into(),
            pipeline_version: env!("CARGO_PKG_VERSION").into(),
            seconds,
            index: None,
            compaction,
            cleanup,
            last_run: None,
        }
    };
    // The compaction's figures are known only after its commit: they go into the record committed last.
    let options =
        CompactionOptions::default().transaction_properties(record("compaction", None, None, None).properties());
    let metrics = compact_files(ds, options, None).await.map_err(lance_err(&uri))?;
    let compaction = CompactionRecord {
        fragments_removed: metrics.fragments_removed,
        fragments_added: metrics.fragments_added,
        files_removed: metrics.files_removed,
        files_added: metrics.files_added,
    };
    let compacted_version = (ds.version().version != before).then(|| ds.version().version);
    let last_run = newest_run_record(ds, ds.version().version, |_| true)
        .await?
        .map(|(version, record)| LastRun { version, record });
    let tags = ds.tags().list().await.map_err(lance_err(&uri))?;
    let older = chrono::Duration::from_std(older_than)
        .map_err(|_| refuse(&uri, format!("--older-than {older_than_text} is too long")))?;
    let stats = ds.cleanup_old_versions(older, Some(false), Some(false)).await.map_err(lance_err(&uri))?;
    let mut tagged_kept: Vec<u64> = tags.values().map(|t| t.version).collect();
    tagged_kept.sort_unstable();
    tagged_kept.dedup();
    let cleanup = CleanupRecord {
        older_than: older_than_text.to_string(),
        versions_removed: stats.old_versions,
        bytes_removed: stats.bytes_removed,
        data_files_removed: stats.data_files_removed,
        tagged_kept,
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut note = record("optimize", Some(compaction.clone()), Some(cleanup.clone()), Some(seconds));
    note.last_run = last_run;
    let stamp = chrono::Utc::now().to_rfc3339();
    let operation = Operation::UpdateConfig {
        config_updates: Some(UpdateMap {
            update_entries: vec![UpdateMapEntry { key: "embedding_pipeline.optimized".into(), value: Some(stamp) }],
            replace: false,
        }),
        table_metadata_updates: None,
        schema_metadata_updates: None,
        field_metadata_updates: HashMap::new(),
    };
    let transaction = TransactionBuilder::new(ds.version().version, operation)
        .transaction_properties(Some(Arc::new(note.properties())))
        .build();
    let committed = CommitBuilder::new(WriteDestination::Dataset(Arc::new(ds.clone())))
        .execute(transaction)
        .await
        .map_err(lance_err(&uri))?;
    *ds = committed;
    Ok(OptimizeReport { compacted_version, compaction, version: ds.version().version, cleanup, seconds })
}

/// A column name in Lance's filter dialect, which quotes names with backticks (double quotes make a string).
fn quoted(column: &str) -> String {
    format!("`{}`", column.replace('`', "``"))
}
