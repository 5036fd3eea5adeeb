//! Planning a job's writes into Lance, on any machine and with no GPU (`pipeline plan`): check each write's
//! ids as the run does, count its tokens exactly as the run will (same tokenizer, prefix, limit and side),
//! order its rows longest first with the ordering stage's own nodes (DataFusion's sort, spilling under
//! `datafusion.runtime.memory_limit`), cut them into work units, and keep all of it in the plan directory
//! `<output>.plan/`: `plan.json`, the work list and a picture of the histogram. Also what a run, a probe
//! and a trial need of a plan: the job's writes walked in order ([`JobWrites`]), a plan's sources checked.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::datatypes::{Schema, UInt32Type};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::{DdlStatement, Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::sorts::sort::SortExec;
use futures::StreamExt;

use super::image_plan::{IMAGES_FILE, ImagePlan};
use crate::campaign::Fingerprint;
use crate::campaign::metrics::RunMetrics;
use crate::campaign::work_plan::{
    HISTOGRAM_FILE, Histogram, LanceSnapshot, PLAN_FILE, SourceFile, SourceSnapshot, Totals, UNIT_COLUMN, UnitCutter,
    WORK_LIST_FILE, WorkPlan,
};
use crate::error::{Error, Result};
use crate::exec::TokenCountExec;
use crate::exec::length_order::{DROPPED_TOKENS, TOKEN_COUNT, longest_first};
use crate::lance::sink::fingerprint_of_columns;
use crate::lance::target::{WriteTarget, dataset_exists, write_target};
use crate::lance::{LanceTable, dataset_uri};
use crate::model::{CallSettings, TruncationSide};
use crate::ops::script::{Statement, parse_all};
use crate::options::EmbedOptions;
use crate::session::EmbedSession;

/// Useful tokens a work unit holds at most, unless `--units` or `--unit-tokens` says otherwise.
pub const DEFAULT_UNIT_TOKENS: u64 = 1_000_000;

/// How big the work units are.
#[derive(Debug, Clone, Copy)]
pub enum UnitSize {
    /// About this many units in all.
    Count(u64),
    /// About this many useful tokens each (see [`UnitCutter`]).
    Tokens(u64),
}

/// A write's plan: a text write's work plan, or an image write's headers counted.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Planned {
    Texts(Box<WorkPlan>),
    Images(Box<ImagePlan>),
}

impl Planned {
    /// A text write's work plan (none for an image write).
    pub fn texts(&self) -> Option<&WorkPlan> {
        match self {
            Self::Texts(p) => Some(p),
            Self::Images(_) => None,
        }
    }
}

/// Plan every write into Lance of the job file: each plan, and the directory it was written to.
pub async fn plan_job(file: &Path, vars: &BTreeMap<String, String>, size: UnitSize) -> Result<Vec<(Planned, PathBuf)>> {
    plan_job_for(file, vars, size, None).await
}

/// [`plan_job`] for the run on `device` (`pipeline plan --device`; a SET of `embed.device` in the job wins), on
/// any machine: a plan for a GPU holds the model the GPU will use, without one here.
pub async fn plan_job_for(
    file: &Path,
    vars: &BTreeMap<String, String>,
    size: UnitSize,
    device: Option<&str>,
) -> Result<Vec<(Planned, PathBuf)>> {
    let (session, statements) = load_job(file, vars)?;
    if let Some(device) = device {
        set_option(&session, "device", device).await?;
    }
    let mut writes = JobWrites::new(file, &session, &statements);
    let mut plans = Vec::new();
    while let Some((stmt, plan, target)) = writes.next().await? {
        if !crate::uri::is_local(&target.uri) {
            let e = format!(
                "plans are kept beside a local output, and {} is not one; plan with a local output path, or run \
                 without a plan",
                target.uri
            );
            return Err(writes.fail(stmt, &e));
        }
        let dir = plan_dir(&target.uri);
        let set_back = off_the_device(&session).await.map_err(|e| writes.fail(stmt, &e.chain_text()))?;
        let made = if calls_embed_image(&plan) {
            plan_image_write(&session, &target, &dir).await.map(|p| (Planned::Images(Box::new(p)), dir.clone()))
        } else {
            make_plan(&session, &plan, &target, size, &dir).await.map(|(p, d)| (Planned::Texts(Box::new(p)), d))
        };
        for (key, value) in set_back {
            set_option(&session, key, &value).await?;
        }
        plans.push(made.map_err(|e| writes.fail(stmt, &e.chain_text()))?);
    }
    if plans.is_empty() {
        return Err(Error::Refused(format!(
            "{} writes nothing into Lance (COPY … STORED AS LANCE, INSERT INTO a Lance table): nothing to plan",
            file.display()
        )));
    }
    Ok(plans)
}

