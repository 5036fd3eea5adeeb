//! Checks of the model on a sample of a job's corpus, before a campaign relies on it:
//!
//! - [`check_invariance`]: does a vector depend on its batch neighbours? Some exported or quantised models
//!   change a text's vector with the padding and rows around it; a campaign needs to know before it starts.
//! - [`compare_order`]: the same rows embedded in length order and in the original order, side by side, in
//!   useful tokens so that a change that only moves padding cannot pass for a gain; and the largest per-id
//!   difference between the two orders' vectors.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float32Type};
use datafusion::datasource::MemTable;
use serde::Serialize;

use super::plan::{JobWrites, load_job};
use crate::campaign::Fingerprint;
use crate::model::TextEmbedder;
use crate::ops::compare::cosine_and_max_diff;
use crate::options::EmbedOptions;
use crate::session::EmbedSession;
use crate::{Error, Result};

/// Where a check's sample comes from: a job file, with the values of its `${NAME}` variables (`--var`), and a text
/// column of a table its set-up creates (by default its first source that is not Lance).
#[derive(Debug, Clone)]
pub struct SampleSource {
    pub file: PathBuf,
    pub vars: BTreeMap<String, String>,
    /// The source table (default: the job's first source that is not Lance).
    pub table: Option<String>,
    /// The text column.
    pub column: String,
}

impl SampleSource {
    /// The texts of column `text` of the job `file`'s first source that is not Lance, with no variables given.
    pub fn new(file: impl Into<PathBuf>) -> Self {
        Self { file: file.into(), vars: BTreeMap::new(), table: None, column: "text".into() }
    }

    /// A session with the job's set-up done (its SET, RESET, CREATE and DROP statements, by the walk the other
    /// preparations use; its writes and Lance tables left alone), and the source table.
    pub async fn prepare(&self) -> Result<(EmbedSession, String)> {
        let (session, statements) = load_job(&self.file, &self.vars)?;
        let first = JobWrites::new(&self.file, &session, &statements).run_setup().await?;
        let table = self.table.clone().or(first).ok_or_else(|| {
            Error::Refused(format!("{} creates no source table; name one with --table", self.file.display()))
        })?;
        Ok((session, table))
    }
}

/// What the check found.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct InvarianceReport {
    pub table: String,
    pub sample: usize,
    /// Model calls the batched pass made.
    pub batched_calls: u64,
    pub max_abs_diff: f64,
    pub min_cosine: f64,
    /// The start of the text with the largest difference.
    pub worst_text: String,
    pub max_diff_threshold: f64,
    pub passed: bool,
}

/// Run the job's set-up statements, draw the sample, embed it both ways and report.
pub async fn check_invariance(source: &SampleSource, sample: usize, max_diff: f64) -> Result<InvarianceReport> {
    let (session, table) = source.prepare().await?;
    let column = &source.column;
    let ctx = session.context();
    let sql =
        format!("SELECT CAST(\"{column}\" AS VARCHAR) FROM {table} WHERE \"{column}\" IS NOT NULL LIMIT {sample}");
    let batches = ctx.sql(&sql).await?.collect().await?;
    let texts: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            b.column(0).as_string_view().iter().map(|s| s.unwrap_or_default().to_string()).collect::<Vec<_>>()
        })
        .collect();
    if texts.is_empty() {
        return Err(Error::Refused(format!("table {table} has no non-NULL {column} to sample")));
    }

    let options = EmbedOptions::from_config(ctx.state().config_options());
    let (settings, _) = Fingerprint::for_options(&options)?;
    let embedder = options.embedder()?;
    let report = tokio::task::spawn_blocking(move || -> Result<InvarianceReport> {
        let all: Vec<Option<&str>> = texts.iter().map(|t| Some(t.as_str())).collect();
        let batched = embedder.embed(&all, &settings)?;
        let dim = settings.out_dim(embedder.spec());
        let (mut worst, mut worst_row, mut min_cos) = (0f64, 0usize, f64::INFINITY);
        for (i, t) in texts.iter().enumerate() {
            let alone = embedder.embed(&[Some(t.as_str())], &settings)?;
            let (c, d) = cosine_and_max_diff(&alone.vectors, &batched.vectors[i * dim..(i + 1) * dim]);
            min_cos = min_cos.min(c);
            if d > worst || i == 0 {
                (worst, worst_row) = (d, i);
            }
        }
        Ok(InvarianceReport {
            table,
            sample: texts.len(),
            batched_calls: batched.stats.model_calls,
            max_abs_diff: worst,
            min_cosine: min_cos,
            worst_text: texts[worst_row].chars().take(60).collect(),
            max_diff_threshold: max_diff,
            passed: worst <= max_diff,
        })
    })
    .await??;
    Ok(report)
}

