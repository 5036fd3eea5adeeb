//! The `pipeline` command line: its arguments ([`Cli`]), one module per command, each with its arguments and one
//! `run` that calls the library's operation and prints what it returns through a [`printer::Printer`], and the
//! dispatch between them.

pub mod args;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod compare;
pub mod compare_order;
pub mod cost;
pub mod devices;
pub mod display;
pub mod embed;
pub mod evaluate;
pub mod inspect;
pub mod invariance;
pub mod job_input;
pub mod lineage;
pub mod maintain;
pub mod plan;
pub mod printer;
pub mod probe;
#[cfg(test)]
mod reference;
pub mod report;
pub mod run;
#[cfg(test)]
mod schemas;
pub mod search;
pub mod shell;
pub mod signals;
pub mod trial;
pub mod verify;

use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use embedding_pipeline::QUIET_LOGS;

use printer::{Printer, out};

/// Embedding campaigns over text corpora with SQL, into versioned Lance datasets.
#[derive(Debug, Parser)]
#[command(name = "pipeline", about, disable_version_flag = true, arg_required_else_help = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Print the versions of the pipeline, DataFusion, Lance and the ONNX Runtime it loads.
    #[arg(short = 'V', long)]
    pub version: bool,
    /// More log output: -v for info, -vv for debug, -vvv for trace (RUST_LOG is used when neither -v nor -q
    /// is given).
    #[arg(short, long, action = clap::ArgAction::Count, global = true, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Print only results, warnings and errors: no progress, notes or summaries; warnings only in the log,
    /// whatever RUST_LOG says.
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

