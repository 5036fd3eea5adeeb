//! Resuming a campaign: a write into an existing Lance dataset embeds only the ids it does not hold yet.
//!
//! [`ResumeRule`] is an analyzer rule. For every `COPY … STORED AS LANCE` or `INSERT INTO` a Lance table
//! (unless `embed.restart`), it puts an anti-join against the dataset's id column under the projection
//! that calls `embed()`, so rows already written are dropped before they are embedded. EXPLAIN shows
//! the join. [`ExistingIds`] is the table it joins: only the id column of the dataset's latest version,
//! read when the query executes, which is after the sink has taken the dataset's write lock (at planning).
//! So the join is planned even when the output does not exist yet: another run may create it between
//! this plan and its execution, and its ids must then be skipped too.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, Result};
use datafusion::datasource::file_format::DefaultFileType;
use datafusion::datasource::{TableType, provider_as_source, source_as_provider};
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{
    DmlStatement, Expr, JoinType, LogicalPlan, LogicalPlanBuilder, Projection, WriteOp, ident,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::{StreamExt, TryStreamExt};
use lance::Dataset;

use super::{LanceTable, dataset_uri};
use crate::options::EmbedOptions;

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

fn is_lance_type(copy: &datafusion::logical_expr::dml::CopyTo) -> bool {
    copy.file_type
        .as_any()
        .downcast_ref::<DefaultFileType>()
        .is_some_and(|t| t.as_format_factory().as_ref().downcast_ref::<super::LanceFormatFactory>().is_some())
}

/// Whether a Lance dataset exists at `uri`: a local path with `_versions`, or an object store URI that
/// Lance opens (any failure but "not found" counts as there, so that opening it reports the failure).
pub async fn dataset_exists(uri: &str) -> bool {
    if crate::stores::is_local(uri) {
        return Path::new(uri).join("_versions").is_dir();
    }
    if !crate::stores::is_supported(uri) {
        return false; // the sink refuses it, by its scheme
    }
    !matches!(Dataset::open(uri).await, Err(lance::Error::DatasetNotFound { .. }))
}

/// The Lance dataset at `uri` when there is one, opened once (on an object store, finding out whether it
/// exists is opening it); `None` where [`dataset_exists`] says no.
pub async fn open_existing(uri: &str) -> crate::Result<Option<Dataset>> {
    let opened = |r: lance::Result<Dataset>| {
        r.map(Some).map_err(|e| crate::Error::Lance {
            uri: uri.to_string(),
            message: format!("cannot open: {}", super::lance_message(&e)),
        })
    };
    if crate::stores::is_local(uri) {
        if !Path::new(uri).join("_versions").is_dir() {
            return Ok(None);
        }
        return opened(Dataset::open(uri).await);
    }
    if !crate::stores::is_supported(uri) {
        return Ok(None);
    }
    match Dataset::open(uri).await {
        Err(lance::Error::DatasetNotFound { .. }) => Ok(None),
        r => opened(r),
    }
}

/// The id column of a dataset's latest version, as a table whose id type matches the writer's input.
#[derive(Debug)]
pub struct ExistingIds {
    uri: String,
    column: String,
    schema: SchemaRef,
}

impl ExistingIds {
    /// The ids of the dataset at `uri`, read as `id_type`.
    pub fn new(uri: &str, column: &str, id_type: DataType) -> Self {
        let schema = Arc::new(Schema::new(vec![Field::new(column, id_type, true)]));
        Self { uri: uri.to_string(), column: column.to_string(), schema }
    }

    /// A scan of these ids, named `__done_ids`.
    pub fn scan_plan(self) -> Result<LogicalPlan> {
        LogicalPlanBuilder::scan("__done_ids", provider_as_source(Arc::new(self)), None)?.build()
    }
}

#[async_trait]
impl TableProvider for ExistingIds {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let whole = projection.is_none_or(|p| p.as_slice() == [0]);
        if whole && limit.is_none() {
            let exec = ExistingIdsExec::new(&self.uri, &self.column, Arc::clone(&self.schema));
            return Ok(Arc::new(exec.with_rows(rows_now(&self.uri).await)));
        }
        let ids =
            Arc::new(IdStream { uri: self.uri.clone(), column: self.column.clone(), schema: Arc::clone(&self.schema) });
        Ok(Arc::new(StreamingTableExec::try_new(Arc::clone(&self.schema), vec![ids], projection, [], false, limit)?))
    }
}

impl ExistingIds {
    /// The dataset and id column it reads (what a cluster's codec carries).
    pub fn source(&self) -> (&str, &str) {
        (&self.uri, &self.column)
    }
}

