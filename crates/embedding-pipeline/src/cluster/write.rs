//! A write into Lance on a cluster: every task writes its share as uncommitted Lance fragments, and the client
//! makes one commit of them all.
//!
//! The client checks what a local write checks (ids, fingerprint, tag, the write lock, which it holds to the
//! end), puts the same anti-join against the ids already written under `embed()`, and sends the input wrapped
//! in a [`ClusterWriteNode`]. The scheduler plans that as a [`FragmentWriteExec`] over the input's partitions.
//! On each executor the task orders its partition by length and embeds it a model call at a time (the write
//! path's own stages, built there from the job's options and the executor's device), writes Lance data files
//! without a manifest, and answers with one row: the uncommitted transaction, and a run record of its rows.
//! The client merges the tasks' fragments into one Append (or Overwrite, for a new dataset or `--restart`)
//! against the version it read, with a run record that sums every task's and lists each executor's share.
//!
//! A task that Ballista runs again (a failure, a lost executor) writes new files; only the attempt whose
//! result reaches the client is committed, so a retry leaves unreferenced files (which Lance's cleanup
//! removes once older than its threshold), never duplicate rows. A job that fails commits nothing.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, BinaryArray, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{DFSchema, DFSchemaRef, Result, exec_datafusion_err};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::session_state::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use futures::StreamExt;
use lance::dataset::transaction::{Operation, Transaction, TransactionBuilder};
use lance::dataset::{CommitBuilder, InsertBuilder, WriteMode, WriteParams};
use lance::table::format::pb;
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::campaign::metrics::{RunMetrics, WriteReport};
use crate::campaign::{EmbedStats, ExecutorShare, FINGERPRINT_KEY, RUN_RECORD_KEY, RunRecord};
use crate::exec::existing_ids::resume_refusal;
use crate::exec::resume::without_done_ids;
use crate::lance::lance_err;
use crate::lance::lock::{Holder, WriteLock};
use crate::lance::sink::{ExistingOutput, check_existing, check_output_location, fingerprint_of_columns};
use crate::lance::target::{WriteTarget, open_existing};
use crate::options::EmbedOptions;

/// What a distributed write writes: the dataset, how, and the fingerprint its schema carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WriteSpec {
    /// The dataset's URI, which every executor and the client reach alike.
    pub uri: String,
    /// Add to the dataset (else the tasks' fragments replace its rows, or make it).
    pub append: bool,
    /// The campaign fingerprint (JSON) the dataset's schema carries.
    pub fingerprint: Option<String>,
}

/// The columns of each task's answer.
fn task_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("task", DataType::UInt64, false),
        Field::new("executor", DataType::Utf8, false),
        Field::new("transaction", DataType::Binary, false),
        Field::new("record", DataType::Utf8, false),
    ]))
}

/// The logical node of a distributed write: its input, written by the tasks as uncommitted fragments.
#[derive(Debug, Clone)]
pub struct ClusterWriteNode {
    input: LogicalPlan,
    spec: WriteSpec,
    schema: DFSchemaRef,
}

impl ClusterWriteNode {
    /// A write of `input` as `spec` says.
    pub fn new(input: LogicalPlan, spec: WriteSpec) -> Result<Self> {
        Ok(Self { input, spec, schema: Arc::new(DFSchema::try_from(task_schema().as_ref().clone())?) })
    }

    /// What it writes.
    pub fn spec(&self) -> &WriteSpec {
        &self.spec
    }
}

impl PartialEq for ClusterWriteNode {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec && self.input == other.input
    }
}
impl Eq for ClusterWriteNode {}
impl Hash for ClusterWriteNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.spec.hash(state);
        self.input.hash(state);
    }
}
impl PartialOrd for ClusterWriteNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match self.spec.uri.partial_cmp(&other.spec.uri) {
            Some(Ordering::Equal) => self.input.partial_cmp(&other.input),
            o => o,
        }
    }
}