/// Plan an image write into `dir`: its images' headers counted (see [`super::image_plan`]).
async fn plan_image_write(session: &EmbedSession, target: &WriteTarget, dir: &Path) -> Result<ImagePlan> {
    let options = EmbedOptions::from_config(session.context().state().config_options());
    let Some(inputs) = embedded_input(&target.input, &options.id_column) else {
        return Err(Error::Refused(format!(
            "the write into {} is not one SELECT with embed_image() in its columns (a UNION of several, say), so its \
             images cannot be read beside their ids ({}); run it without a plan",
            target.uri, options.id_column
        )));
    };
    let fingerprint = fingerprint_of_columns(target.input.schema().as_arrow())?
        .ok_or_else(|| Error::Refused(format!("the write into {} has no fingerprinted column", target.uri)))?;
    refuse_other_folder(dir)?;
    super::image_plan::plan_images(session, inputs, target, fingerprint, dir).await
}

/// `SET embed.<key> = '<value>'` in `session`.
async fn set_option(session: &EmbedSession, key: &str, value: &str) -> Result<()> {
    let sql = format!("SET embed.{key} = '{}'", value.replace('\'', "''"));
    session.context().sql(&sql).await?;
    Ok(())
}

/// A write for a GPU is planned on the CPU with the model the GPU would use (the float16 default where
/// `embed.model` is left at its own): a plan holds no device, and its fingerprint must be the GPU run's. Loading
/// the model for a CUDA session would fail on a machine without one. The settings to put back after.
async fn off_the_device(session: &EmbedSession) -> Result<Vec<(&'static str, String)>> {
    let options = EmbedOptions::from_config(session.context().state().config_options());
    if !matches!(crate::model::Device::parse(&options.device), Some(crate::model::Device::Cuda(_))) {
        return Ok(Vec::new());
    }
    set_option(session, "model", &options.model_dir().display().to_string()).await?;
    set_option(session, "device", "cpu").await?;
    Ok(vec![("model", options.model), ("device", options.device)])
}

/// A job file's statements, with its `${NAME}` variables given their values in `vars` (`--var`), parsed, and a
/// session for them that starts fresh (`embed.restart`): what is prepared covers the whole input, whatever an
/// output already holds (the run skips the ids already there). A variable given and not used is warned about.
pub fn load_job(file: &Path, vars: &BTreeMap<String, String>) -> Result<(EmbedSession, Vec<Statement>)> {
    // As `pipeline run` reads it: refused past MAX_JOB_BYTES (a job of `/dev/zero`), or when it is not UTF-8.
    let opened =
        std::fs::File::open(file).map_err(|e| Error::file(format!("cannot read job file {}", file.display()), e))?;
    let source = file.display().to_string();
    let text = crate::ops::script::read_job(opened, &source).map_err(Error::Refused)?;
    let (statements, unused) = crate::ops::script::job_statements(&source, &text, vars)?;
    if !unused.is_empty() {
        tracing::warn!("--var {} is not used by {source} (no ${{…}} names it)", unused.join(", --var "));
    }
    let statements: Vec<Statement> = statements.into_iter().map(|s| s.stmt).collect();
    let session = EmbedSession::with_options(EmbedOptions { restart: true, ..EmbedOptions::default() })?;
    parse_all(&session.context().state(), &statements).map_err(|(i, e)| {
        Error::Refused(format!(
            "{}: statement {} (line {}) does not parse: {e}",
            file.display(),
            statements[i].index,
            statements[i].line
        ))
    })?;
    Ok((session, statements))
}

/// The statements of a job's set-up, which its walk runs.
const SETUP: [&str; 4] = ["SET", "RESET", "CREATE", "DROP"];

