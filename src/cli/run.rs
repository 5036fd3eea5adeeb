//! `pipeline run [FILE|-]… [-c SQL]…`: the job's statements in order ([`embedding_pipeline::ops::run`]), each query's
//! result printed, a line per write, a progress bar on a terminal, and a summary of the whole run.

use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Mutex;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;

use super::ExitStatus;
use super::args::{JobArgs, Output, Runtime};
use super::display::{self, ResultStyle, ResultWriter};
use super::job_input::{self, Input, JobStatement};
use super::printer::{ClosedPipeExit, Printer, err, note};
use super::signals::{StopSays, stop_on_signals};
use embedding_pipeline::campaign::DeviceInfo;
use embedding_pipeline::campaign::metrics::{HostShare, usable_cores};
use embedding_pipeline::model::EmbedStats;
use embedding_pipeline::ops::run::{ModelNote, RunReport, WriteProgress};
use embedding_pipeline::ops::{Reporter, RunOptions, WorkPlanChoice};
use embedding_pipeline::process::interrupt::StopToken;

/// `pipeline run`'s arguments. Its job files and `-c` statements arrive apart, in the order given (see
/// [`super::parse`]).
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Job files; `-` is a job on standard input.
    #[arg(value_name = "FILE")]
    files: Vec<PathBuf>,
    /// SQL statements to run (repeatable), in order with the job files.
    #[arg(short = 'c', long = "command", value_name = "SQL")]
    commands: Vec<String>,
    #[command(flatten)]
    settings: JobArgs,
    #[command(flatten)]
    output: Output,
    /// Start every Lance output over: embed all rows again and commit them as a new version that
    /// replaces the rows (older versions stay readable), instead of resuming.
    #[arg(long)]
    restart: bool,
    /// Execute the plan in this directory (made by pipeline plan) instead of the one beside the
    /// output (<output>.plan/, used when it exists).
    #[arg(long, value_name = "DIR", conflicts_with = "no_plan")]
    plan: Option<PathBuf>,
    /// Do not execute a plan, even when <output>.plan/ exists: read and order the input as it is now.
    #[arg(long)]
    no_plan: bool,
    #[command(flatten)]
    runtime: Runtime,
}

/// Run the job's statements in order (`inputs`: its files and `-c` statements, in the order given), and print its
/// summary.
pub async fn run(args: RunArgs, inputs: &[Input], printer: Printer) -> anyhow::Result<ExitStatus> {
    args.runtime.apply();
    let stop = StopToken::new();
    stop_on_signals(StopSays::Committing, printer, stop.clone());
    let plans = match (args.plan, args.no_plan) {
        (Some(dir), _) => WorkPlanChoice::Dir(dir),
        (None, true) => WorkPlanChoice::Off,
        (None, false) => WorkPlanChoice::Beside,
    };
    if inputs.is_empty() {
        anyhow::bail!("give a job file, - for a job on standard input, or -c 'SQL'");
    }
    let (statements, settings) = job(inputs, args.settings, args.output, args.restart, plans, stop, printer)?;
    let printer = settings.printer;
    let reporter = JobDisplay::new(&settings);
    let report = embedding_pipeline::ops::run_job(&statements, &settings.job, &reporter).await?;
    if !printer.quiet() {
        print_summary(&report, printer);
        if let Some(advice) = report.sharing_advice() {
            note!(printer, "shared machine: {advice}");
        }
    }
    Ok(ExitStatus::Success)
}

/// How `pipeline run` and `pipeline sql` run a job and show it.
#[derive(Debug, Clone)]
pub struct CommandSettings {
    pub job: RunOptions,
    /// How query results print.
    pub style: ResultStyle,
    /// The command's printer, its notes where `--format` puts them.
    pub printer: Printer,
}

/// A job's statements, variables filled, and the settings it runs with (`pipeline run` and `pipeline sql`).
pub fn job(
    inputs: &[Input],
    settings: JobArgs,
    output: Output,
    restart: bool,
    plans: WorkPlanChoice,
    stop: StopToken,
    printer: Printer,
) -> anyhow::Result<(Vec<JobStatement>, CommandSettings)> {
    let vars = settings.vars.parse()?;
    let sets = job_input::parse_sets(&settings.sets)?;
    let (statements, unused) = job_input::read_statements(inputs, &vars)?;
    job_input::check_sets_against_job(&sets, &statements)?;
    if !unused.is_empty() {
        err!(printer, "warning: --var {} is not used by the job (no ${{…}} names it)", unused.join(", --var "));
    }
    let style = ResultStyle { format: output.format, max_rows: output.maxrows };
    let job = RunOptions {
        restart,
        device: settings.device,
        plans,
        sets,
        // Read only for a cluster: a keys folder named in the environment does not stop a local run.
        #[cfg(feature = "cluster")]
        cluster_keys: match settings.cluster {
            Some(_) => {
                settings.cluster_keys.as_deref().map(embedding_pipeline::cluster::ClusterKeys::load).transpose()?
            }
            None => None,
        },
        cluster: settings.cluster,
        stop,
    };
    let printer = printer.notes_on_stderr(output.format != display::Format::Table);
    Ok((statements, CommandSettings { job, style, printer }))
}

