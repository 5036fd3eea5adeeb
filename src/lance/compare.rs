//! Comparing the vectors of two datasets, or two versions of one, by id: which ids only one side has,
//! and how close the shared ones are (cosine, largest absolute difference).

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Float32Type;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use lance::datafusion::LanceTableProvider;
use serde::Serialize;

use super::open_dataset;
use crate::error::{Error, Result};

/// How many example ids to list for each side.
const EXAMPLES: usize = 10;

/// What `pipeline compare` reports.
#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    pub a: String,
    pub b: String,
    /// Ids in both.
    pub matched: u64,
    pub only_in_a: u64,
    pub only_in_a_examples: Vec<String>,
    pub only_in_b: u64,
    pub only_in_b_examples: Vec<String>,
    /// Shared ids whose vector is NULL on one side only.
    pub null_mismatches: u64,
    /// Over shared ids with a vector on both sides; null when there are none.
    pub min_cosine: Option<f64>,
    pub mean_cosine: Option<f64>,
    pub max_abs_diff: Option<f64>,
    /// The threshold applied.
    pub min_cosine_threshold: f64,
    /// Every id on both sides, no NULL mismatch, and min_cosine at or above the threshold.
    pub passed: bool,
}

/// Compare `a` and `b` (each `path`, `path@version` or `path@tag`) on `vector_column` by `id_column`.
pub async fn compare(a: &str, b: &str, id_column: &str, vector_column: &str, min_cosine: f64) -> Result<CompareReport> {
    let ctx = SessionContext::new();
    for (name, location) in [("a", a), ("b", b)] {
        let ds = open_dataset(location).await?;
        for col in [id_column, vector_column] {
            if ds.schema().field(col).is_none() {
                return Err(Error::Lance { uri: location.into(), message: format!("has no column `{col}`") });
            }
        }
        ctx.register_table(name, Arc::new(LanceTableProvider::new(Arc::new(ds), false, false)))
            .map_err(|e| Error::Lance { uri: location.into(), message: e.to_string() })?;
    }
    let q = |c: &str| format!("\"{}\"", c.replace('"', "\"\""));
    let (id, v) = (q(id_column), q(vector_column));
    let err =
        |e: datafusion::error::DataFusionError| Error::Lance { uri: format!("{a} vs {b}"), message: e.to_string() };

    let mut sides = Vec::new();
    for (left, right) in [("a", "b"), ("b", "a")] {
        let sql = format!(
            "SELECT CAST({left}.{id} AS VARCHAR) FROM {left} LEFT ANTI JOIN {right} ON {left}.{id} = {right}.{id}"
        );
        let mut stream = ctx.sql(&sql).await.map_err(err)?.execute_stream().await.map_err(err)?;
        let (mut count, mut examples) = (0u64, Vec::new());
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(err)?;
            let ids = datafusion::arrow::compute::cast(batch.column(0), &datafusion::arrow::datatypes::DataType::Utf8)
                .map_err(|e| err(e.into()))?;
            for s in ids.as_string::<i32>().iter().take(EXAMPLES.saturating_sub(examples.len())) {
                examples.push(s.unwrap_or("NULL").to_string());
            }
            count += batch.num_rows() as u64;
        }
        sides.push((count, examples));
    }

    let sql = format!("SELECT a.{v} AS va, b.{v} AS vb FROM a JOIN b ON a.{id} = b.{id}");
    let mut stream = ctx.sql(&sql).await.map_err(err)?.execute_stream().await.map_err(err)?;
    let (mut matched, mut null_mismatches, mut n, mut sum) = (0u64, 0u64, 0u64, 0f64);
    let (mut min_cos, mut max_abs) = (f64::INFINITY, 0f64);
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(err)?;
        let (va, vb) = (batch.column(0).as_fixed_size_list(), batch.column(1).as_fixed_size_list());
        for i in 0..batch.num_rows() {
            matched += 1;
            match (va.is_valid(i), vb.is_valid(i)) {
                (true, true) => {}
                (false, false) => continue,
                _ => {
                    null_mismatches += 1;
                    continue;
                }
            }
            let (x, y) = (va.value(i), vb.value(i));
            let (x, y) = (x.as_primitive::<Float32Type>().values(), y.as_primitive::<Float32Type>().values());
            if x.len() != y.len() {
                return Err(Error::Lance {
                    uri: format!("{a} vs {b}"),
                    message: format!("vectors of {} and {} dimensions", x.len(), y.len()),
                });
            }
            let (c, d) = cosine_and_max_diff(x, y);
            min_cos = min_cos.min(c);
            max_abs = max_abs.max(d);
            sum += c;
            n += 1;
        }
    }
    let (min_cosine_v, mean, max) =
        if n > 0 { (Some(min_cos), Some(sum / n as f64), Some(max_abs)) } else { (None, None, None) };
    let ((only_a, ex_a), (only_b, ex_b)) = (sides[0].clone(), sides[1].clone());
    let passed = only_a == 0 && only_b == 0 && null_mismatches == 0 && min_cosine_v.is_none_or(|c| c >= min_cosine);
    Ok(CompareReport {
        a: a.to_string(),
        b: b.to_string(),
        matched,
        only_in_a: only_a,
        only_in_a_examples: ex_a,
        only_in_b: only_b,
        only_in_b_examples: ex_b,
        null_mismatches,
        min_cosine: min_cosine_v,
        mean_cosine: mean,
        max_abs_diff: max,
        min_cosine_threshold: min_cosine,
        passed,
    })
}

