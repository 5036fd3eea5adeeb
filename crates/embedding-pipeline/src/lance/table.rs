//! `CREATE EXTERNAL TABLE t STORED AS LANCE LOCATION '…' [OPTIONS ('version' '3' | 'tag' 'name')]`,
//! and `INSERT INTO t …`, which appends a new version through the same sink as COPY.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::common::{Result, not_impl_err, plan_err};
use datafusion::datasource::TableType;
use datafusion::datasource::sink::DataSinkExec;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{CreateExternalTable, Expr, LogicalPlan, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use lance::datafusion::LanceTableProvider;
use lance::dataset::builder::DatasetBuilder;

use super::{LanceSink, dataset_uri};
use crate::campaign::Fingerprint;
use crate::campaign::metrics::RunMetrics;
use crate::error::Error;
use crate::options::EmbedOptions;
use datafusion::arrow::datatypes::DataType;

/// Builds [`LanceTable`]s for `STORED AS LANCE`.
#[derive(Debug)]
pub struct LanceTableFactory {
    metrics: Arc<RunMetrics>,
}

impl LanceTableFactory {
    /// A factory whose tables' sinks report into `metrics`.
    pub fn new(metrics: Arc<RunMetrics>) -> Self {
        Self { metrics }
    }
}

#[async_trait]
impl TableProviderFactory for LanceTableFactory {
    async fn create(&self, _state: &dyn Session, cmd: &CreateExternalTable) -> Result<Arc<dyn TableProvider>> {
        let uri = dataset_uri(&cmd.location);
        let mut builder = DatasetBuilder::from_uri(&uri);
        let mut pinned = None;
        for (key, value) in &cmd.options {
            match key.strip_prefix("format.").unwrap_or(key) {
                "version" => {
                    let v: u64 = value.parse().map_err(|_| {
                        datafusion::error::DataFusionError::Plan(format!(
                            "table {}: option version '{value}' is not a version number",
                            cmd.name
                        ))
                    })?;
                    builder = builder.with_version(v);
                    pinned = Some(format!("version {v}"));
                }
                "tag" => {
                    builder = builder.with_tag(value);
                    pinned = Some(format!("tag '{value}'"));
                }
                other => {
                    return plan_err!(
                        "table {}: unknown option '{other}' for STORED AS LANCE; use 'version' or 'tag'",
                        cmd.name
                    );
                }
            }
        }
        let dataset = builder.load().await.map_err(|e| {
            let message = format!(
                "cannot open ({}); create it first with COPY (…) TO '{}' STORED AS LANCE",
                super::lance_message(&e),
                cmd.location
            );
            Error::lance_because(cmd.location.clone(), message, e)
        })?;
        let dataset = Arc::new(dataset);
        let provider = LanceTableProvider::new(dataset, false, false);
        Ok(Arc::new(LanceTable { uri, provider, pinned, metrics: Arc::clone(&self.metrics) }))
    }
}

/// A Lance dataset as a SQL table: reads the latest version at each scan (or the pinned one), and
/// appends new versions on INSERT.
#[derive(Debug)]
pub struct LanceTable {
    uri: String,
    provider: LanceTableProvider,
    pinned: Option<String>,
    metrics: Arc<RunMetrics>,
}

impl LanceTable {
    /// The dataset's URI.
    pub fn uri(&self) -> &str {
        &self.uri
    }
}

#[async_trait]
impl TableProvider for LanceTable {
    fn schema(&self) -> SchemaRef {
        self.provider.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn get_logical_plan(&'_ self) -> Option<Cow<'_, LogicalPlan>> {
        None
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if self.pinned.is_none() {
            // Unpinned: the latest version at scan time, so that a job reads what its own earlier
            // statements wrote.
            let latest = DatasetBuilder::from_uri(&self.uri).load().await.map_err(|e| {
                Error::lance_because(
                    self.uri.clone(),
                    format!("cannot open its latest version ({})", super::lance_message(&e)),
                    e,
                )
            })?;
            let provider = LanceTableProvider::new(Arc::new(latest), false, false);
            if provider.schema().fields() != self.provider.schema().fields() {
                return plan_err!(
                    "the columns of the Lance dataset {} changed since its table was created; run its CREATE \
                     EXTERNAL TABLE again",
                    self.uri
                );
            }
            return provider.scan(state, projection, filters, limit).await;
        }
        self.provider.scan(state, projection, filters, limit).await
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> Result<Vec<TableProviderFilterPushDown>> {
        self.provider.supports_filters_pushdown(filters)
    }

    async fn insert_into(
        &self,
        state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if insert_op != InsertOp::Append {
            return not_impl_err!("{insert_op} into a Lance table is not supported; use INSERT INTO");
        }
        if let Some(pinned) = &self.pinned {
            return plan_err!(
                "this Lance table is pinned to {pinned}; INSERT into a table created without 'version' or 'tag'"
            );
        }
        // NOTE: an INSERT's physical input has lost embed()'s field metadata (see sink.rs), so vector
        // columns are taken to be made under the session's current embed.* settings.
        let has_vectors = input.schema().fields().iter().any(
            |f| matches!(f.data_type(), DataType::FixedSizeList(child, _) if child.data_type() == &DataType::Float32),
        );
        let fingerprint = if has_vectors {
            let options = EmbedOptions::from_config(state.config_options());
            Some(Fingerprint::for_options(&options).map(|(_, fp)| fp)?)
        } else {
            None
        };
        let sink = LanceSink::try_new(self.uri.clone(), self.schema(), fingerprint, Arc::clone(&self.metrics))?;
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }
}
