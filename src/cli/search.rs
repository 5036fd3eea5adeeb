//! `pipeline search DATASET "query" [-k 10] [--where SQL] [--model DIR] [--json] [--join SOURCE]`: the dataset's nearest
//! vectors to a query, the query embedded exactly as the dataset's vectors were. The model directory comes from
//! the run records (or `--model`), and it must give the dataset's fingerprint, every field of it: a query
//! embedded with another model, tokenizer, prefix, pooling or truncation is refused, not searched.
//! `--join SOURCE` adds the source's columns (the text) to each hit, matched by id. `--prompt-name` embeds the
//! query with another of the model's prompts (e5's `query` against documents embedded under `passage`).

use std::path::PathBuf;

use super::ExitStatus;
use super::args::{MetricArg, Runtime};
use super::printer::{Printer, out};
use embedding_pipeline::ops::search::{SearchOptions, nearest};

/// What to search and how (the arguments of `pipeline search`).
#[derive(clap::Args, Debug)]
pub struct SearchArgs {
    /// The Lance dataset: `path`, `path@version` or `path@tag`.
    pub dataset: String,
    /// The query text.
    pub query: String,
    /// How many rows.
    #[arg(short, default_value_t = 10)]
    pub k: usize,
    /// Only rows that pass this SQL filter, e.g. "lang = 'en'" (applied before the search).
    #[arg(long = "where", value_name = "SQL")]
    pub filter: Option<String>,
    /// The model directory, when the run records do not name it (written by an older version).
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// The vector column.
    #[arg(long, default_value = "embedding")]
    pub column: String,
    /// How vectors are compared; the index (pipeline index) serves a search of its own metric.
    #[arg(long, value_enum, default_value_t = MetricArg::Cosine)]
    pub metric: MetricArg,
    /// Print JSON (an array of rows).
    #[arg(long)]
    pub json: bool,
    /// A source file (JSON lines, Parquet, CSV, Arrow, or a Lance dataset; local or s3://) whose rows are
    /// joined to the hits by id, to show their text.
    #[arg(long, value_name = "SOURCE")]
    pub join: Option<String>,
    /// The id column the join matches on (default: the one the dataset was written with, else `id`).
    #[arg(long = "id", value_name = "COLUMN")]
    pub id_column: Option<String>,
    /// Search every vector, without the dataset's vector index (pipeline index), which is otherwise used
    /// when the metric matches its own.
    #[arg(long)]
    pub exact: bool,
    /// Where the index serves the search, re-rank this many times k of its candidates by their stored vectors:
    /// exact distances, and the recall PQ's approximation loses (1: the index's order and distances alone).
    #[arg(long, value_name = "FACTOR", default_value_t = embedding_pipeline::ops::search::DEFAULT_REFINE,
          value_parser = clap::value_parser!(u32).range(1..), conflicts_with = "exact")]
    pub refine: u32,
    /// Embed the query with this prompt of the model (e5-style `query`, where the documents were embedded
    /// under `passage`) instead of the documents' prompt; the rest of the fingerprint must still match.
    #[arg(long, value_name = "NAME")]
    pub prompt_name: Option<String>,
    #[command(flatten)]
    pub runtime: Runtime,
}

impl SearchArgs {
    /// The search these arguments ask for.
    pub fn request(&self) -> SearchOptions {
        SearchOptions {
            dataset: self.dataset.clone(),
            query: self.query.clone(),
            k: self.k,
            filter: self.filter.clone(),
            model: self.model.clone(),
            column: self.column.clone(),
            metric: self.metric.into(),
            exact: self.exact,
            refine: self.refine,
            prompt_name: self.prompt_name.clone(),
        }
    }
}

/// Search and print the nearest rows, nearest first, with their distance (`_distance`).
pub async fn run(args: SearchArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    args.runtime.apply();
    let mut batch = nearest(&args.request()).await?;
    if let Some(source) = &args.join {
        batch = embedding_pipeline::ops::search::join_source(batch, source, &args.dataset, args.id_column.as_deref())
            .await?;
    }
    if args.json {
        // Every column on every row: a hit the --join source lacks shows its columns as null, not missing.
        let mut writer = datafusion::arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, datafusion::arrow::json::writer::JsonArray>(Vec::new());
        writer.write(&batch)?;
        writer.finish()?;
        let rows = writer.into_inner();
        out!(printer, "{}", if rows.is_empty() { "[]".into() } else { String::from_utf8(rows)? });
    } else {
        out!(printer, "{}", datafusion::arrow::util::pretty::pretty_format_batches(&[batch])?);
    }
    Ok(ExitStatus::Success)
}
