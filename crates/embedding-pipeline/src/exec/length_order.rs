//! Ordering rows by their real token count ahead of `embed()`, so each model call groups texts of similar
//! length and pads little. Two nodes:
//!
//! - [`TokenCountExec`] tokenises each row's text with the model's own tokenizer (with the prefix and
//!   truncation that `embed` will apply) and appends the count as the column [`TOKEN_COUNT`]; on the write
//!   path it also appends the tokens themselves as [`TOKENS`], which [`super::EmbedExec`] hands to `embed`, so
//!   that each text is tokenised once.
//! - [`LengthOrderExec`] passes the rows on longest first, in batches of one model call each (cut by
//!   `embed.batch_tokens` and `embed.max_batch_rows` as `embed` cuts them, so the rows reach the sink as
//!   each call finishes), without the count column:
//!   - with `embed.order_window = N`, it orders N rows at a time itself, or fewer when they reach
//!     [`WINDOW_BYTES`] or the session's memory pool (`datafusion.runtime.memory_limit`) refuses more
//!     (memory: the window being filled and the one being passed on, each held once, in the batches its rows
//!     came in: ordering a window sorts its rows' places, not the rows, and each call's rows are copied out as
//!     it is sent). The next
//!     window fills while the last one's calls run, so the model does not wait for it, and the first windows
//!     are small ([`FIRST_WINDOW_ROWS`], each next one [`WINDOW_GROWTH`] times the last up to N), so the first model call starts within a second
//!     whatever the corpus's size, on a start and on a resume;
//!   - with `embed.order_window = 0`, DataFusion's `SortExec` orders the whole input by the count column
//!     below it, spilling to disk under the session's memory pool, and this node only cuts the calls.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, BinaryBuilder, RecordBatch, RecordBatchOptions, UInt32Array};
use datafusion::arrow::compute::{SortOptions, concat_batches, interleave};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{Result, exec_datafusion_err};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{
    EquivalenceProperties, LexOrdering, OrderingRequirements, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use futures::StreamExt;

use crate::campaign::Fingerprint;
use crate::campaign::metrics::{RunMetrics, batch_bytes, compact_views};
use crate::model::batching::plan_batches;
use crate::model::{CallSettings, TextEmbedder};
use crate::options::EmbedOptions;
use crate::udf::embed::string_values;

/// The column [`TokenCountExec`] appends: each row's token count, as `embed` will feed it.
pub const TOKEN_COUNT: &str = "__token_count";

/// The column [`TokenCountExec::with_dropped_tokens`] appends after it: the tokens truncation cuts.
pub const DROPPED_TOKENS: &str = "__dropped_tokens";

/// The column [`TokenCountExec::with_tokens`] appends before [`TOKEN_COUNT`]: each row's tokens as
/// [`crate::model::tokenize::Tokenized::to_bytes`] writes them (NULL for a NULL text).
pub const TOKENS: &str = "__tokens";

/// Rows of the first window (`embed.order_window` > 0); each next window is [`WINDOW_GROWTH`] times the last, up
/// to the option.
/// Small, so that the first model call starts as soon as these rows are read and counted; a window's ordering
/// is good from a few hundred rows on (the calls it cuts hold neighbouring lengths).
pub const FIRST_WINDOW_ROWS: usize = 1024;

/// How many times the last window's rows each next window holds, up to `embed.order_window`: four, so that a run
/// reaches full windows (their padding, and their memory) after 21,504 rows at the default, where doubling took
/// 64,512 (at 100,000 mixed documents, padding efficiency 0.990 against doubling's 0.986). The model does not wait
/// longer for it: the next window is counted while the last one's calls run, and counting is the faster of the two
/// except where the host, not the model, sets the pace anyway.
pub const WINDOW_GROWTH: usize = 4;

/// Most rows tokenised at once by [`TokenCountExec`]: a scan's batch (8,192 rows by default) is counted in
/// slices of this many, so that the ordering stage sees its first rows early.
pub const COUNT_ROWS: usize = 1024;

/// Most bytes of rows one window holds (`embed.order_window` > 0) before it is ordered and passed on.
pub const WINDOW_BYTES: usize = 64 * 1024 * 1024;

/// The ordering stage for `options` over `input`, ordering by the token count of `text` (an expression
/// over `input`): counting, then the windowed ordering, or the whole-input sort and the cutting of calls.
pub fn length_order(
    input: Arc<dyn ExecutionPlan>,
    text: Arc<dyn PhysicalExpr>,
    options: &EmbedOptions,
    run: Option<Arc<RunMetrics>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let counted: Arc<dyn ExecutionPlan> = Arc::new(
        TokenCountExec::try_new(input, Arc::clone(&text), options.clone())?.with_run_metrics(run).with_tokens(),
    );
    let (input, window) = match options.order_window {
        0 => {
            let sort = SortExec::new(longest_first(&counted.schema())?, counted);
            (Arc::new(sort) as Arc<dyn ExecutionPlan>, None)
        }
        n => (counted, Some(n)),
    };
    Ok(Arc::new(LengthOrderExec::try_new(input, text, options.clone(), window)?))
}

/// The ordering on [`TOKEN_COUNT`], largest first.
pub fn longest_first(schema: &SchemaRef) -> Result<LexOrdering> {
    let count = Arc::new(Column::new_with_schema(TOKEN_COUNT, schema)?);
    let options = SortOptions { descending: true, nulls_first: false };
    LexOrdering::new([PhysicalSortExpr::new(count, options)])
        .ok_or_else(|| exec_datafusion_err!("an empty ordering on {TOKEN_COUNT}"))
}

type Sender = tokio::sync::mpsc::Sender<Result<RecordBatch>>;

/// Appends [`TOKEN_COUNT`] to every row; see the module docs.
#[derive(Debug)]
pub struct TokenCountExec {
    input: Arc<dyn ExecutionPlan>,
    text: Arc<dyn PhysicalExpr>,
    options: EmbedOptions,
    properties: Arc<PlanProperties>,
    /// The run's counters, told each batch's token count (for the progress display).
    run: Option<Arc<RunMetrics>>,
    /// Whether to append [`DROPPED_TOKENS`] too.
    dropped: bool,
    /// Whether to append [`TOKENS`] (before [`TOKEN_COUNT`]).
    tokens: bool,
}

impl TokenCountExec {
    /// Count the tokens of `text` (an expression over `input`) on every row of `input`.
    pub fn try_new(input: Arc<dyn ExecutionPlan>, text: Arc<dyn PhysicalExpr>, options: EmbedOptions) -> Result<Self> {
        let properties = Self::properties_for(&input, false, false);
        Ok(Self { input, text, options, properties, run: None, dropped: false, tokens: false })
    }

    fn properties_for(input: &Arc<dyn ExecutionPlan>, dropped: bool, tokens: bool) -> Arc<PlanProperties> {
        let mut fields: Vec<Arc<Field>> = input.schema().fields().iter().cloned().collect();
        if tokens {
            fields.push(Arc::new(Field::new(TOKENS, DataType::Binary, true)));
        }
        fields.push(Arc::new(Field::new(TOKEN_COUNT, DataType::UInt32, false)));
        if dropped {
            fields.push(Arc::new(Field::new(DROPPED_TOKENS, DataType::UInt32, false)));
        }
        let schema = Arc::new(Schema::new_with_metadata(fields, input.schema().metadata().clone()));
        Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ))
    }

    /// Also append [`DROPPED_TOKENS`], for an account of truncation (`pipeline plan`).
    pub fn with_dropped_tokens(mut self) -> Self {
        self.dropped = true;
        self.properties = Self::properties_for(&self.input, true, self.tokens);
        self
    }

    /// Also append [`TOKENS`], for `embed` to use instead of tokenising the texts again (the write path).
    pub fn with_tokens(mut self) -> Self {
        self.tokens = true;
        self.properties = Self::properties_for(&self.input, self.dropped, true);
        self
    }

    /// The rows counted.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// The text whose tokens are counted, an expression over [`Self::input`].
    pub fn text(&self) -> &Arc<dyn PhysicalExpr> {
        &self.text
    }

    /// Tell `run` the token counts as they are made.
    pub fn with_run_metrics(mut self, run: Option<Arc<RunMetrics>>) -> Self {
        self.run = run;
        self
    }
}