/// Cosine similarity (in f64) and the largest absolute element difference of two vectors.
pub fn cosine_and_max_diff(x: &[f32], y: &[f32]) -> (f64, f64) {
    let (mut dot, mut nx, mut ny, mut max) = (0f64, 0f64, 0f64, 0f64);
    for (a, b) in x.iter().zip(y) {
        let (a, b) = (*a as f64, *b as f64);
        dot += a * b;
        nx += a * a;
        ny += b * b;
        max = max.max((a - b).abs());
    }
    let cos = if nx == 0.0 && ny == 0.0 { 1.0 } else { dot / (nx.sqrt() * ny.sqrt()).max(1e-300) };
    (cos, max)
}

impl CompareReport {
    /// The human-readable form.
    pub fn to_text(&self) -> String {
        let f = |x: Option<f64>| x.map(|v| format!("{v:.7}")).unwrap_or_else(|| "n/a".into());
        let mut out = format!("compare {} (A) with {} (B)\n", self.a, self.b);
        out += &format!("  ids in both: {}\n", self.matched);
        out += &format!("  ids only in A: {}{}\n", self.only_in_a, examples(&self.only_in_a_examples));
        out += &format!("  ids only in B: {}{}\n", self.only_in_b, examples(&self.only_in_b_examples));
        if self.null_mismatches > 0 {
            out += &format!("  NULL on one side only: {}\n", self.null_mismatches);
        }
        out += &format!("  cosine: min {}, mean {}\n", f(self.min_cosine), f(self.mean_cosine));
        out += &format!(
            "  max abs difference: {}\n",
            self.max_abs_diff.map(|v| format!("{v:.3e}")).unwrap_or_else(|| "n/a".into())
        );
        out += &format!(
            "  {} (min cosine threshold {})\n",
            if self.passed { "PASS" } else { "FAIL" },
            self.min_cosine_threshold
        );
        out
    }
}

fn examples(ids: &[String]) -> String {
    if ids.is_empty() { String::new() } else { format!(" (e.g. {})", ids.join(", ")) }
}

#[cfg(test)]
mod tests {
    use super::cosine_and_max_diff;

    #[test]
    fn cosine_of_equal_opposite_and_zero_vectors() {
        assert_eq!(cosine_and_max_diff(&[1.0, 0.0], &[1.0, 0.0]), (1.0, 0.0));
        assert_eq!(cosine_and_max_diff(&[1.0, 0.0], &[-1.0, 0.0]), (-1.0, 2.0));
        assert_eq!(cosine_and_max_diff(&[0.0, 0.0], &[0.0, 0.0]).0, 1.0);
    }
}
