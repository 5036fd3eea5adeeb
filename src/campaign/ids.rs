//! Checking a campaign's ids before anything is embedded: the id column must be present, non-NULL and
//! unique. The check runs the campaign's own input plan projected to the id column, so DataFusion
//! prunes the `embed()` call and only scans ids.

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::Result;
use datafusion::dataframe::DataFrame;
use datafusion::execution::SessionState;
use datafusion::functions_aggregate::expr_fn::count;
use datafusion::logical_expr::{LogicalPlan, ident, lit};

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
    /// The first few duplicated ids.
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

/// Check the ids of `input`, the plan whose rows a campaign writes.
pub async fn check_ids(state: &SessionState, input: &LogicalPlan, column: &str) -> Result<IdCheck> {
    if input.schema().columns().iter().all(|c| c.name != column) {
        return datafusion::common::plan_err!(
            "the output has no id column `{column}`; select one (SELECT {column}, embed(text) …), or SET embed.id_column"
        );
    }
    let ids = DataFrame::new(state.clone(), input.clone()).select(vec![ident(column)])?;
    let totals = ids
        .clone()
        .aggregate(vec![], vec![count(lit(1)).alias("rows"), count(ident(column)).alias("ids")])?
        .collect()
        .await?;
    let get = |i: usize| totals[0].column(i).as_primitive::<Int64Type>().value(0) as u64;
    let (rows, non_null) = (get(0), get(1));
    // GROUP BY rather than count(DISTINCT): the grouped aggregation can spill to disk.
    let dup_plan = ids
        .filter(ident(column).is_not_null())?
        .aggregate(vec![ident(column)], vec![count(lit(1)).alias("n")])?
        .filter(ident("n").gt(lit(1i64)))?;
    let dup_count = dup_plan.clone().count().await? as u64;
    let examples = if dup_count == 0 {
        Vec::new()
    } else {
        let batches = dup_plan.limit(0, Some(EXAMPLES))?.collect().await?;
        batches
            .iter()
            .flat_map(|b| {
                let c = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).expect("ids cast to text");
                c.as_string::<i32>().iter().map(|s| s.unwrap_or_default().to_string()).collect::<Vec<_>>()
            })
            .collect()
    };
    Ok(IdCheck { rows, nulls: rows - non_null, duplicated: dup_count, duplicate_examples: examples })
}