impl DisplayAs for TokenCountExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "TokenCountExec: text={}", self.text)
    }
}

impl ExecutionPlan for TokenCountExec {
    fn name(&self) -> &str {
        "TokenCountExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input =
            children.into_iter().next().ok_or_else(|| exec_datafusion_err!("TokenCountExec needs one child"))?;
        let mut node =
            Self::try_new(input, Arc::clone(&self.text), self.options.clone())?.with_run_metrics(self.run.clone());
        if self.dropped {
            node = node.with_dropped_tokens();
        }
        if self.tokens {
            node = node.with_tokens();
        }
        Ok(Arc::new(node))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let mut input = self.input.execute(partition, context)?;
        let (dropped, with_tokens) = (self.dropped, self.tokens);
        let (settings, _) = Fingerprint::for_options(&self.options)?;
        let (options, text, run, schema) =
            (self.options.clone(), Arc::clone(&self.text), self.run.clone(), self.schema());
        let mut builder = RecordBatchReceiverStreamBuilder::new(Arc::clone(&schema), 2);
        let tx = builder.tx();
        builder.spawn(async move {
            let embedder = tokio::task::spawn_blocking(move || options.embedder())
                .await
                .map_err(|e| exec_datafusion_err!("loading the model failed: {e}"))??;
            while let Some(batch) = input.next().await {
                let batch = batch?;
                for at in (0..batch.num_rows()).step_by(COUNT_ROWS) {
                    let slice = batch.slice(at, COUNT_ROWS.min(batch.num_rows() - at));
                    let texts = text.evaluate(&slice)?.into_array(slice.num_rows())?;
                    let (embedder, settings) = (Arc::clone(&embedder), settings.clone());
                    let counted = tokio::task::spawn_blocking(move || -> Result<Counted> {
                        let started = std::time::Instant::now();
                        let tokens = embedder.tokenize_texts(&string_values(&texts)?, &settings)?;
                        Ok(Counted::of(tokens, with_tokens, started.elapsed()))
                    })
                    .await
                    .map_err(|e| exec_datafusion_err!("token counting failed: {e}"))??;
                    if let Some(run) = &run {
                        let tokens = counted.lengths.values().iter().map(|n| *n as u64).sum();
                        run.record_counted(counted.lengths.len() as u64, tokens);
                        run.record_tokenizing(counted.took);
                    }
                    let mut columns = slice.columns().to_vec();
                    columns.extend(counted.tokens.map(|t| Arc::new(t) as _));
                    columns.push(Arc::new(counted.lengths));
                    if dropped {
                        columns.push(Arc::new(counted.dropped));
                    }
                    let options = RecordBatchOptions::new().with_row_count(Some(slice.num_rows()));
                    let counted = RecordBatch::try_new_with_options(Arc::clone(&schema), columns, &options)?;
                    if tx.send(Ok(counted)).await.is_err() {
                        return Ok(());
                    }
                }
            }
            Ok(())
        });
        Ok(builder.build())
    }
}