/// One order's figures.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct OrderRun {
    pub order: String,
    pub documents: u64,
    pub useful_tokens: u64,
    pub processed_tokens: u64,
    pub padding_efficiency: f64,
    pub useful_tokens_per_second: f64,
    pub wall_seconds: f64,
    pub model_calls: u64,
}

/// What `compare-order` reports.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct OrderComparison {
    pub table: String,
    pub sample: usize,
    pub length: OrderRun,
    pub original: OrderRun,
    /// useful tokens/s in length order over the original order.
    pub speedup: f64,
    /// Largest absolute difference between one id's vectors in the two orders.
    pub max_abs_diff: f64,
    pub passed: bool,
}

/// Embed a sample of the job's corpus in both orders and compare.
pub async fn compare_order(source: &SampleSource, sample: usize) -> Result<OrderComparison> {
    let (session, table) = source.prepare().await?;
    let column = &source.column;
    let ctx = session.context();
    let id = crate::EmbedOptions::from_config(ctx.state().config_options()).id_column;
    let rows = ctx
        .sql(&format!("SELECT CAST(\"{id}\" AS VARCHAR) AS id, \"{column}\" AS text FROM {table} LIMIT {sample}"))
        .await?
        .collect()
        .await?;
    let schema = rows.first().map(|b| b.schema()).ok_or_else(|| Error::Refused(format!("table {table} is empty")))?;
    ctx.register_table("__sample", Arc::new(MemTable::try_new(schema, vec![rows])?))?;

    // Each order writes a scratch Lance dataset, as a campaign does: the ordering stage applies to writes.
    let scratch = tempfile::tempdir().map_err(|e| Error::file("cannot make a scratch folder", e))?;
    let mut runs = Vec::new();
    let mut vectors = Vec::new();
    for order in ["length", "original"] {
        ctx.sql(&format!("SET embed.order = '{order}'")).await?;
        let out = scratch.path().join(format!("{order}.lance"));
        let before = session.metrics().embed_stats();
        let started = Instant::now();
        ctx.sql(&format!("COPY (SELECT id, embed(text) AS v FROM __sample) TO '{}' STORED AS LANCE", out.display()))
            .await?
            .collect()
            .await?;
        let wall = started.elapsed().as_secs_f64();
        ctx.sql(&format!("CREATE EXTERNAL TABLE \"__{order}\" STORED AS LANCE LOCATION '{}'", out.display())).await?;
        let batches = ctx.sql(&format!("SELECT id, v FROM \"__{order}\"")).await?.collect().await?;
        let s = session.metrics().embed_stats().since(&before);
        runs.push(OrderRun {
            order: order.to_string(),
            documents: s.docs,
            useful_tokens: s.useful_tokens,
            processed_tokens: s.processed_tokens,
            padding_efficiency: s.useful_tokens as f64 / (s.processed_tokens as f64).max(1.0),
            useful_tokens_per_second: s.useful_tokens as f64 / wall.max(1e-9),
            wall_seconds: wall,
            model_calls: s.model_calls,
        });
        vectors.push(by_id(&batches));
    }
    let mut max_abs_diff = 0f64;
    for (id, a) in &vectors[0] {
        let b = vectors[1].get(id).ok_or_else(|| Error::Internal(format!("id {id} came back in one order only")))?;
        if let (Some(a), Some(b)) = (a, b) {
            max_abs_diff = max_abs_diff.max(cosine_and_max_diff(a, b).1);
        }
    }
    let original = runs.pop().expect("two runs");
    let length = runs.pop().expect("two runs");
    let report = OrderComparison {
        table,
        sample: vectors[0].len(),
        speedup: length.useful_tokens_per_second / original.useful_tokens_per_second.max(1e-9),
        length,
        original,
        max_abs_diff,
        passed: max_abs_diff <= 1e-5,
    };
    Ok(report)
}

fn by_id(batches: &[RecordBatch]) -> HashMap<String, Option<Vec<f32>>> {
    let mut out = HashMap::new();
    for b in batches {
        let ids = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).expect("ids cast to text");
        let ids = ids.as_string::<i32>();
        let v = b.column(1).as_fixed_size_list();
        for i in 0..b.num_rows() {
            let vec = v.is_valid(i).then(|| v.value(i).as_primitive::<Float32Type>().values().to_vec());
            out.insert(ids.value(i).to_string(), vec);
        }
    }
    out
}
