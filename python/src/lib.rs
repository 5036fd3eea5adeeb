//! `embedding_pipeline._native`: the Python package's bridge to the library the `pipeline` command runs on.
//! Every operation is the library's own (`ops::run_job`, `ops::plan`, `ops::trial`, `ops::verify`,
//! `ops::embed`); this crate only converts arguments, hands results to pyarrow through the Arrow C data
//! interface (no copy), and turns ctrl-C in Python into the stop that SIGINT asks of the command.
//!
//! Each call runs on a Tokio runtime of its own threads while the calling Python thread waits without the GIL,
//! waking every 100 ms to pass notes and progress to the package's Python side and to see whether ctrl-C was
//! pressed.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arrow::array::{Array, FixedSizeListArray, Float32Array, RecordBatch, RecordBatchIterator};
use arrow::datatypes::{DataType, Field, SchemaRef};
use arrow::ffi_stream::FFI_ArrowArrayStream;
use embedding_pipeline::ops::run::{RunOptions, RunReport, WriteProgress};
use embedding_pipeline::ops::script::{
    JobStatement, check_sets_against_job, is_setting_name, is_var_name, job_statements, read_job,
};
use embedding_pipeline::ops::{Reporter, WorkPlanChoice};
use embedding_pipeline::process::interrupt::StopToken;
use embedding_pipeline::{EmbedOptions, EmbedSession, Error};
use pyo3::exceptions::{PyException, PyKeyboardInterrupt};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};

pyo3::create_exception!(
    embedding_pipeline._native,
    PipelineError,
    PyException,
    "An operation of the pipeline refused its input or failed; the message says what and what to do."
);

/// How often a waiting call wakes to show progress and look for ctrl-C.
const TICK: Duration = Duration::from_millis(100);

/// The runtime every call runs on (made at the first call), and the process that made it: a child made by
/// fork() has none of its threads, so a call there is refused rather than left waiting forever.
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<(u32, std::io::Result<tokio::runtime::Runtime>)> = OnceLock::new();
    let (made_by, made) =
        RUNTIME.get_or_init(|| (std::process::id(), tokio::runtime::Builder::new_multi_thread().enable_all().build()));
    if *made_by != std::process::id() {
        return Err(PipelineError::new_err(
            "this process was forked from one that had used embedding_pipeline, and its threads do not survive a \
             fork; start worker processes with multiprocessing's \"spawn\" or \"forkserver\" method, or import and \
             use the package only in the workers",
        ));
    }
    match made {
        Ok(rt) => Ok(rt),
        Err(e) => Err(PipelineError::new_err(format!("cannot start the pipeline's threads: {e}"))),
    }
}

fn py_err(e: &Error) -> PyErr {
    PipelineError::new_err(e.chain_text())
}

/// What a running call tells its Python caller, kept until the waiting thread passes it on: notes, warnings,
/// the write in progress, and the last query's result (for `sql`).
#[derive(Default)]
struct Collector {
    /// Whether query results are kept (`sql`) or read and dropped (`run`).
    keep_results: bool,
    events: Mutex<Vec<Event>>,
    progress: Mutex<Option<WriteProgress>>,
    current: Mutex<Vec<RecordBatch>>,
    result: Mutex<Option<(SchemaRef, Vec<RecordBatch>)>>,
}

