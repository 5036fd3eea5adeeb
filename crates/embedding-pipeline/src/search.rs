//! Searching a campaign's dataset with a query embedded exactly as its vectors were: what `pipeline search`
//! ([`crate::ops::search`]) and SQL's `embed_search()` ([`crate::udf`]) both run. The model directory comes from the
//! run records (or is given), and it must give the dataset's fingerprint, every field of it: a query embedded with
//! another model, tokenizer, prefix, pooling or truncation is refused, not searched. Lance's nearest-neighbour search
//! uses the dataset's vector index when it has one whose metric is the search's (`pipeline index`), unless the search
//! is exact.

use std::path::PathBuf;

use datafusion::arrow::array::{Array, Float32Array, RecordBatch};
use datafusion::arrow::datatypes::DataType;

use crate::campaign::Fingerprint;
use crate::error::{Error, Result};
use crate::lance::records::{fingerprint_of_dataset, newest_run_record};
use crate::lance::{Metric, lance_err, no_vector_column, open_dataset};
use crate::model::TextEmbedder;
use crate::options::EmbedOptions;

/// The default re-ranking factor. On 20,000 debian_desc_en vectors under Lance's default IVF_PQ, recall@10
/// against an exact search was 0.4 to 0.8 without re-ranking and 0.9 to 1.0 with 10 (README, results).
pub const DEFAULT_REFINE: u32 = 10;

/// A search: the dataset, the query, and how.
#[derive(Debug, Clone)]
pub struct SearchOptions {
    /// The Lance dataset: `path`, `path@version` or `path@tag`.
    pub dataset: String,
    pub query: String,
    /// How many rows.
    pub k: usize,
    /// A SQL filter applied before the search.
    pub filter: Option<String>,
    /// The model directory, when the run records do not name it.
    pub model: Option<PathBuf>,
    /// The vector column.
    pub column: String,
    pub metric: Metric,
    /// Search every vector, without the index.
    pub exact: bool,
    /// Where an index serves the search: take `refine` times `k` candidates from it and re-rank them by their
    /// stored vectors, so the hits and distances are exact among those candidates (1: the index's own order
    /// and approximate distances).
    pub refine: u32,
    /// Embed the query with this prompt of the model instead of the documents' own.
    pub prompt_name: Option<String>,
}

impl SearchOptions {
    /// `k` rows of `dataset` nearest to `query`, by cosine, with the dataset's own model.
    pub fn new(dataset: &str, query: &str, k: usize) -> Self {
        Self {
            dataset: dataset.into(),
            query: query.into(),
            k,
            filter: None,
            model: None,
            column: "embedding".into(),
            metric: Metric::Cosine,
            exact: false,
            refine: DEFAULT_REFINE,
            prompt_name: None,
        }
    }
}

