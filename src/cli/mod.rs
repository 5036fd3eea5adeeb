//! The `pipeline` command line: argument parsing and the subcommands.

// The one part of the library that prints: what the command says, on stdout and stderr.
#![allow(clippy::print_stdout, clippy::print_stderr)]

/// Print a note of `pipeline run` (a write's line, the summary): on stdout under `--format table`, on stderr
/// under the machine-read formats, which keep stdout for results. See [`note_line`].
macro_rules! note {
    ($($arg:tt)*) => { $crate::cli::note_line(format_args!($($arg)*)) };
}

pub mod args;
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
pub mod probe;
pub mod report;
pub mod run;
pub mod search;
pub mod shell;
pub mod trial;
pub mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

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

pub use embedding_pipeline::QUIET_LOGS;

/// How query results print (`pipeline run` and `pipeline sql`).
#[derive(Debug, Clone, clap::Args)]
pub struct Output {
    /// table, csv, json or ndjson (csv, json and ndjson carry vectors in full).
    #[arg(long, value_enum, default_value_t = display::Format::Table)]
    pub format: display::Format,
    /// At most this many rows of each result; inf for all.
    #[arg(long, value_name = "N", default_value = "1000")]
    pub maxrows: display::MaxRows,
}

/// What a job's session starts from: options and variables (`pipeline run` and `pipeline sql`).
#[derive(Debug, Clone, clap::Args)]
pub struct JobSettings {
    /// Where the model runs: cpu, cuda, cuda:N or cuda:N,M (sets embed.device; a SET in the job wins).
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
    /// Set an option before the job runs, e.g. --set embed.batch_tokens=8192 (repeatable). A job that SETs
    /// the same key is refused.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    #[command(flatten)]
    pub vars: JobVars,
    /// Run the job's queries on the Ballista cluster whose scheduler is at df://HOST:PORT (pipeline scheduler),
    /// on its executors' devices.
    #[arg(long, value_name = "df://HOST:PORT", env = "EMBED_PIPELINE_CLUSTER")]
    pub cluster: Option<String>,
    /// The cluster's keys, for a cluster started with --cluster-keys (`pipeline cluster-keys DIR`).
    #[cfg(feature = "cluster")]
    #[arg(long, value_name = "DIR", env = "EMBED_PIPELINE_CLUSTER_KEYS")]
    pub cluster_keys: Option<PathBuf>,
}

/// Values for a job's `${NAME}` variables: every command that reads a job file takes them.
#[derive(Debug, Clone, clap::Args)]
pub struct JobVars {
    /// A value for ${NAME} in the job's text, e.g. --var CORPUS=data/a.jsonl (repeatable).
    #[arg(long = "var", value_name = "NAME=VALUE")]
    vars: Vec<String>,
}

impl JobVars {
    /// The values by name; a malformed one, or a name given twice, is an error.
    fn parse(&self) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
        job_input::parse_vars(&self.vars)
    }
}

/// A dataset's id and vector columns (`verify`, `evaluate`, `compare`).
#[derive(Debug, Clone, clap::Args)]
pub struct Columns {
    /// The id column (default: the one the dataset was written with, else `id`).
    #[arg(long)]
    id_column: Option<String>,
    /// The vector column.
    #[arg(long, default_value = "embedding")]
    column: String,
}

/// Where a check's sample of a job's corpus comes from (`compare-order`, `check-invariance`).
#[derive(Debug, Clone, clap::Args)]
pub struct SampleSource {
    /// The source table (default: the job's first non-Lance external table).
    #[arg(long)]
    table: Option<String>,
    /// The text column.
    #[arg(long, default_value = "text")]
    column: String,
}

impl SampleSource {
    /// The library's sample source: this table and column of the job `file`, with its variables.
    fn of(self, file: PathBuf, vars: &JobVars) -> anyhow::Result<embedding_pipeline::ops::checks::SampleSource> {
        Ok(embedding_pipeline::ops::checks::SampleSource {
            file,
            vars: vars.parse()?,
            table: self.table,
            column: self.column,
        })
    }
}

/// What `pipeline trial` is asked beside its job: the library's [`embedding_pipeline::ops::trial::TrialArgs`].
#[derive(Debug, Clone, clap::Args)]
pub struct TrialFlags {
    /// Embedding time the sample should take, minutes (sized by the warm-up's rate).
    #[arg(long, default_value_t = embedding_pipeline::ops::trial::TrialArgs::DEFAULT_MINUTES, conflicts_with = "sample")]
    minutes: f64,
    /// About this many rows in the sample, instead of --minutes (every 2^k-th row of each length
    /// stratum, k chosen to come nearest).
    #[arg(long, value_parser = at_least::<1>)]
    sample: Option<u64>,
    /// Where the trial is saved; the sample's vectors go beside it (trial.json: trial.lance).
    #[arg(long, default_value = embedding_pipeline::ops::trial::TrialArgs::DEFAULT_SAVE)]
    save: PathBuf,
    /// A dataset (a reference run's output, or another trial's vectors) to compare the sample's
    /// vectors with, by id: they match at minimum cosine >= 0.9999. Exits 1 when they do not.
    #[arg(long, value_name = "DATASET")]
    reference: Option<String>,
    /// Memory budget for the probe, e.g. 8GiB (as pipeline probe).
    #[arg(long, value_name = "SIZE", value_parser = embedding_pipeline::campaign::memory::parse_size)]
    memory_budget: Option<u64>,
    /// Keep the job's batch settings; do not probe.
    #[arg(long)]
    no_probe: bool,
    /// The trial's name, which pipeline cost prints and prices it by (default: the device).
    #[arg(long)]
    name: Option<String>,
}