enum Event {
    Note(String),
    Warning(String),
    WriteStarted,
    WriteFinished,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Reporter for Collector {
    fn note(&self, line: &str) {
        lock(&self.events).push(Event::Note(line.to_string()));
    }

    fn warning(&self, line: &str) {
        lock(&self.events).push(Event::Warning(line.to_string()));
    }

    fn write_started(&self, progress: WriteProgress) {
        *lock(&self.progress) = Some(progress);
        lock(&self.events).push(Event::WriteStarted);
    }

    fn write_finished(&self) {
        *lock(&self.progress) = None;
        lock(&self.events).push(Event::WriteFinished);
    }

    fn query_rows(&self, batch: &RecordBatch) -> embedding_pipeline::Result<ControlFlow<()>> {
        if self.keep_results {
            lock(&self.current).push(batch.clone());
        }
        Ok(ControlFlow::Continue(()))
    }

    fn query_finished(&self, schema: &SchemaRef) -> embedding_pipeline::Result<()> {
        let batches = std::mem::take(&mut *lock(&self.current));
        if self.keep_results {
            *lock(&self.result) = Some((schema.clone(), batches));
        }
        Ok(())
    }
}

impl Collector {
    /// Pass what happened since the last tick to `on_event(kind, value)`: ("note" | "warning", line),
    /// ("write_started" | "write_finished", None), ("progress", dict of the write's snapshot).
    fn tick(&self, py: Python<'_>, on_event: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let Some(on_event) = on_event else {
            lock(&self.events).clear();
            return Ok(());
        };
        let events = std::mem::take(&mut *lock(&self.events));
        // Every event is delivered even when one raises (ctrl-C inside the caller's code): the first error is
        // returned after them, so a bar is still closed and no warning is lost.
        let mut first: Option<PyErr> = None;
        for event in events {
            let called = match event {
                Event::Note(line) => on_event.call1(("note", line)),
                Event::Warning(line) => on_event.call1(("warning", line)),
                Event::WriteStarted => on_event.call1(("write_started", py.None())),
                Event::WriteFinished => on_event.call1(("write_finished", py.None())),
            };
            if let Err(e) = called {
                first.get_or_insert(e);
            }
        }
        if let Some(e) = first {
            return Err(e);
        }
        let snapshot = lock(&self.progress).as_ref().map(WriteProgress::snapshot);
        if let Some(s) = snapshot {
            let value = serde_json::json!({
                "documents": s.docs,
                "documents_total": s.todo,
                "useful_tokens": s.tokens,
                "useful_tokens_total": s.total_tokens(),
                "seconds": s.seconds,
                "line": s.line(),
            });
            on_event.call1(("progress", json_to_py(py, &value)?))?;
        }
        Ok(())
    }
}

/// What ctrl-C does to an operation.
enum OnStop {
    /// Writes commit the rows already embedded and end, as SIGINT makes `pipeline run`'s: the next run resumes
    /// after them.
    Commit,
    /// The operation is dropped where it is (it writes nothing that a stop could leave half-done, as the command
    /// is killed by SIGINT); the text names it in the KeyboardInterrupt.
    Abandon(String),
}

/// The package's request to stop, handed to every call it makes (the library's sessions and operations take one):
/// one for all of them, as a ctrl-C reaches whichever call is running, in any thread.
fn stop_token() -> &'static StopToken {
    static STOP: std::sync::OnceLock<StopToken> = std::sync::OnceLock::new();
    STOP.get_or_init(StopToken::new)
}

/// Calls working now, in any thread of this process. The stop request is the package's ([`stop_token`]): it is
/// cleared when the first call starts and when the last one ends, never under another call, so that a ctrl-C in
/// one thread is not wiped by a call that starts or ends in another.
static WORKING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One working call, from its start to its worker's end (which may be after `wait` returned: see [`wait`]).
struct Working;

impl Working {
    fn start() -> Self {
        if WORKING.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            stop_token().clear();
        }
        Self
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        if WORKING.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            stop_token().clear();
        }
    }
}

