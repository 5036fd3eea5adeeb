//! `LengthOrderExec`: orders rows by their real token count ahead of `embed()`, so each model call
//! groups texts of similar length and pads little.
//!
//! Per partition, it reads rows, counts their tokens with the model's own tokenizer (with the prefix
//! and truncation that `embed` will apply), and emits them longest first:
//! - with `embed.order_window = N`, N rows at a time, or fewer when they reach `embed.order_memory`
//!   bytes (memory: one window);
//! - with `embed.order_window = 0`, the whole input: rows are sorted in runs of at most
//!   `embed.order_memory` bytes, each run beyond the first is spilled to an Arrow IPC file, and the runs
//!   are merged longest first (memory: one run, plus one batch per spilled run).
//!
//! It passes the rows on in batches of one model call each, cut by `embed.batch_tokens` and
//! `embed.max_batch_rows` as `embed` cuts them, so that the rows reach the sink as each call finishes.
//!
//! NOTE: `embed` tokenises the texts again. Keeping the token ids from here would mean carrying them
//! through DataFusion as an extra column; tokenising is about 1.5% of the time of a CPU run (see
//! BENCHMARKS.md), so the simpler route was taken.

use std::collections::BinaryHeap;
use std::fmt;
use std::fs::File;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, RecordBatch, RecordBatchOptions, UInt32Array};
use datafusion::arrow::compute::{concat_batches, interleave_record_batch, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, UInt32Type};
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::common::{Result, exec_datafusion_err};
use datafusion::execution::disk_manager::RefCountedTempFile;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use futures::StreamExt;

use crate::campaign::Fingerprint;
use crate::metrics::{RunMetrics, batch_bytes, compact_views};
use crate::model::batching::plan_batches;
use crate::model::{Embedder, registry};
use crate::options::{CallSettings, EmbedOptions};
use crate::udf::embed::string_values;

/// The ordering stage; see the module docs.
#[derive(Debug)]
pub struct LengthOrderExec {
    input: Arc<dyn ExecutionPlan>,
    text: Arc<dyn PhysicalExpr>,
    options: EmbedOptions,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// The run's counters, told each batch's token count (for the progress display).
    run: Option<Arc<RunMetrics>>,
}

impl LengthOrderExec {
    /// Order `input`'s rows by the token count of `text` (an expression over `input`).
    pub fn try_new(input: Arc<dyn ExecutionPlan>, text: Arc<dyn PhysicalExpr>, options: EmbedOptions) -> Result<Self> {
        let properties = Arc::new(PlanProperties::new(
            datafusion::physical_expr::EquivalenceProperties::new(input.schema()),
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self { input, text, options, properties, metrics: ExecutionPlanMetricsSet::new(), run: None })
    }

    /// Tell `run` the token counts as they are made.
    pub fn with_run_metrics(mut self, run: Option<Arc<RunMetrics>>) -> Self {
        self.run = run;
        self
    }
}

impl DisplayAs for LengthOrderExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match self.options.order_window {
            0 => write!(
                f,
                "LengthOrderExec: text={}, window=whole input, memory={} bytes",
                self.text, self.options.order_memory
            ),
            n => write!(f, "LengthOrderExec: text={}, window={n} rows", self.text),
        }
    }
}

impl ExecutionPlan for LengthOrderExec {
    fn name(&self) -> &str {
        "LengthOrderExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input =
            children.into_iter().next().ok_or_else(|| exec_datafusion_err!("LengthOrderExec needs one child"))?;
        Ok(Arc::new(
            Self::try_new(input, Arc::clone(&self.text), self.options.clone())?.with_run_metrics(self.run.clone()),
        ))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let schema = self.input.schema();
        let input = self.input.execute(partition, Arc::clone(&context))?;
        let (settings, _) = Fingerprint::for_options(&self.options)?;
        let job = Job {
            run: self.run.clone(),
            text: Arc::clone(&self.text),
            options: self.options.clone(),
            settings,
            batch_size: context.session_config().batch_size(),
            context,
            spills: MetricBuilder::new(&self.metrics).spill_count(partition),
            spilled_rows: MetricBuilder::new(&self.metrics).spilled_rows(partition),
        };
        let mut builder = RecordBatchReceiverStreamBuilder::new(Arc::clone(&schema), 2);
        let tx = builder.tx();
        builder.spawn(async move { job.run(input, tx).await });
        Ok(builder.build())
    }
}