impl TrialFlags {
    /// The library's arguments: these, for the job `file` with its variables.
    fn args(self, file: PathBuf, vars: &JobVars) -> anyhow::Result<embedding_pipeline::ops::trial::TrialArgs> {
        let Self { minutes, sample, save, reference, memory_budget, no_probe, name } = self;
        Ok(embedding_pipeline::ops::trial::TrialArgs {
            file,
            vars: vars.parse()?,
            minutes,
            sample,
            save,
            reference,
            memory_budget,
            no_probe,
            name,
        })
    }
}

/// The cluster's keys, for its scheduler and executors.
#[cfg(feature = "cluster")]
#[derive(Debug, Clone, clap::Args)]
pub struct KeysDir {
    /// The cluster's keys (`pipeline cluster-keys DIR`): serve and connect over TLS with them, and take only
    /// clients and executors that hold the same keys. Needed to listen on an address other hosts can reach.
    #[arg(long, value_name = "DIR", env = "EMBED_PIPELINE_CLUSTER_KEYS")]
    cluster_keys: Option<PathBuf>,
}

/// Where ONNX Runtime comes from; only the commands that run the model take it.
#[derive(Debug, Clone, clap::Args)]
pub struct Runtime {
    /// ONNX Runtime shared library to load (libonnxruntime.so). Without it: ORT_DYLIB_PATH, then
    /// where scripts/setup installs it.
    #[arg(long, value_name = "PATH")]
    pub ort_lib: Option<PathBuf>,
}

