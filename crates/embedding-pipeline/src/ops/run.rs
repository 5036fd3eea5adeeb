//! Running a job (`pipeline run`, `pipeline sql`, the Python package's `run`): its statements in order, each
//! write into Lance checked against its output (fingerprint, lock, plan, tag) before anything is embedded,
//! resumed where the output stopped, and followed by a [`Reporter`]. Returns a [`RunReport`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::UInt64Type;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use futures::StreamExt;

use super::Reporter;
use crate::campaign::metrics::{RunMetrics, WriteReport};
use crate::campaign::work_plan::{WORK_LIST_FILE, WorkPlanInUse};
use crate::campaign::{DeviceInfo, EmbedStats};
use crate::error::{Error, Result};
use crate::exec::existing_ids::{ExistingIds, count_done};
use crate::lance::records::fingerprint_of_dataset;
use crate::lance::sink::{check_fingerprint, fingerprint_of_columns};
use crate::lance::target::{WriteTarget, open_existing, write_target};
use crate::ops::script::{JobStatement, Statement, parse_all};
use crate::options::EmbedOptions;
use crate::process::interrupt::StopToken;
use crate::session::EmbedSession;

/// Which plan (`pipeline plan`) a write executes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WorkPlanChoice {
    /// The plan in the write's `<output>.plan/`, when there is one.
    #[default]
    Beside,
    /// The plan in this directory, for the job's write into Lance (which must be the write it planned).
    Dir(PathBuf),
    /// None: every write reads and orders its input itself.
    Off,
}

/// How a job runs.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Start every Lance output over instead of resuming.
    pub restart: bool,
    /// `embed.device` before the job's own SETs.
    pub device: Option<String>,
    pub plans: WorkPlanChoice,
    /// `key=value` settings applied (as `SET key = 'value'`) before the first statement.
    pub sets: Vec<(String, String)>,
    /// The Ballista cluster (`df://HOST:PORT`) the job's queries run on; `None` runs them here.
    pub cluster: Option<String>,
    /// The cluster's keys, for a cluster started with them.
    #[cfg(feature = "cluster")]
    pub cluster_keys: Option<crate::cluster::ClusterKeys>,
    /// Asks the job to stop: its writes commit what they have, and no statement starts after it (a signal
    /// handler holds a clone).
    pub stop: StopToken,
}

/// What a job did, for its summary: the commits of its writes into Lance and the rows of its other writes,
/// the embedding counters (useful tokens against padding, truncation), timings and the device.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Seconds from the first statement to the end of the last.
    pub wall_seconds: f64,
    /// Every commit into a Lance output, in order.
    pub writes: Vec<WriteReport>,
    /// Every write into another format (COPY … STORED AS PARQUET, INSERT into a file table): target and rows.
    pub file_writes: Vec<(String, u64)>,
    /// Documents, useful and processed tokens, truncation, blank texts, model time.
    pub embedded: EmbedStats,
    /// When the first model call started, in seconds from the first statement.
    pub first_model_call_seconds: Option<f64>,
    /// The cluster the queries ran on.
    pub cluster: Option<String>,
    /// Where the model came from, when it is not simply the `embed.model` asked for.
    pub model_note: Option<ModelNote>,
    /// The device the vectors were made on (here; on a cluster, each executor's share says).
    pub device: Option<DeviceInfo>,
    /// Other `pipeline run` processes on this machine (process ids), which share its cores.
    pub other_runs: Vec<u32>,
    /// Whether the job chose `embed.intra_threads` itself.
    pub threads_chosen: bool,
}

/// Which model directory the job embedded with, when the setting named another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelNote {
    /// The float16 default export for GPUs.
    GpuDefault(PathBuf),
    /// The default model as scripts/setup installed it, in place of `asked` (which is not here).
    Installed { dir: PathBuf, asked: String },
}

impl RunReport {
    /// Rows written in all, into Lance and into files.
    pub fn rows_written(&self) -> u64 {
        self.writes.iter().map(|w| w.rows).sum::<u64>() + self.file_writes.iter().map(|(_, rows)| rows).sum::<u64>()
    }

