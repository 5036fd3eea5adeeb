//! `pipeline search DATASET "query" [-k 10] [--where SQL] [--model DIR] [--json] [--join SOURCE]`: the dataset's nearest
//! vectors to a query, the query embedded exactly as the dataset's vectors were. The model directory comes from
//! the run records (or `--model`), and it must give the dataset's fingerprint, every field of it: a query
//! embedded with another model, tokenizer, prefix, pooling or truncation is refused, not searched.
//! `--join SOURCE` adds the source's columns (the text) to each hit, matched by id. `--prompt-name` embeds the
//! query with another of the model's prompts (e5's `query` against documents embedded under `passage`).

use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::DataType;

use crate::lance::Metric;
use crate::lance::search::{SearchRequest, nearest};

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
    #[arg(long, value_enum, default_value_t = Metric::Cosine)]
    pub metric: Metric,
    /// Print JSON (an array of rows).
    #[arg(long)]
    pub json: bool,
    /// A source file (JSON lines, Parquet, CSV, Arrow, or a Lance dataset; local or s3://) whose rows are
    /// joined to the hits by id, to show their text.
    #[arg(long, value_name = "SOURCE")]
    pub join: Option<String>,
    /// The id column the join matches on.
    #[arg(long = "id", value_name = "COLUMN", default_value = "id")]
    pub id_column: String,
    /// Search every vector, without the dataset's vector index (pipeline index), which is otherwise used
    /// when the metric matches its own.
    #[arg(long)]
    pub exact: bool,
    /// Where the index serves the search, re-rank this many times k of its candidates by their stored vectors:
    /// exact distances, and the recall PQ's approximation loses (1: the index's order and distances alone).
    #[arg(long, value_name = "FACTOR", default_value_t = crate::lance::search::DEFAULT_REFINE,
          value_parser = clap::value_parser!(u32).range(1..), conflicts_with = "exact")]
    pub refine: u32,
    /// Embed the query with this prompt of the model (e5-style `query`, where the documents were embedded
    /// under `passage`) instead of the documents' prompt; the rest of the fingerprint must still match.
    #[arg(long, value_name = "NAME")]
    pub prompt_name: Option<String>,
}

impl SearchArgs {
    /// The search these arguments ask for.
    pub fn request(&self) -> SearchRequest {
        SearchRequest {
            dataset: self.dataset.clone(),
            query: self.query.clone(),
            k: self.k,
            filter: self.filter.clone(),
            model: self.model.clone(),
            column: self.column.clone(),
            metric: self.metric,
            exact: self.exact,
            refine: self.refine,
            prompt_name: self.prompt_name.clone(),
        }
    }
}

/// Search and print the nearest rows, nearest first, with their distance (`_distance`).
pub async fn search(args: &SearchArgs) -> anyhow::Result<()> {
    let mut batch = nearest(&args.request()).await?;
    if let Some(source) = &args.join {
        batch = join_source(batch, source, &args.id_column).await?;
    }
    if args.json {
        // Every column on every row: a hit the --join source lacks shows its columns as null, not missing.
        let mut writer = datafusion::arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, datafusion::arrow::json::writer::JsonArray>(Vec::new());
        writer.write(&batch)?;
        writer.finish()?;
        let rows = writer.into_inner();
        println!("{}", if rows.is_empty() { "[]".into() } else { String::from_utf8(rows)? });
    } else {
        println!("{}", datafusion::arrow::util::pretty::pretty_format_batches(&[batch])?);
    }
    Ok(())
}

/// The file format of a source, by its name's ending.
fn source_format(source: &str) -> anyhow::Result<&'static str> {
    let name = source.trim_end_matches('/').to_ascii_lowercase();
    let formats = [
        (".jsonl", "JSON"),
        (".ndjson", "JSON"),
        (".json", "JSON"),
        (".parquet", "PARQUET"),
        (".csv", "CSV"),
        (".arrow", "ARROW"),
        (".lance", "LANCE"),
    ];
    formats.iter().find(|(end, _)| name.ends_with(end)).map(|(_, f)| *f).ok_or_else(|| {
        anyhow!("--join {source}: name a .jsonl, .json, .ndjson, .parquet, .csv, .arrow or .lance source")
    })
}