/// The options that reproduce `fp` with the model in `dir`.
pub fn options_for(fp: &Fingerprint, dir: &std::path::Path) -> EmbedOptions {
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

/// The `k` nearest rows of the dataset to the query: every column but the vectors, then `_distance`.
pub async fn nearest(args: &SearchOptions) -> Result<RecordBatch> {
    if args.k == 0 {
        return Err(Error::Refused("a search returns at least 1 row (k = 0)".into()));
    }
    let ds = open_dataset(&args.dataset).await?;
    let field = ds
        .schema()
        .field(&args.column)
        .ok_or_else(|| Error::Refused(format!("{}: {}", args.dataset, no_vector_column(ds.schema(), &args.column))))?;
    if !matches!(field.data_type(), DataType::FixedSizeList(_, _)) {
        return Err(Error::Refused(format!(
            "{}: column `{}` holds no vectors ({})",
            args.dataset,
            args.column,
            field.data_type()
        )));
    }
    let fp = fingerprint_of_dataset(&ds)?.ok_or_else(|| {
        Error::Refused(format!(
            "{}: the dataset holds no fingerprint (it was not written by embed()), so there is no telling which model \
             made its vectors; search needs that model",
            args.dataset
        ))
    })?;
    let (embedder, settings) = query_model(&ds, &fp, &args.dataset, args.model.as_deref(), args.prompt_name.as_deref())
        .await
        .map_err(|e| e.context(format!("refusing to search {}", args.dataset)))?;
    let query = args.query.clone();
    let vector = tokio::task::spawn_blocking(move || embedder.embed(&[Some(query.as_str())], &settings))
        .await
        .map_err(|e| Error::onnx(format!("the query's embedding did not finish: {e}")))??;
    let q = Float32Array::from(vector.vectors);
    // The query in the stored vectors' element type (float16 under embed.precision).
    let element = match field.data_type() {
        DataType::FixedSizeList(f, _) => f.data_type().clone(),
        _ => DataType::Float32,
    };
    let q = datafusion::arrow::compute::cast(&q, &element)?;

    // `_distance` named, not left to Lance to add (which it warns is going away).
    let columns: Vec<String> = hit_fields(ds.schema()).iter().map(|f| f.name().clone()).collect();
    let lance = lance_err(&args.dataset);
    let mut scan = ds.scan();
    scan.project(&columns).map_err(&lance)?;
    scan.nearest(&args.column, q.as_ref() as &dyn Array, args.k).map_err(&lance)?;
    scan.distance_metric(args.metric.lance());
    if args.exact {
        scan.use_index(false);
    } else if args.refine > 1 {
        scan.refine(args.refine);
    }
    if let Some(filter) = &args.filter {
        scan.prefilter(true);
        scan.filter(filter).map_err(|e| lance(e).context(format!("the filter {filter}")))?;
    }
    scan.try_into_batch().await.map_err(lance)
}

/// The model that embeds queries for the dataset `ds` (fingerprint `fp`) exactly as its vectors were: the
/// directory its run records name (or `model`), which must give the fingerprint, every field of it, but for the
/// prompt when `prompt_name` asks for another of the model's prompts (e5's `query`).
pub async fn query_model(
    ds: &lance::Dataset,
    fp: &Fingerprint,
    label: &str,
    model: Option<&std::path::Path>,
    prompt_name: Option<&str>,
) -> Result<(std::sync::Arc<crate::model::Embedder>, crate::model::CallSettings)> {
    let dir = match model {
        Some(dir) => dir.to_path_buf(),
        None => {
            let found = newest_run_record(ds, ds.version().version, |r| r.model_dir.is_some()).await?;
            found.and_then(|(_, r)| r.model_dir).map(PathBuf::from).ok_or_else(|| {
                Error::Refused(format!(
                    "{label}: its run records do not say where the model is (written by an older version); name the \
                     model directory that made it with --model DIR"
                ))
            })?
        }
    };
    let mut options = options_for(fp, &dir);
    if let Some(name) = prompt_name {
        (options.prompt_name, options.prefix) = (name.to_string(), String::new());
    }
    let (settings, now) = Fingerprint::for_options(&options).map_err(|e| {
        e.context(match model {
            Some(_) => format!("the model directory given for {label}"),
            None => format!("the model that made {label}, as its run records name it"),
        })
    })?;
    let mut differences = fp.differences(&now);
    if prompt_name.is_some() {
        // The query's own prompt: the one field allowed to differ.
        differences.retain(|(k, _, _)| k != "prefix");
    }
    if !differences.is_empty() {
        let lines: Vec<String> =
            differences.iter().map(|(k, a, b)| format!("  {k}: the dataset's {a}, this model's {b}")).collect();
        return Err(Error::Refused(format!(
            "the model directory {} does not make the vectors of {label}, so a query embedded with it would not be \
             comparable:\n{}\nName the model directory that made them with --model DIR.",
            dir.display(),
            lines.join("\n")
        )));
    }
    Ok((options.embedder()?, settings))
}

/// The columns a search of a dataset of `schema` returns: every column but the vectors, then `_distance`.
pub fn hit_fields(schema: &lance::datatypes::Schema) -> Vec<datafusion::arrow::datatypes::Field> {
    let arrow = datafusion::arrow::datatypes::Schema::from(schema);
    let mut fields: Vec<_> = arrow
        .fields()
        .iter()
        .filter(|f| !matches!(f.data_type(), DataType::FixedSizeList(_, _)))
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(datafusion::arrow::datatypes::Field::new("_distance", DataType::Float32, true));
    fields
}