type Sender = tokio::sync::mpsc::Sender<Result<RecordBatch>>;

/// Rows of a spilled run read back at a time: the merge holds one such batch per run.
const SPILL_BATCH_ROWS: usize = 1024;

/// One partition's work.
struct Job {
    run: Option<Arc<RunMetrics>>,
    text: Arc<dyn PhysicalExpr>,
    options: EmbedOptions,
    settings: CallSettings,
    batch_size: usize,
    context: Arc<TaskContext>,
    spills: Count,
    spilled_rows: Count,
}

/// Rows held in memory, with their token counts.
#[derive(Default)]
struct Buffer {
    batches: Vec<RecordBatch>,
    lengths: Vec<u32>,
    bytes: usize,
}

impl Buffer {
    /// The first `n` rows, and the rest.
    fn split(self, n: usize) -> Result<(Buffer, Buffer)> {
        let Some(first) = self.batches.first() else { return Ok((Buffer::default(), Buffer::default())) };
        let all = concat_batches(&first.schema(), &self.batches)?;
        let (head, tail) = (all.slice(0, n), all.slice(n, all.num_rows() - n));
        let mut lengths = self.lengths;
        let tail_lengths = lengths.split_off(n);
        let part = |b: RecordBatch, l: Vec<u32>| Buffer { bytes: batch_bytes(&b), batches: vec![b], lengths: l };
        Ok((part(head, lengths), part(tail, tail_lengths)))
    }
}

impl Job {
    async fn run(self, mut input: SendableRecordBatchStream, tx: Sender) -> Result<()> {
        let options = self.options.clone();
        let embedder = tokio::task::spawn_blocking(move || registry::for_options(&options))
            .await
            .map_err(|e| exec_datafusion_err!("loading the model failed: {e}"))??;
        let window = self.options.order_window;
        let mut buffer = Buffer::default();
        let mut runs: Vec<RefCountedTempFile> = Vec::new();
        while let Some(batch) = input.next().await {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let lengths = self.lengths(&embedder, &batch).await?;
            if let Some(run) = &self.run {
                run.record_counted(lengths.len() as u64, lengths.iter().map(|n| *n as u64).sum());
            }
            buffer.bytes += batch_bytes(&batch);
            buffer.lengths.extend(lengths);
            buffer.batches.push(batch);
            while window > 0
                && !buffer.lengths.is_empty()
                && (buffer.lengths.len() >= window || buffer.bytes >= self.options.order_memory)
            {
                let n = window.min(buffer.lengths.len());
                let (full, rest) = buffer.split(n)?;
                self.emit_sorted(full, &tx).await?;
                buffer = rest;
            }
            if window == 0 && buffer.bytes >= self.options.order_memory {
                runs.push(self.spill(std::mem::take(&mut buffer))?);
            }
        }
        if runs.is_empty() {
            return self.emit_sorted(buffer, &tx).await;
        }
        if !buffer.lengths.is_empty() {
            runs.push(self.spill(buffer)?);
        }
        self.merge(runs, &tx).await
    }

    /// Token counts of a batch's texts, off the async runtime.
    async fn lengths(&self, embedder: &Arc<Embedder>, batch: &RecordBatch) -> Result<Vec<u32>> {
        let texts = self.text.evaluate(batch)?.into_array(batch.num_rows())?;
        let (embedder, settings) = (Arc::clone(embedder), self.settings.clone());
        tokio::task::spawn_blocking(move || -> Result<Vec<u32>> {
            let values = string_values(&texts)?;
            Ok(embedder.token_lengths(&values, &settings)?.into_iter().map(|n| n as u32).collect())
        })
        .await
        .map_err(|e| exec_datafusion_err!("token counting failed: {e}"))?
    }

