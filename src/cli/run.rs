//! `pipeline run [FILE|-]… [-c SQL]…`: the job's statements in order, each query's result printed, a line per
//! write, and a summary of the whole run.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, anyhow, bail};
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::UInt64Type;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use futures::StreamExt;

use super::display::{ResultStyle, ResultWriter};
use super::job_input::JobStatement;
use crate::campaign::interrupt;
use crate::campaign::plan::{PlanInUse, WORK_LIST_FILE};
use crate::lance::resume::{ExistingIds, WriteTarget, count_done, open_existing, write_target};
use crate::lance::sink::{check_fingerprint, fingerprint_of_columns, fingerprint_of_dataset};
use crate::options::EmbedOptions;
use crate::script::{Statement, parse_all};
use crate::session::EmbedSession;

/// Which plan (`pipeline plan`) a write executes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PlanChoice {
    /// The plan in the write's `<output>.plan/`, when there is one.
    #[default]
    Beside,
    /// The plan in this directory, for the job's write into Lance (which must be the write it planned).
    Dir(PathBuf),
    /// None: every write reads and orders its input itself.
    Off,
}

/// How `pipeline run` runs a job.
#[derive(Debug, Clone, Default)]
pub struct RunSettings {
    /// Start every Lance output over instead of resuming.
    pub restart: bool,
    /// `embed.device` before the job's own SETs.
    pub device: Option<String>,
    /// Print only results and errors.
    pub quiet: bool,
    pub plans: PlanChoice,
    /// `--set key=value`, applied before the first statement.
    pub sets: Vec<(String, String)>,
    /// How query results print.
    pub style: ResultStyle,
    /// The Ballista cluster (`df://HOST:PORT`) the job's queries run on; `None` runs them here.
    pub cluster: Option<String>,
    /// The cluster's keys, for a cluster started with them.
    pub cluster_keys: Option<crate::cluster::ClusterKeys>,
}

/// A session for a job: `--device` and `--set` applied.
pub async fn job_session(settings: &RunSettings) -> anyhow::Result<EmbedSession> {
    let mut options = EmbedOptions { restart: settings.restart, ..EmbedOptions::default() };
    if let Some(device) = &settings.device {
        options.device = device.clone();
    }
    let session = match &settings.cluster {
        Some(url) => EmbedSession::on_cluster(url, options, settings.cluster_keys.as_ref()).await?,
        None => EmbedSession::with_options(options)?,
    };
    for (key, value) in &settings.sets {
        // Through SQL, as a job's own SET: the same checks, and embed() follows a new embed.model.
        session
            .context()
            .sql(&format!("SET {key} = '{}'", value.replace('\'', "''")))
            .await
            .map_err(|e| anyhow!("--set {key}={value}: {}", super::error_chain(&e.into())))?;
    }
    Ok(session)
}

/// Run a job's statements in order. The error names the statement, where it came from and its line.
pub async fn run_job(statements: &[JobStatement], settings: &RunSettings) -> anyhow::Result<()> {
    let quiet = settings.quiet;
    let session = job_session(settings).await?;
    // Every statement parses before the first one runs: a typo at the end must not wait for an hour of COPY.
    let plain: Vec<Statement> = statements.iter().map(|s| s.stmt.clone()).collect();
    parse_all(&session.context().state(), &plain).map_err(|(i, e)| {
        let s = &statements[i];
        anyhow!(
            "{}: statement {} (line {}) does not parse, so nothing was run: {e}\n  {}",
            s.source,
            s.stmt.index,
            s.stmt.line,
            s.stmt.sql.lines().next().unwrap_or_default()
        )
    })?;
    let others = other_runs();
    let threads_chosen = || {
        let state = session.context().state();
        EmbedOptions::from_config(state.config_options()).intra_threads != 0
    };
    if !quiet && !others.is_empty() {
        let list = others.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        eprintln!("note: other pipeline runs share this machine (pid {list}); the summary says how to share its cores");
    }
    let started = Instant::now();
    let mut json_sources = Vec::new();
    for s in statements {
        if interrupt::stop_requested() {
            return Err(anyhow!("{}: stopped before statement {} (line {})", s.source, s.stmt.index, s.stmt.line));
        }
        run_labelled(&session, s, settings, &mut json_sources).await?;
    }
    if !quiet {
        print_summary(&session, started, started.elapsed().as_secs_f64());
        if !others.is_empty() {
            note!("shared machine: {}", sharing_advice(&others, threads_chosen()));
        }
    }
    Ok(())
}

