//! `embed_search('dataset', 'query' [, k])`: the table of a dataset's `k` (default 10) nearest rows to a query,
//! nearest first, embedded exactly as the dataset's vectors were; every column but the vectors, and
//! `_distance`. The same search as `pipeline search`, in SQL, so its hits join back to the sources:
//! `SELECT h.id, h._distance, d.text FROM embed_search('out/docs.lance', 'a talking dog', 5) h JOIN docs d USING (id)`.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{DataFusionError, Result, ScalarValue, plan_err};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use crate::search::{SearchOptions, hit_fields, nearest};

/// The table function.
#[derive(Debug, Default)]
pub struct EmbedSearchFunc;

const USAGE: &str = "embed_search('dataset', 'query text' [, k]): a dataset path (or path@version), the query, and how many rows (default 10)";

impl TableFunctionImpl for EmbedSearchFunc {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let text = |e: &Expr, what: &str| match e {
            Expr::Literal(v, _) => match v.try_as_str() {
                Some(Some(t)) => Ok(t.to_string()),
                _ => plan_err!("embed_search: {what} must be a text constant (it is {v}); {USAGE}"),
            },
            other => plan_err!("embed_search: {what} must be a constant (it is `{other}`); {USAGE}"),
        };
        let (dataset, query, k) = match args.exprs() {
            [d, q] => (text(d, "the dataset")?, text(q, "the query")?, 10),
            [d, q, k] => (text(d, "the dataset")?, text(q, "the query")?, whole_k(k)?),
            other => return plan_err!("embed_search: {} arguments given; {USAGE}", other.len()),
        };
        let request = SearchOptions::new(&dataset, &query, k);
        let schema = hit_schema(&dataset)?;
        Ok(Arc::new(SearchTable { request, schema }))
    }
}

/// `k`: a whole number, at least 1 (not `2.5`, not `'5'`).
fn whole_k(k: &Expr) -> Result<usize> {
    let value = match k {
        Expr::Literal(v, _) if v.data_type().is_integer() => match v.cast_to(&DataType::Int64) {
            Ok(ScalarValue::Int64(Some(k))) => Some(k),
            _ => None,
        },
        _ => None,
    };
    match value {
        Some(k) if k >= 1 => Ok(k as usize),
        _ => plan_err!("embed_search: k, how many rows, must be a whole number of at least 1 (it is `{k}`); {USAGE}"),
    }
}

/// The columns of a search's hits: the dataset's, less its vectors, then `_distance`. Planning is synchronous
/// and the dataset's schema needs a read, so it is opened on a thread of its own with a runtime of its own
/// (which works under any runtime the caller plans on, and under none).
fn hit_schema(dataset: &str) -> Result<SchemaRef> {
    let open = || -> Result<SchemaRef> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let ds = runtime.block_on(crate::lance::open_dataset(dataset)).map_err(DataFusionError::from)?;
        Ok(Arc::new(Schema::new(hit_fields(ds.schema()))))
    };
    std::thread::scope(|s| s.spawn(open).join()).unwrap_or_else(|_| plan_err!("embed_search: opening {dataset} failed"))
}

/// One search, run when the query is executed.
#[derive(Debug)]
struct SearchTable {
    request: SearchOptions,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for SearchTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // NOTE: the search runs here, at physical planning, as a Lance scan would open its dataset: it only
        // reads. The query is embedded once per plan.
        let hits = nearest(&self.request).await.map_err(|e| {
            DataFusionError::Plan(format!("embed_search({}): {}", self.request.dataset, e.chain_text()))
        })?;
        // Nullability as the planned schema says, whatever Lance's own flags.
        let hits = datafusion::arrow::array::RecordBatch::try_new(Arc::clone(&self.schema), hits.columns().to_vec())?;
        Ok(MemorySourceConfig::try_new_exec(&[vec![hits]], Arc::clone(&self.schema), projection.cloned())?)
    }
}