impl UserDefinedLogicalNodeCore for ClusterWriteNode {
    fn name(&self) -> &str {
        "ClusterWrite"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        Vec::new()
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "ClusterWrite: uri={}, append={}", self.spec.uri, self.spec.append)
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> Result<Self> {
        let input = inputs.into_iter().next().ok_or_else(|| exec_datafusion_err!("ClusterWrite needs one input"))?;
        Ok(Self { input, spec: self.spec.clone(), schema: Arc::clone(&self.schema) })
    }
}

/// The scheduler's physical planner: DataFusion's, which plans a [`ClusterWriteNode`] as a
/// [`FragmentWriteExec`].
///
/// A write's joins are planned as hash joins, whatever `datafusion.optimizer.prefer_hash_join` says (Ballista
/// sets it false, for sort-merge joins, which spill). The join that drops the done ids of a resume then sends
/// them whole to every task when they are few (up to 1,000,000 ids, the threshold Ballista sets), and the input keeps
/// its scan's partitions; as a sort-merge join, it shuffled the input by id into `target_partitions` tasks.
#[derive(Debug, Default)]
pub struct SchedulerPlanner;

#[async_trait]
impl QueryPlanner for SchedulerPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session_state: &SessionState,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let planner = DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(ClusterWritePlanner)]);
        let write = matches!(logical_plan, LogicalPlan::Extension(e) if e.node.as_any().is::<ClusterWriteNode>());
        if write && !session_state.config().options().optimizer.prefer_hash_join {
            let mut state = session_state.clone();
            state.config_mut().options_mut().optimizer.prefer_hash_join = true;
            return planner.create_physical_plan(logical_plan, &state).await;
        }
        planner.create_physical_plan(logical_plan, session_state).await
    }
}

#[derive(Debug)]
struct ClusterWritePlanner;

#[async_trait]
impl ExtensionPlanner for ClusterWritePlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session_state: &SessionState,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<ClusterWriteNode>() else { return Ok(None) };
        let input = physical_inputs.first().ok_or_else(|| exec_datafusion_err!("ClusterWrite needs one input"))?;
        Ok(Some(Arc::new(FragmentWriteExec::new(Arc::clone(input), node.spec.clone(), None))))
    }
}

/// Where a [`FragmentWriteExec`] runs: the executor, its process's counters (which know the device its model
/// calls ran on), and the counters of this task's rows, which the embedding stage sends with them.
#[derive(Debug, Clone)]
pub struct TaskPlace {
    pub executor: String,
    pub process: Arc<RunMetrics>,
    pub task: Arc<RunMetrics>,
}

/// Writes each partition of its input as uncommitted Lance fragments and answers with one row per partition
/// (see the module docs).
#[derive(Debug)]
pub struct FragmentWriteExec {
    input: Arc<dyn ExecutionPlan>,
    spec: WriteSpec,
    place: Option<TaskPlace>,
    properties: Arc<PlanProperties>,
}

impl FragmentWriteExec {
    /// The write of `input` as `spec` says, on the executor `place` names (`None` where it is only planned).
    pub fn new(input: Arc<dyn ExecutionPlan>, spec: WriteSpec, place: Option<TaskPlace>) -> Self {
        let partitions = input.properties().output_partitioning().partition_count();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(task_schema()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self { input, spec, place, properties }
    }

    /// What it writes.
    pub fn spec(&self) -> &WriteSpec {
        &self.spec
    }
}

impl DisplayAs for FragmentWriteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "FragmentWriteExec: uri={}, append={}", self.spec.uri, self.spec.append)
    }
}

impl ExecutionPlan for FragmentWriteExec {
    fn name(&self) -> &str {
        "FragmentWriteExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    /// Each task writes the partition it reads: no repartitioning between the embedding and the writer.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input =
            children.into_iter().next().ok_or_else(|| exec_datafusion_err!("FragmentWriteExec needs one child"))?;
        Ok(Arc::new(Self::new(input, self.spec.clone(), self.place.clone())))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let spec = self.spec.clone();
        let place = self.place.clone().unwrap_or_else(|| TaskPlace {
            executor: "here".into(),
            process: Arc::new(RunMetrics::default()),
            task: Arc::new(RunMetrics::default()),
        });
        let answer = async move { write_partition(input, &spec, &place, partition as u64).await };
        Ok(Box::pin(RecordBatchStreamAdapter::new(task_schema(), futures::stream::once(answer))))
    }
}