    /// Useful tokens over processed tokens (padding included); 0 when nothing was embedded.
    pub fn padding_efficiency(&self) -> f64 {
        let e = &self.embedded;
        if e.processed_tokens > 0 { e.useful_tokens as f64 / e.processed_tokens as f64 } else { 0.0 }
    }

    /// Useful tokens per second of the whole run.
    pub fn useful_tokens_per_second(&self) -> f64 {
        self.embedded.useful_tokens as f64 / self.wall_seconds.max(1e-9)
    }

    /// What to tell a run that shares the machine with other runs; `None` when it does not.
    pub fn sharing_advice(&self) -> Option<String> {
        (!self.other_runs.is_empty()).then(|| sharing_advice(&self.other_runs, self.threads_chosen))
    }

    fn of(session: &EmbedSession, started: Instant, other_runs: Vec<u32>) -> Self {
        let metrics = session.metrics();
        let options = EmbedOptions::from_config(session.context().state().config_options());
        let model_note = if options.uses_gpu_default() {
            Some(ModelNote::GpuDefault(options.model_dir()))
        } else if options.model_dir() != Path::new(&options.model) {
            Some(ModelNote::Installed { dir: options.model_dir(), asked: options.model.clone() })
        } else {
            None
        };
        Self {
            wall_seconds: started.elapsed().as_secs_f64(),
            writes: metrics.writes(),
            file_writes: metrics.file_writes(),
            embedded: metrics.embed_stats(),
            first_model_call_seconds: metrics.first_call().map(|t| t.saturating_duration_since(started).as_secs_f64()),
            cluster: session.cluster().map(str::to_string),
            model_note,
            device: metrics.device(),
            other_runs,
            threads_chosen: options.intra_threads != 0,
        }
    }
}

/// A session for a job: `device` and `sets` applied.
pub async fn job_session(settings: &RunOptions) -> Result<EmbedSession> {
    let mut options = EmbedOptions { restart: settings.restart, ..EmbedOptions::default() };
    if let Some(device) = &settings.device {
        options.device = device.clone();
    }
    let session = match &settings.cluster {
        #[cfg(feature = "cluster")]
        Some(url) => {
            EmbedSession::on_cluster(url, options, settings.cluster_keys.as_ref(), settings.stop.clone()).await?
        }
        #[cfg(not(feature = "cluster"))]
        Some(url) => {
            return Err(Error::Cluster(format!(
                "cannot run on the cluster at {url}: this build has no cluster (it was built without the `cluster` \
                 feature); use the `pipeline` command, which has it"
            )));
        }
        None => EmbedSession::stopped_by(options, settings.stop.clone())?,
    };
    for (key, value) in &settings.sets {
        // Through SQL, as a job's own SET: the same checks, and embed() follows a new embed.model.
        session
            .context()
            .sql(&format!("SET {key} = '{}'", value.replace('\'', "''")))
            .await
            .map_err(|e| Error::Refused(format!("--set {key}={value}: {}", crate::error::chain_text(&e))))?;
    }
    Ok(session)
}

/// Run a job's statements in order, in a session made for it. The error names the statement, where it came
/// from and its line.
pub async fn run_job(statements: &[JobStatement], settings: &RunOptions, reporter: &dyn Reporter) -> Result<RunReport> {
    let session = job_session(settings).await?;
    run_in(&session, statements, settings, reporter).await
}