/// Walks a job's statements in order, running its set-up (SET, RESET, CREATE, DROP), skipping its queries
/// (a query may read an output that does not exist before the run), and handing out each write into Lance
/// (COPY, INSERT) as its logical plan, not run.
pub struct JobWrites<'a> {
    file: &'a Path,
    session: &'a EmbedSession,
    statements: &'a [Statement],
    next: usize,
    json_sources: Vec<String>,
    first_source: Option<String>,
    /// Set-up only ([`JobWrites::run_setup`]): writes are skipped unplanned, Lance tables not opened.
    setup_only: bool,
}

impl<'a> JobWrites<'a> {
    pub fn new(file: &'a Path, session: &'a EmbedSession, statements: &'a [Statement]) -> Self {
        Self { file, session, statements, next: 0, json_sources: Vec::new(), first_source: None, setup_only: false }
    }

    /// Run the job's whole set-up and nothing else, for a check on its corpus: its writes are not planned (one
    /// may read an output that a write before it makes) and its Lance tables are not opened (outputs, which may
    /// not exist yet). The first table created over a source that is not Lance (the corpus), if any.
    pub async fn run_setup(mut self) -> Result<Option<String>> {
        self.setup_only = true;
        while self.next().await?.is_some() {}
        Ok(self.first_source)
    }

    /// The next write into Lance, after running the set-up before it.
    pub async fn next(&mut self) -> Result<Option<(&'a Statement, LogicalPlan, WriteTarget)>> {
        let ctx = self.session.context();
        while let Some(stmt) = self.statements.get(self.next) {
            self.next += 1;
            let first_word = stmt.sql.split_whitespace().next().unwrap_or_default().to_ascii_uppercase();
            let kinds: &[&str] = if self.setup_only { &SETUP } else { &["COPY", "INSERT"] };
            if !SETUP.contains(&first_word.as_str()) && !kinds.contains(&first_word.as_str()) {
                continue;
            }
            let plan = ctx.state().create_logical_plan(&stmt.sql).await.map_err(|e| self.fail(stmt, &e))?;
            if let LogicalPlan::Ddl(DdlStatement::CreateExternalTable(c)) = &plan {
                let lance = c.file_type.eq_ignore_ascii_case("lance");
                if lance && (self.setup_only || !dataset_exists(&dataset_uri(&c.location)).await) {
                    // An output the job reads back after writing it: it does not exist before the run.
                    continue;
                }
                if c.file_type.eq_ignore_ascii_case("json") {
                    self.json_sources.push(c.location.clone());
                }
                if !c.file_type.eq_ignore_ascii_case("lance") {
                    self.first_source.get_or_insert_with(|| c.name.to_string());
                }
            }
            if matches!(plan, LogicalPlan::Ddl(_) | LogicalPlan::Statement(_)) {
                ctx.execute_logical_plan(plan).await.map_err(|e| self.fail(stmt, &e))?;
            } else if let Some(target) = write_target(&plan) {
                return Ok(Some((stmt, plan, target)));
            }
        }
        Ok(None)
    }

    /// The first table the set-up run so far created over a source that is not Lance (the corpus).
    pub fn first_source(&self) -> Option<&str> {
        self.first_source.as_deref()
    }

    /// An error of `stmt`, placed as `pipeline run` places it (a JSON error with its file's bad line).
    /// `e` is written in its alternate form `{:#}` (with its causes, for errors that print them so); give a
    /// library error as its [`Error::chain_text`].
    pub fn fail(&self, stmt: &Statement, e: &dyn std::fmt::Display) -> Error {
        let e = crate::error::plain(&stmt.relocate(&format!("{e:#}")));
        let message = format!("{}: {e}", position(self.file, stmt.index, stmt.line, &self.json_sources, &e));
        Error::Statement { message, cause: None }
    }
}

/// Where a statement is, and for a JSON error the first bad line of the job's JSON sources (Arrow's JSON
/// errors say what, not where), as `pipeline run` says it.
fn position(file: &Path, index: usize, line: usize, json_sources: &[String], error: &str) -> String {
    let located = json_sources
        .iter()
        .rev()
        .filter(|_| error.contains("Json error"))
        .find_map(|l| super::json_lines::first_bad_line(l, error))
        .map(|(f, line, why)| format!(" ({} line {line}: {why})", f.display()))
        .unwrap_or_default();
    format!("{}: statement {index} (line {line}){located}", file.display())
}