/// One task: its partition's rows into uncommitted fragments, and the row that answers for them.
async fn write_partition(
    input: SendableRecordBatchStream,
    spec: &WriteSpec,
    place: &TaskPlace,
    task: u64,
) -> Result<RecordBatch> {
    let started = Instant::now();
    let mut schema = input.schema().as_ref().clone();
    if let Some(fp) = &spec.fingerprint {
        schema.metadata.insert(FINGERPRINT_KEY.to_string(), fp.clone());
    }
    let schema = Arc::new(schema);
    let counted = Arc::new(Mutex::new((0u64, EmbedStats::default())));
    let (sum, to, metrics) = (Arc::clone(&counted), Arc::clone(&schema), Arc::clone(&place.task));
    let batches = input.map(move |batch| {
        let batch = batch?;
        let stats = metrics.receive_embedded(batch.num_rows() as u64);
        let mut sum = sum.lock().unwrap_or_else(|e| e.into_inner());
        sum.0 += batch.num_rows() as u64;
        sum.1.add(&stats);
        Ok(batch.with_schema(Arc::clone(&to))?)
    });
    let mut batches = Box::pin(batches.peekable());
    let mut transaction = Vec::new();
    let mut write_seconds = 0.0;
    if batches.as_mut().peek().await.is_some() {
        let written = Instant::now();
        let stream: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&schema), batches));
        let mode = if spec.append { WriteMode::Append } else { WriteMode::Overwrite };
        let params = WriteParams { mode, ..Default::default() };
        let failed = |e| datafusion::error::DataFusionError::from(lance_err(&spec.uri)(e));
        let written_txn = InsertBuilder::new(spec.uri.as_str())
            .with_params(&params)
            .execute_uncommitted_stream(stream)
            .await
            .map_err(failed)?;
        transaction = pb::Transaction::try_from(&written_txn).map_err(failed)?.encode_to_vec();
        write_seconds = written.elapsed().as_secs_f64();
    }
    let (rows, stats) = counted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let device = if stats.docs + stats.nulls > 0 { place.process.device() } else { None };
    let mut record = RunRecord::new(&stats, rows, started.elapsed().as_secs_f64(), write_seconds, device);
    record.peak_memory_bytes = crate::process::memory::peak().unwrap_or(0);
    let record = serde_json::to_string(&record).map_err(|e| exec_datafusion_err!("task record: {e}"))?;
    Ok(RecordBatch::try_new(
        task_schema(),
        vec![
            Arc::new(UInt64Array::from(vec![task])),
            Arc::new(StringArray::from(vec![place.executor.clone()])),
            Arc::new(BinaryArray::from(vec![transaction.as_slice()])),
            Arc::new(StringArray::from(vec![record])),
        ],
    )?)
}

/// The tasks' answers gathered: their transactions and records, by task.
#[derive(Debug, Default)]
pub struct Gathered {
    pub operations: Vec<Operation>,
    pub records: Vec<(String, RunRecord)>,
    /// The tasks that answered (each once).
    pub tasks: std::collections::BTreeSet<u64>,
}

/// Read the tasks' answer rows.
pub fn gather(batches: &[RecordBatch]) -> crate::Result<Gathered> {
    let bad = |what: String| crate::Error::Cluster(format!("a task's answer does not read: {what}"));
    let mut out = Gathered::default();
    for batch in batches {
        let column = |name: &str| batch.column_by_name(name).ok_or_else(|| bad(format!("no column {name}")));
        let executors = column("executor")?.as_string_opt::<i32>().ok_or_else(|| bad("executor".into()))?.clone();
        let transactions =
            column("transaction")?.as_binary_opt::<i32>().ok_or_else(|| bad("transaction".into()))?.clone();
        let records = column("record")?.as_string_opt::<i32>().ok_or_else(|| bad("record".into()))?.clone();
        let tasks = column("task")?
            .as_primitive_opt::<datafusion::arrow::datatypes::UInt64Type>()
            .ok_or_else(|| bad("task".into()))?
            .clone();
        for row in 0..batch.num_rows() {
            if !out.tasks.insert(tasks.value(row)) {
                return Err(bad(format!("task {} answered twice; nothing was committed", tasks.value(row))));
            }
            let record: RunRecord = serde_json::from_str(records.value(row)).map_err(|e| bad(e.to_string()))?;
            if !transactions.is_null(row) && !transactions.value(row).is_empty() {
                let message = pb::Transaction::decode(transactions.value(row)).map_err(|e| bad(e.to_string()))?;
                let transaction = Transaction::try_from(message).map_err(|e| bad(e.to_string()))?;
                out.operations.push(transaction.operation);
            }
            out.records.push((executors.value(row).to_string(), record));
        }
    }
    Ok(out)
}