/// Run a job's statements in order in `session`.
pub async fn run_in(
    session: &EmbedSession,
    statements: &[JobStatement],
    settings: &RunOptions,
    reporter: &dyn Reporter,
) -> Result<RunReport> {
    // Every statement parses before the first one runs: a typo at the end must not wait for an hour of COPY.
    let plain: Vec<Statement> = statements.iter().map(|s| s.stmt.clone()).collect();
    parse_all(&session.context().state(), &plain).map_err(|(i, e)| {
        let s = &statements[i];
        Error::Refused(format!(
            "{}: statement {} (line {}) does not parse, so nothing was run: {e}\n  {}",
            s.source,
            s.stmt.index,
            s.stmt.line,
            s.stmt.sql.lines().next().unwrap_or_default()
        ))
    })?;
    let others = other_runs();
    if !others.is_empty() {
        let list = others.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        reporter.note(&format!(
            "note: other pipeline runs share this machine (pid {list}); the summary says how to share its cores"
        ));
    }
    let started = Instant::now();
    let mut json_sources = Vec::new();
    for s in statements {
        if session.stop().requested() {
            return Err(Error::StoppedAt(format!(
                "{}: stopped before statement {} (line {})",
                s.source, s.stmt.index, s.stmt.line
            )));
        }
        run_labelled(session, s, &settings.plans, &mut json_sources, reporter).await?;
    }
    Ok(RunReport::of(session, started, others))
}

/// Run one of a job's statements; the error names it, where it came from and its line.
/// `json_sources` collects the locations of the JSON tables the job creates, to find a bad line in.
pub async fn run_labelled(
    session: &EmbedSession,
    s: &JobStatement,
    plans: &WorkPlanChoice,
    json_sources: &mut Vec<String>,
    reporter: &dyn Reporter,
) -> Result<()> {
    let JobStatement { source, stmt } = s;
    run_statement(session, stmt, plans, json_sources, reporter).await.map_err(|e| {
        let chain = stmt.relocate(&e.chain_text());
        // Arrow's JSON errors say what, not where: find the line.
        let located = chain
            .contains("Json error")
            .then(|| json_sources.iter().rev().find_map(|l| super::json_lines::first_bad_line(l, &chain)))
            .flatten()
            .map(|(f, line, why)| format!("\n  {} line {line}: {why}", f.display()))
            .unwrap_or_default();
        // The shell's statements come from no file: they are named by their place alone.
        let source = if source.is_empty() { String::new() } else { format!("{source}: ") };
        let message = format!(
            "{source}statement {} (line {}) failed: {chain}{located}\n  {}",
            stmt.index,
            stmt.line,
            stmt.sql.lines().next().unwrap_or_default()
        );
        Error::Statement { message, cause: Some(Box::new(e)) }
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
    plans: &WorkPlanChoice,
    json_sources: &mut Vec<String>,
    reporter: &dyn Reporter,
) -> Result<()> {
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
    refuse_on_cluster(session, &plan, lance_target.as_ref())?;
    let file_target = lance_target.is_none().then(|| file_target(&plan)).flatten();
    // The plan a write (or the EXPLAIN of one) executes, checked against the job before anything is written.
    let explained = match &plan {
        LogicalPlan::Explain(e) => write_target(&e.plan),
        _ => None,
    };
    let planned = match lance_target.as_ref().or(explained.as_ref()) {
        Some(target) => use_write_plan(session, target, plans, lance_target.is_some(), reporter).await?,
        None => None,
    };
    // Held to the statement's end: a restart that resumes the one that stopped is a restart again after it.
    let _restart = match lance_target.as_ref() {
        Some(target) => super::restart::prepare_restart(session, target, &|m: &str| reporter.note(m)).await?,
        None => None,
    };
    let mut todo = match &lance_target {
        Some(target) => prepare_write(session, target, planned.as_ref().map(|p| p.plan.as_ref()), reporter).await?,
        None => None,
    };
    #[cfg(feature = "cluster")]
    if session.cluster().is_some()
        && let Some(target) = &lance_target
    {
        crate::cluster::write::run(session, target).await?;
        refuse_nothing_written(session, writes_before, target).await?;
        report_write(session, writes_before, None, reporter);
        return Ok(());
    }
    let df = ctx.execute_logical_plan(plan).await?;
    if is_ddl {
        return Ok(());
    }
    // Planning a write into Lance checks its ids (crate::exec::guard), and says how many rows it has left.
    let mut stream = df.execute_stream().await?;
    if let Some(target) = &lance_target
        && let Some(rows) = session.metrics().take_ids_checked(&target.uri)
    {
        todo = todo.or(Some(Todo { rows, tokens: None }));
    }
    if let Some(target) = file_target {
        return count_file_write(stream, &target, session, reporter).await;
    }
    if lance_target.is_some() {
        let plan = planned.as_ref().map(|p| Arc::clone(&p.plan));
        let following = Following::start(reporter, WriteProgress::start(session.metrics(), todo, plan));
        while let Some(batch) = stream.next().await {
            batch?;
        }
        drop(following);
        if let Some(target) = &lance_target {
            refuse_nothing_written(session, writes_before, target).await?;
        }
        report_write(session, writes_before, planned.as_ref().map(|p| p.plan.as_ref()), reporter);
        return Ok(());
    }
    show_result(stream, session.stop(), reporter).await
}

/// Where a write into anything but Lance goes (COPY … STORED AS PARQUET, an INSERT into a file table): DataFusion's
/// own writer, which answers with a row count.
fn file_target(plan: &LogicalPlan) -> Option<String> {
    match plan {
        LogicalPlan::Copy(c) => Some(c.output_url.clone()),
        LogicalPlan::Dml(d) => Some(d.table_name.to_string()),
        _ => None,
    }
}

/// The plan `target`'s write executes (none when it reads and orders its input itself), in use until the
/// guard drops; `writes` says the statement writes (it is not an EXPLAIN of the write), which is told.
async fn use_write_plan<'a>(
    session: &'a EmbedSession,
    target: &WriteTarget,
    plans: &WorkPlanChoice,
    writes: bool,
    reporter: &dyn Reporter,
) -> Result<Option<PlanGuard<'a>>> {
    let Some(p) = plan_for_write(session, target, plans).await? else { return Ok(None) };
    if writes {
        let t = &p.plan.totals;
        reporter.note(&format!(
            "executing the plan {}: {} rows, {} useful tokens, {} units; the sources are as planned ({})",
            p.dir.display(),
            t.rows,
            t.useful_tokens,
            p.plan.units.len(),
            p.plan.created
        ));
    }
    if let Some(url) = session.cluster() {
        return Err(Error::Refused(format!(
            "{} has a plan ({}), which a cluster (--cluster {url}) does not execute yet; run with --no-plan to \
             read and order the input on the executors",
            target.uri,
            p.dir.display()
        )));
    }
    session.metrics().use_plan(&target.uri, Arc::clone(&p));
    Ok(Some(PlanGuard { session, uri: target.uri.clone(), plan: p }))
}

