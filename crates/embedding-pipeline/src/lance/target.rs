//! Where a write goes: the Lance dataset of a `COPY … STORED AS LANCE` or an `INSERT INTO` a Lance table, and
//! whether it exists yet.

use std::path::Path;
use std::sync::Arc;

use datafusion::datasource::file_format::DefaultFileType;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::{DmlStatement, LogicalPlan, WriteOp};
use lance::Dataset;

use crate::lance::{LanceTable, dataset_uri};

/// Where a write plan sends its rows, and the rows it sends.
#[derive(Debug, Clone)]
pub struct WriteTarget {
    /// The dataset's URI.
    pub uri: String,
    /// The plan of the rows to write.
    pub input: Arc<LogicalPlan>,
}

/// The Lance dataset a COPY or INSERT writes to, if the plan is one.
pub fn write_target(plan: &LogicalPlan) -> Option<WriteTarget> {
    match plan {
        LogicalPlan::Copy(copy) if is_lance_type(copy) => {
            Some(WriteTarget { uri: dataset_uri(&copy.output_url), input: Arc::clone(&copy.input) })
        }
        LogicalPlan::Dml(DmlStatement { target, op: WriteOp::Insert(_), input, .. }) => {
            let provider = source_as_provider(target).ok()?;
            let table = provider.as_ref().downcast_ref::<LanceTable>()?;
            Some(WriteTarget { uri: table.uri().to_string(), input: Arc::clone(input) })
        }
        _ => None,
    }
}

/// The statement a plan executes: an `EXPLAIN ANALYZE`'s (which runs it, writing as it would) or the plan itself.
pub fn executed(plan: &LogicalPlan) -> &LogicalPlan {
    match plan {
        LogicalPlan::Analyze(analyze) => analyze.input.as_ref(),
        _ => plan,
    }
}

fn is_lance_type(copy: &datafusion::logical_expr::dml::CopyTo) -> bool {
    copy.file_type
        .as_any()
        .downcast_ref::<DefaultFileType>()
        .is_some_and(|t| t.as_format_factory().as_ref().downcast_ref::<super::LanceFormatFactory>().is_some())
}

/// Whether a Lance dataset exists at `uri`: a local path with `_versions`, or an object store URI that
/// Lance opens (any failure but "not found" counts as there, so that opening it reports the failure).
pub async fn dataset_exists(uri: &str) -> bool {
    if crate::uri::is_local(uri) {
        return Path::new(uri).join("_versions").is_dir();
    }
    if !crate::uri::is_supported(uri) {
        return false; // the sink refuses it, by its scheme
    }
    !matches!(Dataset::open(uri).await, Err(lance::Error::DatasetNotFound { .. }))
}

/// The Lance dataset at `uri` when there is one, opened once (on an object store, finding out whether it
/// exists is opening it); `None` where [`dataset_exists`] says no.
pub async fn open_existing(uri: &str) -> crate::Result<Option<Dataset>> {
    let opened = |r: lance::Result<Dataset>| {
        r.map(Some)
            .map_err(|e| crate::Error::lance_because(uri, format!("cannot open: {}", super::lance_message(&e)), e))
    };
    if crate::uri::is_local(uri) {
        if !Path::new(uri).join("_versions").is_dir() {
            return Ok(None);
        }
        return opened(Dataset::open(uri).await);
    }
    if !crate::uri::is_supported(uri) {
        return Ok(None);
    }
    match Dataset::open(uri).await {
        Err(lance::Error::DatasetNotFound { .. }) => Ok(None),
        r => opened(r),
    }
}
