//! The checks every write passes before anything is embedded, whoever plans it: `pipeline run`, a Rust program
//! calling `ctx.sql("COPY …")` on an [`crate::EmbedSession`], `pipeline compare-order` or a future binding. They
//! sit in the session's query planner, which every statement goes through on its way to execution (an
//! `EXPLAIN ANALYZE` of a write, which writes, included):
//! - a write into Lance has non-NULL, unique ids over its whole output, the rows already written included (a
//!   repeated id is the corpus's fault whether or not one of its rows is done; [`super::resume`] drops the done
//!   ids from what is embedded), so no id is written twice; and a resume that could drop done ids only after
//!   embedding them is refused;
//! - a COPY into a file format does not replace an existing file or write among a folder's files unless the
//!   job sets `embed.overwrite`.
//!
//! A write that executes a plan (`pipeline plan`) skips the id check: the plan's own check ran on this very
//! corpus, and `pipeline run` checked that it is unchanged.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::source_as_provider;
use datafusion::execution::SessionState;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::{JoinType, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};

use super::existing_ids::ExistingIds;
use crate::campaign::ids::{IdCheck, check_ids};
use crate::campaign::metrics::RunMetrics;
use crate::error::Error;
use crate::lance::target::{executed, write_target};
use crate::options::EmbedOptions;

/// DataFusion's physical planner, after the checks in the module docs.
#[derive(Debug)]
pub struct CheckedPlanner {
    metrics: Arc<RunMetrics>,
}

impl CheckedPlanner {
    /// The planner of a session whose counters are `metrics` (where a write's plan is found).
    pub fn new(metrics: Arc<RunMetrics>) -> Self {
        Self { metrics }
    }
}

#[async_trait]
impl QueryPlanner for CheckedPlanner {
    async fn create_physical_plan(&self, plan: &LogicalPlan, state: &SessionState) -> Result<Arc<dyn ExecutionPlan>> {
        let options = EmbedOptions::from_config(state.config_options());
        // The statement that runs: an EXPLAIN ANALYZE of a write writes, so it is checked as the write.
        let executed = executed(plan);
        let target = write_target(executed);
        if let Some(target) = target.as_ref().filter(|t| self.metrics.plan_for(&t.uri).is_none()) {
            // A resume that could drop done ids only after embedding them is refused before anything else runs.
            for table in done_id_tables(&target.input) {
                if let Some(ids) = table.as_ref().downcast_ref::<ExistingIds>() {
                    ids.refuse_if_resumed().await?;
                }
            }
            // Every id of the output, those already written included: a repeated id is the corpus's fault
            // whether or not one of its rows is done.
            let all = without_done_joins(target.input.as_ref().clone())?;
            let check = check_write_ids(state, &all, &options.id_column).await?;
            self.metrics.note_ids_checked(&target.uri, check.rows);
        } else if let LogicalPlan::Copy(copy) = executed
            && target.is_none()
            && !options.overwrite
        {
            check_file_output(&copy.output_url)?;
        }
        DefaultPhysicalPlanner::default().create_physical_plan(plan, state).await
    }
}

/// The tables of done ids that [`super::resume::ResumeRule`] joined into a write's input.
fn done_id_tables(input: &LogicalPlan) -> Vec<Arc<dyn datafusion::catalog::TableProvider>> {
    let mut found = Vec::new();
    let _ = input.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Ok(provider) = source_as_provider(&scan.source)
            && provider.as_ref().downcast_ref::<ExistingIds>().is_some()
        {
            found.push(provider);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// A write's input without the joins that drop its done ids: the rows of its whole output.
fn without_done_joins(input: LogicalPlan) -> Result<LogicalPlan> {
    input
        .transform_up(|node| match &node {
            LogicalPlan::Join(j) if j.join_type == JoinType::RightAnti && !done_id_tables(&j.left).is_empty() => {
                Ok(Transformed::yes(j.right.as_ref().clone()))
            }
            _ => Ok(Transformed::no(node)),
        })
        .map(|t| t.data)
}

/// The ids of the rows a write is about to write, refused when some are NULL or repeated.
pub async fn check_write_ids(state: &SessionState, input: &LogicalPlan, column: &str) -> Result<IdCheck> {
    let check = check_ids(state, input, column).await?;
    match check.problem(column) {
        Some(problem) => Err(Error::Ids(problem).into()),
        None => Ok(check),
    }
}

/// Refuse a COPY into an existing file, or into a folder that holds files (see the module docs).
fn check_file_output(url: &str) -> Result<()> {
    if url.contains("://") && !url.starts_with("file://") {
        return Ok(()); // an object store's keys: DataFusion writes new ones
    }
    let path = Path::new(url.strip_prefix("file://").unwrap_or(url));
    let Ok(meta) = std::fs::metadata(path) else { return Ok(()) };
    let refuse = |what: String| {
        Err(Error::Output {
            path: path.display().to_string(),
            message: format!(
                "{what}; nothing was written. Write to a new path, or SET embed.overwrite = true to let this COPY \
                 replace what is there"
            ),
        }
        .into())
    };
    if meta.is_file() {
        return refuse("exists, and the COPY would replace it".into());
    }
    let held = std::fs::read_dir(path).map(|d| d.filter_map(|e| e.ok()).count()).unwrap_or(0);
    if meta.is_dir() && held > 0 {
        return refuse(format!("is a folder that holds {held} entries, among which the COPY would write its files"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_file_or_a_folder_with_files_is_refused_and_a_new_path_or_empty_folder_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.jsonl");
        assert!(check_file_output(&file.display().to_string()).is_ok(), "a new path");
        std::fs::write(&file, "{}\n").unwrap();
        let err = check_file_output(&file.display().to_string()).unwrap_err().to_string();
        assert!(err.contains("x.jsonl") && err.contains("exists") && err.contains("embed.overwrite"), "{err}");
        let folder = dir.path().join("out");
        std::fs::create_dir(&folder).unwrap();
        assert!(check_file_output(&format!("{}/", folder.display())).is_ok(), "an empty folder");
        std::fs::write(folder.join("a.parquet"), "").unwrap();
        let err = check_file_output(&format!("{}/", folder.display())).unwrap_err().to_string();
        assert!(err.contains("holds 1 entries"), "{err}");
        assert!(check_file_output("s3://bucket/x.parquet").is_ok());
    }
}