impl Runtime {
    fn apply(&self) {
        if let Some(lib) = &self.ort_lib {
            embedding_pipeline::model::runtime::set_library_path(lib);
        }
    }
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the SQL statements of job files (`-` reads one from standard input) and of -c, in the order
    /// given, printing each query's result. Every statement parses before the first one runs.
    #[command(arg_required_else_help = true)]
    Run {
        /// Job files; `-` is a job on standard input.
        #[arg(value_name = "FILE")]
        files: Vec<PathBuf>,
        /// SQL statements to run (repeatable), in order with the job files.
        #[arg(short = 'c', long = "command", value_name = "SQL")]
        commands: Vec<String>,
        #[command(flatten)]
        settings: JobSettings,
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
    },
    /// Prepare a job's writes before renting a GPU, on any machine: check the ids, count the tokens and
    /// truncation exactly as the run will, order the rows longest first and cut them into work units,
    /// kept in <output>.plan/ (plan.json and the work list).
    Plan {
        /// The job file.
        file: PathBuf,
        #[command(flatten)]
        vars: JobVars,
        /// Print the plans as JSON.
        #[arg(long)]
        json: bool,
        /// At most this many work units, of equal tokens.
        #[arg(long, conflicts_with = "unit_tokens", value_parser = at_least::<1>)]
        units: Option<u64>,
        /// About this many useful tokens per work unit (a unit ends with the row that reaches it).
        #[arg(long, default_value_t = embedding_pipeline::ops::plan::DEFAULT_UNIT_TOKENS, value_parser = at_least::<1>)]
        unit_tokens: u64,
        /// Plan for a run on this device (cpu, cuda, cuda:N…; sets embed.device, a SET in the job wins), from any
        /// machine: for a GPU, with the model it will use there (the float16 default), without a GPU here.
        #[arg(long, value_name = "DEVICE")]
        device: Option<String>,
        #[command(flatten)]
        runtime: Runtime,
    },
    /// Find the batch setting this machine's device affords: real model calls on the job's longest texts,
    /// embed.batch_tokens doubling, each step's peak memory and useful tokens/s, until the next would pass
    /// the memory budget; then the fastest setting that fits with a margin, and the faster session layout.
    Probe {
        /// The job file (its first write into Lance is probed).
        file: PathBuf,
        #[command(flatten)]
        vars: JobVars,
        /// Most memory the process may use, e.g. 8GiB or 900MB (default: 90% of the available memory,
        /// plus what the loaded model holds).
        #[arg(long, value_name = "SIZE", value_parser = embedding_pipeline::campaign::memory::parse_size)]
        memory_budget: Option<u64>,
        /// Largest embed.batch_tokens tried.
        #[arg(long, default_value_t = 262_144, value_parser = at_least::<512>)]
        max_batch_tokens: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        runtime: Runtime,
    },
    /// Price the campaign on this machine's device: probe for a batch setting (unless the job sets
    /// embed.batch_tokens), embed a sample stratified by token length through the run's own write path,
    /// and predict the whole corpus's time from the plan, stratum by stratum. Saves trial.json, and the
    /// sample's vectors beside it; --reference compares them with another dataset's by id.
    Trial {
        /// The job file (its first write into Lance is tried; the output itself is not touched).
        file: PathBuf,
        #[command(flatten)]
        vars: JobVars,
        #[command(flatten)]
        trial: TrialFlags,
        /// Print trial.json.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        runtime: Runtime,
    },
    /// Compare trials of one campaign on several devices: predicted hours (with range), cost, cost per
    /// million useful tokens, whether the vectors match, whether the deadline is met; and the cheapest
    /// device that meets it with matching vectors.
    Cost {
        /// trial.json files from pipeline trial.
        #[arg(required = true)]
        trials: Vec<PathBuf>,
        /// Hourly prices (see examples/prices.toml, whose prices are placeholders).
        #[arg(long, value_name = "FILE")]
        prices: Option<PathBuf>,
        /// The campaign must finish within this, e.g. 7d, 36h, 90min.
        #[arg(long, value_parser = embedding_pipeline::ops::cost::parse_deadline)]
        deadline: Option<f64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Draw hours and cost per device, with the deadline, into this SVG file.
        #[arg(long, value_name = "FILE")]
        chart: Option<PathBuf>,
    },
    #[cfg(feature = "cluster")]
    /// Run a cluster's scheduler (Apache DataFusion Ballista), which plans jobs sent with `pipeline run
    /// --cluster` and hands their tasks to the executors. Runs until stopped.
    Scheduler {
        /// Address to listen on.
        #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50050")]
        bind: std::net::SocketAddr,
        /// Seconds without word from an executor after which it counts as lost and its tasks run elsewhere.
        /// Executors send word every 5 s, busy or not; 10 at least.
        #[arg(long, value_name = "SECONDS", default_value_t = 180)]
        executor_timeout: u64,
        #[command(flatten)]
        keys: KeysDir,
    },
    #[cfg(feature = "cluster")]
    /// Run a cluster executor: one per GPU. It takes tasks from the scheduler and embeds on its device.
    /// Runs until stopped (SIGTERM or ctrl-C; the scheduler then runs its tasks on the other executors).
    Executor {
        /// The scheduler's address.
        #[arg(long, value_name = "HOST:PORT")]
        scheduler: String,
        /// Address to serve results on (Arrow Flight). The executor asks the scheduler for tasks, so only this
        /// port need be reachable (from the client and the other executors).
        #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50051")]
        bind: std::net::SocketAddr,
        /// The name or address other hosts reach this one by (default: the --bind address, or this host's name
        /// when that is 0.0.0.0).
        #[arg(long, value_name = "HOST")]
        external_host: Option<String>,
        /// This executor's device (cpu, cuda:N), over each job's embed.device.
        #[arg(long, value_name = "DEVICE")]
        device: Option<String>,
        /// Tasks at once.
        #[arg(long, value_name = "K", default_value_t = 1, value_parser = at_least::<1>)]
        concurrent_tasks: u64,
        /// ONNX Runtime intra-op threads, over each job's embed.intra_threads (0: one per core).
        #[arg(long, value_name = "N")]
        intra_threads: Option<usize>,
        /// Directory for shuffle files (default: a directory under the system's temporary directory).
        #[arg(long, value_name = "DIR")]
        work_dir: Option<PathBuf>,
        #[command(flatten)]
        keys: KeysDir,
        #[command(flatten)]
        runtime: Runtime,
    },
    #[cfg(feature = "cluster")]
    /// Make a new cluster's keys in DIR (a new folder, readable by you only): copy it to every host of the
    /// cluster and to its clients, and give it as --cluster-keys DIR to `pipeline scheduler`, `pipeline executor`
    /// and `pipeline run --cluster`. Whoever holds it can use the cluster.
    ClusterKeys {
        /// The folder to make.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Show what this machine can run on: the ONNX Runtime build and its providers, the NVIDIA driver
    /// and GPUs (name, compute capability, memory), and the CUDA libraries scripts/setup --gpu installed.
    Devices {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        runtime: Runtime,
    },
    /// Embed texts given as arguments or in a file and print each vector as a JSON line
    /// ({"index": i, "vector": […]}), with the model directory's own settings, as a campaign would.
    Embed {
        /// Texts to embed.
        texts: Vec<String>,
        /// More texts, from a JSON lines file: each line a JSON string or an object with a "text" field.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
        /// The model directory (default: the default model, as embed.model).
        #[arg(long, value_name = "DIR")]
        model: Option<String>,
        /// Where the model runs: cpu, cuda or cuda:N (as embed.device).
        #[arg(long, value_name = "DEVICE")]
        device: Option<String>,
        #[command(flatten)]
        runtime: Runtime,
    },
    /// The dataset's nearest rows to a query, which is embedded exactly as the dataset's vectors were: with
    /// the model directory its run records name (or --model), refused unless it gives the dataset's
    /// fingerprint. Prints every column but the vectors, and the distance.
    Search {
        #[command(flatten)]
        args: search::SearchArgs,
        #[command(flatten)]
        runtime: Runtime,
    },
    /// An interactive SQL shell over a campaign's session (`embed()`, Lance tables, `embed.*` options), with
    /// line editing and history; statements end with `;`. Job files given first set it up. Reads statements
    /// from standard input when that is not a terminal.
    Sql {
        /// Job files to run first (e.g. the CREATE statements of a campaign).
        #[arg(value_name = "FILE")]
        files: Vec<PathBuf>,
        #[command(flatten)]
        settings: JobSettings,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        runtime: Runtime,
    },
    /// Print a completion script for a shell, e.g. `pipeline completions bash > ~/.local/share/bash-completion/completions/pipeline`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Build a vector index on a dataset's vectors, which pipeline search (and any Lance reader) then uses:
    /// a new version recording the kind, metric and rows indexed. Rebuilding replaces the index.
    Index {
        /// The Lance dataset.
        dataset: String,
        /// ivf_pq (small, fast; needs 256 rows) or ivf_hnsw_sq (more recall, more memory).
        #[arg(long, value_enum, default_value_t = args::IndexKindArg::IvfPq)]
        kind: args::IndexKindArg,
        /// The metric searches must use for the index to serve them.
        #[arg(long, value_enum, default_value_t = args::MetricArg::Cosine)]
        metric: args::MetricArg,
        /// The vector column.
        #[arg(long, default_value = "embedding")]
        column: String,
        /// IVF partitions (default: Lance's choice from the row count).
        #[arg(long, value_parser = at_least::<1>)]
        partitions: Option<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Compact a dataset's small fragments (a campaign's many commits) into large ones, remapping indices,
    /// then remove versions older than --older-than except tagged ones and the latest; records both in a
    /// new version.
    Optimize {
        /// The Lance dataset.
        dataset: String,
        /// Remove versions older than this (0s: all but tagged ones and the latest). Their run records go
        /// with them: tag a version (embed.tag) to keep it.
        #[arg(long, default_value = "7d", value_name = "DURATION")]
        older_than: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a dataset's fingerprint, versions with their run records, tags, row count and id uniqueness.
    Inspect {
        /// The Lance dataset.
        dataset: String,
        /// Print the stable JSON form (see the README).
        #[arg(long)]
        json: bool,
        /// The id column (default: the one the dataset was written with, else `id`).
        #[arg(long)]
        id_column: Option<String>,
    },
    /// How a dataset version's vectors were made: training data, checkpoint, ONNX export (from the model's
    /// lineage.json, written by scripts/export-onnx), model directory, vectors and plan, with each hash.
    /// --verify re-checks every link it can reach and exits 1 naming each broken one.
    Lineage {
        /// The Lance dataset: `path`, `path@version` or `path@tag`.
        dataset: String,
        /// Re-check the links: model files, checkpoint weights, the training data's version, the plan's corpus.
        #[arg(long)]
        verify: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check a finished dataset: every id once (with --job, every id of the job's corpus and no other); no NaN,
    /// infinite or zero vectors, norms as the fingerprint says; no version written around the pipeline; a seeded
    /// sample, stratified by token length, embedded again with the recorded model directory and compared; the
    /// lineage chain. Keeps the result beside the dataset (<dataset>.verify.json, one per version checked).
    /// Exits 0 when sound, 1 with findings, 2 when it cannot check, 130 when stopped by ctrl-C (nothing saved).
    Verify {
        /// The Lance dataset: `path`, `path@version` or `path@tag`.
        dataset: String,
        /// The job that made it: its corpus's ids, and the sample's texts.
        #[arg(long, value_name = "FILE")]
        job: Option<PathBuf>,
        #[command(flatten)]
        vars: JobVars,
        /// Rows of the corpus to embed again (with --job; 0: none).
        #[arg(long, default_value_t = embedding_pipeline::ops::verify::VerifyArgs::DEFAULT_SAMPLE)]
        sample: u64,
        /// The sample's seed: the same seed draws the same rows.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Smallest acceptable cosine between a stored vector and its re-embedding.
        #[arg(long, default_value_t = embedding_pipeline::ops::verify::VerifyArgs::DEFAULT_MIN_COSINE)]
        min_cosine: f64,
        /// The model directory, where the run records do not name it.
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
        /// Where the sample is embedded again: cpu, cuda or cuda:N.
        #[arg(long, value_name = "DEVICE")]
        device: Option<String>,
        #[command(flatten)]
        columns: Columns,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        runtime: Runtime,
    },
    /// How well each dataset's vectors retrieve the judged documents of held-out queries, side by side:
    /// recall@k, MRR@10 and nDCG@10, each dataset's queries embedded with its own model under its own
    /// fingerprint, every vector scored (exact cosine). --overlap K with two datasets of the same ids: how many
    /// of a sampled id's K nearest neighbours stay its neighbours under the second representation.
    Evaluate {
        /// Lance datasets (`path`, `path@version` or `path@tag`), shown side by side.
        #[arg(required = true)]
        datasets: Vec<String>,
        /// Held-out queries, JSON lines with `id` (or `_id`) and `text` (BEIR's queries.jsonl).
        #[arg(long, value_name = "FILE", requires = "qrels", conflicts_with = "pairs")]
        queries: Option<PathBuf>,
        /// Relevance judgements: `query-id corpus-id score` per line (BEIR's qrels TSV; TREC's four columns too).
        #[arg(long, value_name = "FILE", requires = "queries")]
        qrels: Option<PathBuf>,
        /// Held-out pairs instead: JSON lines with `query` and the relevant document's `id`.
        #[arg(long, value_name = "FILE")]
        pairs: Option<PathBuf>,
        /// Cut-offs of recall (comma-separated).
        #[arg(short, long = "k", value_delimiter = ',', default_values_t = [1, 5, 10, 100])]
        ks: Vec<usize>,
        /// Embed the queries with this prompt of the model (e5's `query`), not the documents' own.
        #[arg(long, value_name = "NAME")]
        query_prompt: Option<String>,
        /// The model directory, where the run records do not name it (one dataset only).
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
        /// With two datasets of the same ids: compare each sampled id's K nearest neighbours in both.
        #[arg(long, value_name = "K")]
        overlap: Option<usize>,
        /// Ids sampled for --overlap.
        #[arg(long, default_value_t = 200)]
        overlap_sample: usize,
        /// The seed of the --overlap sample.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        columns: Columns,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        runtime: Runtime,
    },
    /// Show a campaign as one self-contained HTML page (no script, nothing fetched): the fingerprint, the plan's
    /// token-length histogram and truncation, each commit's rows, useful tokens/s and padding, the devices,
    /// trials and costs, the lineage chain and the last `pipeline verify`.
    Report {
        /// The Lance dataset: `path`, `path@version` or `path@tag`.
        dataset: String,
        /// The page to write.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
        /// trial.json files from pipeline trial, shown with their costs (repeatable).
        #[arg(long = "trial", value_name = "FILE")]
        trials: Vec<PathBuf>,
        /// Hourly prices for the trials (see examples/prices.toml).
        #[arg(long, value_name = "FILE")]
        prices: Option<PathBuf>,
    },
    /// Compare the vectors of two datasets, or two versions (`path@3`, `path@tag`), by id: fingerprints,
    /// ids on one side only or twice, cosine and largest difference. Exits 1 when they differ, 2 when
    /// they cannot be compared (a dataset or column missing).
    Compare {
        /// The first dataset.
        a: String,
        /// The second dataset.
        b: String,
        /// Smallest acceptable cosine similarity between a pair of vectors.
        #[arg(long, default_value_t = 0.9999)]
        min_cosine: f64,
        /// Largest acceptable absolute difference of any element of a pair (cosine alone does not see
        /// length: a normalised and an unnormalised vector have cosine 1).
        #[arg(long, default_value_t = 0.01)]
        max_diff: f64,
        /// Compare only the ids both have: ids on one side only are reported, but do not fail.
        #[arg(long)]
        shared_ids: bool,
        /// Compare vectors made under different fingerprints (the differences are still reported).
        #[arg(long)]
        allow_different_fingerprints: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        columns: Columns,
    },
    /// Embed a sample of a job's corpus in length order and in the original order, and show both side
    /// by side. Exits non-zero when an id's vectors differ by more than 1e-5 between the orders.
    CompareOrder {
        /// The job file: its SET and CREATE statements are run, then the sample is drawn.
        file: PathBuf,
        #[command(flatten)]
        vars: JobVars,
        /// Rows in the sample.
        #[arg(long, default_value_t = 2000)]
        sample: usize,
        #[command(flatten)]
        source: SampleSource,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        runtime: Runtime,
    },
    /// Embed a sample of a job's corpus one text at a time and again in batches, and report the largest
    /// difference. Exits non-zero above --max-diff.
    CheckInvariance {
        /// The job file: its SET and CREATE statements are run, then the sample is drawn.
        file: PathBuf,
        #[command(flatten)]
        vars: JobVars,
        /// Texts in the sample.
        #[arg(long, default_value_t = 64)]
        sample: usize,
        #[command(flatten)]
        source: SampleSource,
        /// Largest acceptable absolute difference of any vector element.
        #[arg(long, default_value_t = 1e-5)]
        max_diff: f64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        runtime: Runtime,
    },
}

static NOTES_TO_STDERR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A whole number of at least `MIN`, for a flag: clap's own range check would name u64's largest value.
fn at_least<const MIN: u64>(s: &str) -> Result<u64, String> {
    s.trim().parse().ok().filter(|n| *n >= MIN).ok_or_else(|| format!("give a whole number, {MIN} or more"))
}

/// Send notes to stderr (under a machine-read `--format`).
pub(crate) fn notes_to_stderr(on: bool) {
    NOTES_TO_STDERR.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// One note line (the `note!` macro). A closed stdout ends the program quietly (the binary's panic hook).
pub fn note_line(args: std::fmt::Arguments) {
    if NOTES_TO_STDERR.load(std::sync::atomic::Ordering::Relaxed) {
        eprintln!("{args}");
    } else {
        println!("{args}");
    }
}

/// Standard output that ends the program when its reader has gone (`pipeline run … | head`), as `cat` or
/// `grep` end, with the exit code a shell reports for SIGPIPE (141), instead of failing the statement: for
/// writers that return the error (`println!` panics instead, which the binary's panic hook turns into the same
/// exit). A write into Lance stopped this way keeps its commits, as after any kill.
/// NOTE: SIGPIPE itself stays ignored (Rust's default): restoring its default action would also end the
/// program on a reset object-store connection.
pub struct ClosedPipeExit<W>(pub W);

impl ClosedPipeExit<()> {
    /// End the program if `e` says the reader has gone.
    pub fn check(e: &std::io::Error) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Self::exit();
        }
    }

    /// End the program as a reader's leaving ends it, with the code a shell gives SIGPIPE.
    pub fn exit() -> ! {
        // SAFETY: _exit ends the process at once; nothing after it runs. Not exit: its handlers would tear
        // down ONNX Runtime under a running call.
        unsafe { libc::_exit(141) }
    }
}

impl<W: std::io::Write> std::io::Write for ClosedPipeExit<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).inspect_err(ClosedPipeExit::check)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().inspect_err(ClosedPipeExit::check)
    }
}

