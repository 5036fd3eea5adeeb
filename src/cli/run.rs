//! `pipeline run FILE`: the job file's statements in order, each query's result printed, a line per
//! write, and a summary of the whole run.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, Context};
use datafusion::logical_expr::LogicalPlan;
use futures::StreamExt;

use super::display::format_batches;
use crate::script::{split_statements, Statement};
use crate::session::EmbedSession;

/// Rows of one query's result shown before the rest is cut off.
const MAX_SHOWN_ROWS: usize = 1000;

/// Run a job file. The error names the statement and its line.
pub async fn run_file(file: &Path, quiet: bool) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read job file {}", file.display()))?;
    let statements = split_statements(&text);
    if statements.is_empty() {
        return Err(anyhow!("job file {} holds no SQL statements", file.display()));
    }
    let session = EmbedSession::new()?;
    let started = Instant::now();
    for stmt in &statements {
        run_statement(&session, stmt, quiet).await.map_err(|e| {
            anyhow!(
                "{}: statement {} (line {}) failed: {e:#}\n  {}",
                file.display(),
                stmt.index,
                stmt.line,
                stmt.sql.lines().next().unwrap_or_default()
            )
        })?;
    }
    if !quiet {
        print_summary(&session, started.elapsed().as_secs_f64());
    }
    Ok(())
}

async fn run_statement(session: &EmbedSession, stmt: &Statement, quiet: bool) -> anyhow::Result<()> {
    let writes_before = session.metrics().writes().len();
    let ctx = session.context();
    // Plan first to learn what kind of statement this is; DDL and SET run as they are executed.
    let plan = ctx.state().create_logical_plan(&stmt.sql).await?;
    let is_write = matches!(plan, LogicalPlan::Copy(_) | LogicalPlan::Dml(_));
    let is_ddl = matches!(plan, LogicalPlan::Ddl(_) | LogicalPlan::Statement(_));
    let df = ctx.execute_logical_plan(plan).await?;
    if is_ddl {
        return Ok(());
    }
    let mut stream = df.execute_stream().await?;
    if is_write {
        while let Some(batch) = stream.next().await {
            batch?;
        }
        if !quiet {
            for w in session.metrics().writes().iter().skip(writes_before) {
                println!("wrote {} rows to {} (version {}) in {:.1} s", w.rows, w.uri, w.version, w.elapsed.as_secs_f64());
                if let (Some(before), Some(now)) = (&w.record.previous_device, &w.record.device) {
                    println!(
                        "note: the previous version's vectors came from {} on {} (ONNX Runtime {}); these from {} on {} (ONNX Runtime {}). \
                         The fingerprint matches; `pipeline compare` checks how close they are.",
                        before.provider, before.device, before.onnxruntime_version, now.provider, now.device, now.onnxruntime_version
                    );
                }
            }
        }
        return Ok(());
    }
    let (mut shown, mut rows) = (Vec::new(), 0usize);
    let mut cut = false;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let take = batch.num_rows().min(MAX_SHOWN_ROWS - rows);
        rows += take;
        shown.push(batch.slice(0, take));
        if rows >= MAX_SHOWN_ROWS {
            cut = true;
            break;
        }
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", format_batches(&shown)?)?;
    if cut {
        writeln!(out, "(showing the first {MAX_SHOWN_ROWS} rows; add a LIMIT, or COPY the result to a file)")?;
    }
    Ok(())
}

fn print_summary(session: &EmbedSession, wall: f64) {
    let writes = session.metrics().writes();
    let e = session.metrics().embed_stats();
    let written: u64 = writes.iter().map(|w| w.rows).sum();
    let last = writes.last().map(|w| format!(", {} at version {}", w.uri, w.version)).unwrap_or_default();
    println!("pipeline run: {written} rows written{last}, wall {wall:.1} s");
    if e.docs + e.nulls > 0 {
        let efficiency = if e.processed_tokens > 0 { e.useful_tokens as f64 / e.processed_tokens as f64 } else { 0.0 };
        println!(
            "embedded {} documents ({} NULL), {} useful of {} processed tokens (padding efficiency {:.3}), \
             {} truncated ({} tokens dropped), {:.0} useful tokens/s",
            e.docs,
            e.nulls,
            e.useful_tokens,
            e.processed_tokens,
            efficiency,
            e.truncated_docs,
            e.dropped_tokens,
            e.useful_tokens as f64 / wall.max(1e-9)
        );
    }
}