/// Run `work` and wait for it, passing events to `on_event` every tick. The first ctrl-C stops it as
/// [`OnStop`] says and waits for that, then raises KeyboardInterrupt with what was kept. A second ctrl-C stops
/// waiting: KeyboardInterrupt at once, while the worker finishes its commit (or its model call) behind it, as
/// the command's second SIGINT exits at once; a commit cut short would be no worse (the next run resumes after
/// the last commit), but nothing is cut here.
fn wait<T, W, F>(
    py: Python<'_>,
    collector: &Collector,
    on_event: Option<&Bound<'_, PyAny>>,
    on_stop: OnStop,
    work: W,
) -> PyResult<T>
where
    T: Send + 'static,
    W: FnOnce() -> F + Send + 'static,
    F: Future<Output = embedding_pipeline::Result<T>>,
{
    let runtime = runtime()?;
    let commits = matches!(on_stop, OnStop::Commit);
    // An operation left to finish by a second ctrl-C is still stopping: a call started now would be stopped
    // by its stop request at once. Wait for it to end (ctrl-C stops waiting).
    let mut told = false;
    while WORKING.load(std::sync::atomic::Ordering::SeqCst) > 0 && stop_token().requested() {
        if !told && let Some(on_event) = on_event {
            let _ = on_event.call1(("warning", "waiting for an interrupted operation to finish its commit"));
            told = true;
        }
        py.detach(|| std::thread::sleep(TICK));
        py.check_signals()?;
    }
    let (tx, rx) = channel();
    let working = Working::start();
    // A thread of its own that blocks on the work: some operations' futures are not Send, so they are made and
    // driven there rather than spawned onto the runtime.
    std::thread::Builder::new()
        .name("embedding-pipeline".into())
        .spawn(move || {
            let result = match on_stop {
                OnStop::Commit => runtime.block_on(work()),
                OnStop::Abandon(what) => runtime.block_on(async {
                    let stopped =
                        || Error::StoppedAt(format!("{what} stopped before its end, as asked; nothing was kept"));
                    tokio::select! {
                        // Whatever ended it, a stop asked for is the answer (its own stop checks say other words).
                        result = work() => if stop_token().requested() { Err(stopped()) } else { result },
                        () = stop_token().stopped() => Err(stopped()),
                    }
                }),
            };
            drop(working);
            let _ = tx.send(result);
        })
        .map_err(|e| PipelineError::new_err(format!("cannot start the pipeline's thread: {e}")))?;
    let rx = Mutex::new(rx);
    // A ctrl-C arrives as KeyboardInterrupt, raised by the signal check or inside the caller's `on_event` (Python
    // code, where Python's own handler raises it); any other error of theirs stops the work too, and is raised
    // once the work has ended, so that nothing keeps running behind the caller's back.
    let mut stops = 0;
    let mut failure: Option<PyErr> = None;
    loop {
        let got = py.detach(|| lock(&rx).recv_timeout(TICK));
        let raised = [py.check_signals().err(), collector.tick(py, on_event).err()];
        for e in raised.into_iter().flatten() {
            stop_token().request();
            if !e.is_instance_of::<PyKeyboardInterrupt>(py) {
                failure.get_or_insert(e);
                continue;
            }
            stops += 1;
            let writing = lock(&collector.progress).is_some();
            if stops >= 2 {
                let what = if commits && writing {
                    "stopped waiting: the rows already embedded are still being committed, behind this; run the same \
                     job again once this process is idle to resume after them"
                } else {
                    "stopped waiting; the operation ends behind this at its next stop check"
                };
                return Err(PyKeyboardInterrupt::new_err(what));
            }
            let note = if commits && writing {
                "stopping: committing the rows already embedded (press ctrl-C again to stop waiting for it)"
            } else {
                "stopping (press ctrl-C again to stop waiting)"
            };
            if let Some(on_event) = on_event {
                let _ = on_event.call1(("warning", note));
            }
        }
        let result = match got {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                Err(Error::Internal("the operation's thread ended without a result".into()))
            }
        };
        // What happened last is shown; a ctrl-C pressed in the meantime is raised, not lost.
        let last = [collector.tick(py, on_event).err(), py.check_signals().err()];
        if let Some(e) = failure.or(last.into_iter().flatten().next()) {
            return Err(e);
        }
        if stops > 0 {
            let what = match &result {
                Ok(_) => "stopped as asked".to_string(),
                Err(e) => e.chain_text(),
            };
            return Err(PyKeyboardInterrupt::new_err(what));
        }
        return result.map_err(|e| py_err(&e));
    }
}

/// A job's statements: `text` named by `source` in messages, `${NAME}` filled from `vars`. Variables given and
/// not used are warned about, as `pipeline run --var` does.
fn statements(
    source: &str,
    text: &str,
    vars: &BTreeMap<String, String>,
    collector: &Collector,
) -> PyResult<Vec<JobStatement>> {
    checked_vars(vars)?;
    let (statements, unused) = job_statements(source, text, vars).map_err(|e| py_err(&e))?;
    if !unused.is_empty() {
        collector.warning(&format!("vars {} not used by the job (no ${{…}} names it)", unused.join(", ")));
    }
    Ok(statements)
}

