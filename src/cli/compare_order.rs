//! `pipeline compare-order job.sql [--sample N] [--json]`: the same rows embedded in length order and
//! in the original order, side by side, in useful tokens so that a change that only moves padding
//! cannot pass for a gain; and the largest per-id difference between the two orders' vectors.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float32Type};
use datafusion::datasource::MemTable;
use serde::Serialize;

use crate::lance::compare::cosine_and_max_diff;

/// One order's figures.
#[derive(Debug, Serialize)]
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
#[derive(Debug, Serialize)]
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
pub async fn compare_order(
    file: &Path,
    sample: usize,
    table: Option<&str>,
    column: &str,
    json: bool,
) -> anyhow::Result<()> {
    let (session, table) = super::job::prepare(file, table).await?;
    let ctx = session.context();
    let id = crate::EmbedOptions::from_config(ctx.state().config_options()).id_column;
    let rows = ctx
        .sql(&format!("SELECT CAST(\"{id}\" AS VARCHAR) AS id, \"{column}\" AS text FROM {table} LIMIT {sample}"))
        .await?
        .collect()
        .await?;
    let schema = rows.first().map(|b| b.schema()).ok_or_else(|| anyhow!("table {table} is empty"))?;
    ctx.register_table("__sample", Arc::new(MemTable::try_new(schema, vec![rows])?))?;

    // Each order writes a scratch Lance dataset, as a campaign does: the ordering stage applies to writes.
    let scratch = tempfile::tempdir()?;
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
        let b = vectors[1].get(id).ok_or_else(|| anyhow!("id {id} came back in one order only"))?;
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
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    if !report.passed {
        bail!("vectors differ between the two orders by up to {:.3e}", report.max_abs_diff);
    }
    Ok(())
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

impl OrderComparison {
    /// The side-by-side table.
    pub fn to_text(&self) -> String {
        let r = |f: &dyn Fn(&OrderRun) -> String| format!("{:>14} {:>14}", f(&self.length), f(&self.original));
        let mut out =
            format!("{} rows of {}\n{:<22} {:>14} {:>14}\n", self.sample, self.table, "", "length", "original");
        out += &format!("{:<22} {}\n", "documents", r(&|x| x.documents.to_string()));
        out += &format!("{:<22} {}\n", "useful tokens", r(&|x| x.useful_tokens.to_string()));
        out += &format!("{:<22} {}\n", "processed tokens", r(&|x| x.processed_tokens.to_string()));
        out += &format!("{:<22} {}\n", "padding efficiency", r(&|x| format!("{:.3}", x.padding_efficiency)));
        out += &format!("{:<22} {}\n", "model calls", r(&|x| x.model_calls.to_string()));
        out += &format!("{:<22} {}\n", "useful tokens/s", r(&|x| format!("{:.0}", x.useful_tokens_per_second)));
        out += &format!("{:<22} {}\n", "wall s", r(&|x| format!("{:.2}", x.wall_seconds)));
        out += &format!("length order is {:.2}x the original order in useful tokens/s\n", self.speedup);
        out += &format!(
            "largest per-id vector difference: {:.3e} ({})\n",
            self.max_abs_diff,
            if self.passed { "PASS, at most 1e-5" } else { "FAIL, above 1e-5" }
        );
        out
    }
}