/// One slice's tokens, as the columns [`TokenCountExec`] appends.
struct Counted {
    lengths: UInt32Array,
    dropped: UInt32Array,
    tokens: Option<datafusion::arrow::array::BinaryArray>,
    /// Time spent tokenising.
    took: std::time::Duration,
}

impl Counted {
    fn of(tokens: Vec<Option<crate::model::tokenize::Tokenized>>, keep: bool, took: std::time::Duration) -> Self {
        let lengths = tokens.iter().map(|t| t.as_ref().map_or(0, |t| t.ids.len() as u32)).collect();
        let dropped = tokens.iter().map(|t| t.as_ref().map_or(0, |t| t.dropped as u32)).collect();
        let tokens = keep.then(|| {
            let bytes: usize = tokens.iter().flatten().map(|t| 8 + 8 * t.ids.len()).sum();
            let mut column = BinaryBuilder::with_capacity(tokens.len(), bytes);
            let mut record = Vec::new();
            for t in &tokens {
                match t {
                    Some(t) => {
                        record.clear();
                        t.to_bytes(&mut record);
                        column.append_value(&record);
                    }
                    None => column.append_null(),
                }
            }
            column.finish()
        });
        Self { lengths, dropped, tokens, took }
    }
}

/// Passes rows on longest first, a model call's rows per batch; see the module docs.
#[derive(Debug)]
pub struct LengthOrderExec {
    /// Rows with [`TOKEN_COUNT`] as their last column.
    input: Arc<dyn ExecutionPlan>,
    /// For EXPLAIN: the text whose tokens were counted.
    text: Arc<dyn PhysicalExpr>,
    options: EmbedOptions,
    /// Rows ordered together; `None`: the input arrives sorted.
    window: Option<usize>,
    properties: Arc<PlanProperties>,
}

