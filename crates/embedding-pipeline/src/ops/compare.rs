//! Comparing the vectors of two datasets, or two versions of one, by id: which ids only one side has,
//! and how close the shared ones are (cosine, largest absolute difference).

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float32Type};
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use lance::datafusion::LanceTableProvider;
use serde::Serialize;

use crate::campaign::fingerprint::Fingerprint;
use crate::error::{Error, Result};
use crate::lance::open_dataset;
use crate::lance::records::fingerprint_of_dataset;

/// How many example ids to list for each side.
pub(crate) const EXAMPLES: usize = 10;

/// What `pipeline compare` requires for a pass.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Thresholds {
    /// Smallest acceptable cosine similarity of a pair.
    pub min_cosine: f64,
    /// Largest acceptable absolute difference of any element of a pair.
    pub max_diff: f64,
    /// Compare only the ids both sides have: ids on one side only are reported, not failed.
    pub shared_ids: bool,
    /// Compare vectors made under different fingerprints (reported, not failed).
    pub allow_different_fingerprints: bool,
}

/// One field in which the two fingerprints differ.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct FieldDifference {
    pub field: String,
    pub a: String,
    pub b: String,
}

/// What `pipeline compare` reports.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CompareReport {
    pub a: String,
    pub b: String,
    /// Each side's campaign fingerprint (null for a dataset not written by embed()).
    pub fingerprint_a: Option<Fingerprint>,
    pub fingerprint_b: Option<Fingerprint>,
    /// Fields in which they differ (all of them when only one side has one).
    pub fingerprint_differences: Vec<FieldDifference>,
    /// Distinct ids in both.
    pub matched: u64,
    /// Distinct ids on one side only.
    pub only_in_a: u64,
    pub only_in_a_examples: Vec<String>,
    pub only_in_b: u64,
    pub only_in_b_examples: Vec<String>,
    /// Ids that occur more than once on a side, and how many such ids.
    pub duplicates_in_a: u64,
    pub duplicates_in_a_examples: Vec<String>,
    pub duplicates_in_b: u64,
    pub duplicates_in_b_examples: Vec<String>,
    /// Shared ids whose vector is NULL on one side only.
    pub null_mismatches: u64,
    /// Over shared ids with a vector on both sides; null when there are none.
    pub min_cosine: Option<f64>,
    pub mean_cosine: Option<f64>,
    pub max_abs_diff: Option<f64>,
    /// The thresholds applied.
    pub thresholds: Thresholds,
    /// The checks that failed, in words; empty when it passed.
    pub failures: Vec<String>,
    /// No check failed.
    pub passed: bool,
}

/// Compare `a` and `b` (each `path`, `path@version` or `path@tag`) on `vector_column` by `id_column` (default: the
/// one `a` was written with).
pub async fn compare(
    a: &str,
    b: &str,
    id_column: Option<&str>,
    vector_column: &str,
    thresholds: Thresholds,
) -> Result<CompareReport> {
    // NOTE: DataFusion 54's join selection may swap the sides of the vector join, and its projection
    // pushdown then fails on the two vector columns ("Schema mismatch", seen with two small datasets
    // under different fingerprints). The sides stay as written.
    let config = datafusion::prelude::SessionConfig::new().set_bool("datafusion.optimizer.join_reordering", false);
    let ctx = SessionContext::new_with_config(config);
    let mut fingerprints = Vec::new();
    // Unless given: the id column `a` was written with.
    let mut id_column = id_column.map(str::to_string);
    for (name, location) in [("a", a), ("b", b)] {
        let ds = open_dataset(location).await?;
        let id_column = id_column.get_or_insert_with(|| crate::lance::records::id_column_of(&ds, None)).clone();
        for col in [id_column.as_str(), vector_column] {
            if ds.schema().field(col).is_none() {
                return Err(Error::lance(location, format!("has no column `{col}`")));
            }
        }
        fingerprints.push(fingerprint_of_dataset(&ds).map_err(|e| Error::lance_from(location, e))?);
        ctx.register_table(name, Arc::new(LanceTableProvider::new(Arc::new(ds), false, false)))
            .map_err(|e| Error::lance_from(location, e))?;
    }
    let (id, v) = (crate::lance::quote_ident(&id_column.unwrap_or_default()), crate::lance::quote_ident(vector_column));
    let err = |e: datafusion::error::DataFusionError| Error::lance_from(format!("{a} vs {b}"), e);
    let ids_of = |sql: String| {
        let ctx = ctx.clone();
        async move { distinct_ids(&ctx, &sql).await.map_err(err) }
    };

    let (only_a, ex_a) = ids_of(format!("SELECT DISTINCT a.{id} FROM a LEFT ANTI JOIN b ON a.{id} = b.{id}")).await?;
    let (only_b, ex_b) = ids_of(format!("SELECT DISTINCT b.{id} FROM b LEFT ANTI JOIN a ON b.{id} = a.{id}")).await?;
    let (dup_a, dup_ex_a) = ids_of(format!("SELECT {id} FROM a GROUP BY {id} HAVING count(*) > 1")).await?;
    let (dup_b, dup_ex_b) = ids_of(format!("SELECT {id} FROM b GROUP BY {id} HAVING count(*) > 1")).await?;
    let (matched, _) = ids_of(format!("SELECT DISTINCT a.{id} FROM a JOIN b ON a.{id} = b.{id}")).await?;

    let sql = format!("SELECT a.{v} AS va, b.{v} AS vb FROM a JOIN b ON a.{id} = b.{id}");
    let pairs = ctx.sql(&sql).await.map_err(err)?.execute_stream().await.map_err(err)?;
    let (null_mismatches, min_cosine, mean_cosine, max_abs_diff) = compare_pairs(pairs, &format!("{a} vs {b}")).await?;
    let fingerprint_differences = fingerprint_differences(fingerprints[0].as_ref(), fingerprints[1].as_ref());
    let mut report = CompareReport {
        a: a.to_string(),
        b: b.to_string(),
        fingerprint_b: fingerprints.pop().flatten(),
        fingerprint_a: fingerprints.pop().flatten(),
        fingerprint_differences,
        matched,
        only_in_a: only_a,
        only_in_a_examples: ex_a,
        only_in_b: only_b,
        only_in_b_examples: ex_b,
        duplicates_in_a: dup_a,
        duplicates_in_a_examples: dup_ex_a,
        duplicates_in_b: dup_b,
        duplicates_in_b_examples: dup_ex_b,
        null_mismatches,
        min_cosine,
        mean_cosine,
        max_abs_diff,
        thresholds,
        failures: Vec::new(),
        passed: false,
    };
    report.failures = report.failed_checks();
    report.passed = report.failures.is_empty();
    Ok(report)
}