/// Variables' names as `--var` takes them: a letter or `_`, then letters, digits or `_`.
fn checked_vars(vars: &BTreeMap<String, String>) -> PyResult<()> {
    match vars.keys().find(|k| !is_var_name(k)) {
        Some(bad) => Err(PipelineError::new_err(format!(
            "vars: `{bad}` is not a variable name (a letter or _, then letters, digits or _)"
        ))),
        None => Ok(()),
    }
}

/// Settings' keys as `--set` takes them: `namespace.key`, of letters, digits, `_` and `.`.
fn checked_sets(sets: Vec<(String, String)>) -> PyResult<Vec<(String, String)>> {
    for (key, _) in &sets {
        if !is_setting_name(key) {
            return Err(PipelineError::new_err(format!(
                "sets: `{key}` is not a setting's name; write it as namespace.key, e.g. {{\"embed.batch_tokens\": 8192}}"
            )));
        }
    }
    Ok(sets)
}

/// Read a job file as `pipeline run` reads one: capped in size, UTF-8.
#[pyfunction]
fn read_job_file(path: PathBuf) -> PyResult<String> {
    let file = std::fs::File::open(&path)
        .map_err(|e| PipelineError::new_err(format!("cannot read job file {}: {e}", path.display())))?;
    read_job(file, &path.display().to_string()).map_err(PipelineError::new_err)
}

/// Run a job (its SQL `text`, named `source` in messages) as `pipeline run` does, and return its report as
/// JSON text.
#[pyfunction]
#[pyo3(signature = (source, text, vars=None, sets=None, restart=false, device=None, plan=None, no_plan=false, on_event=None))]
#[allow(clippy::too_many_arguments)]
fn run(
    py: Python<'_>,
    source: String,
    text: String,
    vars: Option<BTreeMap<String, String>>,
    sets: Option<Vec<(String, String)>>,
    restart: bool,
    device: Option<String>,
    plan: Option<PathBuf>,
    no_plan: bool,
    on_event: Option<Bound<'_, PyAny>>,
) -> PyResult<String> {
    let collector = Arc::new(Collector::default());
    let statements = statements(&source, &text, &vars.unwrap_or_default(), &collector)?;
    let sets = checked_sets(sets.unwrap_or_default())?;
    check_sets_against_job(&sets, &statements).map_err(|e| py_err(&e))?;
    let plans = match (plan, no_plan) {
        (Some(_), true) => return Err(PipelineError::new_err("give a plan directory or plan=False, not both")),
        (Some(dir), false) => WorkPlanChoice::Dir(dir),
        (None, true) => WorkPlanChoice::Off,
        (None, false) => WorkPlanChoice::Beside,
    };
    let settings = RunOptions { restart, device, plans, sets, stop: stop_token().clone(), ..RunOptions::default() };
    let reporter = Arc::clone(&collector);
    let report = wait(py, &collector, on_event.as_ref(), OnStop::Commit, move || async move {
        embedding_pipeline::ops::run_job(&statements, &settings, &*reporter).await
    })?;
    Ok(run_report_json(&report).to_string())
}

/// A run's report as the package returns it.
fn run_report_json(r: &RunReport) -> serde_json::Value {
    let e = &r.embedded;
    serde_json::json!({
        "rows_written": r.rows_written(),
        "writes": r.writes.iter().map(|w| serde_json::json!({
            "uri": w.uri,
            "rows": w.rows,
            "version": w.version,
            "seconds": w.elapsed.as_secs_f64(),
            "record": w.record,
        })).collect::<Vec<_>>(),
        "file_writes": r.file_writes.iter().map(|(target, rows)| serde_json::json!({"target": target, "rows": rows}))
            .collect::<Vec<_>>(),
        "documents": e.docs,
        "null_texts": e.nulls,
        "blank_texts": e.blank,
        "useful_tokens": e.useful_tokens,
        "processed_tokens": e.processed_tokens,
        "padding_efficiency": r.padding_efficiency(),
        "truncated_documents": e.truncated_docs,
        "dropped_tokens": e.dropped_tokens,
        "model_calls": e.model_calls,
        "wall_seconds": r.wall_seconds,
        "useful_tokens_per_second": r.useful_tokens_per_second(),
        "tokenize_seconds": e.tokenize_time.as_secs_f64(),
        "model_seconds": e.model_time.as_secs_f64(),
        "first_model_call_seconds": r.first_model_call_seconds,
        "device": r.device,
        "sharing_advice": r.sharing_advice(),
    })
}