impl LengthOrderExec {
    /// Order `input`'s rows (which end in [`TOKEN_COUNT`]) `window` rows at a time, or, with `None`, cut
    /// the calls from rows that arrive sorted longest first.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        text: Arc<dyn PhysicalExpr>,
        options: EmbedOptions,
        window: Option<usize>,
    ) -> Result<Self> {
        let counted = input.schema();
        if counted.fields().last().is_none_or(|f| f.name() != TOKEN_COUNT) {
            return Err(exec_datafusion_err!("LengthOrderExec needs {TOKEN_COUNT} as its input's last column"));
        }
        let schema = Arc::new(counted.project(&(0..counted.fields().len() - 1).collect::<Vec<_>>())?);
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self { input, text, options, window, properties })
    }
}

impl DisplayAs for LengthOrderExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match self.window {
            None => write!(f, "LengthOrderExec: text={}, window=whole input, sorted below", self.text),
            Some(n) => write!(f, "LengthOrderExec: text={}, window={n} rows", self.text),
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

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        let sorted = self.window.is_none().then(|| longest_first(&self.input.schema()).ok()).flatten();
        vec![sorted.map(OrderingRequirements::from)]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![self.window.is_none()]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input =
            children.into_iter().next().ok_or_else(|| exec_datafusion_err!("LengthOrderExec needs one child"))?;
        Ok(Arc::new(Self::try_new(input, Arc::clone(&self.text), self.options.clone(), self.window)?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, Arc::clone(&context))?;
        let (settings, _) = Fingerprint::for_options(&self.options)?;
        let reservation = MemoryConsumer::new(format!("LengthOrderExec[{partition}]"))
            .with_can_spill(true)
            .register(context.memory_pool());
        let job = Job { settings, schema: self.schema() };
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.schema(), 2);
        let tx = builder.tx();
        let window = self.window;
        builder.spawn(async move {
            match window {
                None => job.run_sorted(input, tx).await,
                Some(window) => job.run_windows(input, window, reservation, tx).await,
            }
        });
        Ok(builder.build())
    }
}

/// One partition's work.
struct Job {
    settings: CallSettings,
    /// The output schema: the input's without [`TOKEN_COUNT`].
    schema: SchemaRef,
}

/// Rows ordered longest first without being copied: the batches they arrived in, and each row's place as
/// (batch, row) in the order they go out (ties in input order). Each model call's rows are copied out of them
/// as it is sent, so a window's rows are held once, and only until its last call is sent.
struct Window {
    batches: Vec<RecordBatch>,
    order: Vec<(usize, usize)>,
    /// The memory the rows hold in the session's pool, given back when the window is dropped.
    _held: MemoryReservation,
}

impl Window {
    /// `batches` (each ending in [`TOKEN_COUNT`]) ordered longest first, ties in input order.
    fn of(batches: Vec<RecordBatch>, held: MemoryReservation) -> Self {
        let mut order: Vec<(usize, usize)> =
            batches.iter().enumerate().flat_map(|(b, batch)| (0..batch.num_rows()).map(move |r| (b, r))).collect();
        let lengths: Vec<&[u32]> = batches.iter().map(|batch| counts(batch).values().as_ref()).collect();
        order.sort_by_key(|&(b, r)| std::cmp::Reverse(lengths[b][r]));
        Self { batches, order, _held: held }
    }
}

impl Job {
    /// Rows that arrive sorted longest first: every call but the last of what is held is complete; the last
    /// waits for the rows that may still join it.
    async fn run_sorted(self, mut input: SendableRecordBatchStream, tx: Sender) -> Result<()> {
        let mut held: Option<RecordBatch> = None;
        while let Some(batch) = input.next().await {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let all = match held.take() {
                Some(rest) => concat_batches(&rest.schema(), [&rest, &batch])?,
                None => batch,
            };
            let Some(rest) = self.emit_in_order(all, false, &tx).await? else { return Ok(()) };
            held = Some(rest);
        }
        if let Some(all) = held.filter(|b| b.num_rows() > 0) {
            self.emit_in_order(all, true, &tx).await?;
        }
        Ok(())
    }