/// The command line, parsed; and `pipeline run`'s job files and `-c` statements in the order they were given
/// (clap keeps each kind in order, not the two together).
pub fn parse() -> (Cli, Vec<job_input::Input>) {
    use clap::{CommandFactory, FromArgMatches};
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

pub use embedding_pipeline::ops::devices::versions;

/// [`main`] on a runtime of its own, for the `pipeline` binary: polled here, the command's futures are compiled
/// with the library; polled from the binary, they were compiled into it again (2 min 40 s a build; issue 55).
pub fn run(cli: Cli, inputs: Vec<job_input::Input>) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    let result = runtime.block_on(main(cli, inputs));
    // Do not wait for blocking work nobody needs any more (a model call or token count started before a
    // stop): its results are never used, and nothing it does is written.
    runtime.shutdown_background();
    result
}

/// Run the parsed command line; `inputs` are `pipeline run`'s job files and `-c` statements, in order.
pub async fn main(cli: Cli, inputs: Vec<job_input::Input>) -> anyhow::Result<()> {
    if cli.version {
        println!("{}", versions());
        return Ok(());
    }
    let quiet = cli.quiet;
    let Some(command) = cli.command else {
        use clap::CommandFactory;
        Cli::command().print_help()?;
        return Ok(());
    };
    match command {
        Command::Run { files: _, commands: _, settings, output, restart, plan, no_plan, runtime } => {
            runtime.apply();
            stop_on_signals(StopSays::Committing);
            let plans = plan_choice(plan, no_plan);
            let (statements, run_settings) = job(&inputs, settings, output, restart, quiet, plans, false)?;
            run::run_job(&statements, &run_settings).await
        }
        Command::Sql { files, settings, output, runtime } => {
            runtime.apply();
            let inputs: Vec<_> = files.into_iter().map(job_input::Input::from_arg).collect();
            let (statements, run_settings) =
                job(&inputs, settings, output, false, quiet, embedding_pipeline::ops::PlanChoice::Beside, true)?;
            shell::shell(&statements, &run_settings).await
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "pipeline", &mut std::io::stdout());
            Ok(())
        }
        c @ (Command::Plan { .. }
        | Command::Probe { .. }
        | Command::Trial { .. }
        | Command::Cost { .. }
        | Command::CompareOrder { .. }
        | Command::CheckInvariance { .. }) => prepare_command(c).await,
        Command::Devices { json, runtime } => {
            runtime.apply();
            devices::print(json)
        }
        Command::Embed { texts, file, model, device, runtime } => {
            runtime.apply();
            embed::embed(texts, file.as_deref(), model, device).await
        }
        c @ (Command::Search { .. }
        | Command::Index { .. }
        | Command::Optimize { .. }
        | Command::Inspect { .. }
        | Command::Lineage { .. }
        | Command::Report { .. }
        | Command::Compare { .. }) => dataset_command(c).await,
        c @ (Command::Verify { .. } | Command::Evaluate { .. }) => check_command(c, quiet).await,
        #[cfg(feature = "cluster")]
        c @ (Command::Scheduler { .. } | Command::ClusterKeys { .. } | Command::Executor { .. }) => {
            cluster_command(c).await
        }
    }
}