/// A SQL session, as `pipeline sql` keeps one: tables created stay for the next call.
#[pyclass(module = "embedding_pipeline._native")]
struct Session {
    session: EmbedSession,
    calls: Mutex<u64>,
}

#[pymethods]
impl Session {
    #[new]
    #[pyo3(signature = (sets=None, device=None))]
    fn new(py: Python<'_>, sets: Option<Vec<(String, String)>>, device: Option<String>) -> PyResult<Self> {
        let settings = RunOptions {
            device,
            sets: checked_sets(sets.unwrap_or_default())?,
            stop: stop_token().clone(),
            ..RunOptions::default()
        };
        let collector = Collector::default();
        let session = wait(py, &collector, None, OnStop::Abandon("starting the session".into()), move || async move {
            embedding_pipeline::ops::run::job_session(&settings).await
        })?;
        Ok(Self { session, calls: Mutex::new(0) })
    }

    /// Run `text`'s statements in this session. Returns the result of the last query (an Arrow stream that
    /// pyarrow reads without copying), or None when no statement returns rows.
    #[pyo3(signature = (text, vars=None, on_event=None))]
    fn sql(
        &self,
        py: Python<'_>,
        text: String,
        vars: Option<BTreeMap<String, String>>,
        on_event: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Option<ArrowStream>> {
        let call = {
            let mut calls = lock(&self.calls);
            *calls += 1;
            *calls
        };
        let collector = Arc::new(Collector { keep_results: true, ..Collector::default() });
        let statements = statements(&format!("sql #{call}"), &text, &vars.unwrap_or_default(), &collector)?;
        let (session, reporter) = (self.session.clone(), Arc::clone(&collector));
        wait(py, &collector, on_event.as_ref(), OnStop::Commit, move || async move {
            let settings = RunOptions::default();
            embedding_pipeline::ops::run::run_in(&session, &statements, &settings, &*reporter).await
        })?;
        let result = lock(&collector.result).take();
        Ok(result.map(|(schema, batches)| ArrowStream { schema, batches: Mutex::new(Some(batches)) }))
    }
}

/// A query's result, handed to pyarrow through the Arrow PyCapsule interface (`__arrow_c_stream__`): its
/// buffers are shared, not copied. It can be read once.
#[pyclass(module = "embedding_pipeline._native")]
struct ArrowStream {
    schema: SchemaRef,
    batches: Mutex<Option<Vec<RecordBatch>>>,
}

#[pymethods]
impl ArrowStream {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // The schema is the result's own; a consumer asking for another casts it itself.
        let _ = requested_schema;
        let batches = lock(&self.batches)
            .take()
            .ok_or_else(|| PipelineError::new_err("this result was already read; run the query again"))?;
        let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), self.schema.clone());
        let stream = FFI_ArrowArrayStream::new(Box::new(reader));
        PyCapsule::new_with_value(py, stream, ARROW_ARRAY_STREAM)
    }

    /// The addresses of the result's data buffers, children's included: a reader that shares them holds the
    /// same (the package's tests check that pyarrow's table does).
    fn buffer_addresses(&self) -> Vec<usize> {
        fn walk(data: &arrow::array::ArrayData, out: &mut Vec<usize>) {
            out.extend(data.buffers().iter().map(|b| b.as_ptr() as usize));
            for child in data.child_data() {
                walk(child, out);
            }
        }
        let mut out = Vec::new();
        for batch in lock(&self.batches).iter().flatten() {
            for column in batch.columns() {
                walk(&column.to_data(), &mut out);
            }
        }
        out
    }
}

const ARROW_ARRAY_STREAM: &CStr = c"arrow_array_stream";
const ARROW_SCHEMA: &CStr = c"arrow_schema";
const ARROW_ARRAY: &CStr = c"arrow_array";

