//! `EmbedExec`: `embed()` on the write path, in place of DataFusion's `AsyncFuncExec`.
//!
//! `AsyncFuncExec` gathers `datafusion.execution.batch_size` rows (8,192 by default) before it calls a
//! function, so rows reached the sink in bursts minutes apart, commits came late, and a stop waited for
//! a whole burst. This node calls the same functions on each chunk of rows as it arrives: a model
//! call's worth as the ordering stage cuts them (at most `chunk_rows` rows). It keeps one chunk per
//! model session in flight plus one, so that tokenising overlaps the model, and passes each chunk on,
//! in order, as soon as it is done, with its counters sent to the sink through [`RunMetrics`].
//!
//! When its input ends in the ordering stage's [`TOKENS`] column, the first `embed()` (the one whose text was
//! counted) is handed those tokens instead of tokenising its texts again, and the column is left out of the
//! output.
//!
//! After a stop request it starts no chunk: the chunks in flight finish, or are refused by the model
//! before their call starts ([`crate::Error::Stopped`]), and the stream ends, so the sink can commit
//! every row already embedded.

use std::fmt;
use std::sync::Arc;
use std::task::Poll;

use datafusion::arrow::array::{ArrayRef, AsArray, RecordBatch};
use datafusion::common::{Result, exec_datafusion_err};
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_expr::async_scalar_function::AsyncFuncExpr;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use futures::{StreamExt, TryStreamExt};

use super::length_order::TOKENS;
use crate::campaign::metrics::RunMetrics;
use crate::model::CallSettings;
use crate::model::tokenize::Tokenized;
use crate::udf::embed::{GivenTokens, counting_calls, with_tokens};

/// The write path's `embed()` node; see the module docs.
#[derive(Debug)]
pub struct EmbedExec {
    input: Arc<dyn ExecutionPlan>,
    exprs: Vec<Arc<AsyncFuncExpr>>,
    chunk_rows: usize,
    in_flight: usize,
    /// Where each chunk's counters go, for a Lance sink to receive; `None` for other sinks.
    metrics: Option<Arc<RunMetrics>>,
    properties: Arc<PlanProperties>,
    /// The settings the input's [`TOKENS`] were made under, when it has them.
    tokens: Option<CallSettings>,
}

impl EmbedExec {
    /// Evaluate `exprs` (the async expressions of the `AsyncFuncExec` this replaces, whose output
    /// schema is `schema`) over `input`, in chunks of at most `chunk_rows` rows, `in_flight` at a time.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        exprs: Vec<Arc<AsyncFuncExpr>>,
        schema: datafusion::arrow::datatypes::SchemaRef,
        chunk_rows: usize,
        in_flight: usize,
        metrics: Option<Arc<RunMetrics>>,
    ) -> Result<Self> {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        let (chunk_rows, in_flight) = (chunk_rows.max(1), in_flight.max(1));
        Ok(Self { input, exprs, chunk_rows, in_flight, metrics, properties, tokens: None })
    }

    /// Hand the input's last column, [`TOKENS`] (made under `settings`), to the first `embed()`; without that
    /// column, nothing changes.
    pub fn with_tokens(mut self, settings: CallSettings) -> Self {
        let schema = self.input.schema();
        self.tokens = schema.fields().last().is_some_and(|f| f.name() == TOKENS).then_some(settings);
        self
    }
}

/// A chunk's [`TOKENS`] column, one record per row.
fn given_tokens(column: &ArrayRef, settings: &CallSettings) -> Result<GivenTokens> {
    let column = column.as_binary_opt::<i32>().ok_or_else(|| exec_datafusion_err!("{TOKENS} is not binary"))?;
    let tokens = column
        .iter()
        .enumerate()
        .map(|(row, bytes)| match bytes {
            None => Ok(None),
            Some(bytes) => Tokenized::from_bytes(bytes)
                .map(Some)
                .ok_or_else(|| exec_datafusion_err!("{TOKENS} holds no tokens at row {row}")),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(GivenTokens { tokens, made_under: settings.clone() })
}

impl DisplayAs for EmbedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let exprs: Vec<String> = self.exprs.iter().map(|e| format!("{} as {}", e.func, e.name)).collect();
        write!(f, "EmbedExec: {}, chunk={} rows, in_flight={}", exprs.join(", "), self.chunk_rows, self.in_flight)
    }
}