/// `--plan DIR` or `--no-plan`: which plan a run executes (by default, the one beside its output).
fn plan_choice(plan: Option<std::path::PathBuf>, no_plan: bool) -> embedding_pipeline::ops::PlanChoice {
    match (plan, no_plan) {
        (Some(dir), _) => embedding_pipeline::ops::PlanChoice::Dir(dir),
        (None, true) => embedding_pipeline::ops::PlanChoice::Off,
        (None, false) => embedding_pipeline::ops::PlanChoice::Beside,
    }
}

/// The commands that prepare a campaign before it runs: plan, probe, trial, cost and the model checks.
async fn prepare_command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Plan { file, vars, json, units, unit_tokens, device, runtime } => {
            runtime.apply();
            let size = units.map_or(
                embedding_pipeline::ops::plan::UnitSize::Tokens(unit_tokens),
                embedding_pipeline::ops::plan::UnitSize::Count,
            );
            plan::plan_file(&file, &vars.parse()?, json, size, device.as_deref()).await
        }
        Command::Probe { file, vars, memory_budget, max_batch_tokens, json, runtime } => {
            runtime.apply();
            probe::probe_file(&file, &vars.parse()?, memory_budget, max_batch_tokens as usize, json).await
        }
        Command::Trial { file, vars, trial, json, runtime } => {
            runtime.apply();
            trial::trial_file(&trial.args(file, &vars)?, json).await
        }
        Command::Cost { trials, prices, deadline, json, chart } => {
            cost::cost_files(&trials, prices.as_deref(), deadline, json, chart.as_deref())
        }
        Command::CompareOrder { file, vars, sample, source, json, runtime } => {
            runtime.apply();
            compare_order::compare_order_command(&source.of(file, &vars)?, sample, json).await
        }
        Command::CheckInvariance { file, vars, sample, source, max_diff, json, runtime } => {
            runtime.apply();
            invariance::check(&source.of(file, &vars)?, sample, max_diff, json).await
        }
        _ => unreachable!("main hands only the preparations here"),
    }
}