/// Vectors as an Arrow fixed-size list of float32, handed over by `__arrow_c_array__`.
#[pyclass(module = "embedding_pipeline._native")]
struct Vectors {
    array: FixedSizeListArray,
    /// The fingerprint they were made under, as JSON.
    #[pyo3(get)]
    fingerprint: String,
    #[pyo3(get)]
    dim: usize,
}

#[pymethods]
impl Vectors {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = requested_schema;
        let (array, schema) = arrow::ffi::to_ffi(&self.array.to_data())
            .map_err(|e| PipelineError::new_err(format!("cannot export the vectors: {e}")))?;
        let schema = PyCapsule::new_with_value(py, schema, ARROW_SCHEMA)?;
        let array = PyCapsule::new_with_value(py, array, ARROW_ARRAY)?;
        PyTuple::new(py, [schema.into_any(), array.into_any()])
    }
}

/// Embed `texts` as a campaign with the model directory `model` (default: the default model) embeds them.
#[pyfunction]
#[pyo3(signature = (texts, model=None, device=None))]
fn embed(py: Python<'_>, texts: Vec<String>, model: Option<String>, device: Option<String>) -> PyResult<Vectors> {
    let mut options = EmbedOptions::default();
    if let Some(model) = model {
        options = options.with_model(model);
    }
    if let Some(device) = device {
        options.device = device;
    }
    let collector = Collector::default();
    let embedded = wait(py, &collector, None, OnStop::Abandon("embed".into()), move || async move {
        embedding_pipeline::ops::embed::embed_texts(texts, &options, stop_token()).await
    })?;
    let dim = embedded.fingerprint.dim;
    let values = Float32Array::from(embedded.vectors);
    let field = Arc::new(Field::new("item", DataType::Float32, false));
    let size = i32::try_from(dim).map_err(|_| PipelineError::new_err(format!("vectors of {dim} values")))?;
    let array = FixedSizeListArray::try_new(field, size, Arc::new(values), None)
        .map_err(|e| PipelineError::new_err(format!("cannot shape the vectors: {e}")))?;
    Ok(Vectors { array, fingerprint: embedded.fingerprint.to_json(), dim })
}

/// Plan every write into Lance of the job file (`pipeline plan`): the plans and where each was written, as
/// JSON text.
#[pyfunction]
#[pyo3(signature = (job, vars=None, units=None, unit_tokens=None, on_event=None))]
fn plan(
    py: Python<'_>,
    job: PathBuf,
    vars: Option<BTreeMap<String, String>>,
    units: Option<u64>,
    unit_tokens: Option<u64>,
    on_event: Option<Bound<'_, PyAny>>,
) -> PyResult<String> {
    use embedding_pipeline::ops::plan::{DEFAULT_UNIT_TOKENS, UnitSize};
    let size = match (units, unit_tokens) {
        (Some(_), Some(_)) => return Err(PipelineError::new_err("give units or unit_tokens, not both")),
        (Some(n), None) => UnitSize::Count(n),
        (None, t) => UnitSize::Tokens(t.unwrap_or(DEFAULT_UNIT_TOKENS)),
    };
    if matches!(size, UnitSize::Count(0) | UnitSize::Tokens(0)) {
        return Err(PipelineError::new_err("units and unit_tokens must be at least 1"));
    }
    let vars = vars.unwrap_or_default();
    checked_vars(&vars)?;
    let what = format!("the plan of {}", job.display());
    let collector = Collector::default();
    let plans = wait(py, &collector, on_event.as_ref(), OnStop::Abandon(what), move || async move {
        embedding_pipeline::ops::plan::plan_job(&job, &vars, size).await
    })?;
    let out: Vec<_> =
        plans.iter().map(|(plan, dir)| serde_json::json!({"dir": dir.display().to_string(), "plan": plan})).collect();
    Ok(serde_json::Value::Array(out).to_string())
}