    /// The buffer's rows, longest first, as one batch (and their lengths, in the same order).
    fn sorted(&self, buffer: Buffer) -> Result<Option<(RecordBatch, Vec<u32>)>> {
        let Some((all, order)) = longest_first(&buffer)? else { return Ok(None) };
        let lengths = order.iter().map(|&i| buffer.lengths[i as usize]).collect();
        Ok(Some((take_rows(&all, &UInt32Array::from(order))?, lengths)))
    }

    async fn emit_sorted(&self, buffer: Buffer, tx: &Sender) -> Result<()> {
        let Some((all, order)) = longest_first(&buffer)? else { return Ok(()) };
        let lengths: Vec<usize> = order.iter().map(|&i| buffer.lengths[i as usize] as usize).collect();
        self.emit_calls(&all, &order, &lengths, tx).await?;
        Ok(())
    }

    /// Send the rows `order` picks from `batch` (longest first; `lengths` are theirs) as batches of one
    /// model call each, cut as `embed` will cut them, each copied out so that it holds only its own
    /// rows. False when the consumer is gone (a LIMIT was met, or the query stopped).
    async fn emit_calls(&self, batch: &RecordBatch, order: &[u32], lengths: &[usize], tx: &Sender) -> Result<bool> {
        let mut at = 0;
        // On rows already longest first, the calls are consecutive runs of them.
        for call in plan_batches(lengths, self.settings.batch_tokens, self.settings.max_batch_rows) {
            let rows = UInt32Array::from(order[at..at + call.rows.len()].to_vec());
            at += call.rows.len();
            if tx.send(compact_views(take_rows(batch, &rows)?)).await.is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Write the buffer as a sorted run, with its lengths as a last column.
    fn spill(&self, buffer: Buffer) -> Result<RefCountedTempFile> {
        let rows = buffer.lengths.len();
        let Some((sorted, lengths)) = self.sorted(buffer)? else {
            return Err(exec_datafusion_err!("nothing to spill"));
        };
        let file = self.context.runtime_env().disk_manager.create_tmp_file("LengthOrderExec run")?;
        let with_lengths = with_length_column(&sorted, lengths)?;
        let mut writer = FileWriter::try_new(File::create(file.path())?, &with_lengths.schema())?;
        let mut offset = 0;
        while offset < rows {
            let n = SPILL_BATCH_ROWS.min(rows - offset);
            writer.write(&with_lengths.slice(offset, n))?;
            offset += n;
        }
        writer.finish()?;
        self.spills.add(1);
        self.spilled_rows.add(rows);
        Ok(file)
    }

    /// Merge sorted runs, longest first, reading one batch per run at a time.
    async fn merge(&self, runs: Vec<RefCountedTempFile>, tx: &Sender) -> Result<()> {
        let mut cursors = Vec::with_capacity(runs.len());
        for run in &runs {
            let mut reader = FileReader::try_new(File::open(run.path())?, None)?;
            let first = reader.next().transpose()?;
            cursors.push(Cursor { reader, batch: first, row: 0 });
        }
        // Max-heap of (length, run); ties go to the lower run, which holds earlier input.
        let mut heap = BinaryHeap::new();
        for (i, c) in cursors.iter().enumerate() {
            if let Some(len) = c.length() {
                heap.push((len, std::cmp::Reverse(i)));
            }
        }
        let mut picks: Vec<(usize, usize)> = Vec::with_capacity(self.batch_size);
        let mut pick_lengths: Vec<usize> = Vec::with_capacity(self.batch_size);
        while let Some((len, std::cmp::Reverse(i))) = heap.pop() {
            picks.push((i, cursors[i].row));
            pick_lengths.push(len as usize);
            cursors[i].row += 1;
            let exhausted_batch = cursors[i].batch.as_ref().is_some_and(|b| cursors[i].row >= b.num_rows());
            if (picks.len() >= self.batch_size || exhausted_batch)
                && !self.emit_picks(&cursors, &mut picks, &mut pick_lengths, tx).await?
            {
                return Ok(());
            }
            if exhausted_batch {
                cursors[i].batch = cursors[i].reader.next().transpose()?;
                cursors[i].row = 0;
            }
            if let Some(len) = cursors[i].length() {
                heap.push((len, std::cmp::Reverse(i)));
            }
        }
        self.emit_picks(&cursors, &mut picks, &mut pick_lengths, tx).await?;
        Ok(())
    }

    /// Send the picked rows as one batch, without the length column. False when the consumer is gone.
    async fn emit_picks(
        &self,
        cursors: &[Cursor],
        picks: &mut Vec<(usize, usize)>,
        lengths: &mut Vec<usize>,
        tx: &Sender,
    ) -> Result<bool> {
        if picks.is_empty() {
            return Ok(true);
        }
        // Exhausted runs are never picked, but interleave wants a batch of the same schema for each.
        let batches: Vec<RecordBatch> = cursors
            .iter()
            .map(|c| c.batch.clone().unwrap_or_else(|| RecordBatch::new_empty(c.reader.schema())))
            .collect();
        let refs: Vec<&RecordBatch> = batches.iter().collect();
        let merged = interleave_record_batch(&refs, picks)?;
        picks.clear();
        let without = merged.project(&(0..merged.num_columns() - 1).collect::<Vec<_>>())?;
        let order: Vec<u32> = (0..without.num_rows() as u32).collect();
        let sent = self.emit_calls(&without, &order, lengths, tx).await;
        lengths.clear();
        sent
    }
}

/// The buffer's rows as one batch, and the order of its rows longest first (ties keep input order).
fn longest_first(buffer: &Buffer) -> Result<Option<(RecordBatch, Vec<u32>)>> {
    let Some(first) = buffer.batches.first() else { return Ok(None) };
    let all = concat_batches(&first.schema(), &buffer.batches)?;
    let mut order: Vec<u32> = (0..buffer.lengths.len() as u32).collect();
    order.sort_by(|a, b| buffer.lengths[*b as usize].cmp(&buffer.lengths[*a as usize]));
    Ok(Some((all, order)))
}

/// A position in one spilled run.
struct Cursor {
    reader: FileReader<File>,
    batch: Option<RecordBatch>,
    row: usize,
}

impl Cursor {
    fn length(&self) -> Option<u32> {
        let b = self.batch.as_ref()?;
        (self.row < b.num_rows()).then(|| b.column(b.num_columns() - 1).as_primitive::<UInt32Type>().value(self.row))
    }
}

/// `batch`'s rows at `indices`. Unlike arrow's `take_record_batch`, also for a batch without columns (a
/// query of constants, `SELECT 'a' AS id, embed('x')`, reaches the ordering stage as rows of no columns).
fn take_rows(batch: &RecordBatch, indices: &UInt32Array) -> Result<RecordBatch> {
    let columns = batch.columns().iter().map(|c| take(c, indices, None)).collect::<Result<Vec<_>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(indices.len()));
    Ok(RecordBatch::try_new_with_options(batch.schema(), columns, &options)?)
}

fn with_length_column(batch: &RecordBatch, lengths: Vec<u32>) -> Result<RecordBatch> {
    let mut fields: Vec<Arc<Field>> = batch.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new("__token_count", DataType::UInt32, false)));
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns.push(Arc::new(UInt32Array::from(lengths)));
    Ok(RecordBatch::try_new(Arc::new(Schema::new_with_metadata(fields, batch.schema().metadata().clone())), columns)?)
}