/// Run one of a job's statements; the error names it, where it came from and its line.
/// `json_sources` collects the locations of the JSON tables the job creates, to find a bad line in.
pub(crate) async fn run_labelled(
    session: &EmbedSession,
    s: &JobStatement,
    settings: &RunSettings,
    json_sources: &mut Vec<String>,
) -> anyhow::Result<()> {
    let JobStatement { source, stmt } = s;
    run_statement(session, stmt, settings.quiet, &settings.plans, settings.style, json_sources).await.map_err(|e| {
        let chain = stmt.relocate(&super::error_chain(&e));
        // Arrow's JSON errors say what, not where: find the line.
        let located = chain
            .contains("Json error")
            .then(|| json_sources.iter().rev().find_map(|l| super::json_lines::first_bad_line(l, &chain)))
            .flatten()
            .map(|(f, line, why)| format!("\n  {} line {line}: {why}", f.display()))
            .unwrap_or_default();
        // The shell's statements come from no file: they are named by their place alone.
        let source = if source.is_empty() { String::new() } else { format!("{source}: ") };
        anyhow!(
            "{source}statement {} (line {}) failed: {chain}{located}\n  {}",
            stmt.index,
            stmt.line,
            stmt.sql.lines().next().unwrap_or_default()
        )
    })
}

/// Other `pipeline run` processes of this same program on this machine, by process id.
fn other_runs() -> Vec<u32> {
    let (Ok(me), Ok(entries)) = (std::env::current_exe(), std::fs::read_dir("/proc")) else { return Vec::new() };
    let mine = std::process::id();
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != mine)
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == me))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == b"run"))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// What to tell a run that shares the machine with `others`.
fn sharing_advice(others: &[u32], threads_chosen: bool) -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let runs = others.len() + 1;
    let list = others.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    let each = (cores / runs).max(1);
    if threads_chosen {
        format!(
            "{} other pipeline run(s) on this machine (pid {list}); {cores} cores shared by {runs} runs",
            others.len()
        )
    } else {
        format!(
            "{} other pipeline run(s) on this machine (pid {list}). Each run takes one thread per core ({cores}) by \
             default, so {runs} runs at once oversubscribe the cores and slow each other down; give each \
             `SET embed.intra_threads = {each};`",
            others.len()
        )
    }
}