/// The tasks' operations as one: every fragment in one Append, or in one Overwrite with their schema.
pub fn merged(operations: Vec<Operation>) -> crate::Result<Option<Operation>> {
    let mut merged: Option<Operation> = None;
    for op in operations {
        merged = Some(match (merged, op) {
            (None, op @ (Operation::Append { .. } | Operation::Overwrite { .. })) => op,
            (Some(Operation::Append { mut fragments }), Operation::Append { fragments: more }) => {
                fragments.extend(more);
                Operation::Append { fragments }
            }
            (
                Some(Operation::Overwrite { mut fragments, schema, config_upsert_values, initial_bases }),
                Operation::Overwrite { fragments: more, .. },
            ) => {
                fragments.extend(more);
                Operation::Overwrite { fragments, schema, config_upsert_values, initial_bases }
            }
            (Some(first), other) => {
                return Err(crate::Error::Cluster(format!(
                    "the tasks wrote with different Lance operations ({first} and {other}); nothing was committed"
                )));
            }
            (None, other) => {
                return Err(crate::Error::Cluster(format!(
                    "a task wrote with the Lance operation {other}, not an append or overwrite; nothing was committed"
                )));
            }
        });
    }
    Ok(merged)
}

/// Each executor's share, and the sum of every task's counters.
pub fn shares(records: &[(String, RunRecord)]) -> (Vec<ExecutorShare>, EmbedStats, u64) {
    let mut by: BTreeMap<String, ExecutorShare> = BTreeMap::new();
    let (mut total, mut rows) = (EmbedStats::default(), 0);
    for (executor, r) in records {
        total.add(&r.stats());
        rows += r.rows_written;
        let share = by
            .entry(executor.clone())
            .or_insert_with(|| ExecutorShare { executor: executor.clone(), ..Default::default() });
        share.tasks += 1;
        share.rows_written += r.rows_written;
        share.documents += r.documents;
        share.useful_tokens += r.useful_tokens;
        share.processed_tokens += r.processed_tokens;
        share.model_seconds += r.model_seconds;
        if share.device.is_none() {
            share.device = r.device.clone();
        }
    }
    (by.into_values().collect(), total, rows)
}

/// What the client knows of a write when its tasks have answered: where it goes, what it read, how it began.
pub struct Committing<'a> {
    pub uri: &'a str,
    /// The version of `uri` the write was planned against (0 when it did not exist).
    pub read_version: u64,
    pub fingerprint: Option<&'a crate::campaign::Fingerprint>,
    /// The device the output's previous version was made on, which the run record notes beside its own.
    pub previous_device: Option<crate::campaign::DeviceInfo>,
    pub started: Instant,
    /// Whether the write is a `--restart`.
    pub restarted: bool,
}