/// A short trial of the job (`pipeline trial`), saved as the command saves it; its report as JSON text.
#[pyfunction]
#[pyo3(signature = (job, vars=None, minutes=None, sample=None, save=None, reference=None, memory_budget=None, probe=true, name=None, on_event=None))]
#[allow(clippy::too_many_arguments)]
fn trial(
    py: Python<'_>,
    job: PathBuf,
    vars: Option<BTreeMap<String, String>>,
    minutes: Option<f64>,
    sample: Option<u64>,
    save: Option<PathBuf>,
    reference: Option<String>,
    memory_budget: Option<u64>,
    probe: bool,
    name: Option<String>,
    on_event: Option<Bound<'_, PyAny>>,
) -> PyResult<String> {
    use embedding_pipeline::ops::trial::TrialOptions;
    if minutes.is_some() && sample.is_some() {
        return Err(PipelineError::new_err("give minutes or sample, not both"));
    }
    let mut args = TrialOptions::new(job);
    args.vars = vars.unwrap_or_default();
    checked_vars(&args.vars)?;
    if let Some(minutes) = minutes {
        args.minutes = minutes;
    }
    args.sample = sample;
    if let Some(save) = save {
        args.save = save;
    }
    args.reference = reference;
    args.memory_budget = memory_budget;
    args.no_probe = !probe;
    args.name = name;
    let what = format!("the trial of {}", args.file.display());
    let collector = Collector::default();
    let report = wait(py, &collector, on_event.as_ref(), OnStop::Abandon(what), move || async move {
        embedding_pipeline::ops::trial::run_trial(&args).await
    })?;
    serde_json::to_string(&report).map_err(|e| PipelineError::new_err(format!("cannot show the trial: {e}")))
}

/// Verify a dataset (`pipeline verify`), saving the result beside a local dataset as the command does; the
/// report as JSON text.
#[pyfunction]
#[pyo3(signature = (dataset, job=None, vars=None, sample=None, seed=0, min_cosine=None, model=None, device=None, id_column=None, column=None, on_event=None))]
#[allow(clippy::too_many_arguments)]
fn verify(
    py: Python<'_>,
    dataset: String,
    job: Option<PathBuf>,
    vars: Option<BTreeMap<String, String>>,
    sample: Option<u64>,
    seed: u64,
    min_cosine: Option<f64>,
    model: Option<PathBuf>,
    device: Option<String>,
    id_column: Option<String>,
    column: Option<String>,
    on_event: Option<Bound<'_, PyAny>>,
) -> PyResult<String> {
    use embedding_pipeline::ops::verify::VerifyOptions;
    let mut args = VerifyOptions::new(dataset);
    args.stop = stop_token().clone();
    args.job = job;
    args.vars = vars.unwrap_or_default();
    checked_vars(&args.vars)?;
    if let Some(sample) = sample {
        args.sample = sample;
    }
    args.seed = seed;
    if let Some(min_cosine) = min_cosine {
        args.min_cosine = min_cosine;
    }
    args.model = model;
    args.device = device;
    args.id_column = id_column;
    if let Some(column) = column {
        args.column = column;
    }
    let what = format!("verify of {}", args.dataset);
    let collector = Arc::new(Collector::default());
    let reporter = Arc::clone(&collector);
    let report = wait(py, &collector, on_event.as_ref(), OnStop::Abandon(what), move || async move {
        embedding_pipeline::ops::verify::verify(&args, &*reporter).await
    })?;
    if let Err(e) = embedding_pipeline::ops::verify::save(&report)
        && let Some(on_event) = &on_event
    {
        on_event.call1(("warning", e.chain_text()))?;
    }
    serde_json::to_string(&report).map_err(|e| PipelineError::new_err(format!("cannot show the report: {e}")))
}

/// JSON as Python objects (through the json module: reports are small).
fn json_to_py<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (value.to_string(),))
}

/// The versions this package was built with (as `pipeline --version`).
#[pyfunction]
fn versions() -> String {
    embedding_pipeline::ops::devices::versions()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The library's warnings (a damaged model, a deprecated setting) on stderr, as the command prints them;
    // RUST_LOG chooses others. A program that installed its own subscriber keeps it.
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| embedding_pipeline::QUIET_LOGS.into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    m.add("PipelineError", m.py().get_type::<PipelineError>())?;
    m.add_function(wrap_pyfunction!(read_job_file, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(embed, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(trial, m)?)?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(versions, m)?)?;
    m.add_class::<Session>()?;
    m.add_class::<ArrowStream>()?;
    m.add_class::<Vectors>()?;
    Ok(())
}
