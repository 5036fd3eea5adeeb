//! `WorkListExec`: a write that executes a plan (`pipeline plan`) reads the plan's work list in place of
//! its query's input and of the ordering stage's counting and sort. The work list holds the input's
//! rows already counted and ordered longest first, so this node passes them on as they are read, with
//! their count as [`TOKEN_COUNT`], for [`super::LengthOrderExec`] to cut into model calls.
//!
//! It also does the resume's work there: unless `embed.restart`, the ids already in the output (read
//! when the node executes, after the sink holds the output's lock) are skipped. And it tells the plan in
//! use where each unit ends among the rows passed on, so that each commit can say which units it
//! completed.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::compute::{cast, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::{Result, exec_datafusion_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::parquet::arrow::ParquetRecordBatchStreamBuilder;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use futures::StreamExt;

use super::existing_ids::id_arrays;
use super::length_order::{TOKEN_COUNT, longest_first};
use crate::campaign::metrics::RunMetrics;
use crate::campaign::work_plan::{UNIT_COLUMN, WORK_LIST_FILE, WorkPlanInUse};

/// Rows read from the work list at a time.
const READ_ROWS: usize = 8192;

/// Reads a plan's work list; see the module docs.
#[derive(Debug)]
pub struct WorkListExec {
    plan: Arc<WorkPlanInUse>,
    /// The output: the columns of the input it replaces, then [`TOKEN_COUNT`].
    schema: SchemaRef,
    /// The output dataset and its id column, for the ids to skip; `None` under `embed.restart`.
    resume: Option<(String, String)>,
    run: Option<Arc<RunMetrics>>,
    properties: Arc<PlanProperties>,
}

impl WorkListExec {
    /// Read `plan`'s work list as rows of `input` (the schema of the input it replaces), skipping the ids
    /// of `resume` = (output URI, id column) when given, and telling `run` the rows and tokens passed on.
    pub fn try_new(
        plan: Arc<WorkPlanInUse>,
        input: &SchemaRef,
        resume: Option<(String, String)>,
        run: Option<Arc<RunMetrics>>,
    ) -> Result<Self> {
        let mut fields: Vec<Arc<Field>> = input.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(TOKEN_COUNT, DataType::UInt32, false)));
        let schema = Arc::new(Schema::new_with_metadata(fields, input.metadata().clone()));
        let ordering = longest_first(&schema)?;
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new_with_orderings(Arc::clone(&schema), [ordering]),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self { plan, schema, resume, run, properties })
    }
}

impl DisplayAs for WorkListExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let p = &self.plan.plan;
        write!(
            f,
            "WorkListExec: plan={}, rows={}, units={}, sorted longest first by the plan",
            self.plan.dir.display(),
            p.totals.rows,
            p.units.len()
        )?;
        if self.resume.is_some() { write!(f, ", skipping ids already in the output") } else { Ok(()) }
    }
}

impl ExecutionPlan for WorkListExec {
    fn name(&self) -> &str {
        "WorkListExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if !children.is_empty() {
            return Err(exec_datafusion_err!("WorkListExec has no children"));
        }
        Ok(self)
    }

    fn execute(&self, partition: usize, _context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(exec_datafusion_err!("WorkListExec has one partition, not {}", partition + 1));
        }
        let reader = Reader {
            plan: Arc::clone(&self.plan),
            schema: Arc::clone(&self.schema),
            resume: self.resume.clone(),
            run: self.run.clone(),
        };
        let mut builder = RecordBatchReceiverStreamBuilder::new(Arc::clone(&self.schema), 2);
        let tx = builder.tx();
        builder.spawn(async move { reader.run(tx).await });
        Ok(builder.build())
    }
}

/// One execution's reading.
struct Reader {
    plan: Arc<WorkPlanInUse>,
    schema: SchemaRef,
    resume: Option<(String, String)>,
    run: Option<Arc<RunMetrics>>,
}

