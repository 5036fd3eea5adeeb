//! `pipeline search`: a dataset's nearest rows to a query ([`crate::search`], which SQL's `embed_search()` runs too),
//! and with `--join SOURCE` the source's other columns (the text) beside each hit, by id, nearest first.

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::DataType;

use crate::error::{Error, Result};

pub use crate::search::{DEFAULT_REFINE, SearchOptions, nearest};

/// The file format of a source, by its name's ending.
fn source_format(source: &str) -> Result<&'static str> {
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
        Error::Refused(format!(
            "--join {source}: name a .jsonl, .json, .ndjson, .parquet, .csv, .arrow or .lance source"
        ))
    })
}

/// `pipeline search --join SOURCE`: the hits of a search of `dataset` with the source's other columns beside them,
/// matched on `id` (default: the id column the dataset was written with), nearest first. Hits whose id the source
/// lacks keep empty columns; ids the source holds twice are refused.
pub async fn join_source(hits: RecordBatch, source: &str, dataset: &str, id: Option<&str>) -> Result<RecordBatch> {
    use datafusion::datasource::MemTable;
    let format = source_format(source)?;
    let id = &match id {
        Some(id) => id.to_string(),
        None => crate::lance::records::id_column_of(&crate::lance::open_dataset(dataset).await?, None),
    };
    if hits.schema().column_with_name(id).is_none() {
        return Err(Error::Refused(format!(
            "--join: the dataset has no id column `{id}` to join on (name it with --id)"
        )));
    }
    let ctx = crate::session::EmbedSession::for_reading()?;
    // A CSV as pandas and pyarrow write it: a header, and line breaks inside quoted texts.
    let header =
        if format == "CSV" { " OPTIONS ('format.has_header' 'true', 'format.newlines_in_values' 'true')" } else { "" };
    let location = source.replace('\'', "''");
    ctx.sql(&format!("CREATE EXTERNAL TABLE source STORED AS {format} LOCATION '{location}'{header}"))
        .await
        .map_err(|e| Error::from(e).context(format!("--join {source}")))?;
    let source_schema = ctx.table("source").await?.schema().as_arrow().clone();
    if source_schema.column_with_name(id).is_none() {
        return Err(Error::Refused(format!("--join {source}: no id column `{id}` (name it with --id)")));
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
            return Err(Error::Refused(format!(
                "--join {source}: id {shown} is there more than once, so its hit has no one text; join a source \
                 keyed by `{id}`"
            )));
        }
    }
    let batches: Vec<RecordBatch> =
        batches.iter().map(|b| b.project(&(0..b.num_columns() - 1).collect::<Vec<_>>())).collect::<Result<_, _>>()?;
    let schema = batches.first().map(|b| b.schema()).unwrap_or_else(|| hits.schema());
    Ok(datafusion::arrow::compute::concat_batches(&schema, &batches)?)
}