    /// [`Self::emit_calls`] of `all`, whose rows are already longest first: the rows not sent (none when `last`),
    /// or `None` when the consumer is gone.
    async fn emit_in_order(&self, all: RecordBatch, last: bool, tx: &Sender) -> Result<Option<RecordBatch>> {
        let in_order: Vec<(usize, usize)> = (0..all.num_rows()).map(|r| (0, r)).collect();
        let sent = self.emit_calls(std::slice::from_ref(&all), &in_order, last, tx).await?;
        Ok(sent.map(|n| all.slice(n, all.num_rows() - n)))
    }

    /// Windows of at most `window` rows: one task fills and orders them (see [`fill_windows`]) while this one
    /// cuts the last ordered window into calls and sends them, so the model does not wait for the next window.
    async fn run_windows(
        self,
        input: SendableRecordBatchStream,
        window: usize,
        reservation: MemoryReservation,
        tx: Sender,
    ) -> Result<()> {
        let (windows_tx, mut windows) = tokio::sync::mpsc::channel::<Result<Window>>(1);
        // Stopped when dropped: on an error, or when the consumer went away.
        let filling = SpawnedTask::spawn(fill_windows(input, window, reservation, windows_tx));
        while let Some(next) = windows.recv().await {
            let window = next?;
            if self.emit_calls(&window.batches, &window.order, true, &tx).await?.is_none() {
                return Ok(());
            }
        }
        // The windows ran out: a task that failed (a panic) must not pass for the end of the input.
        filling.join().await.map_err(|e| exec_datafusion_err!("ordering the rows by length failed: {e}"))
    }

    /// Send the rows of `batches` in `order` (longest first) as batches of one model call each, cut as `embed`
    /// will cut them, each copied out so that it holds only its own rows, without [`TOKEN_COUNT`]. Unless
    /// `last`, the last call's rows are not sent but left to be joined by the rows that follow. The number of
    /// rows sent, or `None` when the consumer is gone.
    async fn emit_calls(
        &self,
        batches: &[RecordBatch],
        order: &[(usize, usize)],
        last: bool,
        tx: &Sender,
    ) -> Result<Option<usize>> {
        let counts: Vec<&[u32]> = batches.iter().map(|batch| counts(batch).values().as_ref()).collect();
        let lengths: Vec<usize> = order.iter().map(|&(b, r)| counts[b][r] as usize).collect();
        let calls = plan_batches(&lengths, self.settings.batch_tokens, self.settings.max_batch_rows);
        let mut at = 0;
        for (i, call) in calls.iter().enumerate() {
            let n = call.rows.len();
            if !last && i + 1 == calls.len() {
                return Ok(Some(at));
            }
            // On rows already longest first, the calls are consecutive runs of them.
            let batch = self.rows_of(batches, &order[at..at + n])?;
            at += n;
            if tx.send(compact_views(batch)).await.is_err() {
                return Ok(None);
            }
        }
        Ok(Some(at))
    }

    /// The rows at `places` ((batch, row) in `batches`), copied into one batch of the output schema: every
    /// column but [`TOKEN_COUNT`]. Unlike arrow's `interleave_record_batch`, also for rows of no columns (a
    /// query of constants, `SELECT 'a' AS id, embed('x')`, reaches the ordering stage as rows of no columns).
    fn rows_of(&self, batches: &[RecordBatch], places: &[(usize, usize)]) -> Result<RecordBatch> {
        let columns = (0..self.schema.fields().len())
            .map(|c| {
                let arrays: Vec<&dyn datafusion::arrow::array::Array> =
                    batches.iter().map(|b| b.column(c).as_ref()).collect();
                interleave(&arrays, places)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(places.len()));
        Ok(RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)?)
    }
}