impl ExecutionPlan for EmbedExec {
    fn name(&self) -> &str {
        "EmbedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children.into_iter().next().ok_or_else(|| exec_datafusion_err!("EmbedExec needs one child"))?;
        let node = Self::try_new(
            input,
            self.exprs.clone(),
            self.schema(),
            self.chunk_rows,
            self.in_flight,
            self.metrics.clone(),
        )?;
        Ok(Arc::new(match &self.tokens {
            Some(settings) => node.with_tokens(settings.clone()),
            None => node,
        }))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, Arc::clone(&context))?;
        let chunk_rows = self.chunk_rows;
        let mut chunks = Box::pin(
            input
                .map_ok(move |batch| {
                    let n = batch.num_rows();
                    let starts: Vec<usize> = (0..n).step_by(chunk_rows).collect();
                    futures::stream::iter(starts.into_iter().map(move |at| Ok(batch.slice(at, chunk_rows.min(n - at)))))
                })
                .try_flatten(),
        );
        // No chunk is taken once the session was asked to stop (a node without its session's counters, on a
        // cluster's executor, is stopped by the executor's end instead).
        let stop = self.metrics.as_ref().map(|m| m.stop().clone()).unwrap_or_default();
        let chunks = futures::stream::poll_fn(move |cx| {
            if stop.requested() {
                return Poll::Ready(None);
            }
            chunks.poll_next_unpin(cx)
        });
        let (exprs, schema, config) =
            (self.exprs.clone(), self.schema(), Arc::clone(context.session_config().options()));
        let tokens = self.tokens.clone();
        let embedded = chunks
            .map(move |chunk: Result<RecordBatch>| {
                let (exprs, schema, config) = (exprs.clone(), Arc::clone(&schema), Arc::clone(&config));
                let tokens = tokens.clone();
                async move {
                    let chunk = chunk?;
                    let (columns, stats) = counting_calls(async {
                        let mut columns = chunk.columns().to_vec();
                        // The tokens go to the first embed(), not into the output.
                        let given = match &tokens {
                            Some(settings) => {
                                let column = columns.pop().ok_or_else(|| exec_datafusion_err!("no {TOKENS}"))?;
                                Some(given_tokens(&column, settings)?)
                            }
                            None => None,
                        };
                        let mut given = given.into_iter();
                        for e in &exprs {
                            let call = e.invoke_with_args(&chunk, Arc::clone(&config));
                            let out = match given.next() {
                                Some(tokens) => with_tokens(tokens, call).await?,
                                None => call.await?,
                            };
                            columns.push(out.to_array(chunk.num_rows())?);
                        }
                        Ok::<_, DataFusionError>(columns)
                    })
                    .await;
                    let batch = RecordBatch::try_new(schema, columns?)?;
                    Ok((without_skipped_images(batch, &chunk, &exprs, &config)?, stats))
                }
            })
            .buffered(self.in_flight)
            // A chunk the model refused because of a stop is not an error: the write ends with what is done.
            .filter(|r| futures::future::ready(!matches!(r, Err(e) if is_stopped(e))));
        let metrics = self.metrics.clone();
        let alive = self.metrics.as_ref().map(|m| m.embedding_started());
        let sent = embedded.map_ok(move |(batch, stats)| {
            let _alive = &alive;
            if let Some(m) = &metrics {
                m.send_embedded(batch.num_rows() as u64, stats);
            }
            batch
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), sent)))
    }
}

/// `batch` without the rows whose image `embed_image` skipped (`embed.bad_images = 'skip'`): a NULL vector for an
/// image that was there. The sink then writes no row for them, and a rerun tries them again. A NULL image keeps its
/// row (and its NULL vector), as a NULL text does.
fn without_skipped_images(
    batch: RecordBatch,
    chunk: &RecordBatch,
    exprs: &[Arc<AsyncFuncExpr>],
    config: &datafusion::common::config::ConfigOptions,
) -> Result<RecordBatch> {
    if !crate::options::EmbedOptions::from_config(config).skip_bad_images().unwrap_or(false) {
        return Ok(batch);
    }
    let first_output = batch.num_columns() - exprs.len();
    let mut keep: Option<datafusion::arrow::array::BooleanArray> = None;
    for (i, e) in exprs.iter().enumerate() {
        let Some(f) = e.func.as_ref().downcast_ref::<datafusion::physical_expr::ScalarFunctionExpr>() else { continue };
        let Some(image) = f.args().first().filter(|_| f.name() == "embed_image") else { continue };
        let image = image.evaluate(chunk)?.into_array(chunk.num_rows())?;
        let vectors = batch.column(first_output + i);
        let kept: datafusion::arrow::array::BooleanArray =
            (0..batch.num_rows()).map(|r| Some(!(vectors.is_null(r) && image.is_valid(r)))).collect();
        keep = Some(match keep {
            Some(k) => datafusion::arrow::compute::and(&k, &kept)?,
            None => kept,
        });
    }
    match keep {
        Some(keep) if keep.false_count() > 0 => Ok(datafusion::arrow::compute::filter_record_batch(&batch, &keep)?),
        _ => Ok(batch),
    }
}

/// Whether an error is the model's refusal to start a call after a stop request.
fn is_stopped(e: &DataFusionError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if matches!(c.downcast_ref::<crate::Error>(), Some(crate::Error::Stopped)) {
            return true;
        }
        cause = c.source();
    }
    false
}