/// A write into Lance that committed nothing where no dataset was before: its query gave no rows (a write that
/// found every id done has a dataset to find them in).
async fn refuse_nothing_written(session: &EmbedSession, writes_before: usize, target: &WriteTarget) -> Result<()> {
    if session.metrics().writes().len() > writes_before || open_existing(&target.uri).await?.is_some() {
        return Ok(());
    }
    Err(super::plan::no_rows(&target.uri, "written"))
}

/// Read a write into a file (DataFusion's writer answers with its row count), record it and say it.
async fn count_file_write(
    mut stream: datafusion::execution::SendableRecordBatchStream,
    target: &str,
    session: &EmbedSession,
    reporter: &dyn Reporter,
) -> Result<()> {
    let mut rows = 0u64;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if let Some(count) = batch.column_by_name("count").and_then(|c| c.as_primitive_opt::<UInt64Type>()) {
            rows += count.iter().flatten().sum::<u64>();
        }
    }
    session.metrics().record_file_write(target, rows);
    reporter.note(&format!("wrote {rows} rows to {target}"));
    Ok(())
}

/// Hand a query's result to the reporter, batch by batch, until it ends or the reporter has seen enough.
async fn show_result(
    mut stream: datafusion::execution::SendableRecordBatchStream,
    stop: &StopToken,
    reporter: &dyn Reporter,
) -> Result<()> {
    let schema = stream.schema();
    while let Some(batch) = stream.next().await {
        if stop.requested() {
            return Err(Error::StoppedAt("stopped".into()));
        }
        if reporter.query_rows(&batch?)?.is_break() {
            break;
        }
    }
    reporter.query_finished(&schema)
}