/// Run one statement. `json_sources` collects the locations of the JSON tables the job creates.
async fn run_statement(
    session: &EmbedSession,
    stmt: &Statement,
    quiet: bool,
    plans: &PlanChoice,
    style: ResultStyle,
    json_sources: &mut Vec<String>,
) -> anyhow::Result<()> {
    let writes_before = session.metrics().writes().len();
    let ctx = session.context();
    // Plan first to learn what kind of statement this is; DDL and SET run as they are executed.
    let plan = ctx.state().create_logical_plan(&stmt.sql).await?;
    let is_ddl = matches!(plan, LogicalPlan::Ddl(_) | LogicalPlan::Statement(_));
    if let LogicalPlan::Ddl(DdlStatement::CreateExternalTable(c)) = &plan
        && c.file_type.eq_ignore_ascii_case("json")
    {
        json_sources.push(c.location.clone());
    }
    let lance_target = write_target(&plan);
    if let Some(url) = session.cluster()
        && let Some(table) = lance_source(lance_target.as_ref().map_or(&plan, |t| t.input.as_ref()))
    {
        return Err(anyhow!(
            "{table} is a Lance table, which is read here, not on a cluster (--cluster {url}); run this statement \
             without --cluster"
        ));
    }
    if let Some(url) = session.cluster()
        && lance_target.is_none()
        && matches!(plan, LogicalPlan::Copy(_) | LogicalPlan::Dml(_))
    {
        return Err(anyhow!(
            "on a cluster (--cluster {url}) only writes into Lance run; write this output without --cluster"
        ));
    }
    // A write into anything but Lance (COPY … STORED AS PARQUET, an INSERT into a file table): DataFusion's
    // own writer, which answers with a row count.
    let file_target = match (&plan, &lance_target) {
        (_, Some(_)) => None,
        (LogicalPlan::Copy(c), None) => Some(c.output_url.clone()),
        (LogicalPlan::Dml(d), None) => Some(d.table_name.to_string()),
        _ => None,
    };
    // The plan a write (or the EXPLAIN of one) executes, checked against the job before anything is written.
    let explained = match &plan {
        LogicalPlan::Explain(e) => write_target(&e.plan),
        _ => None,
    };
    let mut planned = None;
    if let Some(target) = lance_target.as_ref().or(explained.as_ref())
        && let Some(p) = plan_for_write(session, target, plans).await?
    {
        if !quiet && lance_target.is_some() {
            let t = &p.plan.totals;
            note!(
                "executing the plan {}: {} rows, {} useful tokens, {} units; the sources are as planned ({})",
                p.dir.display(),
                t.rows,
                t.useful_tokens,
                p.plan.units.len(),
                p.plan.created
            );
        }
        if let Some(url) = session.cluster() {
            bail!(
                "{} has a plan ({}), which a cluster (--cluster {url}) does not execute yet; run with --no-plan to \
                 read and order the input on the executors",
                target.uri,
                p.dir.display()
            );
        }
        session.metrics().use_plan(&target.uri, Arc::clone(&p));
        planned = Some(PlanGuard { session, uri: target.uri.clone(), plan: p });
    }
    let mut todo = None;
    if let Some(target) = &lance_target {
        todo = prepare_write(session, target, planned.as_ref().map(|p| p.plan.as_ref()), quiet).await?;
    }
    if session.cluster().is_some()
        && let Some(target) = &lance_target
    {
        crate::cluster::write::run(session, target).await?;
        return report_write(session, writes_before, None, quiet);
    }
    let df = ctx.execute_logical_plan(plan).await?;
    if is_ddl {
        return Ok(());
    }
    // Planning a write into Lance checks its ids (crate::lance::guard), and says how many rows it has left.
    let mut stream = df.execute_stream().await?;
    if let Some(target) = &lance_target
        && let Some(rows) = session.metrics().take_ids_checked(&target.uri)
    {
        todo = todo.or(Some(Todo { rows, tokens: None }));
    }
    if let Some(target) = file_target {
        let mut rows = 0u64;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            if let Some(count) = batch.column_by_name("count").and_then(|c| c.as_primitive_opt::<UInt64Type>()) {
                rows += count.iter().flatten().sum::<u64>();
            }
        }
        session.metrics().record_file_write(&target, rows);
        if !quiet {
            note!("wrote {rows} rows to {target}");
        }
        return Ok(());
    }
    if lance_target.is_some() {
        let plan = planned.as_ref().map(|p| Arc::clone(&p.plan));
        let progress = (!quiet && std::io::stderr().is_terminal()).then(|| Progress::start(session, todo, plan));
        while let Some(batch) = stream.next().await {
            batch?;
        }
        drop(progress);
        return report_write(session, writes_before, planned.as_ref().map(|p| p.plan.as_ref()), quiet);
    }
    let schema = stream.schema();
    let mut writer = ResultWriter::new(style.format, super::ClosedPipeExit(std::io::stdout().lock()));
    let (mut rows, mut cut) = (0usize, false);
    while let Some(batch) = stream.next().await {
        if interrupt::stop_requested() {
            return Err(anyhow!("stopped"));
        }
        let batch = batch?;
        let take = style.max_rows.0.map_or(batch.num_rows(), |max| batch.num_rows().min(max - rows));
        rows += take;
        writer.write(&batch.slice(0, take))?;
        if style.max_rows.0.is_some_and(|max| rows >= max) {
            cut = true;
            break;
        }
    }
    writer.finish(&schema)?;
    if cut {
        let note = format!(
            "(showing the first {rows} rows; add a LIMIT, give --maxrows N or inf, or COPY the result to a file)"
        );
        // On stderr under the machine-read formats, which keep stdout for results.
        note!("{note}");
    }
    Ok(())
}