/// The rows the dataset at `uri` holds now, if it can be read: an estimate for the planner (the ids are read
/// later, and a run may add some in between).
async fn rows_now(uri: &str) -> Option<usize> {
    let ds = open_existing(uri).await.ok()??;
    ds.count_rows(None).await.ok()
}

/// The scan of [`ExistingIds`]: one partition of the dataset's ids. Its own node (not DataFusion's streaming
/// table) so that a cluster's codec can carry it to the executors, which read the ids themselves.
///
/// It tells the planner how many ids there were at planning, so that few done ids are sent whole to every task
/// of the join (DataFusion's thresholds: 131,072 rows here, 1,000,000 as Ballista sets it on a cluster) rather
/// than the input being split by id: on a cluster, that shuffle cut a resume into `target_partitions` tasks of
/// mixed lengths, with the texts through the executors' work directories.
#[derive(Debug)]
pub struct ExistingIdsExec {
    ids: IdStream,
    rows: Option<usize>,
    properties: Arc<datafusion::physical_plan::PlanProperties>,
}

impl ExistingIdsExec {
    /// The ids in column `column` of the dataset at `uri`, as `schema` (one column) has them.
    pub fn new(uri: &str, column: &str, schema: SchemaRef) -> Self {
        use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
        let properties = Arc::new(datafusion::physical_plan::PlanProperties::new(
            datafusion::physical_expr::EquivalenceProperties::new(Arc::clone(&schema)),
            datafusion::physical_plan::Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self { ids: IdStream { uri: uri.to_string(), column: column.to_string(), schema }, rows: None, properties }
    }

    /// With the number of ids the dataset held at planning (none: not known).
    pub fn with_rows(mut self, rows: Option<usize>) -> Self {
        self.rows = rows;
        self
    }

    /// The number of ids the dataset held at planning, if known.
    pub fn rows(&self) -> Option<usize> {
        self.rows
    }

    /// The dataset and id column it reads.
    pub fn source(&self) -> (&str, &str) {
        (&self.ids.uri, &self.ids.column)
    }
}

impl datafusion::physical_plan::DisplayAs for ExistingIdsExec {
    fn fmt_as(
        &self,
        _t: datafusion::physical_plan::DisplayFormatType,
        f: &mut std::fmt::Formatter,
    ) -> std::fmt::Result {
        write!(f, "ExistingIdsExec: uri={}, column={}", self.ids.uri, self.ids.column)
    }
}

impl ExecutionPlan for ExistingIdsExec {
    fn name(&self) -> &str {
        "ExistingIdsExec"
    }

    fn properties(&self) -> &Arc<datafusion::physical_plan::PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(self: Arc<Self>, _children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(&self, _partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        Ok(self.ids.execute(context))
    }

    fn partition_statistics(&self, _partition: Option<usize>) -> Result<Arc<datafusion::common::Statistics>> {
        use datafusion::common::stats::Precision;
        let mut stats = datafusion::common::Statistics::new_unknown(&self.ids.schema);
        // Inexact: a run may add ids between planning and the read. None when there is no dataset yet.
        if let Some(rows) = self.rows.filter(|&n| n > 0) {
            stats.num_rows = Precision::Inexact(rows);
        }
        Ok(Arc::new(stats))
    }
}

/// Streams the id column out of the dataset, cast to the writer's id type and without the dataset's
/// schema metadata.
///
/// NOTE: a plain Lance scan would carry the dataset's schema metadata (the fingerprint) into the
/// anti-join's output, which DataFusion then rejects as differing from the logical plan's schema.
#[derive(Debug)]
struct IdStream {
    uri: String,
    column: String,
    schema: SchemaRef,
}

impl PartitionStream for IdStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (uri, column, schema) = (self.uri.clone(), self.column.clone(), Arc::clone(&self.schema));
        let out_schema = Arc::clone(&schema);
        let want = schema.field(0).data_type().clone();
        let batches = futures::stream::once(async move { id_arrays(&uri, &column, &want).await })
            .try_flatten()
            .map(move |ids| Ok(RecordBatch::try_new(Arc::clone(&schema), vec![ids?])?));
        Box::pin(RecordBatchStreamAdapter::new(out_schema, batches))
    }
}

/// The id column of the latest version of the dataset at `uri` (none when there is no dataset yet), cast
/// to `want`, read when the stream is polled.
pub async fn id_arrays(
    uri: &str,
    column: &str,
    want: &DataType,
) -> Result<futures::stream::BoxStream<'static, Result<datafusion::arrow::array::ArrayRef>>> {
    let lance_err = |e: lance::Error| -> DataFusionError {
        crate::Error::Lance { uri: uri.to_string(), message: e.to_string() }.into()
    };
    let Some(ds) = open_existing(uri).await? else {
        return Ok(Box::pin(futures::stream::empty()));
    };
    if ds.schema().field(column).is_none() {
        let e =
            crate::Error::Lance { uri: uri.to_string(), message: format!("has no id column `{column}` to resume by") };
        return Err(DataFusionError::from(e));
    }
    let mut scan = ds.scan();
    scan.project(&[column]).map_err(lance_err)?;
    let stream = scan.try_into_stream().await.map_err(lance_err)?;
    let want = want.clone();
    Ok(Box::pin(stream.map(move |batch| {
        let batch = batch.map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(cast(batch.column(0), &want)?)
    })))
}