/// SHA-256 of what a write reads: its query's plan (tables, columns, filters) and its id column. The
/// tables' files are checked apart from it, by [`compare_sources`].
pub fn write_digest(target: &WriteTarget, id_column: &str) -> String {
    let query = format!("{}\nid column: {id_column}", target.input.display_indent_schema());
    crate::campaign::digest::hex_sha256(query.as_bytes())
}

/// SHA-256 of a write and what it reads now: its query and id column ([`write_digest`]) and its sources' files as
/// they are (sizes, times, contents) or Lance versions. Two writes with the same identity and fingerprint write
/// the same rows. `None` when a source cannot be checked (an object store, a table in memory): nothing then says
/// that two writes read the same rows.
pub async fn write_identity(target: &WriteTarget, id_column: &str) -> Result<Option<String>> {
    let sources = snapshot_sources(&target.input).await?;
    if sources.iter().any(|s| s.unchecked.is_some()) {
        return Ok(None);
    }
    let text = format!("{}\n{}", write_digest(target, id_column), serde_json::to_string(&sources)?);
    Ok(Some(crate::campaign::digest::hex_sha256(text.as_bytes())))
}

/// The plan directory of an output.
pub fn plan_dir(output: &str) -> PathBuf {
    PathBuf::from(format!("{}.plan", output.trim_end_matches('/')))
}

/// The plan in `dir` when it is this write's (same query, fingerprint and sources unchanged), or `None`.
pub async fn current_plan(dir: &Path, target: &WriteTarget, options: &EmbedOptions) -> Result<Option<WorkPlan>> {
    let Ok((plan, _)) = WorkPlan::read(dir) else { return Ok(None) };
    let fingerprint = fingerprint_of_columns(target.input.schema().as_arrow())?;
    let same_settings = fingerprint.is_some_and(|f| plan.fingerprint.differences(&f).is_empty());
    if !same_settings
        || plan.write_digest != write_digest(target, &options.id_column)
        || !source_changes(&plan).await.is_empty()
    {
        return Ok(None);
    }
    Ok(Some(plan))
}

/// Plan one write into the plan directory `dir` (replacing what is there).
pub async fn make_plan(
    session: &EmbedSession,
    write: &LogicalPlan,
    target: &WriteTarget,
    size: UnitSize,
    dir: &Path,
) -> Result<(WorkPlan, PathBuf)> {
    let state = session.context().state();
    let options = EmbedOptions::from_config(state.config_options());
    let column = &options.id_column;
    let fingerprint = plannable(&options, target)?;
    let sources = snapshot_sources(&target.input).await?;

    // The run's own ordering nodes, found in the write's physical plan, counting truncation too.
    let (input, text) = counting_input(session, write, target).await?;
    let counted = Arc::new(RunMetrics::default());
    let counter = TokenCountExec::try_new(input, Arc::clone(&text), options.clone())?
        .with_run_metrics(Some(Arc::clone(&counted)))
        .with_dropped_tokens();
    let counter: Arc<dyn ExecutionPlan> = Arc::new(counter);
    let sorted = SortExec::new(longest_first(&counter.schema())?, Arc::clone(&counter));
    let mut stream = sorted.execute(0, state.task_ctx())?;

    let (settings, _) = crate::campaign::Fingerprint::for_options(&options)?;
    let dir = dir.to_path_buf();
    let staging = PathBuf::from(format!("{}.tmp-{}", dir.display(), std::process::id()));
    refuse_other_folder(&dir)?;
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| Error::file(format!("cannot create {}", staging.display()), e))?;
    // A plan refused half-way (or stopped) leaves nothing behind.
    let _cleanup = RemoveOnDrop(staging.clone());
    let mut totals = Totals { max_tokens: settings.max_tokens as u64, ..Totals::default() };
    let mut histogram = Histogram::new(totals.max_tokens);
    let mut cutter: Option<UnitCutter> = None;
    let mut writer: Option<ArrowWriter<File>> = None;
    let id_index = counter.schema().index_of(column)?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        // Every row is counted before the sort gives its first: the total is known here.
        let cutter = cutter.get_or_insert_with(|| {
            UnitCutter::new(match size {
                UnitSize::Tokens(t) => t,
                UnitSize::Count(n) => counted.counted().1.div_ceil(n.max(1)),
            })
        });
        let units = count_batch(&batch, &text, &settings, id_index, (column, &mut totals, &mut histogram), cutter)?;
        let row = work_list_rows(&batch, units)?;
        let writer = match &mut writer {
            Some(w) => w,
            None => {
                writer.insert(ArrowWriter::try_new(File::create(staging.join(WORK_LIST_FILE))?, row.schema(), None)?)
            }
        };
        writer.write(&row)?;
    }
    match writer {
        Some(w) if totals.rows > 0 => {
            w.close()?;
        }
        _ => return Err(no_rows(&target.uri, "planned")),
    }
    histogram.finish(&totals);
    let plan = WorkPlan {
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        output: target.uri.clone(),
        fingerprint,
        write_digest: write_digest(target, column),
        sources,
        totals,
        unit_tokens: cutter.as_ref().map_or(0, |c| c.unit_tokens()),
        units: cutter.map(|c| c.units).unwrap_or_default(),
        histogram,
    };
    publish(&plan, &staging, &dir).await?;
    Ok((plan, dir))
}