/// The first Lance table a plan reads, by name.
fn lance_source(plan: &LogicalPlan) -> Option<String> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    let mut found = None;
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && datafusion::datasource::source_as_provider(&scan.source)
                .is_ok_and(|p| p.as_ref().downcast_ref::<crate::lance::LanceTable>().is_some())
        {
            found = Some(scan.table_name.to_string());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// What a write into Lance did, from the commits it recorded since `writes_before`: rows, versions, memory,
/// the plan's progress, a change of device.
fn report_write(
    session: &EmbedSession,
    writes_before: usize,
    planned: Option<&PlanInUse>,
    quiet: bool,
) -> anyhow::Result<()> {
    let ctx = session.context();
    let writes = session.metrics().writes();
    let commits = &writes[writes_before.min(writes.len())..];
    if !quiet && let Some(last) = commits.last() {
        let rows: u64 = commits.iter().map(|w| w.rows).sum();
        let seconds: f64 = commits.iter().map(|w| w.elapsed.as_secs_f64()).sum();
        note!(
            "wrote {rows} rows to {} in {} commit(s), now at version {} ({seconds:.1} s)",
            last.uri,
            commits.len(),
            last.version
        );
    } else if !quiet {
        note!("nothing new to write: every id is already in the output");
    }
    let options = EmbedOptions::from_config(ctx.state().config_options());
    if let (Ok(Some(budget)), Some(peak)) =
        (options.memory_budget_bytes(), commits.iter().map(|w| w.record.peak_memory_bytes).max())
        && peak * 10 > budget * 9
    {
        eprintln!(
            "warning: this run's memory peaked at {}, within 10% of the budget of {} that pipeline probe assumed \
             (embed.memory_budget){}; probe again on this machine, or lower embed.batch_tokens",
            crate::memory::mib(peak),
            crate::memory::mib(budget),
            if peak > budget { ", and passed it" } else { "" }
        );
    }
    if !quiet && let Some(p) = planned {
        let (done, units) = p.units_done();
        note!("plan {}: {done} of {units} units done", p.dir.display());
    }
    if !quiet {
        for share in commits.iter().flat_map(|w| &w.record.executors) {
            note!(
                "executor {}: {} task(s), {} rows, {} useful tokens{}",
                share.executor,
                share.tasks,
                share.rows_written,
                share.useful_tokens,
                share.device.as_ref().map(|d| format!(", on {d}")).unwrap_or_default()
            );
        }
        for w in commits {
            if let (Some(before), Some(now)) = (&w.record.previous_device, &w.record.device) {
                note!(
                    "note: the previous version's vectors came from {before}; these from {now}. The fingerprint \
                     matches; `pipeline compare` checks how close they are."
                );
            }
        }
    }
    Ok(())
}

/// Before a campaign writes into Lance, and before its write is planned: refuse an output another command holds
/// or one made under another fingerprint, and say how much of the input an existing output already holds (the
/// write itself skips those rows; its planning refuses NULL and repeated ids in the rest). A write that executes
/// a plan takes its rows from the plan, whose checks ran on this very corpus.
/// Returns how many rows, and, from a plan, how many useful tokens, are left to embed, when known before the
/// write is planned.
async fn prepare_write(
    session: &EmbedSession,
    target: &WriteTarget,
    plan: Option<&PlanInUse>,
    quiet: bool,
) -> anyhow::Result<Option<Todo>> {
    let state = session.local_state();
    let options = EmbedOptions::from_config(state.config_options());
    let column = &options.id_column;
    let existing = if options.restart { None } else { open_existing(&target.uri).await? };
    let Some(ds) = existing else {
        return Ok(plan.map(|p| Todo { rows: p.plan.totals.rows, tokens: Some(p.plan.totals.useful_tokens) }));
    };
    // Refused now if another command holds the output, rather than after a resume count that would read as
    // if this run were going on. (The write takes the lock itself when it is planned; this only asks.)
    crate::lance::lock::WriteLock::acquire(&target.uri, crate::lance::lock::Holder::Run)?;
    // Refused here, before the resume count, which would read as if the run were going on.
    let new = fingerprint_of_columns(target.input.schema().as_arrow())?;
    check_fingerprint(&target.uri, fingerprint_of_dataset(&ds)?.as_ref(), new.as_ref())?;
    let (rows, done, done_tokens) = match plan {
        Some(p) => {
            let (done, tokens) = done_in_work_list(session, p, &target.uri, column).await?;
            (p.plan.totals.rows, done, tokens)
        }
        None => {
            let (rows, done) = count_done(&state, target, column).await?;
            (rows, done, 0)
        }
    };
    let left = rows.saturating_sub(done);
    if !options.tag.is_empty()
        && let Ok(v) = ds.tags().get_version(&options.tag).await
    {
        if left > 0 && v == ds.version().version {
            return Err(anyhow!(
                "embed.tag '{}' already marks version {v} of {}, and the {left} ids not yet there would make a new \
                 version; choose another tag for it",
                options.tag,
                target.uri
            ));
        }
        if left == 0 && !quiet {
            note!("embed.tag '{}' already marks version {v}, the current one: this job is done", options.tag);
        }
    }
    if !quiet {
        note!("resuming: {done} of {rows} already done in {}", target.uri);
    }
    Ok(Some(Todo { rows: left, tokens: plan.map(|p| p.plan.totals.useful_tokens.saturating_sub(done_tokens)) }))
}

/// What a write has left to embed.
#[derive(Debug, Clone, Copy)]
struct Todo {
    rows: u64,
    /// Useful tokens, when a plan counted them.
    tokens: Option<u64>,
}

/// Rows and useful tokens of a plan's work list already in the output.
async fn done_in_work_list(
    session: &EmbedSession,
    plan: &PlanInUse,
    uri: &str,
    column: &str,
) -> anyhow::Result<(u64, u64)> {
    use datafusion::common::Column;
    use datafusion::functions_aggregate::expr_fn::{count, sum};
    use datafusion::logical_expr::{JoinType, LogicalPlanBuilder, col, lit};
    let path = plan.dir.join(WORK_LIST_FILE);
    let list = session
        .context()
        .read_parquet(path.to_string_lossy().as_ref(), Default::default())
        .await
        .with_context(|| format!("cannot read the plan's work list {}; run pipeline plan again", path.display()))?
        .into_unoptimized_plan();
    let (qualifier, field) = list.schema().qualified_field_with_unqualified_name(column)?;
    let rows = Column::new(qualifier.cloned(), column);
    let ids = ExistingIds::new(uri, column, field.data_type().clone()).scan_plan()?;
    let done = Column::new(Some("__done_ids"), column);
    let counted = LogicalPlanBuilder::from(list)
        .join(ids, JoinType::LeftSemi, (vec![rows], vec![done]), None)?
        .aggregate(
            Vec::<datafusion::logical_expr::Expr>::new(),
            vec![count(lit(1)).alias("rows"), sum(col(crate::plan::length_order::TOKEN_COUNT)).alias("tokens")],
        )?
        .build()?;
    let batches = datafusion::dataframe::DataFrame::new(session.context().state(), counted).collect().await?;
    let value = |name: &str| -> anyhow::Result<u64> {
        let Some(batch) = batches.first() else { return Ok(0) };
        let column = datafusion::arrow::compute::cast(
            batch.column_by_name(name).expect("aggregated"),
            &datafusion::arrow::datatypes::DataType::UInt64,
        )?;
        Ok(column.as_primitive::<UInt64Type>().iter().flatten().sum())
    };
    Ok((value("rows")?, value("tokens")?))
}

/// The plan a write executes, checked against the job: the sources unchanged since it was made, the same
/// fingerprint, the same query and id column. `None` when the write has no plan.
async fn plan_for_write(
    session: &EmbedSession,
    target: &WriteTarget,
    plans: &PlanChoice,
) -> anyhow::Result<Option<Arc<PlanInUse>>> {
    let dir = match plans {
        PlanChoice::Off => return Ok(None),
        PlanChoice::Dir(dir) => dir.clone(),
        PlanChoice::Beside => {
            let dir = super::plan::plan_dir(&target.uri);
            if !dir.join(crate::campaign::plan::PLAN_FILE).is_file() {
                return Ok(None);
            }
            dir
        }
    };
    let plan = PlanInUse::load(&dir).map_err(|e| anyhow!(e))?;
    let shown = dir.display();
    let p = &plan.plan;
    let again = "run pipeline plan on the job again, or run without it (--no-plan)";
    // NOTE: the output's path is not compared: a plan copied to another machine, beside the output there,
    // is the same plan. What it covers is checked: the query, the sources and the fingerprint.
    let options = EmbedOptions::from_config(session.context().state().config_options());
    if !options.order.eq_ignore_ascii_case("length") {
        bail!(
            "the plan {shown} orders the rows by length, and this job sets embed.order = '{}': remove that SET, or {again}",
            options.order
        );
    }
    let now = super::plan::snapshot_sources(&target.input).await?;
    let changes = super::plan::compare_sources(&p.sources, &now);
    if !changes.is_empty() {
        bail!(
            "the corpus changed since the plan {shown} was made ({}), so its work list is not this corpus; nothing \
             was written. To embed the corpus as it is now, {again}:\n  {}",
            p.created,
            changes.join("\n  ")
        );
    }
    let fingerprint = fingerprint_of_columns(target.input.schema().as_arrow())?;
    let differences = fingerprint.as_ref().map(|f| p.fingerprint.differences(f)).unwrap_or_default();
    if !differences.is_empty() {
        let lines: Vec<String> =
            differences.iter().map(|(k, planned, now)| format!("  {k}: plan {planned}, this run {now}")).collect();
        bail!(
            "the plan {shown} was made under another campaign fingerprint than this run's settings; nothing was \
             written. Go back to the plan's settings, or {again}:\n{}",
            lines.join("\n")
        );
    }
    if p.write_digest != super::plan::write_digest(target, &options.id_column) {
        bail!(
            "the write into {} is not the one the plan {shown} was made for (its query, tables or id column \
             changed since); nothing was written. {}",
            target.uri,
            capitalised(again)
        );
    }
    Ok(Some(Arc::new(plan)))
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

/// Keeps a plan in use for one statement's write.
struct PlanGuard<'a> {
    session: &'a EmbedSession,
    uri: String,
    plan: Arc<PlanInUse>,
}

impl Drop for PlanGuard<'_> {
    fn drop(&mut self) {
        self.session.metrics().forget_plan(&self.uri);
    }
}

