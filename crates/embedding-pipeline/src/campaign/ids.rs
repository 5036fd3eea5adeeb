//! Checking a campaign's ids before anything is embedded: the id column must be present, non-NULL and
//! unique. The check runs the campaign's own input plan projected to the id column, so DataFusion
//! prunes the `embed()` call and only scans ids.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::Result;
use datafusion::dataframe::DataFrame;
use datafusion::execution::SessionState;
use datafusion::functions_aggregate::expr_fn::{count, sum};
use datafusion::logical_expr::{LogicalPlan, ident, lit, when};

/// How many example ids an error lists.
const EXAMPLES: usize = 5;

/// What the id check found.
#[derive(Debug, Clone, PartialEq)]
pub struct IdCheck {
    /// Input rows.
    pub rows: u64,
    /// Rows whose id is NULL.
    pub nulls: u64,
    /// Ids that occur more than once.
    pub duplicated: u64,
    /// The lowest few duplicated ids, in order.
    pub duplicate_examples: Vec<String>,
}

impl IdCheck {
    /// None when the ids are fine, or the reason they are not.
    pub fn problem(&self, column: &str) -> Option<String> {
        if self.nulls == 0 && self.duplicated == 0 {
            return None;
        }
        let mut parts = Vec::new();
        if self.nulls > 0 {
            parts.push(format!("{} rows have a NULL {column}", self.nulls));
        }
        if self.duplicated > 0 {
            parts.push(format!(
                "{} ids occur more than once (first: {})",
                self.duplicated,
                self.duplicate_examples.join(", ")
            ));
        }
        Some(format!(
            "the input's id column `{column}` must be non-NULL and unique: {}. Nothing was embedded or written; \
             fix the ids, or SET embed.id_column to a column that is unique",
            parts.join("; ")
        ))
    }
}

/// Refuse a write whose output has no id column, or one of floating-point numbers: ids are integers or strings,
/// which compare exactly (1.0 and 0.1 + 0.9 need not be the same id, and NaN is no id at all).
pub fn require_id_column(input: &LogicalPlan, column: &str) -> Result<()> {
    let Some(field) = input.schema().fields().iter().find(|f| f.name() == column) else {
        return datafusion::common::plan_err!(
            "the output has no id column `{column}`; select one (SELECT {column}, embed(text) …), or SET embed.id_column"
        );
    };
    if field.data_type().is_floating() || matches!(field.data_type(), DataType::Dictionary(_, v) if v.is_floating()) {
        return datafusion::common::plan_err!(
            "the id column `{column}` holds floating-point numbers ({}); ids are integers or strings, which compare \
             exactly. Cast it (SELECT CAST({column} AS BIGINT) AS {column}, … or CAST({column} AS VARCHAR)), or SET \
             embed.id_column to another column",
            field.data_type()
        );
    }
    Ok(())
}

/// Check the ids of `input`, the plan whose rows a campaign writes, in one pass over them: the ids are
/// grouped (a grouped aggregation, which can spill to disk), and the groups counted.
pub async fn check_ids(state: &SessionState, input: &LogicalPlan, column: &str) -> Result<IdCheck> {
    require_id_column(input, column)?;
    let ids = DataFrame::new(state.clone(), input.clone()).select(vec![ident(column).alias("id")])?;
    let groups = ids.aggregate(vec![ident("id")], vec![count(lit(1)).alias("n")])?;
    let totals = groups
        .clone()
        .aggregate(
            vec![],
            vec![
                sum(ident("n")).alias("rows"),
                sum(when(ident("id").is_null(), ident("n")).otherwise(lit(0i64))?).alias("nulls"),
                sum(when(ident("id").is_not_null().and(ident("n").gt(lit(1i64))), lit(1i64)).otherwise(lit(0i64))?)
                    .alias("duplicated"),
            ],
        )?
        .collect()
        .await?;
    let get = |i: usize| {
        totals.first().map_or(0, |b| {
            let c = b.column(i).as_primitive::<Int64Type>();
            if c.is_null(0) { 0 } else { c.value(0) as u64 }
        })
    };
    let (rows, nulls, duplicated) = (get(0), get(1), get(2));
    let examples = if duplicated == 0 {
        Vec::new()
    } else {
        let batches = groups
            .filter(ident("id").is_not_null().and(ident("n").gt(lit(1i64))))?
            // The lowest, so that the message is the same on every run (the groups come in hash order).
            .sort(vec![ident("id").sort(true, false)])?
            .limit(0, Some(EXAMPLES))?
            .collect()
            .await?;
        let mut found = Vec::new();
        for b in &batches {
            let c = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8)?;
            found.extend(c.as_string::<i32>().iter().map(|s| s.unwrap_or_default().to_string()));
        }
        found
    };
    Ok(IdCheck { rows, nulls, duplicated, duplicate_examples: examples })
}
