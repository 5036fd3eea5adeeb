//! `pipeline search DATASET "query" [-k 10] [--where SQL] [--model DIR] [--json] [--join SOURCE]`: the dataset's nearest
//! vectors to a query, the query embedded exactly as the dataset's vectors were. The model directory comes from
//! the run records (or `--model`), and it must give the dataset's fingerprint, every field of it: a query
//! embedded with another model, tokenizer, prefix, pooling or truncation is refused, not searched.
//! `--join SOURCE` adds the source's columns (the text) to each hit, matched by id. `--prompt-name` embeds the
//! query with another of the model's prompts (e5's `query` against documents embedded under `passage`).

use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use datafusion::arrow::array::{Array, AsArray, Float32Array, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use lance_linalg::distance::MetricType;

use crate::campaign::Fingerprint;
use crate::lance::inspect::run_record;
use crate::lance::open_dataset;
use crate::lance::sink::fingerprint_of_dataset;
use crate::model::TextEmbedder;
use crate::options::EmbedOptions;

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
    /// cosine, l2 or dot.
    #[arg(long, default_value = "cosine")]
    pub metric: String,
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
    /// Embed the query with this prompt of the model (e5-style `query`, where the documents were embedded
    /// under `passage`) instead of the documents' prompt; the rest of the fingerprint must still match.
    #[arg(long, value_name = "NAME")]
    pub prompt_name: Option<String>,
}

/// The options that reproduce `fp` with the model in `dir`.
fn options_for(fp: &Fingerprint, dir: &std::path::Path) -> EmbedOptions {
    let mut options = EmbedOptions::default().with_model(dir.display().to_string());
    options.max_tokens = fp.max_tokens;
    options.truncation = fp.truncation.clone();
    options.pooling = fp.pooling.clone();
    options.normalize = fp.normalize.to_string();
    // The prompt by its name where the fingerprint has one; otherwise exactly its prefix, and not a default
    // prompt the model may have gained since.
    options.prefix = fp.prefix.clone();
    options.prompt_name = if fp.prompt_name.is_empty() { "none".into() } else { fp.prompt_name.clone() };
    options.truncate_dim = fp.truncate_dim;
    options.precision = fp.dtype.clone();
    options
}