/// Commit the tasks' fragments as one version of the write's output, with a run record of them all.
/// `None` when the tasks wrote nothing.
pub async fn commit(
    write: Committing<'_>,
    gathered: Gathered,
    metrics: &RunMetrics,
) -> crate::Result<Option<WriteReport>> {
    let Committing { uri, read_version, fingerprint, previous_device, started, restarted } = write;
    let (executors, stats, rows) = shares(&gathered.records);
    let peak = gathered.records.iter().map(|(_, r)| r.peak_memory_bytes).max().unwrap_or(0);
    let Some(mut operation) = merged(gathered.operations)?.filter(|_| rows > 0) else { return Ok(None) };
    // NOTE: lance 14.0.2's protobuf form of an Overwrite drops the schema's metadata ("TODO: handle metadata"), which
    // holds the fingerprint: put it back.
    if let (Operation::Overwrite { schema, .. }, Some(fp)) = (&mut operation, fingerprint) {
        schema.metadata.insert(FINGERPRINT_KEY.to_string(), fp.to_json());
    }
    let committing = Instant::now();
    let device = executors.iter().find_map(|s| s.device.clone());
    let wall = started.elapsed().as_secs_f64();
    let mut record = RunRecord::new(&stats, rows, wall, 0.0, device);
    record.note_origin(fingerprint, previous_device);
    record.executors = executors;
    // The executors' peak (the largest of their processes'), which a memory budget is about.
    record.peak_memory_bytes = peak;
    // A restart's record, as a local write's (see `ops::restart`): one commit, so never unfinished, and a local
    // restart that stopped is finished by it.
    record.write_digest = metrics.write_digest(uri);
    record.restarted = restarted || record.write_digest.is_some();
    let json = serde_json::to_string(&record).unwrap_or_default();
    let transaction = TransactionBuilder::new(read_version, operation)
        .transaction_properties(Some(Arc::new(HashMap::from([(RUN_RECORD_KEY.to_string(), json)]))))
        .build();
    let dataset = CommitBuilder::new(uri).execute(transaction).await.map_err(lance_err(uri))?;
    record.write_seconds = committing.elapsed().as_secs_f64();
    metrics.record_embed(&stats);
    if let Some(device) = &record.device {
        metrics.record_device(device);
    }
    let report = WriteReport {
        uri: uri.to_string(),
        rows,
        version: dataset.version().version,
        elapsed: started.elapsed(),
        record,
    };
    metrics.record_write(report.clone());
    Ok(Some(report))
}

/// The logical plan a client sends for a write: `input` under a [`ClusterWriteNode`].
pub fn write_plan(input: LogicalPlan, spec: WriteSpec) -> Result<LogicalPlan> {
    Ok(LogicalPlan::Extension(Extension { node: Arc::new(ClusterWriteNode::new(input, spec)?) }))
}

/// The write's input without the ids the dataset `existing` at `uri` holds, dropped before embed(), on the
/// executors, as a local write drops them. A resume that cannot drop them there, or whose rows are chosen anew on
/// every run, is refused when the dataset holds rows (see [`resume_refusal`]).
async fn without_done(
    input: LogicalPlan,
    uri: &str,
    existing: &lance::Dataset,
    id_column: &str,
) -> Result<LogicalPlan> {
    let skipped = without_done_ids(input, uri, id_column)?;
    if skipped.after_embed.is_some() || skipped.chosen_by.is_some() {
        let rows = existing.count_rows(None).await.map_err(lance_err(uri))? as u64;
        let refusal = resume_refusal(uri, rows, skipped.after_embed.as_ref(), skipped.chosen_by.as_ref());
        if let (true, Some(refusal)) = (rows > 0, refusal) {
            return Err(refusal.into());
        }
    }
    Ok(skipped.plan)
}