/// A write into Lance, or any write, refused on a cluster before it starts when the cluster cannot run it.
fn refuse_on_cluster(session: &EmbedSession, plan: &LogicalPlan, lance_target: Option<&WriteTarget>) -> Result<()> {
    let Some(url) = session.cluster() else { return Ok(()) };
    if let Some(table) = lance_source(lance_target.map_or(plan, |t| t.input.as_ref())) {
        return Err(Error::Refused(format!(
            "{table} is a Lance table, which is read here, not on a cluster (--cluster {url}); run this statement \
             without --cluster"
        )));
    }
    if lance_target.is_none() && matches!(plan, LogicalPlan::Copy(_) | LogicalPlan::Dml(_)) {
        return Err(Error::Refused(format!(
            "on a cluster (--cluster {url}) only writes into Lance run; write this output without --cluster"
        )));
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

/// Say what a write into Lance did, from the commits it recorded since `writes_before`: rows, versions,
/// memory, the plan's progress, a change of device.
fn report_write(
    session: &EmbedSession,
    writes_before: usize,
    planned: Option<&WorkPlanInUse>,
    reporter: &dyn Reporter,
) {
    let ctx = session.context();
    let writes = session.metrics().writes();
    let commits = &writes[writes_before.min(writes.len())..];
    if let Some(last) = commits.last() {
        let rows: u64 = commits.iter().map(|w| w.rows).sum();
        let seconds: f64 = commits.iter().map(|w| w.elapsed.as_secs_f64()).sum();
        reporter.note(&format!(
            "wrote {rows} rows to {} in {} commit(s), now at version {} ({seconds:.1} s)",
            last.uri,
            commits.len(),
            last.version
        ));
    }
    let options = EmbedOptions::from_config(ctx.state().config_options());
    if let (Ok(Some(budget)), Some(peak)) =
        (options.memory_budget_bytes(), commits.iter().map(|w| w.record.peak_memory_bytes).max())
        && peak * 10 > budget * 9
    {
        reporter.warning(&format!(
            "this run's memory peaked at {}, within 10% of the budget of {} that pipeline probe assumed \
             (embed.memory_budget){}; probe again on this machine, or lower embed.batch_tokens",
            crate::process::memory::mib(peak),
            crate::process::memory::mib(budget),
            if peak > budget { ", and passed it" } else { "" }
        ));
    }
    // A write that committed nothing found its job done, and said so before it began.
    if let Some(p) = planned.filter(|_| !commits.is_empty()) {
        let (done, units) = p.units_done();
        reporter.note(&format!("plan {}: {done} of {units} units done", p.dir.display()));
    }
    for share in commits.iter().flat_map(|w| &w.record.executors) {
        reporter.note(&format!(
            "executor {}: {} task(s), {} rows, {} useful tokens{}",
            share.executor,
            share.tasks,
            share.rows_written,
            share.useful_tokens,
            share.device.as_ref().map(|d| format!(", on {d}")).unwrap_or_default()
        ));
    }
    for w in commits {
        if let (Some(before), Some(now)) = (&w.record.previous_device, &w.record.device) {
            reporter.note(&format!(
                "note: the previous version's vectors came from {before}; these from {now}. The fingerprint \
                 matches; `pipeline compare` checks how close they are."
            ));
        }
    }
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
    plan: Option<&WorkPlanInUse>,
    reporter: &dyn Reporter,
) -> Result<Option<Todo>> {
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
    crate::lance::sink::check_id_column(&target.uri, &ds, column)?;
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
    let mut tagged = String::new();
    if !options.tag.is_empty()
        && let Ok(v) = ds.tags().get_version(&options.tag).await
    {
        if left > 0 && v == ds.version().version {
            return Err(Error::Refused(format!(
                "embed.tag '{}' already marks version {v} of {}, and the {left} ids not yet there would make a new \
                 version; choose another tag for it",
                options.tag, target.uri
            )));
        }
        tagged = format!(", tagged '{}'", options.tag);
    }
    // One line either way: a finished job is not also "resuming".
    reporter.note(&if left == 0 {
        format!(
            "this job is done: all {rows} ids are already in {} (version {}{tagged}); nothing to write",
            target.uri,
            ds.version().version
        )
    } else {
        format!("resuming: {done} of {rows} already done in {}", target.uri)
    });
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
    plan: &WorkPlanInUse,
    uri: &str,
    column: &str,
) -> Result<(u64, u64)> {
    use datafusion::common::Column;
    use datafusion::functions_aggregate::expr_fn::{count, sum};
    use datafusion::logical_expr::{JoinType, LogicalPlanBuilder, col, lit};
    let path = plan.dir.join(WORK_LIST_FILE);
    let list = session
        .context()
        .read_parquet(path.to_string_lossy().as_ref(), Default::default())
        .await
        .map_err(|e| {
            Error::Refused(format!(
                "cannot read the plan's work list {}; run pipeline plan again: {}",
                path.display(),
                crate::error::chain_text(&e)
            ))
        })?
        .into_unoptimized_plan();
    let (qualifier, field) = list.schema().qualified_field_with_unqualified_name(column)?;
    let rows = Column::new(qualifier.cloned(), column);
    let ids = ExistingIds::new(uri, column, field.data_type().clone()).scan_plan()?;
    let done = Column::new(Some("__done_ids"), column);
    let counted = LogicalPlanBuilder::from(list)
        .join(ids, JoinType::LeftSemi, (vec![rows], vec![done]), None)?
        .aggregate(
            Vec::<datafusion::logical_expr::Expr>::new(),
            vec![count(lit(1)).alias("rows"), sum(col(crate::exec::length_order::TOKEN_COUNT)).alias("tokens")],
        )?
        .build()?;
    let batches = datafusion::dataframe::DataFrame::new(session.context().state(), counted).collect().await?;
    let value = |name: &str| -> Result<u64> {
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
    plans: &WorkPlanChoice,
) -> Result<Option<Arc<WorkPlanInUse>>> {
    let dir = match plans {
        WorkPlanChoice::Off => return Ok(None),
        WorkPlanChoice::Dir(dir) => dir.clone(),
        WorkPlanChoice::Beside => {
            let dir = super::plan::plan_dir(&target.uri);
            if !dir.join(crate::campaign::work_plan::PLAN_FILE).is_file() {
                return Ok(None);
            }
            dir
        }
    };
    let plan = WorkPlanInUse::load(&dir).map_err(Error::Refused)?;
    let shown = dir.display();
    let p = &plan.plan;
    let again = "run pipeline plan on the job again, or run without it (--no-plan)";
    // NOTE: the output's path is not compared: a plan copied to another machine, beside the output there,
    // is the same plan. What it covers is checked: the query, the sources and the fingerprint.
    let options = EmbedOptions::from_config(session.context().state().config_options());
    if !options.order.eq_ignore_ascii_case("length") {
        return Err(Error::Refused(format!(
            "the plan {shown} orders the rows by length, and this job sets embed.order = '{}': remove that SET, or {again}",
            options.order
        )));
    }
    let now = super::plan::snapshot_sources(&target.input).await?;
    let changes = super::plan::compare_sources(&p.sources, &now);
    if !changes.is_empty() {
        return Err(Error::Refused(format!(
            "the corpus changed since the plan {shown} was made ({}), so its work list is not this corpus; nothing \
             was written. To embed the corpus as it is now, {again}:\n  {}",
            p.created,
            changes.join("\n  ")
        )));
    }
    let fingerprint = fingerprint_of_columns(target.input.schema().as_arrow())?;
    let differences = fingerprint.as_ref().map(|f| p.fingerprint.differences(f)).unwrap_or_default();
    if !differences.is_empty() {
        let lines: Vec<String> =
            differences.iter().map(|(k, planned, now)| format!("  {k}: plan {planned}, this run {now}")).collect();
        // A plan made for the CPU, run on a GPU, whose default model differs.
        let again = match crate::model::Device::parse(&options.device) {
            Some(crate::model::Device::Cuda(_)) => format!(
                "plan it for this device, on any machine (pipeline plan JOB --device {}: a GPU run takes the model \
                 it will use there), or run without it (--no-plan)",
                options.device
            ),
            _ => again.to_string(),
        };
        return Err(Error::Refused(format!(
            "the plan {shown} was made under another campaign fingerprint than this run's settings; nothing was \
             written. Go back to the plan's settings, or {again}:\n{}",
            lines.join("\n")
        )));
    }
    if p.write_digest != super::plan::write_digest(target, &options.id_column) {
        return Err(Error::Refused(format!(
            "the write into {} is not the one the plan {shown} was made for (its query, tables or id column \
             changed since); nothing was written. {}",
            target.uri,
            capitalised(again)
        )));
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
    plan: Arc<WorkPlanInUse>,
}

impl Drop for PlanGuard<'_> {
    fn drop(&mut self) {
        self.session.metrics().forget_plan(&self.uri);
    }
}

/// How far a write into Lance is, whenever asked: what a progress bar shows ([`Snapshot::line`]), driven by
/// useful tokens: longest-first ordering makes the document rate climb through a run (the first documents are
/// the longest), so a bar of documents predicted 24 minutes 30 s into a 5 min 47 s run. The token total is the
/// ordering stage's count so far, extrapolated over the documents still to count (exact once every row is
/// counted); a write that executes a plan knows it exactly from the start, and shows its units done.
#[derive(Clone)]
pub struct WriteProgress {
    metrics: Arc<RunMetrics>,
    /// Documents and useful tokens embedded, and rows and tokens counted, before this write.
    before: ((u64, u64), (u64, u64)),
    started: Instant,
    todo: Option<u64>,
    planned_tokens: Option<u64>,
    plan: Option<Arc<WorkPlanInUse>>,
}

impl WriteProgress {
    fn start(metrics: &Arc<RunMetrics>, todo: Option<Todo>, plan: Option<Arc<WorkPlanInUse>>) -> Self {
        Self {
            before: (metrics.progress(), metrics.counted()),
            metrics: Arc::clone(metrics),
            started: Instant::now(),
            todo: todo.map(|t| t.rows),
            planned_tokens: todo.and_then(|t| t.tokens),
            plan,
        }
    }

    /// Where the write is now.
    pub fn snapshot(&self) -> Snapshot {
        let ((docs, tokens), (rows, counted)) = (self.metrics.progress(), self.metrics.counted());
        let ((docs_before, tokens_before), (rows_before, counted_before)) = self.before;
        Snapshot {
            todo: self.todo,
            docs: docs - docs_before,
            tokens: tokens - tokens_before,
            counted_rows: rows - rows_before,
            counted_tokens: counted - counted_before,
            seconds: self.started.elapsed().as_secs_f64(),
            planned_tokens: self.planned_tokens,
            units: self.plan.as_ref().map(|p| p.units_done()),
        }
    }
}

/// Tells the reporter a write ended, however it ends (an error, a stop).
struct Following<'a>(&'a dyn Reporter);

impl<'a> Following<'a> {
    fn start(reporter: &'a dyn Reporter, progress: WriteProgress) -> Self {
        reporter.write_started(progress);
        Self(reporter)
    }
}

impl Drop for Following<'_> {
    fn drop(&mut self) {
        self.0.write_finished();
    }
}

/// Where a write into Lance is at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    /// Documents to write in all, if known.
    pub todo: Option<u64>,
    /// Documents and useful tokens embedded so far.
    pub docs: u64,
    pub tokens: u64,
    /// Rows and tokens the ordering stage has counted so far.
    pub counted_rows: u64,
    pub counted_tokens: u64,
    pub seconds: f64,
    /// Useful tokens to embed in all, when a plan counted them.
    pub planned_tokens: Option<u64>,
    /// A plan's units done and units in all.
    pub units: Option<(u64, u64)>,
}

impl Snapshot {
    /// Useful tokens in all: counted, plus the rows not counted yet at the counted rows' average.
    pub fn total_tokens(&self) -> Option<u64> {
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

    /// The line beside a progress bar: tokens, documents, rate and time left (none until there is a rate).
    pub fn line(&self) -> String {
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