/// Search and print the nearest rows, nearest first, with their distance (`_distance`).
pub async fn search(args: &SearchArgs) -> anyhow::Result<()> {
    let mut batch = nearest(args).await?;
    if let Some(source) = &args.join {
        batch = join_source(batch, source, &args.id_column).await?;
    }
    if args.json {
        let mut writer = datafusion::arrow::json::ArrayWriter::new(Vec::new());
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
    let header = if format == "CSV" { " OPTIONS ('format.has_header' 'true')" } else { "" };
    let location = source.replace('\'', "''");
    ctx.sql(&format!("CREATE EXTERNAL TABLE source STORED AS {format} LOCATION '{location}'{header}"))
        .await
        .with_context(|| format!("--join {source}"))?;
    let source_schema = ctx.table("source").await?.schema().as_arrow().clone();
    if source_schema.column_with_name(id).is_none() {
        bail!("--join {source}: no id column `{id}` (name it with --id)");
    }
    let quoted = |c: &str| format!("\"{}\"", c.replace('"', "\"\""));
    let extra: Vec<String> = source_schema
        .fields()
        .iter()
        .filter(|f| hits.schema().column_with_name(f.name()).is_none())
        .filter(|f| !matches!(f.data_type(), DataType::FixedSizeList(_, _)))
        .map(|f| format!("s.{}", quoted(f.name())))
        .collect();
    ctx.register_table("hits", std::sync::Arc::new(MemTable::try_new(hits.schema(), vec![vec![hits.clone()]])?))?;
    // One pass over the source: the join, with how many source rows each hit's id met.
    let select = std::iter::once("h.*".to_string()).chain(extra).collect::<Vec<_>>().join(", ");
    let joined = ctx
        .sql(&format!(
            "SELECT {select}, count(*) OVER (PARTITION BY h.{i}) AS __copies FROM hits h LEFT JOIN source s \
             ON h.{i} = s.{i} ORDER BY h._distance",
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

/// The `k` nearest rows of the dataset to the query: every column but the vectors, then `_distance`.
pub async fn nearest(args: &SearchArgs) -> anyhow::Result<RecordBatch> {
    let metric = match args.metric.as_str() {
        "cosine" => MetricType::Cosine,
        "l2" => MetricType::L2,
        "dot" => MetricType::Dot,
        other => bail!("--metric {other}: use cosine, l2 or dot"),
    };
    if args.k == 0 {
        bail!("-k must be at least 1");
    }
    let ds = open_dataset(&args.dataset).await?;
    let field = ds.schema().field(&args.column).ok_or_else(|| {
        anyhow!("{}: no column `{}` (choose the vector column with --column)", args.dataset, args.column)
    })?;
    if !matches!(field.data_type(), DataType::FixedSizeList(_, _)) {
        bail!("{}: column `{}` holds no vectors ({})", args.dataset, args.column, field.data_type());
    }
    let fp = fingerprint_of_dataset(&ds)?.ok_or_else(|| {
        anyhow!(
            "{}: the dataset holds no fingerprint (it was not written by embed()), so there is no telling which model \
             made its vectors; search needs that model",
            args.dataset
        )
    })?;
    let dir = match &args.model {
        Some(dir) => dir.clone(),
        None => {
            let mut found = None;
            for v in super::lineage::existing_versions(&ds, ds.version().version).await? {
                if let Some(dir) = run_record(&ds, v).await?.and_then(|r| r.model_dir) {
                    found = Some(PathBuf::from(dir));
                    break;
                }
            }
            found.ok_or_else(|| {
                anyhow!(
                    "{}: its run records do not say where the model is (written by an older version); give the \
                     model directory with --model",
                    args.dataset
                )
            })?
        }
    };
    let mut options = options_for(&fp, &dir);
    if let Some(name) = &args.prompt_name {
        (options.prompt_name, options.prefix) = (name.clone(), String::new());
    }
    let (settings, now) =
        Fingerprint::for_options(&options).with_context(|| format!("the model that made {}", args.dataset))?;
    let mut differences = fp.differences(&now);
    if args.prompt_name.is_some() {
        // The query's own prompt: the one field allowed to differ.
        differences.retain(|(k, _, _)| k != "prefix");
    }
    if !differences.is_empty() {
        let lines: Vec<String> =
            differences.iter().map(|(k, a, b)| format!("  {k}: the dataset's {a}, this model's {b}")).collect();
        bail!(
            "refusing to search {}: the model directory {} does not make its vectors, so a query embedded with it \
             would not be comparable:\n{}\nGive the model that made them with --model.",
            args.dataset,
            dir.display(),
            lines.join("\n")
        );
    }
    let embedder = options.embedder()?;
    let query = args.query.clone();
    let vector = tokio::task::spawn_blocking(move || embedder.embed(&[Some(query.as_str())], &settings)).await??;
    let q = Float32Array::from(vector.vectors);
    // The query in the stored vectors' element type (float16 under embed.precision).
    let element = match field.data_type() {
        DataType::FixedSizeList(f, _) => f.data_type().clone(),
        _ => DataType::Float32,
    };
    let q = datafusion::arrow::compute::cast(&q, &element)?;

    let mut columns: Vec<String> = ds
        .schema()
        .fields
        .iter()
        .filter(|f| f.name != args.column && !matches!(f.data_type(), DataType::FixedSizeList(_, _)))
        .map(|f| f.name.clone())
        .collect();
    // Named, not left to Lance to add (which it warns is going away).
    columns.push("_distance".into());
    let mut scan = ds.scan();
    scan.project(&columns)?;
    scan.nearest(&args.column, q.as_ref() as &dyn Array, args.k)?;
    scan.distance_metric(metric);
    if let Some(filter) = &args.filter {
        scan.prefilter(true);
        scan.filter(filter).with_context(|| format!("--where {filter}"))?;
    }
    Ok(scan.try_into_batch().await?)
}