/// What the command shows of a running job: notes on standard output (stderr under a machine-read format)
/// unless `--quiet`, warnings on stderr, a progress bar on a terminal, query results as `--format` says.
pub struct JobDisplay {
    printer: Printer,
    style: ResultStyle,
    result: Mutex<Option<Shown>>,
    bar: Mutex<Option<Bar>>,
}

/// A query result being printed.
struct Shown {
    writer: ResultWriter<ClosedPipeExit<std::io::Stdout>>,
    rows: usize,
    cut: bool,
}

impl JobDisplay {
    pub fn new(settings: &CommandSettings) -> Self {
        Self { printer: settings.printer, style: settings.style, result: Mutex::new(None), bar: Mutex::new(None) }
    }

    /// The result being shown, made at its first batch.
    fn shown<T>(&self, f: impl FnOnce(&mut Shown) -> T) -> T {
        let mut guard = self.result.lock().unwrap_or_else(|e| e.into_inner());
        f(guard.get_or_insert_with(|| self.new_shown()))
    }

    fn new_shown(&self) -> Shown {
        Shown { writer: ResultWriter::new(self.style.format, self.printer.stdout()), rows: 0, cut: false }
    }
}

impl Reporter for JobDisplay {
    fn note(&self, line: &str) {
        if !self.printer.quiet() {
            note!(self.printer, "{line}");
        }
    }

    fn warning(&self, line: &str) {
        err!(self.printer, "warning: {line}");
    }

    fn write_started(&self, progress: WriteProgress) {
        if !self.printer.quiet() && std::io::stderr().is_terminal() {
            *self.bar.lock().unwrap_or_else(|e| e.into_inner()) = Some(Bar::start(progress));
        }
    }

