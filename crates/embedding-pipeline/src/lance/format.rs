//! `COPY (query) TO 'x.lance' STORED AS LANCE`: DataFusion finds a COPY target's writer through a
//! registered file format, so Lance gets one whose only job is to plan the [`LanceSink`].
//! Reading goes through [`super::LanceTableFactory`] instead.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::{GetExt, Result, Statistics, not_impl_err};
use datafusion::datasource::file_format::arrow::ArrowFormat;
use datafusion::datasource::file_format::file_compression_type::FileCompressionType;
use datafusion::datasource::file_format::{FileFormat, FileFormatFactory};
use datafusion::datasource::physical_plan::{FileScanConfig, FileSinkConfig, FileSource};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::object_store::{ObjectMeta, ObjectStore};
use datafusion::physical_expr::LexRequirement;
use datafusion::physical_plan::ExecutionPlan;

use super::sink::fingerprint_of_columns;
use super::{LanceSink, dataset_uri};
use crate::campaign::metrics::RunMetrics;

const READ_HINT: &str = "read a Lance dataset with CREATE EXTERNAL TABLE t STORED AS LANCE LOCATION '…'";

/// Registers `LANCE` as a COPY target.
#[derive(Debug)]
pub struct LanceFormatFactory {
    metrics: Arc<RunMetrics>,
}

impl LanceFormatFactory {
    /// A factory whose sinks report into `metrics`.
    pub fn new(metrics: Arc<RunMetrics>) -> Self {
        Self { metrics }
    }
}

impl GetExt for LanceFormatFactory {
    fn get_ext(&self) -> String {
        "lance".to_string()
    }
}

impl FileFormatFactory for LanceFormatFactory {
    fn create(&self, _state: &dyn Session, options: &HashMap<String, String>) -> Result<Arc<dyn FileFormat>> {
        if let Some(key) = options.keys().next() {
            return not_impl_err!("COPY … STORED AS LANCE takes no options, got '{key}'");
        }
        Ok(self.default())
    }

    fn default(&self) -> Arc<dyn FileFormat> {
        Arc::new(LanceFormat { metrics: Arc::clone(&self.metrics) })
    }
}

/// The COPY writer for Lance; see the module docs.
#[derive(Debug)]
pub struct LanceFormat {
    metrics: Arc<RunMetrics>,
}

#[async_trait]
impl FileFormat for LanceFormat {
    fn get_ext(&self) -> String {
        "lance".to_string()
    }

    fn get_ext_with_compression(&self, _c: &FileCompressionType) -> Result<String> {
        Ok(self.get_ext())
    }

    fn compression_type(&self) -> Option<FileCompressionType> {
        None
    }

    async fn infer_schema(&self, _s: &dyn Session, _o: &Arc<dyn ObjectStore>, _m: &[ObjectMeta]) -> Result<SchemaRef> {
        not_impl_err!("{READ_HINT}")
    }

    async fn infer_stats(
        &self,
        _s: &dyn Session,
        _o: &Arc<dyn ObjectStore>,
        _t: SchemaRef,
        _m: &ObjectMeta,
    ) -> Result<Statistics> {
        not_impl_err!("{READ_HINT}")
    }

    async fn create_physical_plan(&self, _s: &dyn Session, _c: FileScanConfig) -> Result<Arc<dyn ExecutionPlan>> {
        not_impl_err!("{READ_HINT}")
    }

    async fn create_writer_physical_plan(
        &self,
        input: Arc<dyn ExecutionPlan>,
        _state: &dyn Session,
        conf: FileSinkConfig,
        _order: Option<LexRequirement>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if !conf.table_partition_cols.is_empty() {
            return not_impl_err!("COPY … STORED AS LANCE does not support PARTITIONED BY");
        }
        // The output schema here is the logical one, which still carries embed()'s fingerprint.
        let fingerprint = fingerprint_of_columns(&conf.output_schema)?;
        let sink = LanceSink::try_new(
            dataset_uri(&conf.original_url),
            Arc::clone(&conf.output_schema),
            fingerprint,
            Arc::clone(&self.metrics),
        )?;
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }

    fn file_source(&self, table_schema: TableSchema) -> Arc<dyn FileSource> {
        // NOTE: never used: no listing table is ever built over this format. DataFusion's trait still
        // asks for a source, so hand it Arrow's rather than invent one.
        ArrowFormat.file_source(table_schema)
    }
}
