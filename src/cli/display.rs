//! Printing query results: vector columns are shortened to their first values and their length,
//! so a result with embeddings still fits a terminal.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::util::pretty::pretty_format_batches;

/// How many leading values of a vector to show.
const SHOWN: usize = 3;

/// Render batches as one table, with vector columns abbreviated.
pub fn format_batches(batches: &[RecordBatch]) -> Result<String, ArrowError> {
    let shortened = batches.iter().map(shorten_vectors).collect::<Result<Vec<_>, _>>()?;
    Ok(pretty_format_batches(&shortened)?.to_string())
}

fn shorten_vectors(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    map_vectors(batch, &DataType::Float32, |field, column, dim| {
        Ok((Field::new(field.name(), DataType::Utf8, true), shorten(column, dim as usize)))
    })
}

/// The batch with each vector column (a fixed-size list of `element`) replaced by what `f` makes of it (its
/// field, the column, its length); the other columns as they are.
fn map_vectors(
    batch: &RecordBatch,
    element: &DataType,
    f: impl Fn(&Field, &ArrayRef, i32) -> Result<(Field, ArrayRef), ArrowError>,
) -> Result<RecordBatch, ArrowError> {
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        match field.data_type() {
            DataType::FixedSizeList(child, dim) if child.data_type() == element => {
                let (field, column) = f(field, column, *dim)?;
                fields.push(Arc::new(field));
                columns.push(column);
            }
            _ => {
                fields.push(Arc::clone(field));
                columns.push(Arc::clone(column));
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

fn shorten(column: &ArrayRef, dim: usize) -> ArrayRef {
    vector_text(column, |v| {
        let head: Vec<String> = v.iter().take(SHOWN).map(|x| format!("{x:.4}")).collect();
        format!("[{}, … {dim} values]", head.join(", "))
    })
}

/// Each vector of a float32 vector column as the text `show` makes of its values (NULL stays NULL).
fn vector_text(column: &ArrayRef, show: impl Fn(&[f32]) -> String) -> ArrayRef {
    let list = column.as_fixed_size_list();
    let text: StringArray = (0..list.len())
        .map(|i| {
            list.is_valid(i).then(|| {
                let v = list.value(i);
                show(v.as_primitive::<datafusion::arrow::datatypes::Float32Type>().values())
            })
        })
        .collect();
    Arc::new(text)
}

/// How `pipeline run` and `pipeline sql` print a query's result (`--format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table, vectors shortened to their first values.
    #[default]
    Table,
    /// CSV with a header; a vector is one field holding a JSON array.
    Csv,
    /// One JSON array of objects per query, vectors in full.
    Json,
    /// One JSON object per line, vectors in full.
    Ndjson,
}

/// How many rows of a result to print (`--maxrows N`, or `inf` for all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxRows(pub Option<usize>);

impl Default for MaxRows {
    fn default() -> Self {
        Self(Some(1000))
    }
}

impl std::str::FromStr for MaxRows {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("inf") {
            return Ok(Self(None));
        }
        match s.parse::<usize>() {
            Ok(0) | Err(_) => Err(format!("`{s}`: give a number of rows, 1 or more, or inf for all")),
            Ok(n) => Ok(Self(Some(n))),
        }
    }
}

/// The format and row limit of printed results.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResultStyle {
    pub format: Format,
    pub max_rows: MaxRows,
}

/// Writes one query's result as its batches arrive: CSV and JSON stream, a table is drawn at the end.
pub struct ResultWriter<W: std::io::Write> {
    format: Format,
    out: W,
    table: Vec<RecordBatch>,
    json: Option<datafusion::arrow::json::ArrayWriter<Vec<u8>>>,
    wrote_header: bool,
    rows: usize,
}

impl<W: std::io::Write> ResultWriter<W> {
    pub fn new(format: Format, out: W) -> Self {
        let json = (format == Format::Json).then(|| datafusion::arrow::json::ArrayWriter::new(Vec::new()));
        Self { format, out, table: Vec::new(), json, wrote_header: false, rows: 0 }
    }

    /// Write a batch (float16 vectors are written as float32 values).
    pub fn write(&mut self, batch: &RecordBatch) -> embedding_pipeline::Result<()> {
        let batch = vectors_as_f32(batch)?;
        self.rows += batch.num_rows();
        match self.format {
            Format::Table => self.table.push(batch),
            Format::Csv => {
                let batch = vectors_as_json_text(&batch)?;
                let mut writer =
                    datafusion::arrow::csv::WriterBuilder::new().with_header(!self.wrote_header).build(&mut self.out);
                writer.write(&batch)?;
                self.wrote_header = true;
            }
            Format::Json => {
                if let Some(json) = &mut self.json {
                    json.write(&batch)?;
                    // NOTE: the array writer keeps what it wrote in its buffer until finish; hand it on as it grows.
                    let written = std::mem::take(json.get_mut());
                    self.out.write_all(&written)?;
                }
            }
            Format::Ndjson => {
                let mut writer = datafusion::arrow::json::LineDelimitedWriter::new(&mut self.out);
                writer.write(&batch)?;
                writer.finish()?;
            }
        }
        Ok(())
    }

