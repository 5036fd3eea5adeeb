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
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        match field.data_type() {
            DataType::FixedSizeList(child, dim) if child.data_type() == &DataType::Float32 => {
                fields.push(Arc::new(Field::new(field.name(), DataType::Utf8, true)));
                columns.push(shorten(column, *dim as usize));
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
    let list = column.as_fixed_size_list();
    let text: StringArray = (0..list.len())
        .map(|i| {
            list.is_valid(i).then(|| {
                let v = list.value(i);
                let v = v.as_primitive::<datafusion::arrow::datatypes::Float32Type>();
                let head: Vec<String> = v.values().iter().take(SHOWN).map(|x| format!("{x:.4}")).collect();
                format!("[{}, … {dim} values]", head.join(", "))
            })
        })
        .collect();
    Arc::new(text)
}