/// The refusal of a write into `uri` whose query gives no rows: nothing was `done` (planned, written).
pub(crate) fn no_rows(uri: &str, done: &str) -> Error {
    Error::Refused(format!(
        "the write into {uri} has no rows: its query gives none (an empty corpus, or a filter that keeps no row), so \
         nothing was {done}; check the corpus's location and the query"
    ))
}

/// The write refused when it cannot be planned (another order, an output not on this disk, a query shape
/// whose rows cannot be listed ahead, no embed() column); else the fingerprint of its embed() column.
fn plannable(options: &EmbedOptions, target: &WriteTarget) -> Result<Fingerprint> {
    if !options.order.eq_ignore_ascii_case("length") {
        return Err(Error::Refused(format!(
            "a plan orders the rows by length; remove SET embed.order = '{}'",
            options.order
        )));
    }
    if target.uri.contains("://") {
        return Err(Error::Refused(format!(
            "a plan is kept beside its output, and {} is not on this machine's disk",
            target.uri
        )));
    }
    let column = &options.id_column;
    if let Some(why) = crate::exec::resume::unplannable(&target.input, column)? {
        return Err(Error::Refused(format!(
            "the write into {} cannot be planned: {why}. Run it without a plan (pipeline run --no-plan), or write \
             each embed() to its own output",
            target.uri
        )));
    }
    // The write's planning (counting_input, below) refuses NULL and repeated ids, as a run's does.
    fingerprint_of_columns(target.input.schema().as_arrow())?.ok_or_else(|| {
        Error::Refused(format!("the write into {} has no embed() column: there is nothing to plan", target.uri))
    })
}

/// Count one batch of the ordered input into `totals` and `histogram`, and cut its rows into units: each
/// row's unit. Under truncation 'error', a text past the limit is refused, by its id.
fn count_batch(
    batch: &RecordBatch,
    text: &Arc<dyn PhysicalExpr>,
    settings: &CallSettings,
    id_index: usize,
    (column, totals, histogram): (&str, &mut Totals, &mut Histogram),
    cutter: &mut UnitCutter,
) -> Result<Vec<u32>> {
    let texts = text.evaluate(batch)?.into_array(batch.num_rows())?;
    let kept = batch.column_by_name(TOKEN_COUNT).expect("counted").as_primitive::<UInt32Type>().clone();
    let cut = batch.column_by_name(DROPPED_TOKENS).expect("counted").as_primitive::<UInt32Type>().clone();
    let mut units = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        let (k, d) = (u64::from(kept.value(row)), u64::from(cut.value(row)));
        // Under truncation 'error' nothing is cut: the count is the whole text, the excess beside it.
        let whole = if settings.truncation == TruncationSide::Error { k } else { k + d };
        totals.rows += 1;
        if texts.is_null(row) {
            totals.null_texts += 1;
        } else {
            if d > 0 && settings.truncation == TruncationSide::Error {
                let id = datafusion::arrow::util::display::array_value_to_string(batch.column(id_index), row)?;
                return Err(Error::Refused(format!(
                    "the text of {column} {id} has {} tokens, above embed.max_tokens = {}, and embed.truncation \
                     is 'error'. Shorten it, raise embed.max_tokens, or SET embed.truncation = 'right'",
                    whole, totals.max_tokens
                )));
            }
            totals.documents += 1;
            totals.useful_tokens += k;
            totals.tokens_before_truncation += whole;
            totals.truncated_documents += u64::from(d > 0);
            totals.dropped_tokens += d;
            histogram.add(whole);
        }
        units.push(cutter.push(kept.value(row)));
    }
    Ok(units)
}