/// Read `input` into windows of [`FIRST_WINDOW_ROWS`] rows, then [`WINDOW_GROWTH`] times as many each time up to `window` rows (or
/// fewer, when they reach [`WINDOW_BYTES`] or the memory pool refuses more; a window's first batch is always
/// taken), each ordered longest first (ties keep input order) and sent to `out` with the memory it holds. A
/// window keeps the batches its rows arrived in (the one that crosses its end is sliced, the two parts sharing
/// their buffers) and is never copied whole: its rows are copied out call by call.
///
/// A window is filled only while `out` has room for it (a permit taken before its rows are read): with the
/// channel's one slot, at most two windows are alive, the one being embedded and the next, whatever the corpus's
/// size.
async fn fill_windows(
    mut input: SendableRecordBatchStream,
    window: usize,
    mut reservation: MemoryReservation,
    out: tokio::sync::mpsc::Sender<Result<Window>>,
) {
    let mut size = FIRST_WINDOW_ROWS.min(window).max(1);
    let mut held: Vec<RecordBatch> = Vec::new();
    let (mut rows, mut bytes) = (0, 0);
    let mut slot = None;
    loop {
        // Room for the window these rows go into, before reading them.
        if slot.is_none() {
            let Ok(permit) = out.reserve().await else { return };
            slot = Some(permit);
        }
        let Some(batch) = input.next().await else { break };
        let batch = match batch {
            Ok(b) if b.num_rows() == 0 => continue,
            Ok(b) => b,
            Err(e) => {
                if let Some(permit) = slot.take() {
                    permit.send(Err(e));
                }
                return;
            }
        };
        let batch_size = batch_bytes(&batch);
        if rows > 0 && (bytes + batch_size > WINDOW_BYTES || reservation.try_grow(batch_size).is_err()) {
            if let Some(permit) = slot.take() {
                permit.send(Ok(Window::of(std::mem::take(&mut held), reservation.take())));
            }
            let Ok(permit) = out.reserve().await else { return };
            slot = Some(permit);
            (rows, bytes) = (0, 0);
            size = (size * WINDOW_GROWTH).min(window);
        }
        if rows == 0 {
            reservation.grow(batch_size);
        }
        (rows, bytes) = (rows + batch.num_rows(), bytes + batch_size);
        held.push(batch);
        while rows >= size {
            let rest = split_off_rows(&mut held, size);
            let rest_bytes: usize = rest.iter().map(batch_bytes).sum();
            // The memory held travels with the window; the rows left over are counted here again until the window
            // is passed on (an overestimate, never an underestimate).
            let taken = reservation.take();
            reservation.grow(rest_bytes);
            let Some(permit) = slot.take() else { return };
            permit.send(Ok(Window::of(std::mem::replace(&mut held, rest), taken)));
            (rows, bytes) = (held.iter().map(RecordBatch::num_rows).sum(), rest_bytes);
            size = (size * WINDOW_GROWTH).min(window);
            let Ok(permit) = out.reserve().await else { return };
            slot = Some(permit);
        }
    }
    if let Some(permit) = slot.take()
        && !held.is_empty()
    {
        permit.send(Ok(Window::of(held, reservation.take())));
    }
}

/// Keep the first `n` rows in `held` (slicing the batch that crosses row `n`), and return the rows after them.
fn split_off_rows(held: &mut Vec<RecordBatch>, n: usize) -> Vec<RecordBatch> {
    let mut kept = 0;
    for (i, batch) in held.iter().enumerate() {
        if kept + batch.num_rows() > n {
            let inside = n - kept;
            let mut rest = held.split_off(i);
            let crossing = rest[0].clone();
            rest[0] = crossing.slice(inside, crossing.num_rows() - inside);
            if inside > 0 {
                held.push(crossing.slice(0, inside));
            }
            return rest;
        }
        kept += batch.num_rows();
    }
    Vec::new()
}

