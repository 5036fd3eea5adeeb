//! What `pipeline verify` reads from a dataset itself: one streaming pass over its ids and vectors (no NaN,
//! infinite or zero vectors, norms as the fingerprint says, the stored vectors of a sample), and the versions
//! written by something other than this tool (no run record), whose vectors nothing vouches for.

use std::collections::{HashMap, HashSet};

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float32Type};
use futures::TryStreamExt;
use lance::Dataset;
use serde::{Deserialize, Serialize};

use super::lance_err;
use super::records::version_records;
use crate::error::{Error, Result};

/// Example ids kept for each kind of fault.
pub const EXAMPLES: usize = 10;

/// What the pass over the vectors found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VectorFindings {
    pub column: String,
    /// Rows read.
    pub rows: u64,
    /// Values per vector (the column's type).
    pub dim: usize,
    /// NULL vectors: a NULL text gets one by design, so they are counted, not faulted.
    pub null_vectors: u64,
    /// Vectors holding a NaN or an infinite value.
    pub non_finite: u64,
    pub non_finite_examples: Vec<String>,
    /// Vectors of zeros.
    pub zero: u64,
    pub zero_examples: Vec<String>,
    /// Whether the fingerprint says the vectors are L2-normalised; only then are norms checked.
    pub normalized: bool,
    /// Largest allowed |norm - 1| of a normalised vector (wider for float16 storage).
    pub norm_tolerance: f64,
    /// Normalised vectors whose norm is further from 1 than the tolerance.
    pub off_norm: u64,
    pub off_norm_examples: Vec<String>,
    /// Smallest and largest norm of the finite vectors.
    pub min_norm: Option<f64>,
    pub max_norm: Option<f64>,
}

impl VectorFindings {
    /// The faults, in words (empty when every vector is sound).
    pub fn faults(&self) -> Vec<String> {
        let mut out = Vec::new();
        let ex = |v: &[String]| if v.is_empty() { String::new() } else { format!(" (e.g. id {})", v.join(", ")) };
        if self.non_finite > 0 {
            out.push(format!(
                "{} vectors hold NaN or infinite values{}",
                self.non_finite,
                ex(&self.non_finite_examples)
            ));
        }
        if self.zero > 0 {
            out.push(format!("{} vectors are all zeros{}", self.zero, ex(&self.zero_examples)));
        }
        if self.off_norm > 0 {
            out.push(format!(
                "{} vectors are not of length 1 (off by more than {}), though the fingerprint says normalised{}",
                self.off_norm,
                self.norm_tolerance,
                ex(&self.off_norm_examples)
            ));
        }
        out
    }
}

/// The pass's results: the findings, and the stored vectors of the ids asked for (as float32).
#[derive(Debug, Default)]
pub struct VectorScan {
    pub vectors: VectorFindings,
    pub stored: HashMap<String, Option<Vec<f32>>>,
}

/// Read every id and vector of `ds` once, in batches (memory bounded by a batch and the `wanted` vectors).
pub async fn scan_vectors(
    ds: &Dataset,
    id_column: &str,
    vector_column: &str,
    normalized: bool,
    wanted: &HashSet<String>,
) -> Result<VectorScan> {
    let uri = ds.uri();
    let fail = |message: String| Error::lance(uri, message);
    let field =
        ds.schema().field(vector_column).ok_or_else(|| fail(super::no_vector_column(ds.schema(), vector_column)))?;
    let (dim, element) = match field.data_type() {
        DataType::FixedSizeList(f, n) if f.data_type().is_floating() => (n as usize, f.data_type().clone()),
        other => return Err(fail(format!("column `{vector_column}` holds no vectors ({other})"))),
    };
    let norm_tolerance = if element == DataType::Float16 { 5e-3 } else { 1e-3 };
    let mut out =
        VectorFindings { column: vector_column.to_string(), dim, normalized, norm_tolerance, ..Default::default() };
    let mut stored = HashMap::new();
    let scanner = super::bounded_scan(ds, &[id_column, vector_column])?;
    let mut stream = scanner.try_into_stream().await.map_err(lance_err(uri))?;
    let arrow = |e: datafusion::arrow::error::ArrowError| fail(e.to_string());
    let keep = |examples: &mut Vec<String>, id: &str| {
        if examples.len() < EXAMPLES {
            examples.push(id.to_string());
        }
    };
    while let Some(batch) = stream.try_next().await.map_err(lance_err(uri))? {
        let ids = cast(batch.column(0), &DataType::Utf8).map_err(arrow)?;
        let ids = ids.as_string::<i32>();
        let list = batch.column(1).as_fixed_size_list();
        let values = cast(list.values(), &DataType::Float32).map_err(arrow)?;
        let values = values.as_primitive::<Float32Type>().values();
        for i in 0..batch.num_rows() {
            out.rows += 1;
            let id = if ids.is_valid(i) { ids.value(i) } else { "NULL" };
            if list.is_null(i) {
                out.null_vectors += 1;
                if wanted.contains(id) {
                    stored.insert(id.to_string(), None);
                }
                continue;
            }
            let v = &values[i * dim..(i + 1) * dim];
            if wanted.contains(id) {
                stored.insert(id.to_string(), Some(v.to_vec()));
            }
            if v.iter().any(|x| !x.is_finite()) {
                out.non_finite += 1;
                keep(&mut out.non_finite_examples, id);
                continue;
            }
            let norm = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
            out.min_norm = Some(out.min_norm.map_or(norm, |m| m.min(norm)));
            out.max_norm = Some(out.max_norm.map_or(norm, |m| m.max(norm)));
            if norm == 0.0 {
                out.zero += 1;
                keep(&mut out.zero_examples, id);
            } else if normalized && (norm - 1.0).abs() > norm_tolerance {
                out.off_norm += 1;
                keep(&mut out.off_norm_examples, id);
            }
        }
    }
    Ok(VectorScan { vectors: out, stored })
}

/// A version that changed the rows without a record from this tool: written around the pipeline (pylance, a
/// LanceDB client), so nothing says how its vectors were made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OutsideWrite {
    pub version: u64,
    /// Lance's name for what the commit did: Append, Overwrite, Update, Merge, Delete…
    pub operation: String,
    /// Commit time, RFC 3339, UTC.
    pub timestamp: String,
}

/// Lance operations that add, replace or remove rows or their values. Index builds, compactions (which move
/// rows unchanged), tags and configuration are not among them.
const ROW_OPERATIONS: [&str; 8] =
    ["Append", "Overwrite", "Update", "Merge", "Delete", "DataReplacement", "DataOverlay", "Unknown"];

/// The versions up to `version` (those still there) that changed rows without a record of this tool.
pub async fn outside_writes(ds: &Dataset, version: u64) -> Result<Vec<OutsideWrite>> {
    let mut out = Vec::new();
    for v in ds.versions().await.map_err(lance_err(ds.uri()))? {
        if v.version > version {
            continue;
        }
        let transaction = ds.read_version_transaction(v.version).await.map_err(lance_err(ds.uri()))?.transaction;
        let Some(operation) = transaction.map(|t| t.operation.name().to_string()) else { continue };
        if !ROW_OPERATIONS.contains(&operation.as_str()) {
            continue;
        }
        if let (None, None) = version_records(ds, v.version).await? {
            out.push(OutsideWrite { version: v.version, operation, timestamp: v.timestamp.to_rfc3339() });
        }
    }
    Ok(out)
}
