//! The write path's physical plan: in a plan that writes its rows (COPY, INSERT), every `AsyncFuncExec`
//! that calls only `embed()` becomes an [`EmbedExec`] over one partition, with the ordering stage
//! ([`super::length_order`]) under it when `embed.order` is 'length', or, when the write executes a plan
//! (`pipeline plan`), the plan's work list ([`super::work_list`]) in place of its input and of the
//! counting and sort. EXPLAIN shows them all.
//!
//! Only writes are reordered: their rows carry their ids into the output, so their order does not
//! matter. A plain SELECT keeps its input order, which a caller may rely on to pair vectors with texts;
//! `embed` still groups each call's texts by length internally and puts every vector back on its row.
//!
//! One partition: the ordering then sees the whole input (not a share of it), the embedding node keeps
//! the model's sessions busy by itself, and the rows reach the sink in the order their counters were
//! sent, so each commit's run record counts exactly its own rows.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::async_func::AsyncFuncExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use super::length_order::length_order;
use super::work_list::WorkListExec;
use super::{EmbedExec, LengthOrderExec};
use crate::campaign::metrics::RunMetrics;
use crate::lance::LanceSink;
use crate::model::ORIGINAL_BATCH_ROWS;
use crate::options::EmbedOptions;

/// The physical optimizer rule described in the module docs.
#[derive(Debug)]
pub struct EmbedWriteRule {
    metrics: Arc<RunMetrics>,
}

impl EmbedWriteRule {
    /// The rule for a session whose counters are `metrics`.
    pub fn new(metrics: Arc<RunMetrics>) -> Self {
        Self { metrics }
    }
}

impl PhysicalOptimizerRule for EmbedWriteRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let options = EmbedOptions::from_config(config);
        let Some(sink) = plan.as_ref().downcast_ref::<DataSinkExec>() else { return Ok(plan) };
        // Only a Lance sink receives the counters of the rows it commits.
        let lance = sink.sink().downcast_ref::<LanceSink>();
        let metrics = lance.is_some().then(|| Arc::clone(&self.metrics));
        // A write that executes a plan reads its work list instead (`pipeline run` checked it against the job).
        let planned = lance.and_then(|l| Some((self.metrics.plan_for(l.uri())?, l.uri().to_string())));
        chunked_embedding(plan, &options, metrics, planned, true)
    }

    fn name(&self) -> &str {
        "embedding_pipeline_embed_write"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` with every `AsyncFuncExec` that calls only `embed()` replaced by an [`EmbedExec`], the ordering
/// stage (or, with `planned`, a plan's work list) under it. `one_partition` coalesces the input first, as a
/// local write does; a cluster's task orders and embeds its own partition.
pub fn chunked_embedding(
    plan: Arc<dyn ExecutionPlan>,
    options: &EmbedOptions,
    metrics: Option<Arc<RunMetrics>>,
    planned: Option<(Arc<crate::campaign::work_plan::WorkPlanInUse>, String)>,
    one_partition: bool,
) -> Result<Arc<dyn ExecutionPlan>> {
    let by_length = options.order.eq_ignore_ascii_case("length");
    // A model call's rows at most; the ordering stage cuts smaller ones by tokens.
    let chunk_rows = if by_length { options.max_batch_rows.max(1) } else { ORIGINAL_BATCH_ROWS };
    // One chunk per model session in flight, plus one being tokenised.
    let sessions = options.placement().map_or(1, |p| p.sessions());
    plan.transform_up(|node| {
        let Some(exec) = node.as_ref().downcast_ref::<AsyncFuncExec>() else { return Ok(Transformed::no(node)) };
        let calls: Vec<_> = exec.async_exprs().iter().map(|e| embed_call(&e.func)).collect();
        if calls.iter().any(Option::is_none) {
            return Ok(Transformed::no(node));
        }
        // Images are not ordered by length: each costs the model the same.
        let texts: Vec<_> = calls.into_iter().flatten().collect();
        let planned = if texts.iter().any(Option::is_none) { None } else { planned.clone() };
        let by_length = by_length && texts.iter().all(Option::is_some);
        let chunk_rows = if texts.iter().any(Option::is_none) { options.batch_images.max(1) } else { chunk_rows };
        let mut input = Arc::clone(exec.input());
        if one_partition && input.output_partitioning().partition_count() > 1 {
            input = Arc::new(CoalescePartitionsExec::new(input));
        }
        match (&planned, texts.into_iter().next().flatten()) {
            (Some((plan, uri)), Some(text)) => {
                let resume = (!options.restart).then(|| (uri.clone(), options.id_column.clone()));
                let list = WorkListExec::try_new(Arc::clone(plan), &exec.input().schema(), resume, metrics.clone())?;
                input = Arc::new(LengthOrderExec::try_new(Arc::new(list), text, options.clone(), None)?);
            }
            (None, Some(text)) if by_length => input = length_order(input, text, options, metrics.clone())?,
            _ => {}
        }
        let mut embed = EmbedExec::try_new(
            input,
            exec.async_exprs().to_vec(),
            exec.schema(),
            chunk_rows,
            sessions + 1,
            metrics.clone(),
        )?;
        // The ordering stage's tokens, where it made them, go to embed() (each text is tokenised once).
        if let Ok((_, settings, _)) = crate::campaign::Fingerprint::settings_for(options) {
            embed = embed.with_tokens(settings);
        }
        Ok(Transformed::yes(Arc::new(embed) as Arc<dyn ExecutionPlan>))
    })
    .map(|t| t.data)
}

/// An `embed(text)` call (with its text argument) or an `embed_image(image)` call (None); None for any other.
fn embed_call(func: &Arc<dyn PhysicalExpr>) -> Option<Option<Arc<dyn PhysicalExpr>>> {
    let f = func.as_ref().downcast_ref::<ScalarFunctionExpr>()?;
    match f.name() {
        "embed" => Some(Some(f.args().first().cloned()?)),
        "embed_image" => Some(None),
        _ => None,
    }
}