/// The [`TOKEN_COUNT`] column (the last) of a batch.
fn counts(batch: &RecordBatch) -> &datafusion::arrow::array::PrimitiveArray<UInt32Type> {
    batch.column(batch.num_columns() - 1).as_primitive::<UInt32Type>()
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::StringArray;
    use datafusion::execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

    use super::*;

    /// Batches of (text, token count) rows, texts naming their batch and row.
    fn batches(counts: &[&[u32]]) -> Vec<RecordBatch> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("text", DataType::Utf8, false),
            Field::new(TOKEN_COUNT, DataType::UInt32, false),
        ]));
        let batch = |(b, counts): (usize, &&[u32])| {
            let texts: StringArray = (0..counts.len()).map(|r| Some(format!("b{b}r{r}"))).collect();
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(texts), Arc::new(UInt32Array::from(counts.to_vec()))],
            )
            .unwrap()
        };
        counts.iter().enumerate().map(batch).collect()
    }

    async fn windows_of(input: Vec<RecordBatch>, window: usize) -> Vec<Window> {
        let schema = input[0].schema();
        let stream = Box::pin(RecordBatchStreamAdapter::new(schema, futures::stream::iter(input.into_iter().map(Ok))));
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let reservation = MemoryConsumer::new("test").register(&pool);
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let filling = tokio::spawn(fill_windows(stream, window, reservation, tx));
        let mut out = Vec::new();
        while let Some(w) = rx.recv().await {
            out.push(w.unwrap());
        }
        filling.await.unwrap();
        out
    }

    fn texts_in_order(w: &Window) -> Vec<String> {
        w.order.iter().map(|&(b, r)| w.batches[b].column(0).as_string::<i32>().value(r).to_string()).collect()
    }

    /// The address of a batch's text bytes: the same for a batch and any slice of it.
    fn text_bytes(batch: &RecordBatch) -> *const u8 {
        batch.column(0).to_data().buffers()[1].as_ptr()
    }

    #[tokio::test]
    async fn a_window_orders_its_rows_longest_first_ties_in_input_order_without_copying_them() {
        let input = batches(&[&[3, 1, 3, 2, 3], &[1, 3, 2, 2, 1], &[3, 3, 1, 2, 2]]);
        let windows = windows_of(input.clone(), 8).await;
        assert_eq!(windows.len(), 2, "8 rows, then the 7 left");
        assert_eq!(
            texts_in_order(&windows[0]),
            ["b0r0", "b0r2", "b0r4", "b1r1", "b0r3", "b1r2", "b0r1", "b1r0"],
            "the first 8 rows (the second batch cut after its third), longest first, ties in input order"
        );
        assert_eq!(texts_in_order(&windows[1]), ["b2r0", "b2r1", "b1r3", "b2r3", "b2r4", "b1r4", "b2r2"]);
        // The rows stay in the batches they came in (the one cut in two shared by both windows), never copied.
        let held: Vec<*const u8> = windows.iter().flat_map(|w| w.batches.iter().map(text_bytes)).collect();
        let given: Vec<*const u8> = input.iter().map(text_bytes).collect();
        assert_eq!(held, [given[0], given[1], given[1], given[2]]);
    }

    #[tokio::test]
    async fn one_batch_longer_than_several_windows_is_cut_into_each_of_them() {
        let lengths: Vec<u32> = (0..6000).map(|i| (i % 7) as u32).collect();
        let windows = windows_of(batches(&[&lengths]), 65_536).await;
        let sizes: Vec<usize> = windows.iter().map(|w| w.order.len()).collect();
        assert_eq!(sizes, [FIRST_WINDOW_ROWS, WINDOW_GROWTH * FIRST_WINDOW_ROWS, 6000 - 5 * FIRST_WINDOW_ROWS]);
        for w in &windows {
            let lengths: Vec<u32> = w.order.iter().map(|&(b, r)| counts(&w.batches[b]).value(r)).collect();
            assert!(lengths.is_sorted_by(|a, b| a >= b), "longest first: {lengths:?}");
        }
    }

    #[test]
    fn splitting_off_rows_cuts_the_batch_that_crosses_the_point_and_keeps_whole_batches_whole() {
        let all = batches(&[&[1, 1, 1], &[1, 1, 1], &[1, 1]]);
        let rows = |held: &[RecordBatch]| held.iter().map(RecordBatch::num_rows).collect::<Vec<_>>();
        let mut held = all.clone();
        let rest = split_off_rows(&mut held, 4);
        assert_eq!((rows(&held), rows(&rest)), (vec![3, 1], vec![2, 2]));
        let mut held = all.clone();
        let rest = split_off_rows(&mut held, 6);
        assert_eq!((rows(&held), rows(&rest)), (vec![3, 3], vec![2]), "at a batch's end, nothing is cut");
        let mut held = all;
        assert!(split_off_rows(&mut held, 8).is_empty());
        assert_eq!(rows(&held), [3, 3, 2]);
    }
}