/// The rows of `pairs` (a vector of each side per row), compared: rows with a vector on one side only, and
/// the smallest and mean cosine and largest absolute difference over the rows with both.
async fn compare_pairs(
    mut pairs: datafusion::execution::SendableRecordBatchStream,
    label: &str,
) -> Result<(u64, Option<f64>, Option<f64>, Option<f64>)> {
    let err = |e: datafusion::error::DataFusionError| Error::lance_from(label, e);
    let (mut null_mismatches, mut n, mut sum) = (0u64, 0u64, 0f64);
    let (mut min_cos, mut max_abs) = (f64::INFINITY, 0f64);
    while let Some(batch) = pairs.next().await {
        let batch = batch.map_err(err)?;
        let (va, vb) = (batch.column(0).as_fixed_size_list(), batch.column(1).as_fixed_size_list());
        for i in 0..batch.num_rows() {
            match (va.is_valid(i), vb.is_valid(i)) {
                (true, true) => {}
                (false, false) => continue,
                _ => {
                    null_mismatches += 1;
                    continue;
                }
            }
            // float16 vectors (embed.precision) are compared as the float32 values they stand for.
            let as_f32 =
                |a: datafusion::arrow::array::ArrayRef| cast(&a, &DataType::Float32).map_err(|e| err(e.into()));
            let (x, y) = (as_f32(va.value(i))?, as_f32(vb.value(i))?);
            let (x, y) = (x.as_primitive::<Float32Type>().values(), y.as_primitive::<Float32Type>().values());
            if x.len() != y.len() {
                return Err(Error::lance(label, format!("vectors of {} and {} dimensions", x.len(), y.len())));
            }
            let (c, d) = cosine_and_max_diff(x, y);
            min_cos = min_cos.min(c);
            max_abs = max_abs.max(d);
            sum += c;
            n += 1;
        }
    }
    Ok(if n > 0 {
        (null_mismatches, Some(min_cos), Some(sum / n as f64), Some(max_abs))
    } else {
        (null_mismatches, None, None, None)
    })
}

/// How many rows the query's single column gives, with the first few as examples (strings).
pub(crate) async fn distinct_ids(ctx: &SessionContext, sql: &str) -> datafusion::error::Result<(u64, Vec<String>)> {
    let mut stream = ctx.sql(sql).await?.execute_stream().await?;
    let (mut count, mut examples) = (0u64, Vec::new());
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let ids = datafusion::arrow::compute::cast(batch.column(0), &datafusion::arrow::datatypes::DataType::Utf8)?;
        for s in ids.as_string::<i32>().iter().take(EXAMPLES.saturating_sub(examples.len())) {
            examples.push(s.unwrap_or("NULL").to_string());
        }
        count += batch.num_rows() as u64;
    }
    Ok((count, examples))
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

