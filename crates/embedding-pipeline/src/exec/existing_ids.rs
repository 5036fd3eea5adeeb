//! The ids a write's output already holds, as the table a resume joins against ([`ExistingIds`]): only the id
//! column of the dataset's latest version, read when the query executes, which is after the sink has taken the
//! dataset's write lock (at planning). Its scan ([`ExistingIdsExec`]) is a node of its own, which a cluster's codec
//! carries to the executors. Also what a dataset's rows say about resuming: [`resume_refusal`], [`count_done`].

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{Column, Result};
use datafusion::datasource::{TableType, provider_as_source};
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, JoinType, LogicalPlan, LogicalPlanBuilder, ident};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::{StreamExt, TryStreamExt};

use crate::lance::target::{WriteTarget, open_existing};

/// The id column of a dataset's latest version, as a table whose id type matches the writer's input.
#[derive(Debug)]
pub struct ExistingIds {
    uri: String,
    column: String,
    schema: SchemaRef,
    /// Why the join with these ids sits after `embed()` (see [`super::resume::WithoutDone::after_embed`]).
    after_embed: Option<String>,
    /// What chooses the write's rows anew on every run (see [`super::resume::WithoutDone::chosen_by`]).
    chosen_by: Option<String>,
}

impl ExistingIds {
    /// The ids of the dataset at `uri`, read as `id_type`.
    pub fn new(uri: &str, column: &str, id_type: DataType) -> Self {
        let schema = Arc::new(Schema::new(vec![Field::new(column, id_type, true)]));
        Self { uri: uri.to_string(), column: column.to_string(), schema, after_embed: None, chosen_by: None }
    }

    /// Joined after `embed()`, for the reason given: planning a scan of them then refuses a dataset that holds
    /// rows, as a resume would embed its rows again.
    pub fn after_embed(mut self, why: Option<String>) -> Self {
        self.after_embed = why;
        self
    }

    /// The write's rows are chosen by `what`, anew on every run: planning a scan of these ids then refuses a
    /// dataset that holds rows, as a resume would add other rows to the ones the first run chose.
    pub fn chosen_by(mut self, what: Option<String>) -> Self {
        self.chosen_by = what;
        self
    }

    /// Refuse a resume these ids would be dropped from only after embedding (see [`Self::after_embed`]), or of a
    /// write whose rows are chosen anew on every run (see [`Self::chosen_by`]): when the dataset holds rows.
    pub async fn refuse_if_resumed(&self) -> Result<()> {
        if self.after_embed.is_none() && self.chosen_by.is_none() {
            return Ok(());
        }
        match rows_now(&self.uri).await {
            Some(rows) if rows > 0 => {
                let refusal =
                    resume_refusal(&self.uri, rows as u64, self.after_embed.as_ref(), self.chosen_by.as_ref());
                refusal.map_or(Ok(()), |e| Err(DataFusionError::from(e)))
            }
            _ => Ok(()),
        }
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
        self.refuse_if_resumed().await?;
        let rows = rows_now(&self.uri).await;
        if whole && limit.is_none() {
            let exec = ExistingIdsExec::new(&self.uri, &self.column, Arc::clone(&self.schema));
            return Ok(Arc::new(exec.with_rows(rows)));
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
        // Inexact: a run may add ids between planning and the read. No dataset yet counts as none: the input
        // then keeps its partitions too (hash-partitioned by id, the branches of a UNION ALL were interleaved,
        // which the embedding stage, one partition per branch, cannot be).
        stats.num_rows = Precision::Inexact(self.rows.unwrap_or(0));
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
    let lance_err = |e: lance::Error| -> DataFusionError { crate::Error::lance_from(uri, e).into() };
    let Some(ds) = open_existing(uri).await? else {
        return Ok(Box::pin(futures::stream::empty()));
    };
    if ds.schema().field(column).is_none() {
        let e = crate::Error::lance(uri, format!("has no id column `{column}` to resume by"));
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

/// Why a write into a dataset holding `rows` rows cannot resume, if it cannot: its done ids are dropped only
/// after `embed()` (`after_embed`), or its rows are chosen anew on every run (`chosen_by`).
pub fn resume_refusal(
    uri: &str,
    rows: u64,
    after_embed: Option<&String>,
    chosen_by: Option<&String>,
) -> Option<crate::Error> {
    let uri = uri.to_string();
    match (chosen_by, after_embed) {
        (Some(what), _) => Some(crate::Error::ResumeChoice { uri, rows, what: what.clone() }),
        (None, Some(why)) => Some(crate::Error::ResumeShape { uri, rows, why: why.clone() }),
        (None, None) => None,
    }
}

/// How many ids the input has, and how many of them the dataset already holds, in one pass over the ids.
pub async fn count_done(
    state: &datafusion::execution::SessionState,
    target: &WriteTarget,
    column: &str,
) -> Result<(u64, u64)> {
    use datafusion::functions_aggregate::expr_fn::count;
    crate::campaign::ids::require_id_column(&target.input, column)?;
    // Named apart from the done ids' column: an unqualified `id` (an INSERT's input) beside `__done_ids.id` in
    // the join's output would be ambiguous.
    let ids =
        LogicalPlanBuilder::from(target.input.as_ref().clone()).project(vec![ident(column).alias("__id")])?.build()?;
    let Some(field) = ids.schema().fields().first().cloned() else { return Ok((0, 0)) };
    let done = ExistingIds::new(&target.uri, column, field.data_type().clone()).scan_plan()?;
    let done_id = Column::new(Some("__done_ids"), column);
    let plan = LogicalPlanBuilder::from(ids)
        .join(done, JoinType::Left, (vec![Column::from_name("__id")], vec![done_id.clone()]), None)?
        .aggregate(
            Vec::<Expr>::new(),
            vec![count(datafusion::logical_expr::lit(1)).alias("rows"), count(Expr::Column(done_id)).alias("done")],
        )?
        .build()?;
    let batches = datafusion::dataframe::DataFrame::new(state.clone(), plan).collect().await?;
    let get = |i: usize| {
        use datafusion::arrow::array::AsArray;
        batches.first().map_or(0, |b| b.column(i).as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0))
    };
    Ok((get(0) as u64, get(1) as u64))
}