impl Cli {
    /// The log filter the flags ask for, if they ask for one.
    pub fn log_filter(&self) -> Option<&'static str> {
        match (self.quiet, self.verbose) {
            // Warnings stay: a deprecated option, a run near its memory budget.
            (true, _) => Some(QUIET_LOGS),
            (false, 0) => None,
            (false, 1) => Some("info"),
            (false, 2) => Some("debug"),
            (false, _) => Some("trace"),
        }
    }
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the SQL statements of job files (`-` reads one from standard input) and of -c, in the order
    /// given, printing each query's result. Every statement parses before the first one runs.
    #[command(arg_required_else_help = true)]
    Run(run::RunArgs),
    /// Prepare a job's writes before renting a GPU, on any machine: check the ids, count the tokens and
    /// truncation exactly as the run will, order the rows longest first and cut them into work units,
    /// kept in <output>.plan/ (plan.json and the work list).
    Plan(plan::PlanArgs),
    /// Find the batch setting this machine's device affords: real model calls on the job's longest texts,
    /// embed.batch_tokens doubling, each step's peak memory and useful tokens/s, until the next would pass
    /// the memory budget; then the fastest setting that fits with a margin, and the faster session layout.
    Probe(probe::ProbeArgs),
    /// Price the campaign on this machine's device: probe for a batch setting (unless the job sets
    /// embed.batch_tokens, or embed.batch_images for an image write), embed a sample stratified by token length
    /// (an image write's: by decoded size) through the run's own write path, and predict the whole corpus's time
    /// from the plan, stratum by stratum. Saves trial.json, and the sample's vectors beside it; --reference
    /// compares them with another dataset's by id.
    Trial(trial::TrialArgs),
    /// Compare trials of one campaign on several devices: predicted hours (with range), cost, cost per
    /// million useful tokens (or images), whether the vectors match, whether the deadline is met; and the cheapest
    /// device that meets it with matching vectors.
    Cost(cost::CostArgs),
    #[cfg(feature = "cluster")]
    /// Run a cluster's scheduler (Apache DataFusion Ballista), which plans jobs sent with `pipeline run
    /// --cluster` and hands their tasks to the executors. Runs until stopped.
    Scheduler(cluster::SchedulerArgs),
    #[cfg(feature = "cluster")]
    /// Run a cluster executor: one per GPU. It takes tasks from the scheduler and embeds on its device.
    /// Runs until stopped (SIGTERM or ctrl-C; the scheduler then runs its tasks on the other executors).
    Executor(cluster::ExecutorArgs),
    #[cfg(feature = "cluster")]
    /// Make a new cluster's keys in DIR (a new folder, readable by you only): copy it to every host of the
    /// cluster and to its clients, and give it as --cluster-keys DIR to `pipeline scheduler`, `pipeline executor`
    /// and `pipeline run --cluster`. Whoever holds it can use the cluster.
    ClusterKeys(cluster::ClusterKeysArgs),
    /// Show what this machine can run on: the ONNX Runtime build and its providers, the NVIDIA driver
    /// and GPUs (name, compute capability, memory), and the CUDA libraries scripts/setup --gpu installed.
    Devices(devices::DevicesArgs),
    /// Embed texts given as arguments or in a file and print each vector as a JSON line
    /// ({"index": i, "vector": […]}), with the model directory's own settings, as a campaign would.
    Embed(embed::EmbedArgs),
    /// The dataset's nearest rows to a query, which is embedded exactly as the dataset's vectors were: with
    /// the model directory its run records name (or --model), refused unless it gives the dataset's
    /// fingerprint. Prints every column but the vectors, and the distance.
    Search(search::SearchArgs),
    /// An interactive SQL shell over a campaign's session (`embed()`, Lance tables, `embed.*` options), with
    /// line editing and history; statements end with `;`. Job files given first set it up. Reads statements
    /// from standard input when that is not a terminal.
    Sql(shell::SqlArgs),
    /// Print a completion script for a shell, e.g. `pipeline completions bash > ~/.local/share/bash-completion/completions/pipeline`.
    Completions(CompletionsArgs),
    /// Build a vector index on a dataset's vectors, which pipeline search (and any Lance reader) then uses:
    /// a new version recording the kind, metric and rows indexed. Rebuilding replaces the index.
    Index(maintain::IndexArgs),
    /// Compact a dataset's small fragments (a campaign's many commits) into large ones, remapping indices,
    /// then remove versions older than --older-than except tagged ones and the latest; records both in a
    /// new version.
    Optimize(maintain::OptimizeArgs),
    /// Show a dataset's fingerprint, versions with their run records, tags, row count and id uniqueness.
    Inspect(inspect::InspectArgs),
    /// How a dataset version's vectors were made: training data, checkpoint, ONNX export (from the model's
    /// lineage.json, written by scripts/export-onnx), model directory, vectors and plan, with each hash.
    /// --verify re-checks every link it can reach and exits 1 naming each broken one.
    Lineage(lineage::LineageArgs),
    /// Check a finished dataset: every id once (with --job, every id of the job's corpus and no other); no NaN,
    /// infinite or zero vectors, norms as the fingerprint says; no version written around the pipeline; a seeded
    /// sample, stratified by token length, embedded again with the recorded model directory and compared; the
    /// lineage chain. Keeps the result beside the dataset (<dataset>.verify.json, one per version checked).
    /// Exits 0 when sound, 1 with findings, 2 when it cannot check, 130 when stopped by ctrl-C (nothing saved).
    Verify(verify::VerifyArgs),
    /// How well each dataset's vectors retrieve the judged documents of held-out queries, side by side:
    /// recall@k, MRR@10 and nDCG@10, each dataset's queries embedded with its own model under its own
    /// fingerprint, every vector scored (exact cosine). --overlap K with two datasets of the same ids: how many
    /// of a sampled id's K nearest neighbours stay its neighbours under the second representation.
    Evaluate(evaluate::EvaluateArgs),
    /// Show a campaign as one self-contained HTML page (no script, nothing fetched): the fingerprint, the plan's
    /// token-length histogram and truncation, each commit's rows, useful tokens/s and padding, the devices,
    /// trials and costs, the lineage chain and the last `pipeline verify`.
    Report(report::ReportArgs),
    /// Compare the vectors of two datasets, or two versions (`path@3`, `path@tag`), by id: fingerprints,
    /// ids on one side only or twice, cosine and largest difference. Exits 1 when they differ, 2 when
    /// they cannot be compared (a dataset or column missing).
    Compare(compare::CompareArgs),
    /// Embed a sample of a job's corpus in length order and in the original order, and show both side
    /// by side. Exits non-zero when an id's vectors differ by more than 1e-5 between the orders.
    CompareOrder(compare_order::CompareOrderArgs),
    /// Embed a sample of a job's corpus one text at a time and again in batches, and report the largest
    /// difference. Exits non-zero above --max-diff.
    CheckInvariance(invariance::CheckInvarianceArgs),
}

/// `pipeline completions`'s arguments.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

/// How the command ends: the process's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: done, and sound.
    Success,
    /// 1: done, with findings (`verify`), a difference (`compare`, `trial --reference`); also any error.
    Failure,
    /// 2: what was asked could not be checked (`verify`, `compare`).
    Cannot,
    /// 130: stopped by ctrl-C or SIGTERM with nothing to keep (as a shell reports a SIGINT: 128 + 2).
    Stopped,
}