/// Write the plan's file and picture into `staging`, then move it into `dir` in place of an older plan.
async fn publish(plan: &WorkPlan, staging: &Path, dir: &Path) -> Result<()> {
    std::fs::write(staging.join(PLAN_FILE), serde_json::to_string_pretty(&plan)?)?;
    let h = &plan.histogram;
    let caption = super::histogram::caption(h, &plan.totals);
    super::histogram::histogram_svg(&staging.join(HISTOGRAM_FILE), h.bin_width, &h.bins, h.limit, &caption)
        .map_err(Error::Refused)?;
    if dir.exists() {
        let old = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        match kept_for(&plan.output, dir).await {
            Some(kept) => {
                let _ = std::fs::remove_dir_all(&kept);
                std::fs::rename(dir, &kept)
            }
            None => std::fs::remove_dir_all(dir),
        }
        .map_err(|e| Error::file(format!("cannot replace the old plan {}", old.display()), e))?;
    }
    std::fs::rename(staging, dir)
        .map_err(|e| Error::file(format!("cannot move the plan into {}", dir.display()), e))?;
    Ok(())
}

/// Where the plan in `dir` is to be kept when a new one replaces it: a version of `output` was made from it
/// (its run record names the plan's digest). None when no version was, or it cannot be read.
async fn kept_for(output: &str, dir: &Path) -> Option<PathBuf> {
    let (_, digest) = WorkPlan::read(dir).ok()?;
    let ds = crate::lance::target::open_existing(output).await.ok()??;
    let made = |r: &crate::campaign::RunRecord| r.plan.as_ref().is_some_and(|p| p.digest == digest);
    crate::lance::records::newest_run_record(&ds, ds.version().version, made).await.ok()??;
    Some(crate::campaign::work_plan::kept_plan_dir(dir, &digest))
}

