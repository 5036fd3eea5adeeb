//! Shared by the commands that take a job file but do not run it whole (`check-invariance`,
//! `compare-order`): run its `SET` and `CREATE` statements, and find its source table.

use std::path::Path;

use anyhow::{Context, anyhow};
use datafusion::logical_expr::{DdlStatement, LogicalPlan};

use crate::script::split_statements;
use crate::session::EmbedSession;

/// A session with the job's set-up done, and the source table: `table` if given, else the job's first
/// non-Lance external table.
pub async fn prepare(file: &Path, table: Option<&str>) -> anyhow::Result<(EmbedSession, String)> {
    let session = EmbedSession::new()?;
    let first_table = run_setup(&session, file).await?;
    let table = table
        .map(str::to_string)
        .or(first_table)
        .ok_or_else(|| anyhow!("{} creates no source table; name one with --table", file.display()))?;
    Ok((session, table))
}

/// Run the job's SET and CREATE statements in `session`; return its first non-Lance external table.
pub async fn run_setup(session: &EmbedSession, file: &Path) -> anyhow::Result<Option<String>> {
    let opened = std::fs::File::open(file).with_context(|| format!("cannot read job file {}", file.display()))?;
    let text = crate::script::read_job(opened, &file.display().to_string()).map_err(|e| anyhow!(e))?;
    let ctx = session.context();
    let mut first_table = None;
    let statements = split_statements(&text).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    for stmt in statements {
        // Only the set-up statements; queries and writes may refer to outputs that do not exist yet.
        let first_word = stmt.sql.split_whitespace().next().unwrap_or_default().to_ascii_uppercase();
        if !["SET", "RESET", "CREATE", "DROP"].contains(&first_word.as_str()) {
            continue;
        }
        let plan = ctx.state().create_logical_plan(&stmt.sql).await.map_err(|e| {
            anyhow!(
                "{}: statement {} (line {}): {}",
                file.display(),
                stmt.index,
                stmt.line,
                stmt.relocate(&e.to_string())
            )
        })?;
        match &plan {
            LogicalPlan::Ddl(ddl) => {
                if let DdlStatement::CreateExternalTable(c) = ddl {
                    // Lance tables are the job's outputs, which may not exist yet.
                    if c.file_type.eq_ignore_ascii_case("lance") {
                        continue;
                    }
                    first_table.get_or_insert_with(|| c.name.to_string());
                }
                ctx.execute_logical_plan(plan).await?;
            }
            LogicalPlan::Statement(_) => {
                ctx.execute_logical_plan(plan).await?;
            }
            _ => {}
        }
    }
    Ok(first_table)
}