/// The commands that read, search, compare, report or maintain a dataset.
async fn dataset_command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Search { args, runtime } => {
            runtime.apply();
            search::search(&args).await
        }
        Command::Index { dataset, kind, metric, column, partitions, json } => {
            maintain::index(&dataset, &column, kind.into(), metric.into(), partitions.map(|p| p as usize), json).await
        }
        Command::Optimize { dataset, older_than, json } => maintain::optimize(&dataset, &older_than, json).await,
        Command::Inspect { dataset, json, id_column } => inspect::inspect(&dataset, id_column.as_deref(), json).await,
        Command::Lineage { dataset, verify, json } => lineage::lineage(&dataset, json, verify).await,
        Command::Report { dataset, output, trials, prices } => {
            report::report_command(&dataset, &output, &trials, prices.as_deref()).await
        }
        Command::Compare {
            a,
            b,
            min_cosine,
            max_diff,
            shared_ids,
            allow_different_fingerprints,
            json,
            columns: Columns { id_column, column },
        } => {
            let thresholds = embedding_pipeline::lance::compare::Thresholds {
                min_cosine,
                max_diff,
                shared_ids,
                allow_different_fingerprints,
            };
            compare::compare(&a, &b, id_column.as_deref(), &column, thresholds, json).await
        }
        _ => unreachable!("main hands only the dataset commands here"),
    }
}