/// What the ordering stage of a write counts: its input rows, and the text (an expression over them), as
/// found in the write's own physical plan.
pub async fn counting_input(
    session: &EmbedSession,
    write: &LogicalPlan,
    target: &WriteTarget,
) -> Result<(Arc<dyn ExecutionPlan>, Arc<dyn datafusion::physical_expr::PhysicalExpr>)> {
    let physical = session.context().state().create_physical_plan(write).await?;
    let mut found = None;
    physical.apply(|node| {
        if let Some(counter) = node.as_ref().downcast_ref::<TokenCountExec>() {
            found = Some((Arc::clone(counter.input()), Arc::clone(counter.text())));
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    found.ok_or_else(|| match calls_embed_image(write) {
        true => Error::Refused(format!(
            "the write into {} embeds images (embed_image): it has no texts to count or order",
            target.uri
        )),
        false => Error::Refused(format!("the write into {} has no embed(text) to order", target.uri)),
    })
}

/// The write's ids and texts: its query with `embed(text)` (or `embed_image(image)`) replaced by `text` (or
/// `image`), the id first, where the query is one projection holding the call.
pub fn embedded_input(input: &LogicalPlan, id_column: &str) -> Option<LogicalPlan> {
    let LogicalPlan::Projection(p) = input else { return None };
    let (mut id, mut text) = (None, None);
    let id_column = p.schema.fields().iter().position(|f| f.name() == id_column);
    for (i, e) in p.expr.iter().enumerate() {
        let e = e.clone().unalias();
        if Some(i) == id_column {
            id = Some(e.clone());
        }
        if let Expr::ScalarFunction(f) = &e
            && matches!(f.name(), "embed" | "embed_image")
        {
            text = f.args.first().cloned();
        }
    }
    LogicalPlanBuilder::from(p.input.as_ref().clone())
        .project(vec![id?.alias("__verify_id"), text?.alias("__verify_text")])
        .ok()?
        .build()
        .ok()
}

/// Whether any expression of `plan` calls `embed_image()`.
pub fn calls_embed_image(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply_with_subqueries(|node| {
        for e in node.expressions() {
            let _ = e.apply(|x| {
                if let datafusion::logical_expr::Expr::ScalarFunction(f) = x
                    && f.name() == "embed_image"
                {
                    found = true;
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            });
        }
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    found
}

/// Refuse to replace `dir` unless it holds a plan, or nothing: a folder of someone else's files that happens to
/// have the plan's name is never deleted.
fn refuse_other_folder(dir: &Path) -> Result<()> {
    if !dir.exists() || dir.join(PLAN_FILE).is_file() || dir.join(IMAGES_FILE).is_file() {
        return Ok(());
    }
    let empty = std::fs::read_dir(dir).map(|mut d| d.next().is_none()).unwrap_or(false);
    if !empty {
        return Err(Error::Refused(format!(
            "{} exists and holds no plan ({PLAN_FILE} or {IMAGES_FILE}), so it is not replaced by one (a plan is kept in \
             <output>.plan/ beside its output); move that folder away, or write to another output",
            dir.display()
        )));
    }
    Ok(())
}

/// Removes a directory when dropped, if it is still there.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A sorted batch as work-list rows: the write's input columns, the token count, and the unit.
fn work_list_rows(batch: &RecordBatch, units: Vec<u32>) -> Result<RecordBatch> {
    let schema = batch.schema();
    let keep: Vec<usize> = (0..schema.fields().len()).filter(|i| schema.field(*i).name() != DROPPED_TOKENS).collect();
    let kept = batch.project(&keep)?;
    let mut fields: Vec<_> = kept.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(datafusion::arrow::datatypes::Field::new(
        UNIT_COLUMN,
        datafusion::arrow::datatypes::DataType::UInt32,
        false,
    )));
    let mut columns = kept.columns().to_vec();
    columns.push(Arc::new(UInt32Array::from(units)));
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

/// What each source table of the write is now: its files' sizes, times and digests, or its Lance version.
pub async fn snapshot_sources(input: &LogicalPlan) -> Result<Vec<SourceSnapshot>> {
    let mut scans = Vec::new();
    input.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            scans.push((scan.table_name.to_string(), Arc::clone(&scan.source)));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut snapshots = Vec::new();
    for (table, source) in scans {
        let mut snapshot = SourceSnapshot {
            table,
            locations: Vec::new(),
            file_extension: String::new(),
            files: Vec::new(),
            lance: None,
            unchecked: None,
        };
        let provider = source_as_provider(&source)?;
        if let Some(lance) = provider.as_ref().downcast_ref::<LanceTable>() {
            let ds = crate::lance::open_dataset(lance.uri()).await?;
            snapshot.lance = Some(LanceSnapshot { uri: lance.uri().to_string(), version: ds.version().version });
        } else if let Some(listing) = provider.as_ref().downcast_ref::<ListingTable>() {
            snapshot.file_extension = listing.options().file_extension.clone();
            for url in listing.table_paths() {
                // The URL's path is percent-encoded (`my%20corpus`): the file system's is not.
                let local = match url.scheme() {
                    "file" => url.get_url().to_file_path().ok(),
                    _ => None,
                };
                let Some(path) = local else {
                    snapshot.unchecked = Some(format!("{url} is not on this machine's disk"));
                    continue;
                };
                snapshot.locations.push(path.display().to_string());
                snapshot.files.extend(files_of(&path, &snapshot.file_extension)?);
            }
        } else {
            snapshot.unchecked = Some("not a file or Lance table".into());
        }
        snapshots.push(snapshot);
    }
    Ok(snapshots)
}

/// What changed in a plan's sources since it was made (its tables' locations as they are now), a line
/// each; empty when nothing did.
pub async fn source_changes(plan: &WorkPlan) -> Vec<String> {
    let mut now = Vec::new();
    for source in &plan.sources {
        now.push(current(source).await);
    }
    compare_sources(&plan.sources, &now)
}

/// A planned source as it is now, at the same locations.
async fn current(planned: &SourceSnapshot) -> SourceSnapshot {
    let mut now = SourceSnapshot { files: Vec::new(), lance: None, ..planned.clone() };
    if let Some(lance) = &planned.lance {
        match crate::lance::open_dataset(&lance.uri).await {
            Ok(ds) => now.lance = Some(LanceSnapshot { uri: lance.uri.clone(), version: ds.version().version }),
            Err(e) => {
                now.unchecked = Some(format!("{} cannot be opened: {}", lance.uri, crate::error::plain(&e.to_string())))
            }
        }
    }
    for location in &planned.locations {
        if Path::new(location).exists() {
            now.files.extend(files_of(Path::new(location), &planned.file_extension).unwrap_or_default());
        }
    }
    now
}

/// How the sources as planned differ from the sources `now`, a line each (file added, removed, resized,
/// content differs; Lance version moved; table not read any more, or new); empty when they do not.
/// Files are matched by their path within their table's location, so a corpus copied to another
/// machine's folder is the same corpus.
pub fn compare_sources(planned: &[SourceSnapshot], now: &[SourceSnapshot]) -> Vec<String> {
    let mut changes = Vec::new();
    for p in planned {
        let table = &p.table;
        let Some(n) = now.iter().find(|n| n.table == p.table) else {
            changes.push(format!("table {table}: planned, but the write does not read it now"));
            continue;
        };
        match (&p.lance, &n.lance) {
            (Some(a), Some(b)) if a.version != b.version => changes.push(format!(
                "table {table}: {} is at version {}, planned at version {}",
                b.uri, b.version, a.version
            )),
            (Some(a), None) => {
                let why = n.unchecked.clone().unwrap_or_else(|| "is not a Lance table now".into());
                changes.push(format!("table {table}: planned as Lance {}, but {why}", a.uri));
            }
            (None, Some(b)) => changes.push(format!("table {table}: is Lance {} now, planned as files", b.uri)),
            _ => {}
        }
        let now_files: Vec<(String, &SourceFile)> = n.files.iter().map(|f| (file_key(n, &f.path), f)).collect();
        for file in &p.files {
            let key = file_key(p, &file.path);
            match now_files.iter().find(|(k, _)| *k == key).map(|(_, f)| f) {
                None => changes.push(format!("table {table}: {} was removed", file.path)),
                Some(f) if f.bytes != file.bytes => changes
                    .push(format!("table {table}: {} has {} bytes, planned with {}", f.path, f.bytes, file.bytes)),
                Some(f) if f.sha256 != file.sha256 => {
                    changes.push(format!("table {table}: {} has other content (its SHA-256 differs)", f.path))
                }
                Some(_) => {}
            }
        }
        for (key, f) in &now_files {
            if p.files.iter().all(|pf| file_key(p, &pf.path) != *key) {
                changes.push(format!("table {table}: {} was added", f.path));
            }
        }
    }
    for n in now.iter().filter(|n| planned.iter().all(|p| p.table != n.table)) {
        changes.push(format!("table {}: read by the write, but not in the plan", n.table));
    }
    changes
}

/// A file's path within its table's location: its name for a location that is the file itself.
fn file_key(source: &SourceSnapshot, path: &str) -> String {
    for location in &source.locations {
        if path == location {
            return Path::new(path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        }
        if let Some(rest) = path.strip_prefix(location.as_str()) {
            return rest.trim_start_matches('/').to_string();
        }
    }
    path.to_string()
}

/// The files of a table path (a file, or a folder read recursively for files ending in `extension`), sorted.
fn files_of(path: &Path, extension: &str) -> Result<Vec<SourceFile>> {
    let mut paths = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for entry in std::fs::read_dir(&p).map_err(|e| Error::file(format!("cannot list {}", p.display()), e))? {
                stack.push(entry?.path());
            }
        } else if p == path || p.to_string_lossy().ends_with(extension) {
            paths.push(p);
        }
    }
    paths.sort();
    paths.iter().map(|p| source_file(p)).collect()
}

/// One file's size, modification time and digest.
pub fn source_file(path: &Path) -> Result<SourceFile> {
    let meta = std::fs::metadata(path).map_err(|e| Error::file(format!("cannot read {}", path.display()), e))?;
    let modified = meta.modified()?.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let sha256 = crate::campaign::fingerprint::sha256_file(path)?;
    Ok(SourceFile { path: path.display().to_string(), bytes: meta.len(), modified, sha256 })
}