/// The analyzer rule described in the module docs.
#[derive(Debug, Default)]
pub struct ResumeRule;

impl AnalyzerRule for ResumeRule {
    fn name(&self) -> &str {
        "embedding_pipeline_resume"
    }

    fn analyze(&self, plan: LogicalPlan, config: &ConfigOptions) -> Result<LogicalPlan> {
        let options = EmbedOptions::from_config(config);
        let Some(target) = write_target(&plan) else { return Ok(plan) };
        if options.restart {
            return Ok(plan);
        }
        let input = without_done_ids(target.input.as_ref().clone(), &target.uri, &options.id_column)?;
        plan.with_new_exprs(plan.expressions(), vec![input])
    }
}

/// Put an anti-join against the dataset's ids under the projection that calls `embed()`, or on top
/// when there is none. Left unchanged when the id column is not found there.
pub fn without_done_ids(input: LogicalPlan, uri: &str, column: &str) -> Result<LogicalPlan> {
    let mut done = false;
    let rewritten = input.clone().transform_down(|node| {
        if done {
            return Ok(Transformed::new(node, false, TreeNodeRecursion::Stop));
        }
        let LogicalPlan::Projection(p) = &node else { return Ok(Transformed::no(node)) };
        if !p.expr.iter().any(calls_embed) {
            return Ok(Transformed::no(node));
        }
        done = true;
        match anti_join(p.input.as_ref().clone(), uri, column)? {
            Some(joined) => {
                let projection = Projection::try_new(p.expr.clone(), Arc::new(joined))?;
                Ok(Transformed::new(LogicalPlan::Projection(projection), true, TreeNodeRecursion::Stop))
            }
            None => Ok(Transformed::new(node, false, TreeNodeRecursion::Stop)),
        }
    })?;
    if rewritten.transformed {
        return Ok(rewritten.data);
    }
    Ok(anti_join(input.clone(), uri, column)?.unwrap_or(input))
}

/// `__done_ids RIGHT ANTI JOIN input`: the hash join builds its table from the done ids (its left side) and
/// streams the input through, so no more than the ids is held, and rows reach `embed()` as they are read.
fn anti_join(input: LogicalPlan, uri: &str, column: &str) -> Result<Option<LogicalPlan>> {
    let Some((qualifier, field)) = input.schema().iter().find(|(_, f)| f.name() == column) else { return Ok(None) };
    let rows = Column::new(qualifier.cloned(), column);
    let ids = ExistingIds::new(uri, column, field.data_type().clone()).scan_plan()?;
    let done = Column::new(Some("__done_ids"), column);
    Ok(Some(LogicalPlanBuilder::from(ids).join(input, JoinType::RightAnti, (vec![done], vec![rows]), None)?.build()?))
}

fn calls_embed(e: &Expr) -> bool {
    let mut found = false;
    let _ = e.apply(|x| {
        if let Expr::ScalarFunction(f) = x
            && f.name() == "embed"
        {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// How many of the input's ids the dataset already holds.
pub async fn count_done(
    state: &datafusion::execution::SessionState,
    target: &WriteTarget,
    column: &str,
) -> Result<u64> {
    if !dataset_exists(&target.uri).await {
        return Ok(0);
    }
    let ids = LogicalPlanBuilder::from(target.input.as_ref().clone()).project(vec![ident(column)])?.build()?;
    let Some((_, field)) = ids.schema().iter().next().map(|(q, f)| (q.cloned(), Arc::clone(f))) else { return Ok(0) };
    let done = ExistingIds::new(&target.uri, column, field.data_type().clone()).scan_plan()?;
    let left = Column::new(ids.schema().iter().next().and_then(|(q, _)| q.cloned()), column);
    let plan = LogicalPlanBuilder::from(ids)
        .join(done, JoinType::LeftSemi, (vec![left], vec![Column::new(Some("__done_ids"), column)]), None)?
        .build()?;
    Ok(datafusion::dataframe::DataFrame::new(state.clone(), plan).count().await? as u64)
}