impl ExitStatus {
    /// Say `error` as the command ends with it, and end with this status.
    pub fn with_error(self, printer: Printer, error: anyhow::Error) -> Self {
        printer.error(&error);
        self
    }
}

impl From<ExitStatus> for std::process::ExitCode {
    fn from(status: ExitStatus) -> Self {
        Self::from(match status {
            ExitStatus::Success => 0,
            ExitStatus::Failure => 1,
            ExitStatus::Cannot => 2,
            ExitStatus::Stopped => 130,
        })
    }
}

/// The command line, parsed; and `pipeline run`'s job files and `-c` statements in the order they were given
/// (clap keeps each kind in order, not the two together).
pub fn parse() -> (Cli, Vec<job_input::Input>) {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let mut inputs: Vec<(usize, job_input::Input)> = Vec::new();
    if let Some(run) = matches.subcommand_matches("run") {
        if let (Some(files), Some(at)) = (run.get_many::<PathBuf>("files"), run.indices_of("files")) {
            inputs.extend(at.zip(files.map(|f| job_input::Input::from_arg(f.clone()))));
        }
        if let (Some(sql), Some(at)) = (run.get_many::<String>("commands"), run.indices_of("commands")) {
            inputs.extend(at.zip(sql.map(|c| job_input::Input::Command(c.clone()))));
        }
    }
    inputs.sort_by_key(|(at, _)| *at);
    (cli, inputs.into_iter().map(|(_, i)| i).collect())
}

/// [`main`] on a runtime of its own, for the `pipeline` binary.
pub fn run(cli: Cli, inputs: Vec<job_input::Input>, printer: Printer) -> anyhow::Result<ExitStatus> {
    use anyhow::Context as _;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    let result = runtime.block_on(main(cli, inputs, printer));
    // Do not wait for blocking work nobody needs any more (a model call or token count started before a
    // stop): its results are never used, and nothing it does is written.
    runtime.shutdown_background();
    result
}

/// Run the parsed command line; `inputs` are `pipeline run`'s job files and `-c` statements, in order.
pub async fn main(cli: Cli, inputs: Vec<job_input::Input>, printer: Printer) -> anyhow::Result<ExitStatus> {
    if cli.version {
        out!(printer, "{}", embedding_pipeline::ops::devices::versions());
        out!(printer, "built from commit {}", env!("PIPELINE_COMMIT"));
        return Ok(ExitStatus::Success);
    }
    let Some(command) = cli.command else {
        Cli::command().print_help()?;
        return Ok(ExitStatus::Success);
    };
    match command {
        Command::Run(args) => run::run(args, &inputs, printer).await,
        Command::Sql(args) => shell::run(args, printer).await,
        Command::Plan(args) => plan::run(args, printer).await,
        Command::Probe(args) => probe::run(args, printer).await,
        Command::Trial(args) => trial::run(args, printer).await,
        Command::Cost(args) => cost::run(args, printer),
        Command::CompareOrder(args) => compare_order::run(args, printer).await,
        Command::CheckInvariance(args) => invariance::run(args, printer).await,
        Command::Devices(args) => devices::run(args, printer),
        Command::Embed(args) => embed::run(args, printer).await,
        Command::Search(args) => search::run(args, printer).await,
        Command::Index(args) => maintain::index(args, printer).await,
        Command::Optimize(args) => maintain::optimize(args, printer).await,
        Command::Inspect(args) => inspect::run(args, printer).await,
        Command::Lineage(args) => lineage::run(args, printer).await,
        Command::Report(args) => report::run(args, printer).await,
        Command::Compare(args) => compare::run(args, printer).await,
        Command::Verify(args) => verify::run(args, printer).await,
        Command::Evaluate(args) => evaluate::run(args, printer).await,
        Command::Completions(CompletionsArgs { shell }) => {
            clap_complete::generate(shell, &mut Cli::command(), "pipeline", &mut printer.stdout());
            Ok(ExitStatus::Success)
        }
        #[cfg(feature = "cluster")]
        Command::Scheduler(args) => cluster::scheduler(args, printer).await,
        #[cfg(feature = "cluster")]
        Command::Executor(args) => cluster::executor(args, printer).await,
        #[cfg(feature = "cluster")]
        Command::ClusterKeys(args) => cluster::cluster_keys(args, printer),
    }
}