fn fingerprint_differences(a: Option<&Fingerprint>, b: Option<&Fingerprint>) -> Vec<FieldDifference> {
    let diff = |(field, a, b)| FieldDifference { field, a, b };
    match (a, b) {
        (Some(a), Some(b)) => a.differences(b).into_iter().map(diff).collect(),
        (None, None) => Vec::new(),
        (a, b) => {
            let say = |f: Option<&Fingerprint>| f.map_or("none (not written by embed())".into(), |f| f.to_json());
            vec![FieldDifference { field: "fingerprint".into(), a: say(a), b: say(b) }]
        }
    }
}

impl CompareReport {
    /// Each check that failed, in words.
    fn failed_checks(&self) -> Vec<String> {
        let t = &self.thresholds;
        let mut failed = Vec::new();
        if !self.fingerprint_differences.is_empty() && !t.allow_different_fingerprints {
            let fields: Vec<&str> = self.fingerprint_differences.iter().map(|d| d.field.as_str()).collect();
            failed.push(format!(
                "fingerprints differ ({}; --allow-different-fingerprints compares anyway)",
                fields.join(", ")
            ));
        }
        if (self.only_in_a > 0 || self.only_in_b > 0) && !t.shared_ids {
            failed.push(format!(
                "ids differ ({} only in A, {} only in B; --shared-ids compares the common ones only)",
                self.only_in_a, self.only_in_b
            ));
        }
        if self.matched == 0 {
            failed.push("no id is in both".into());
        }
        if self.duplicates_in_a > 0 || self.duplicates_in_b > 0 {
            failed.push(format!("duplicate ids ({} in A, {} in B)", self.duplicates_in_a, self.duplicates_in_b));
        }
        if self.null_mismatches > 0 {
            failed.push(format!("{} vectors NULL on one side only", self.null_mismatches));
        }
        if let Some(c) = self.min_cosine.filter(|c| *c < t.min_cosine) {
            failed.push(format!("min cosine {c:.7} below {}", t.min_cosine));
        }
        if let Some(d) = self.max_abs_diff.filter(|d| *d > t.max_diff) {
            failed.push(format!("max abs difference {d:.3e} above {:e}", t.max_diff));
        }
        failed
    }

    /// The human-readable form.
    pub fn to_text(&self) -> String {
        let f = |x: Option<f64>| x.map(|v| format!("{v:.7}")).unwrap_or_else(|| "n/a".into());
        let mut out = format!("compare {} (A) with {} (B)\n", self.a, self.b);
        let model = |fp: &Option<Fingerprint>| {
            fp.as_ref().map_or("none (not written by embed())".into(), |f| {
                format!(
                    "{} ({}…, {}, {} dims)",
                    f.model,
                    &f.model_sha256[..f.model_sha256.len().min(12)],
                    f.pooling,
                    f.dim
                )
            })
        };
        out += &format!(
            "  fingerprint A: {}\n  fingerprint B: {}\n",
            model(&self.fingerprint_a),
            model(&self.fingerprint_b)
        );
        if self.fingerprint_differences.is_empty() {
            out += "  fingerprints: equal\n";
        }
        for d in &self.fingerprint_differences {
            out += &format!("  fingerprints differ in {}: A {}, B {}\n", d.field, d.a, d.b);
        }
        out += &format!("  ids in both: {}\n", self.matched);
        out += &format!("  ids only in A: {}{}\n", self.only_in_a, examples(&self.only_in_a_examples));
        out += &format!("  ids only in B: {}{}\n", self.only_in_b, examples(&self.only_in_b_examples));
        if self.duplicates_in_a + self.duplicates_in_b > 0 {
            out += &format!(
                "  ids more than once in A: {}{}\n",
                self.duplicates_in_a,
                examples(&self.duplicates_in_a_examples)
            );
            out += &format!(
                "  ids more than once in B: {}{}\n",
                self.duplicates_in_b,
                examples(&self.duplicates_in_b_examples)
            );
        }
        if self.null_mismatches > 0 {
            out += &format!("  NULL on one side only: {}\n", self.null_mismatches);
        }
        out += &format!("  cosine: min {}, mean {}\n", f(self.min_cosine), f(self.mean_cosine));
        out += &format!(
            "  max abs difference: {}\n",
            self.max_abs_diff.map(|v| format!("{v:.3e}")).unwrap_or_else(|| "n/a".into())
        );
        let t = &self.thresholds;
        if self.passed {
            out += &format!("  PASS (min cosine >= {}, max abs difference <= {:e})\n", t.min_cosine, t.max_diff);
        } else {
            out += &format!("  FAIL: {}\n", self.failures.join("; "));
        }
        out
    }
}

/// ` (e.g. a, b)`, or nothing for no examples.
pub fn examples(ids: &[String]) -> String {
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