/// Run a job's write into Lance on the cluster `session` is connected to, as the module docs describe: checked
/// and locked here, embedded and written by the tasks, committed here in one version. `None` when there was
/// nothing left to write.
pub async fn run(session: &crate::EmbedSession, target: &WriteTarget) -> Result<Option<WriteReport>> {
    let ctx = session.context();
    let options = EmbedOptions::from_config(ctx.state().config_options());
    let uri = target.uri.as_str();
    check_output_location(uri)?;
    let _lock = WriteLock::acquire(uri, Holder::Run)?;
    let existing = open_existing(uri).await?;
    let fingerprint = fingerprint_of_columns(target.input.schema().as_arrow())?;
    let ExistingOutput { previous_device, tag_is_current } = match &existing {
        Some(ds) => check_existing(uri, ds, fingerprint.as_ref(), &options).await?,
        None => ExistingOutput::default(),
    };
    if let Some(v) = tag_is_current
        && options.restart
    {
        return Err(crate::Error::Cluster(format!(
            "embed.tag '{}' already marks version {v} of {uri}, the current one, and --restart would make a new \
             version; nothing was run: choose another tag",
            options.tag
        ))
        .into());
    }
    let append = existing.is_some() && !options.restart;
    let input = target.input.as_ref().clone();
    let input = match &existing {
        Some(ds) if append => without_done(input, uri, ds, &options.id_column).await?,
        _ => input,
    };
    // The ids the tasks would write are checked here, before any task runs, as a local write's planning does.
    crate::exec::guard::check_write_ids(&session.local_state(), &input, &options.id_column).await?;
    let spec = WriteSpec { uri: uri.to_string(), append, fingerprint: fingerprint.as_ref().map(|f| f.to_json()) };
    let started = Instant::now();
    let job = async { ctx.execute_logical_plan(write_plan(input, spec)?).await?.collect().await };
    let batches = tokio::select! {
        batches = job => batches.map_err(|e| crate::Error::Cluster(format!(
            "the cluster's job failed, so nothing was committed and {uri} is as it was (its tasks' files are used by no \
             version); run the job again to embed what is missing, once the cause below is mended:\n{e}"
        )))?,
        _ = session.stop().stopped() => {
            return Err(crate::Error::Cluster(format!(
                "stopped: nothing was committed, so {uri} is as it was; the cluster may finish the job's tasks, whose \
                 files no version uses (run the job again to embed what is missing)"
            )).into());
        }
    };
    let gathered = gather(&batches)?;
    if let Some(v) = tag_is_current
        && gathered.records.iter().any(|(_, r)| r.rows_written > 0)
    {
        return Err(crate::Error::Cluster(format!(
            "embed.tag '{}' already marks version {v} of {uri}, and this write has rows to add, which would make a new \
             version; nothing was committed: choose another tag",
            options.tag
        ))
        .into());
    }
    let read_version = existing.as_ref().map_or(0, |d| d.version().version);
    let write = Committing {
        uri,
        read_version,
        fingerprint: fingerprint.as_ref(),
        previous_device,
        started,
        restarted: options.restart,
    };
    let report = commit(write, gathered, session.metrics()).await?;
    // The version the job ends on carries the tag: the new one, or, when nothing was left to write, the current one
    // (a finished job run again), as a local write does.
    let tagged = report.as_ref().map(|r| r.version).or(existing.as_ref().map(|_| read_version));
    if let Some(version) = tagged.filter(|_| !options.tag.is_empty() && (report.is_some() || tag_is_current.is_none()))
    {
        let ds = lance::Dataset::open(uri).await.map_err(lance_err(uri))?;
        ds.tags().create(&options.tag, version).await.map_err(lance_err(uri))?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(rows: u64, docs: u64, tokens: u64) -> RunRecord {
        let stats = EmbedStats { docs, useful_tokens: tokens, processed_tokens: tokens * 2, ..Default::default() };
        RunRecord::new(&stats, rows, 1.0, 0.0, None)
    }

    #[test]
    fn shares_add_up_per_executor_and_in_total() {
        let records = vec![
            ("a:1".to_string(), record(10, 10, 100)),
            ("b:1".to_string(), record(5, 4, 40)),
            ("a:1".to_string(), record(7, 7, 70)),
        ];
        let (by, total, rows) = shares(&records);
        assert_eq!(rows, 22);
        assert_eq!((total.docs, total.useful_tokens, total.processed_tokens), (21, 210, 420));
        assert_eq!(by.len(), 2);
        assert_eq!(
            (by[0].executor.as_str(), by[0].tasks, by[0].rows_written, by[0].useful_tokens),
            ("a:1", 2, 17, 170)
        );
        assert_eq!((by[1].executor.as_str(), by[1].tasks, by[1].rows_written), ("b:1", 1, 5));
    }

    #[test]
    fn no_operation_commits_nothing_and_kinds_do_not_mix() {
        assert!(merged(Vec::new()).unwrap().is_none());
        let append = || Operation::Append { fragments: Vec::new() };
        assert!(matches!(merged(vec![append(), append()]).unwrap(), Some(Operation::Append { .. })));
        let other = Operation::Delete {
            updated_fragments: Vec::new(),
            deleted_fragment_ids: Vec::new(),
            predicate: String::new(),
        };
        assert!(merged(vec![append(), other]).is_err());
    }
}