/// A progress bar on stderr while a write runs, driven by useful tokens: longest-first ordering makes the
/// document rate climb through a run (the first documents are the longest), so a bar of documents
/// predicted 24 minutes 30 s into a 5 min 47 s run. The token total is the ordering stage's count so far,
/// extrapolated over the documents still to count (exact once every row is counted); a write that
/// executes a plan knows it exactly from the start, and shows its units done.
struct Progress {
    bar: indicatif::ProgressBar,
    ticker: tokio::task::JoinHandle<()>,
}

/// What the bar shows at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Snapshot {
    /// Documents to write in all, if known.
    todo: Option<u64>,
    /// Documents and useful tokens embedded so far.
    docs: u64,
    tokens: u64,
    /// Rows and tokens the ordering stage has counted so far.
    counted_rows: u64,
    counted_tokens: u64,
    seconds: f64,
    /// Useful tokens to embed in all, when a plan counted them.
    planned_tokens: Option<u64>,
    /// A plan's units done and units in all.
    units: Option<(u64, u64)>,
}

impl Snapshot {
    /// Useful tokens in all: counted, plus the rows not counted yet at the counted rows' average.
    fn total_tokens(&self) -> Option<u64> {
        if let Some(planned) = self.planned_tokens {
            return Some(planned.max(self.tokens));
        }
        let todo = self.todo?;
        if self.counted_rows == 0 {
            return None;
        }
        let uncounted = todo.saturating_sub(self.counted_rows) as f64;
        let total = self.counted_tokens as f64 + uncounted * self.counted_tokens as f64 / self.counted_rows as f64;
        Some((total as u64).max(self.tokens))
    }