/// The commands that check a dataset: `verify` and `evaluate`.
async fn check_command(command: Command, quiet: bool) -> anyhow::Result<()> {
    match command {
        Command::Verify {
            dataset,
            job,
            vars,
            sample,
            seed,
            min_cosine,
            model,
            device,
            columns: Columns { id_column, column },
            json,
            runtime,
        } => {
            runtime.apply();
            let args = embedding_pipeline::ops::verify::VerifyArgs {
                dataset,
                job,
                vars: vars.parse()?,
                sample,
                seed,
                min_cosine,
                model,
                device,
                id_column,
                column,
            };
            verify::verify_command(&args, json, quiet).await
        }
        Command::Evaluate {
            datasets,
            queries,
            qrels,
            pairs,
            ks,
            query_prompt,
            model,
            overlap,
            overlap_sample,
            seed,
            columns: Columns { id_column, column },
            json,
            runtime,
        } => {
            runtime.apply();
            let judgements = match (queries, qrels, pairs) {
                (Some(q), Some(r), _) => Some(embedding_pipeline::ops::evaluate::read_queries_and_qrels(&q, &r)?),
                (_, _, Some(p)) => Some(embedding_pipeline::ops::evaluate::read_pairs(&p)?),
                _ => None,
            };
            let args = embedding_pipeline::ops::evaluate::EvaluateArgs {
                datasets,
                judgements,
                ks,
                model,
                query_prompt,
                id_column,
                column,
                overlap,
                overlap_sample,
                seed,
            };
            evaluate::evaluate_command(&args, json).await
        }
        _ => unreachable!("main hands only the checks here"),
    }
}

/// The cluster's commands: its keys, its scheduler and executors.
#[cfg(feature = "cluster")]
async fn cluster_command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Scheduler { bind, executor_timeout, keys: KeysDir { cluster_keys } } => {
            let keys = cluster_keys.as_deref().map(embedding_pipeline::cluster::ClusterKeys::load).transpose()?;
            Ok(embedding_pipeline::cluster::run_scheduler(bind, executor_timeout, keys, |line| println!("{line}"))
                .await?)
        }
        Command::ClusterKeys { dir } => {
            let keys = embedding_pipeline::cluster::ClusterKeys::make(&dir)?;
            println!(
                "made the cluster's keys in {}: copy the folder to every host of the cluster and to its clients (it \
                 is the secret: whoever holds it can use the cluster), and give it as --cluster-keys {}",
                keys.dir().display(),
                keys.dir().display()
            );
            Ok(())
        }
        Command::Executor {
            scheduler,
            bind,
            external_host,
            device,
            concurrent_tasks,
            intra_threads,
            work_dir,
            keys: KeysDir { cluster_keys },
            runtime,
        } => {
            runtime.apply();
            let work_dir =
                work_dir.unwrap_or_else(|| std::env::temp_dir().join(format!("pipeline-executor-{}", bind.port())));
            let host = embedding_pipeline::udf::embed::HostOptions { device, intra_threads, name: None };
            let settings = embedding_pipeline::cluster::ExecutorSettings {
                scheduler,
                bind,
                external_host,
                concurrent_tasks: concurrent_tasks as usize,
                host,
                work_dir,
                keys: cluster_keys.as_deref().map(embedding_pipeline::cluster::ClusterKeys::load).transpose()?,
            };
            Ok(embedding_pipeline::cluster::run_executor(settings, |line| println!("{line}")).await?)
        }
        _ => unreachable!("main hands only the cluster commands here"),
    }
}

/// A job's statements, variables filled, and the settings it runs with.
fn job(
    inputs: &[job_input::Input],
    settings: JobSettings,
    output: Output,
    restart: bool,
    quiet: bool,
    plans: embedding_pipeline::ops::PlanChoice,
    allow_none: bool,
) -> anyhow::Result<(Vec<job_input::JobStatement>, run::CommandSettings)> {
    if inputs.is_empty() && !allow_none {
        anyhow::bail!("give a job file, - for a job on standard input, or -c 'SQL'");
    }
    let vars = settings.vars.parse()?;
    let sets = job_input::parse_sets(&settings.sets)?;
    let (statements, unused) = job_input::read_statements(inputs, &vars)?;
    job_input::check_sets_against_job(&sets, &statements)?;
    if !unused.is_empty() {
        eprintln!("warning: --var {} is not used by the job (no ${{…}} names it)", unused.join(", --var "));
    }
    let style = display::ResultStyle { format: output.format, max_rows: output.maxrows };
    notes_to_stderr(output.format != display::Format::Table);
    Ok((
        statements,
        run::CommandSettings {
            job: embedding_pipeline::ops::RunSettings {
                restart,
                device: settings.device,
                plans,
                sets,
                // Read only for a cluster: a keys folder named in the environment does not stop a local run.
                #[cfg(feature = "cluster")]
                cluster_keys: match settings.cluster {
                    Some(_) => settings
                        .cluster_keys
                        .as_deref()
                        .map(embedding_pipeline::cluster::ClusterKeys::load)
                        .transpose()?,
                    None => None,
                },
                cluster: settings.cluster,
            },
            quiet,
            style,
        },
    ))
}