    fn write_finished(&self) {
        self.bar.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn query_rows(&self, batch: &RecordBatch) -> embedding_pipeline::Result<ControlFlow<()>> {
        let max = self.style.max_rows.0;
        self.shown(|shown| {
            let take = max.map_or(batch.num_rows(), |max| batch.num_rows().min(max - shown.rows));
            shown.rows += take;
            shown.writer.write(&batch.slice(0, take))?;
            shown.cut = max.is_some_and(|max| shown.rows >= max);
            Ok(if shown.cut { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
        })
    }

    fn query_finished(&self, schema: &SchemaRef) -> embedding_pipeline::Result<()> {
        // A result with no rows had no batch to make its writer: made here, to print the column names.
        let shown = self.result.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_else(|| self.new_shown());
        shown.writer.finish(schema)?;
        if shown.cut {
            // On stderr under the machine-read formats, which keep stdout for results.
            note!(
                self.printer,
                "(showing the first {} rows; add a LIMIT, give --maxrows N or inf, or COPY the result to a file)",
                shown.rows
            );
        }
        Ok(())
    }
}

/// A progress bar on stderr while a write runs (see [`WriteProgress`]).
struct Bar {
    bar: indicatif::ProgressBar,
    ticker: tokio::task::JoinHandle<()>,
}

impl Bar {
    fn start(progress: WriteProgress) -> Self {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        let style = indicatif::ProgressStyle::with_template("{bar:30} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        let ticking = bar.clone();
        let ticker = tokio::spawn(async move {
            loop {
                let now = progress.snapshot();
                match (now.total_tokens(), now.todo) {
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

impl Drop for Bar {
    fn drop(&mut self) {
        self.ticker.abort();
        self.bar.finish_and_clear();
    }
}

/// Say how busy the model was over `wall` seconds, whether the host set the pace and, on a GPU, how many cores would
/// keep it busy; nothing without model calls.
fn note_model_busy(e: &EmbedStats, wall: f64, device: Option<&DeviceInfo>, printer: Printer) {
    let on_gpu = device.is_some_and(|d| d.cuda.is_some());
    let wall = std::time::Duration::from_secs_f64(wall.max(0.0));
    if let Some(share) = HostShare::new(e, wall, usable_cores(), on_gpu) {
        note!(printer, "{}", share.describe());
    }
}

/// The run's summary: rows written, tokens useful and processed, time, model and device.
fn print_summary(r: &RunReport, printer: Printer) {
    let wall = r.wall_seconds;
    let e = &r.embedded;
    let write_seconds = r.writes.iter().map(|w| w.record.write_seconds).fold(0.0, |a, b| a + b);
    let mut outputs: Vec<String> =
        r.writes.last().map(|w| format!("{} at version {}", w.uri, w.version)).into_iter().collect();
    outputs.extend(r.file_writes.iter().map(|(target, _)| target.clone()));
    if outputs.is_empty() {
        note!(printer, "pipeline run: nothing written, wall {wall:.1} s");
    } else {
        note!(printer, "pipeline run: {} rows written to {}, wall {wall:.1} s", r.rows_written(), outputs.join(", "));
    }
    if e.docs + e.nulls == 0 {
        return;
    }
    // Texts: documents and tokens. Images alone have no tokens: their own line says what they were.
    if e.docs > e.images || e.images == 0 {
        note!(
            printer,
            "embedded {} documents ({} NULL), {} useful of {} processed tokens (padding efficiency {:.3}), \
             {} truncated ({} tokens dropped), {:.0} useful tokens/s",
            e.docs - e.images,
            e.nulls,
            e.useful_tokens,
            e.processed_tokens,
            r.padding_efficiency(),
            e.truncated_docs,
            e.dropped_tokens,
            r.useful_tokens_per_second()
        );
    }
    note_images(r, printer);
    if e.nulls > 0 && !r.writes.is_empty() {
        note!(
            printer,
            "note: {} rows had a NULL text and were written with a NULL vector; their ids count as done, so a \
             rerun skips them (docs/concepts/exactly-once.md says how to embed them once they have text)",
            e.nulls
        );
    }
    if e.blank > 0 {
        err!(
            printer,
            "warning: {} texts were blank (empty, or only whitespace or zero-width characters) and each got the \
             same vector, that of no text; leave them out (WHERE trim(text) <> ''), or SET embed.blank_texts = \
             'error' to have the first one named",
            e.blank
        );
    }
    note_times(r, write_seconds, printer);
    note_model_busy(e, wall, r.device.as_ref(), printer);
    match &r.model_note {
        Some(ModelNote::GpuDefault(dir)) => note!(
            printer,
            "model: {} (the float16 default for GPUs, which scripts/setup --gpu exports: the int8 default has \
             no CUDA kernels for its quantisation; SET embed.model to choose another)",
            dir.display()
        ),
        Some(ModelNote::Installed { dir, asked }) => note!(
            printer,
            "model: {} (the default model as scripts/setup installed it; there is no {asked} here)",
            dir.display()
        ),
        None => {}
    }
    if let Some(device) = &r.device {
        note!(printer, "device: {device}");
        if let Some(fallback) = device.nodes.as_ref().filter(|n| !n.fallback_nodes.is_empty()) {
            note!(printer, "nodes that fell back to the CPU: {}", fallback.fallback_nodes.join(", "));
        }
    }
}

/// The images' line: how many, their pixels and bytes, and their pace.
fn note_images(r: &RunReport, printer: Printer) {
    let e = &r.embedded;
    if e.images == 0 && e.skipped_images.is_empty() {
        return;
    }
    let wall = r.wall_seconds.max(1e-9);
    note!(
        printer,
        "embedded {} images ({} NULL, {} bad ones skipped), {:.1} megapixels decoded from {:.1} MB of files, \
         {:.1} images/s",
        e.images,
        if e.docs > e.images { 0 } else { e.nulls },
        e.skipped_images.len(),
        e.image_pixels as f64 / 1e6,
        e.image_bytes as f64 / 1e6,
        e.images as f64 / wall
    );
}

/// Where the run's time went: tokenising, the model, writing (summed over calls, which overlap).
fn note_times(r: &RunReport, write_seconds: f64, printer: Printer) {
    let e = &r.embedded;
    if let Some(url) = &r.cluster {
        note!(
            printer,
            "time on the executors of {url}: tokenising {:.2} s, model {:.1} s (summed over their calls, which \
             overlap); committing {:.2} s here",
            e.tokenize_time.as_secs_f64(),
            e.model_time.as_secs_f64(),
            write_seconds
        );
    } else {
        note!(
            printer,
            "time: first model call at {:.1} s; {} {:.2} s, model {:.1} s, writing {:.2} s (summed over calls and \
             partitions, which overlap)",
            r.first_model_call_seconds.unwrap_or(0.0),
            if e.images > 0 && e.docs == e.images { "decoding images" } else { "tokenising" },
            e.tokenize_time.as_secs_f64(),
            e.model_time.as_secs_f64(),
            write_seconds
        );
    }
}
