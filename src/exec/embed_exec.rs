//! `EmbedExec`: `embed()` on the write path, in place of DataFusion's `AsyncFuncExec`.
//!
//! `AsyncFuncExec` gathers `datafusion.execution.batch_size` rows (8,192 by default) before it calls a
//! function, so rows reached the sink in bursts minutes apart, commits came late, and a stop waited for
//! a whole burst. This node calls the same functions on each chunk of rows as it arrives: a model
//! call's worth as the ordering stage cuts them (at most `chunk_rows` rows). It keeps one chunk per
//! model session in flight plus one, so that tokenising overlaps the model, and passes each chunk on,
//! in order, as soon as it is done, with its counters sent to the sink through [`RunMetrics`].
//!
//! After a stop request it starts no chunk: the chunks in flight finish, or are refused by the model
//! before their call starts ([`crate::Error::Stopped`]), and the stream ends, so the sink can commit
//! every row already embedded.

use std::fmt;
use std::sync::Arc;
use std::task::Poll;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::{Result, exec_datafusion_err};
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_expr::async_scalar_function::AsyncFuncExpr;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use futures::{StreamExt, TryStreamExt};

use crate::campaign::interrupt;
use crate::campaign::metrics::RunMetrics;
use crate::udf::embed::counting_calls;

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
        Ok(Self { input, exprs, chunk_rows: chunk_rows.max(1), in_flight: in_flight.max(1), metrics, properties })
    }
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
        Ok(Arc::new(Self::try_new(
            input,
            self.exprs.clone(),
            self.schema(),
            self.chunk_rows,
            self.in_flight,
            self.metrics.clone(),
        )?))
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
        // No chunk is taken once a stop was asked for.
        let chunks = futures::stream::poll_fn(move |cx| {
            if interrupt::stop_requested() {
                return Poll::Ready(None);
            }
            chunks.poll_next_unpin(cx)
        });
        let (exprs, schema, config) =
            (self.exprs.clone(), self.schema(), Arc::clone(context.session_config().options()));
        let embedded = chunks
            .map(move |chunk: Result<RecordBatch>| {
                let (exprs, schema, config) = (exprs.clone(), Arc::clone(&schema), Arc::clone(&config));
                async move {
                    let chunk = chunk?;
                    let (columns, stats) = counting_calls(async {
                        let mut columns = chunk.columns().to_vec();
                        for e in &exprs {
                            columns.push(
                                e.invoke_with_args(&chunk, Arc::clone(&config)).await?.to_array(chunk.num_rows())?,
                            );
                        }
                        Ok::<_, DataFusionError>(columns)
                    })
                    .await;
                    Ok((RecordBatch::try_new(schema, columns?)?, stats))
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