/// Whether `pipeline sql` waits at its prompt, where a SIGTERM ends it at once (nothing is running, and its
/// history is saved).
static AT_PROMPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn at_prompt(on: bool) {
    AT_PROMPT.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The terminal's settings before the line editor changed them, restored when a SIGTERM ends the shell at its
/// prompt (the editor cannot: it is waiting for a key).
static TERMINAL: std::sync::OnceLock<libc::termios> = std::sync::OnceLock::new();

pub(crate) fn remember_terminal() {
    // SAFETY: a zeroed termios is a valid value to pass; tcgetattr fills it for standard input.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    if unsafe { libc::tcgetattr(0, &mut t) } == 0 {
        let _ = TERMINAL.set(t);
    }
}

/// What the first ctrl-C says it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopSays {
    /// A write: it commits the rows already embedded, then stops.
    Committing,
    /// A command that writes nothing on the way (`pipeline verify`): it stops and saves nothing.
    NothingToCommit,
}

/// A second signal this soon after the first is the same stop delivered twice.
const SAME_STOP: std::time::Duration = std::time::Duration::from_secs(1);

/// First ctrl-C or SIGTERM: ask writes to commit what they have and stop. Second, a second or more after the first:
/// exit at once. A SIGTERM
/// at `pipeline sql`'s prompt, where nothing runs, exits at once.
///
/// The signals are watched on a thread of their own, so that a second one is answered even while the
/// main runtime is busy or shutting down. Returns once they are watched (or that failed and was said), so that
/// a signal sent after anything the command prints is never met by the default action.
pub(crate) fn stop_on_signals(says: StopSays) {
    let (ready, watching) = std::sync::mpsc::channel::<()>();
    let watcher = move || -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (mut int, mut term) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
            let _ = ready.send(());
            // When the stop now asked for was first asked: a second signal within SAME_STOP of it is the same stop
            // delivered twice (`timeout -s INT` signals the process and its group), not a second ctrl-C.
            let mut asked: Option<std::time::Instant> = None;
            // NOTE: a `for` over an endless range, not `loop`, so that the block's `Ok(())` still types it.
            for _ in 0u64.. {
                let terminated = tokio::select! {
                    _ = int.recv() => false,
                    _ = term.recv() => true,
                };
                if terminated && AT_PROMPT.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(t) = TERMINAL.get() {
                        // SAFETY: settings tcgetattr gave, back onto standard input.
                        unsafe { libc::tcsetattr(0, libc::TCSANOW, t) };
                    }
                    eprintln!("\nterminated at the prompt");
                    // SAFETY: _exit ends the process; nothing after it runs. 143: 128 + SIGTERM, as a shell says.
                    unsafe { libc::_exit(143) }
                }
                // The first since the last stop was honoured (pipeline sql clears it after each statement).
                if !embedding_pipeline::campaign::interrupt::stop_requested() {
                    match says {
                        StopSays::Committing => eprintln!(
                            "stopping: committing the rows already embedded (press ctrl-C again to exit at once)"
                        ),
                        StopSays::NothingToCommit => eprintln!("stopping (press ctrl-C again to exit at once)"),
                    }
                    embedding_pipeline::campaign::interrupt::request_stop();
                    asked = Some(std::time::Instant::now());
                } else if asked.is_some_and(|t| t.elapsed() < SAME_STOP) {
                    continue;
                } else {
                    match says {
                        StopSays::Committing => eprintln!(
                            "exiting at once; rows since the last commit are lost and will be embedded on the next run"
                        ),
                        StopSays::NothingToCommit => eprintln!("exiting at once"),
                    }
                    // NOTE: _exit, not exit: exit's handlers would tear down ONNX Runtime under a running call.
                    // SAFETY: _exit ends the process; nothing after it runs.
                    unsafe { libc::_exit(130) }
                }
            }
            Ok(())
        })
    };
    let spawned = std::thread::Builder::new().name("signals".into()).spawn(move || {
        if let Err(e) = watcher() {
            eprintln!("warning: cannot watch for ctrl-C ({e}); ctrl-C will stop the command at once");
        }
    });
    if spawned.is_ok() {
        // Err: the watcher failed and said so (its sender dropped).
        let _ = watching.recv_timeout(std::time::Duration::from_secs(5));
    }
}

/// An error that asks for an exit code of its own (the binary exits 1 for any other error).
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub error: anyhow::Error,
}

impl Exit {
    /// `pipeline compare`: the datasets differ.
    pub const DIFFER: u8 = 1;
    /// `pipeline compare`: the datasets could not be compared.
    pub const CANNOT: u8 = 2;
    /// Stopped by ctrl-C or SIGTERM with nothing to keep (as a shell reports a SIGINT: 128 + 2).
    pub const STOPPED: u8 = 130;

    pub fn with(code: u8, error: anyhow::Error) -> anyhow::Error {
        anyhow::Error::new(Self { code, error })
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&error_chain(&self.error))
    }
}

impl std::error::Error for Exit {}

/// An error and its causes, skipping a cause whose text is already shown (DataFusion's External
/// wrapper displays its source, which the chain then reports again), in plain words: see [`plain`].
pub fn error_chain(e: &anyhow::Error) -> String {
    embedding_pipeline::error::chain_text(e.as_ref())
}