/// The hits with the source's other columns beside them, matched on `id`, nearest first. Hits whose id the
/// source lacks keep empty columns; ids the source holds twice are refused.
async fn join_source(hits: RecordBatch, source: &str, id: &str) -> anyhow::Result<RecordBatch> {
    use datafusion::datasource::MemTable;
    let format = source_format(source)?;
    if hits.schema().column_with_name(id).is_none() {
        bail!("--join: the dataset has no id column `{id}` to join on (name it with --id)");
    }
    let ctx = crate::session::EmbedSession::for_reading()?;
    // A CSV as pandas and pyarrow write it: a header, and line breaks inside quoted texts.
    let header =
        if format == "CSV" { " OPTIONS ('format.has_header' 'true', 'format.newlines_in_values' 'true')" } else { "" };
    let location = source.replace('\'', "''");
    ctx.sql(&format!("CREATE EXTERNAL TABLE source STORED AS {format} LOCATION '{location}'{header}"))
        .await
        .with_context(|| format!("--join {source}"))?;
    let source_schema = ctx.table("source").await?.schema().as_arrow().clone();
    if source_schema.column_with_name(id).is_none() {
        bail!("--join {source}: no id column `{id}` (name it with --id)");
    }
    let quoted = crate::lance::quote_ident;
    let extra: Vec<String> = source_schema
        .fields()
        .iter()
        .filter(|f| hits.schema().column_with_name(f.name()).is_none())
        .filter(|f| !matches!(f.data_type(), DataType::FixedSizeList(_, _)))
        .map(|f| format!("s.{}", quoted(f.name())))
        .collect();
    // Each hit numbered, so that the source rows are counted per hit (the dataset's own ids may repeat).
    let numbered = {
        let n = hits.num_rows() as u64;
        let mut fields: Vec<_> = hits.schema().fields().iter().cloned().collect();
        fields.push(std::sync::Arc::new(datafusion::arrow::datatypes::Field::new("__hit", DataType::UInt64, false)));
        let mut columns = hits.columns().to_vec();
        columns.push(std::sync::Arc::new(datafusion::arrow::array::UInt64Array::from_iter_values(0..n)));
        RecordBatch::try_new(std::sync::Arc::new(datafusion::arrow::datatypes::Schema::new(fields)), columns)?
    };
    ctx.register_table("hits", std::sync::Arc::new(MemTable::try_new(numbered.schema(), vec![vec![numbered]])?))?;
    // One pass over the source: the join, with how many source rows each hit's id met.
    let own: Vec<String> = hits.schema().fields().iter().map(|f| format!("h.{}", quoted(f.name()))).collect();
    let select = own.into_iter().chain(extra).collect::<Vec<_>>().join(", ");
    let joined = ctx
        .sql(&format!(
            "SELECT {select}, count(*) OVER (PARTITION BY h.__hit) AS __copies FROM hits h LEFT JOIN source s \
             ON h.{i} = s.{i} ORDER BY h._distance, h.__hit",
            i = quoted(id)
        ))
        .await?;
    let batches = joined.collect().await?;
    for b in &batches {
        let copies = b.column(b.num_columns() - 1).as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        if let Some(row) = (0..b.num_rows()).find(|&r| copies.value(r) > 1) {
            let at = b.schema().index_of(id)?;
            let shown = datafusion::arrow::util::display::array_value_to_string(b.column(at), row)?;
            bail!(
                "--join {source}: id {shown} is there more than once, so its hit has no one text; join a source \
                 keyed by `{id}`"
            );
        }
    }
    let batches: Vec<RecordBatch> =
        batches.iter().map(|b| b.project(&(0..b.num_columns() - 1).collect::<Vec<_>>())).collect::<Result<_, _>>()?;
    let schema = batches.first().map(|b| b.schema()).unwrap_or_else(|| hits.schema());
    Ok(datafusion::arrow::compute::concat_batches(&schema, &batches)?)
}
