//! The flag groups several commands share, and the command line's words for the library's choices: clap's
//! arguments, each turned into what the library takes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use embedding_pipeline::lance::Metric;
use embedding_pipeline::ops::maintain::IndexKind;

use super::display;
use super::job_input;

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
pub struct JobArgs {
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
    pub fn parse(&self) -> anyhow::Result<BTreeMap<String, String>> {
        job_input::parse_vars(&self.vars)
    }
}

/// A dataset's id and vector columns (`verify`, `evaluate`, `compare`).
#[derive(Debug, Clone, clap::Args)]
pub struct Columns {
    /// The id column (default: the one the dataset was written with, else `id`).
    #[arg(long)]
    pub id_column: Option<String>,
    /// The vector column.
    #[arg(long, default_value = "embedding")]
    pub column: String,
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
    pub fn of(self, file: PathBuf, vars: &JobVars) -> anyhow::Result<embedding_pipeline::ops::checks::SampleSource> {
        Ok(embedding_pipeline::ops::checks::SampleSource {
            file,
            vars: vars.parse()?,
            table: self.table,
            column: self.column,
        })
    }
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
    /// Load ONNX Runtime from `--ort-lib`, where given.
    pub fn apply(&self) {
        if let Some(lib) = &self.ort_lib {
            embedding_pipeline::model::runtime::set_library_path(lib);
        }
    }
}

/// A whole number of at least `MIN`, for a flag: clap's own range check would name u64's largest value.
pub fn at_least<const MIN: u64>(s: &str) -> Result<u64, String> {
    s.trim().parse().ok().filter(|n| *n >= MIN).ok_or_else(|| format!("give a whole number, {MIN} or more"))
}

/// How vectors are compared (`--metric`): [`Metric`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MetricArg {
    /// 1 - cosine similarity (what normalised sentence embeddings are made for).
    #[default]
    Cosine,
    /// Squared Euclidean distance.
    L2,
    /// Negative dot product.
    Dot,
}

impl From<MetricArg> for Metric {
    fn from(m: MetricArg) -> Self {
        match m {
            MetricArg::Cosine => Metric::Cosine,
            MetricArg::L2 => Metric::L2,
            MetricArg::Dot => Metric::Dot,
        }
    }
}

/// The kind of vector index `pipeline index` builds (`--kind`): [`IndexKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum IndexKindArg {
    /// IVF partitions of product-quantised vectors: small, fast, approximate; needs 256 rows to train.
    IvfPq,
    /// IVF partitions holding HNSW graphs over scalar-quantised vectors: more recall, more memory.
    IvfHnswSq,
}

impl From<IndexKindArg> for IndexKind {
    fn from(k: IndexKindArg) -> Self {
        match k {
            IndexKindArg::IvfPq => IndexKind::IvfPq,
            IndexKindArg::IvfHnswSq => IndexKind::IvfHnswSq,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;

    use super::*;

    /// The command's words are the library's names, which the run records and `--json` outputs use.
    #[test]
    fn the_words_are_the_library_names() {
        for m in MetricArg::value_variants() {
            assert_eq!(m.to_possible_value().unwrap().get_name(), Metric::from(*m).name());
        }
        for k in IndexKindArg::value_variants() {
            assert_eq!(k.to_possible_value().unwrap().get_name(), IndexKind::from(*k).name());
        }
    }
}