impl Reader {
    async fn run(self, tx: tokio::sync::mpsc::Sender<Result<datafusion::arrow::array::RecordBatch>>) -> Result<()> {
        let path = self.plan.dir.join(WORK_LIST_FILE);
        let stale = |what: String| {
            exec_datafusion_err!("the plan's work list {} {what}; run pipeline plan again", path.display())
        };
        let file = tokio::fs::File::open(&path).await.map_err(|e| stale(format!("cannot be read ({e})")))?;
        let mut rows = ParquetRecordBatchStreamBuilder::new(file)
            .await
            .map_err(|e| stale(format!("is not readable Parquet ({e})")))?
            .with_batch_size(READ_ROWS)
            .build()
            .map_err(|e| stale(format!("cannot be read ({e})")))?;
        let (skip, converter) = match &self.resume {
            Some((uri, column)) => {
                let id_type = self.schema.field_with_name(column)?.data_type().clone();
                let converter = RowConverter::new(vec![SortField::new(id_type.clone())])?;
                (done_ids(uri, column, &id_type, &converter).await?, Some((converter, column.clone())))
            }
            None => (HashSet::new(), None),
        };
        self.plan.start();
        let (mut passed, mut unit) = (0u64, None::<u32>);
        while let Some(batch) = rows.next().await {
            let batch = batch.map_err(|e| stale(format!("cannot be read ({e})")))?;
            let units = batch.column_by_name(UNIT_COLUMN).ok_or_else(|| stale(format!("has no {UNIT_COLUMN}")))?;
            let units =
                units.as_primitive_opt::<UInt32Type>().ok_or_else(|| stale(format!("has a bad {UNIT_COLUMN}")))?;
            let keep: BooleanArray = match &converter {
                Some((converter, column)) if !skip.is_empty() => {
                    let ids = batch.column_by_name(column).ok_or_else(|| stale(format!("has no column {column}")))?;
                    let ids =
                        converter.convert_columns(&[cast(ids, self.schema.field_with_name(column)?.data_type())?])?;
                    (0..batch.num_rows()).map(|i| Some(!skip.contains(ids.row(i).as_ref()))).collect()
                }
                _ => BooleanArray::from(vec![true; batch.num_rows()]),
            };
            for (row, u) in units.values().iter().enumerate() {
                if unit.is_some_and(|open| open != *u) {
                    self.plan.unit_read(passed);
                }
                unit = Some(*u);
                passed += u64::from(keep.value(row));
            }
            let rows = self.as_output(&filter_record_batch(&batch, &keep)?).map_err(|e| stale(e.to_string()))?;
            if rows.num_rows() == 0 {
                continue;
            }
            if let Some(run) = &self.run {
                let counts = rows.column(rows.num_columns() - 1).as_primitive::<UInt32Type>();
                run.record_counted(rows.num_rows() as u64, counts.values().iter().map(|n| u64::from(*n)).sum());
            }
            if tx.send(Ok(rows)).await.is_err() {
                return Ok(());
            }
        }
        if unit.is_some() {
            self.plan.unit_read(passed);
        }
        Ok(())
    }

    /// Work-list rows as this node's output: its columns by name, cast to the input's types.
    fn as_output(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let columns = self
            .schema
            .fields()
            .iter()
            .map(|f| {
                let column = batch
                    .column_by_name(f.name())
                    .ok_or_else(|| exec_datafusion_err!("has no column {} that the write reads", f.name()))?;
                Ok(cast(column, f.data_type())?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }
}

/// The ids already in the output, each as its row-format bytes.
async fn done_ids(uri: &str, column: &str, id_type: &DataType, converter: &RowConverter) -> Result<HashSet<Box<[u8]>>> {
    let mut ids = id_arrays(uri, column, id_type).await?;
    let mut done = HashSet::new();
    while let Some(array) = ids.next().await {
        let array = array?;
        let rows = converter.convert_columns(&[array])?;
        done.extend(rows.iter().map(|r| Box::<[u8]>::from(r.as_ref())));
    }
    Ok(done)
}