    /// End the result; `schema` names the columns of a result with no rows.
    pub fn finish(mut self, schema: &datafusion::arrow::datatypes::SchemaRef) -> embedding_pipeline::Result<()> {
        match self.format {
            Format::Table if self.rows == 0 => {
                let header = format_batches(&[vectors_as_f32(&RecordBatch::new_empty(Arc::clone(schema)))?])?;
                writeln!(self.out, "{header}\n(0 rows)")?;
            }
            Format::Table => writeln!(self.out, "{}", format_batches(&self.table)?)?,
            Format::Csv if !self.wrote_header => {
                let empty = vectors_as_json_text(&vectors_as_f32(&RecordBatch::new_empty(Arc::clone(schema)))?)?;
                datafusion::arrow::csv::WriterBuilder::new().with_header(true).build(&mut self.out).write(&empty)?;
            }
            Format::Csv | Format::Ndjson => {}
            Format::Json => {
                if let Some(mut json) = self.json.take() {
                    json.finish()?;
                    let rest = json.into_inner();
                    // An empty result: the writer wrote nothing at all.
                    self.out.write_all(if self.rows == 0 { b"[]" } else { &rest })?;
                    writeln!(self.out)?;
                }
            }
        }
        self.out.flush()?;
        Ok(())
    }
}

/// The batch with float16 vector columns cast to float32, which every printer reads.
fn vectors_as_f32(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    map_vectors(batch, &DataType::Float16, |field, column, dim| {
        let to = DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), dim);
        let cast = datafusion::arrow::compute::cast(column, &to)?;
        Ok((Field::new(field.name(), to, field.is_nullable()), cast))
    })
}

/// The batch with each float vector column written out as JSON array text (`[0.1,-0.2,…]`), for CSV.
fn vectors_as_json_text(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    map_vectors(batch, &DataType::Float32, |field, column, _| {
        let text = vector_text(column, |v| {
            let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
            format!("[{}]", items.join(","))
        });
        Ok((Field::new(field.name(), DataType::Utf8, true), text))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{FixedSizeListArray, Float32Array, Int64Array};

    fn batch() -> RecordBatch {
        let values = Float32Array::from(vec![0.5, -0.25, 1.0, 0.0]);
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        let vectors = FixedSizeListArray::try_new(Arc::clone(&item), 2, Arc::new(values), None).unwrap();
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("embedding", DataType::FixedSizeList(item, 2), true),
        ]);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(Int64Array::from(vec![1, 2])), Arc::new(vectors)]).unwrap()
    }

    fn written(format: Format, batches: &[RecordBatch]) -> String {
        let mut out = Vec::new();
        let mut w = ResultWriter::new(format, &mut out);
        for b in batches {
            w.write(b).unwrap();
        }
        w.finish(&batch().schema()).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_format_writes_full_vectors_except_the_table() {
        let b = batch();
        assert_eq!(
            written(Format::Csv, &[b.clone(), b.clone()]),
            "id,embedding\n1,\"[0.5,-0.25]\"\n2,\"[1,0]\"\n1,\"[0.5,-0.25]\"\n2,\"[1,0]\"\n"
        );
        let lines: Vec<serde_json::Value> = written(Format::Ndjson, std::slice::from_ref(&b))
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines,
            [
                serde_json::json!({"id": 1, "embedding": [0.5, -0.25]}),
                serde_json::json!({"id": 2, "embedding": [1.0, 0.0]})
            ]
        );
        let json: serde_json::Value = serde_json::from_str(&written(Format::Json, &[b.clone(), b.clone()])).unwrap();
        assert_eq!(json.as_array().unwrap().len(), 4);
        assert_eq!(json[1]["embedding"], serde_json::json!([1.0, 0.0]));
        let table = written(Format::Table, &[b]);
        assert!(table.contains("[0.5000, -0.2500, … 2 values]"), "{table}");
    }

    #[test]
    fn empty_results_still_say_what_they_are() {
        assert_eq!(written(Format::Json, &[]), "[]\n");
        assert_eq!(written(Format::Csv, &[]), "id,embedding\n");
        assert_eq!(written(Format::Ndjson, &[]), "");
        assert!(written(Format::Table, &[]).contains("(0 rows)"));
        assert_eq!("inf".parse::<MaxRows>().unwrap(), MaxRows(None));
        assert!("0".parse::<MaxRows>().is_err() && "x".parse::<MaxRows>().is_err());
    }
}