    /// The line beside the bar: tokens, documents, rate and time left (none until there is a rate).
    fn line(&self) -> String {
        let rate = if self.seconds > 0.0 { self.tokens as f64 / self.seconds } else { 0.0 };
        let mut docs = match self.todo {
            Some(n) => format!("{}/{n} documents", self.docs),
            None => format!("{} documents", self.docs),
        };
        if let Some((done, units)) = self.units {
            docs += &format!(", {done}/{units} units");
        }
        let (tokens, left) = match self.total_tokens() {
            Some(total) => {
                let left = if rate > 0.0 {
                    format!("{} left", human_seconds(total.saturating_sub(self.tokens) as f64 / rate))
                } else {
                    "time left: measuring".into()
                };
                (format!("{}/{total} tokens", self.tokens), left)
            }
            None => (format!("{} tokens", self.tokens), "time left: measuring".into()),
        };
        format!("{tokens}, {docs}, {rate:.0} useful tokens/s, {} elapsed, {left}", human_seconds(self.seconds))
    }
}

fn human_seconds(s: f64) -> String {
    let s = s.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

impl Progress {
    fn start(session: &EmbedSession, todo: Option<Todo>, plan: Option<Arc<PlanInUse>>) -> Self {
        let planned_tokens = todo.and_then(|t| t.tokens);
        let todo = todo.map(|t| t.rows);
        let bar = indicatif::ProgressBar::new(0);
        bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        let style = indicatif::ProgressStyle::with_template("{bar:30} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        let metrics = std::sync::Arc::clone(session.metrics());
        let (before, counted_before, started) = (metrics.progress(), metrics.counted(), Instant::now());
        let ticking = bar.clone();
        let ticker = tokio::spawn(async move {
            loop {
                let ((docs, tokens), (rows, counted)) = (metrics.progress(), metrics.counted());
                let now = Snapshot {
                    todo,
                    docs: docs - before.0,
                    tokens: tokens - before.1,
                    counted_rows: rows - counted_before.0,
                    counted_tokens: counted - counted_before.1,
                    seconds: started.elapsed().as_secs_f64(),
                    planned_tokens,
                    units: plan.as_ref().map(|p| p.units_done()),
                };
                match (now.total_tokens(), todo) {
                    (Some(total), _) => {
                        ticking.set_length(total);
                        ticking.set_position(now.tokens);
                    }
                    // No token counts (the 'original' order has no ordering stage): documents it is.
                    (None, Some(n)) => {
                        ticking.set_length(n);
                        ticking.set_position(now.docs);
                    }
                    (None, None) => {}
                }
                ticking.set_message(now.line());
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        });
        Self { bar, ticker }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.ticker.abort();
        self.bar.finish_and_clear();
    }
}

fn print_summary(session: &EmbedSession, started: Instant, wall: f64) {
    let writes = session.metrics().writes();
    let e = session.metrics().embed_stats();
    let files = session.metrics().file_writes();
    let written: u64 = writes.iter().map(|w| w.rows).sum::<u64>() + files.iter().map(|(_, rows)| rows).sum::<u64>();
    let write_seconds = writes.iter().map(|w| w.record.write_seconds).fold(0.0, |a, b| a + b);
    let mut outputs: Vec<String> =
        writes.last().map(|w| format!("{} at version {}", w.uri, w.version)).into_iter().collect();
    outputs.extend(files.iter().map(|(target, _)| target.clone()));
    if outputs.is_empty() {
        note!("pipeline run: nothing written, wall {wall:.1} s");
    } else {
        note!("pipeline run: {written} rows written to {}, wall {wall:.1} s", outputs.join(", "));
    }
    if e.docs + e.nulls > 0 {
        let efficiency = if e.processed_tokens > 0 { e.useful_tokens as f64 / e.processed_tokens as f64 } else { 0.0 };
        note!(
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
        if e.nulls > 0 && !writes.is_empty() {
            note!(
                "note: {} rows had a NULL text and were written with a NULL vector; their ids count as done, so a \
                 rerun skips them (the README's Resume section says how to embed them once they have text)",
                e.nulls
            );
        }
        if e.blank > 0 {
            eprintln!(
                "warning: {} texts were blank (empty, or only whitespace or zero-width characters) and each got the \
                 same vector, that of no text; leave them out (WHERE trim(text) <> ''), or SET embed.blank_texts = \
                 'error' to have the first one named",
                e.blank
            );
        }
        let first = session.metrics().first_call().map(|t| t.saturating_duration_since(started).as_secs_f64());
        if let Some(url) = session.cluster() {
            note!(
                "time on the executors of {url}: tokenising {:.2} s, model {:.1} s (summed over their calls, which \
                 overlap); committing {:.2} s here",
                e.tokenize_time.as_secs_f64(),
                e.model_time.as_secs_f64(),
                write_seconds
            );
        } else {
            note!(
                "time: first model call at {:.1} s; tokenising {:.2} s, model {:.1} s, writing {:.2} s (summed over calls \
             and partitions, which overlap)",
                first.unwrap_or(0.0),
                e.tokenize_time.as_secs_f64(),
                e.model_time.as_secs_f64(),
                write_seconds
            );
        }
        let options = EmbedOptions::from_config(session.context().state().config_options());
        if options.uses_gpu_default() {
            note!(
                "model: {} (the float16 default for GPUs, which scripts/setup --gpu exports: the int8 default has \
                 no CUDA kernels for its quantisation; SET embed.model to choose another)",
                options.model_dir().display()
            );
        } else if options.model_dir() != Path::new(&options.model) {
            note!(
                "model: {} (the default model as scripts/setup installed it; there is no {} here)",
                options.model_dir().display(),
                options.model
            );
        }
        if let Some(device) = session.metrics().device() {
            note!("device: {device}");
            if let Some(fallback) = device.nodes.as_ref().filter(|n| !n.fallback_nodes.is_empty()) {
                note!("nodes that fell back to the CPU: {}", fallback.fallback_nodes.join(", "));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Snapshot;

    #[test]
    fn no_time_left_is_shown_before_there_is_a_rate() {
        let start = Snapshot { todo: Some(1000), ..Default::default() };
        assert!(start.line().ends_with("time left: measuring"), "{}", start.line());
        let counted = Snapshot { counted_rows: 1000, counted_tokens: 40_000, ..start };
        assert!(counted.line().ends_with("time left: measuring"), "{}", counted.line());
    }

    #[test]
    fn time_left_follows_tokens_not_documents() {
        // Longest first: 30 s in, 10% of the documents are done but they held 40% of the tokens.
        let s = Snapshot {
            todo: Some(1000),
            docs: 100,
            tokens: 16_000,
            counted_rows: 1000,
            counted_tokens: 40_000,
            seconds: 30.0,
            ..Default::default()
        };
        // By tokens: 24,000 left at 533/s = 45 s. By documents it would have said 270 s.
        assert_eq!(s.total_tokens(), Some(40_000));
        assert!(
            s.line().contains("16000/40000 tokens, 100/1000 documents") && s.line().ends_with("45s left"),
            "{}",
            s.line()
        );
    }

    #[test]
    fn the_token_total_extrapolates_rows_not_yet_counted() {
        let s = Snapshot { todo: Some(1000), counted_rows: 250, counted_tokens: 10_000, ..Default::default() };
        assert_eq!(s.total_tokens(), Some(40_000));
        assert_eq!(Snapshot { todo: None, ..s }.total_tokens(), None);
    }

    #[test]
    fn a_plan_gives_the_token_total_and_the_units_from_the_start() {
        let s = Snapshot {
            todo: Some(1000),
            tokens: 4_000,
            seconds: 2.0,
            planned_tokens: Some(40_000),
            units: Some((1, 4)),
            ..Default::default()
        };
        assert_eq!(s.total_tokens(), Some(40_000));
        assert!(
            s.line().starts_with("4000/40000 tokens, 0/1000 documents, 1/4 units, 2000 useful tokens/s"),
            "{}",
            s.line()
        );
    }
}
