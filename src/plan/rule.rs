//! Puts a [`LengthOrderExec`] under every `AsyncFuncExec` that calls `embed()`, when `embed.order` is
//! 'length' and the plan writes its rows (COPY, INSERT). EXPLAIN shows it as `LengthOrderExec`.
//!
//! Only writes are reordered: their rows carry their ids into the output, so their order does not
//! matter. A plain SELECT keeps its input order, which a caller may rely on to pair vectors with texts;
//! `embed` still groups each call's texts by length internally and puts every vector back on its row.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::async_func::AsyncFuncExec;

use super::LengthOrderExec;
use crate::options::EmbedOptions;

/// The physical optimizer rule described in the module docs.
#[derive(Debug, Default)]
pub struct LengthOrderRule;

impl PhysicalOptimizerRule for LengthOrderRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let options = config.extensions.get::<EmbedOptions>().cloned().unwrap_or_default();
        if !options.order.eq_ignore_ascii_case("length") || !plan.as_ref().is::<DataSinkExec>() {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            let Some(exec) = node.as_ref().downcast_ref::<AsyncFuncExec>() else { return Ok(Transformed::no(node)) };
            if exec.input().as_ref().is::<LengthOrderExec>() {
                return Ok(Transformed::no(node));
            }
            let Some(text) = exec.async_exprs().iter().find_map(|e| embed_text_argument(&e.func)) else {
                return Ok(Transformed::no(node));
            };
            let ordered = Arc::new(LengthOrderExec::try_new(Arc::clone(exec.input()), text, options.clone())?);
            Ok(Transformed::yes(Arc::clone(&node).with_new_children(vec![ordered])?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "embedding_pipeline_length_order"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The text argument of an `embed(...)` call.
fn embed_text_argument(func: &Arc<dyn PhysicalExpr>) -> Option<Arc<dyn PhysicalExpr>> {
    let f = func.as_ref().downcast_ref::<ScalarFunctionExpr>()?;
    (f.name() == "embed").then(|| f.args().first().cloned()).flatten()
}
