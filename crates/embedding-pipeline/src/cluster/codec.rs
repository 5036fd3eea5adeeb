//! How this tool's pieces cross a Ballista cluster: Ballista's own codecs, with `embed` carried as the
//! fingerprint of the vectors it was planned to return.
//!
//! A job's `embed` is planned on the client, whose model fixes its fingerprint (and so the vector type). It
//! reaches the scheduler in the logical plan and each executor in its task's plan as that fingerprint alone:
//! there it becomes [`EmbedUdf::on_cluster`], which returns that vector type and embeds with the job's
//! `embed.*` options (which Ballista hands every task) and the host's device, refusing to embed when the
//! host's model gives another fingerprint. So vectors from a host with another model never mix in.
//!
//! Aggregate and window functions keep the traits' own handling, which Ballista's codecs keep too.

use std::sync::Arc;

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::{Result, TableReference, exec_datafusion_err};
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan, ScalarUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use super::write::{ClusterWriteNode, FragmentWriteExec, TaskPlace, WriteSpec};
use crate::campaign::Fingerprint;
use crate::campaign::metrics::RunMetrics;
use crate::exec::existing_ids::{ExistingIds, ExistingIdsExec};
use crate::options::EmbedOptions;
use crate::udf::EmbedUdf;
use crate::udf::embed::HostOptions;

/// Tags that start this tool's encodings, so that they are told apart from Ballista's own.
const WRITE_TAG: &[u8] = b"embedding-pipeline/write:";
const IDS_TAG: &[u8] = b"embedding-pipeline/ids:";

/// What the done-ids scan carries: the dataset and its id column (and, to an executor, the id type).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct IdsSpec {
    uri: String,
    column: String,
    #[serde(default)]
    schema: Vec<u8>,
    /// The ids the dataset held when the scheduler planned (for the planner's statistics).
    #[serde(default)]
    rows: Option<usize>,
}

fn tagged<T: serde::Serialize>(tag: &[u8], value: &T, buf: &mut Vec<u8>) -> Result<()> {
    buf.extend_from_slice(tag);
    serde_json::to_writer(buf, value).map_err(|e| exec_datafusion_err!("encoding a plan node: {e}"))
}

fn untagged<T: serde::de::DeserializeOwned>(tag: &[u8], buf: &[u8]) -> Option<Result<T>> {
    let rest = buf.strip_prefix(tag)?;
    Some(serde_json::from_slice(rest).map_err(|e| {
        exec_datafusion_err!(
            "a plan node from another pipeline version does not read here ({e}); run the same pipeline version on the \
             client, the scheduler and every executor"
        )
    }))
}

fn schema_bytes(schema: &datafusion::arrow::datatypes::Schema) -> Result<Vec<u8>> {
    use prost::Message;
    Ok(datafusion_proto::protobuf::Schema::try_from(schema)?.encode_to_vec())
}

fn schema_from(bytes: &[u8]) -> Result<SchemaRef> {
    use prost::Message;
    let proto = datafusion_proto::protobuf::Schema::decode(bytes).map_err(|e| exec_datafusion_err!("schema: {e}"))?;
    Ok(Arc::new(datafusion::arrow::datatypes::Schema::try_from(&proto)?))
}

/// The name `embed` is registered under.
const EMBED: &str = "embed";

/// What both codecs do with `embed`: the fingerprint out, [`EmbedUdf::on_cluster`] in.
#[derive(Debug, Default)]
struct EmbedFunction {
    host: HostOptions,
    metrics: Arc<RunMetrics>,
}

impl EmbedFunction {
    fn encode(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<bool> {
        if node.name() != EMBED {
            return Ok(false);
        }
        buf.extend_from_slice(EmbedUdf::planned_fingerprint(node)?.to_json().as_bytes());
        Ok(true)
    }

    fn decode(&self, name: &str, buf: &[u8]) -> Option<Result<Arc<ScalarUDF>>> {
        if name != EMBED || buf.is_empty() {
            return None;
        }
        Some((|| {
            let json = std::str::from_utf8(buf).map_err(|e| exec_datafusion_err!("embed's fingerprint: {e}"))?;
            let planned = Fingerprint::from_json(json).map_err(|e| {
                exec_datafusion_err!(
                    "embed's fingerprint from the client does not read here ({e}); run the same pipeline version on \
                     the client, the scheduler and every executor"
                )
            })?;
            Ok(Arc::new(EmbedUdf::on_cluster(planned, self.host.clone(), Arc::clone(&self.metrics))))
        })())
    }
}

/// Ballista's logical codec (the client's plans to the scheduler), with `embed`.
#[derive(Debug, Default)]
pub struct EmbedLogicalCodec {
    inner: BallistaLogicalExtensionCodec,
    embed: EmbedFunction,
}

impl EmbedLogicalCodec {
    /// The codec of a process whose `embed` calls run with `host`'s settings and add to `metrics`.
    pub fn new(host: HostOptions, metrics: Arc<RunMetrics>) -> Self {
        Self { inner: BallistaLogicalExtensionCodec::default(), embed: EmbedFunction { host, metrics } }
    }
}

impl LogicalExtensionCodec for EmbedLogicalCodec {
    fn try_decode(&self, buf: &[u8], inputs: &[LogicalPlan], ctx: &TaskContext) -> Result<Extension> {
        let Some(spec) = untagged::<WriteSpec>(WRITE_TAG, buf) else { return self.inner.try_decode(buf, inputs, ctx) };
        let input = inputs.first().cloned().ok_or_else(|| exec_datafusion_err!("ClusterWrite needs one input"))?;
        Ok(Extension { node: Arc::new(ClusterWriteNode::new(input, spec?)?) })
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        match node.node.as_any().downcast_ref::<ClusterWriteNode>() {
            Some(write) => tagged(WRITE_TAG, write.spec(), buf),
            None => self.inner.try_encode(node, buf),
        }
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        let Some(ids) = untagged::<IdsSpec>(IDS_TAG, buf) else {
            return self.inner.try_decode_table_provider(buf, table_ref, schema, ctx);
        };
        let ids = ids?;
        let id_type = schema.fields().first().map(|f| f.data_type().clone()).unwrap_or(DataType::Utf8);
        Ok(Arc::new(ExistingIds::new(&ids.uri, &ids.column, id_type)))
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        match node.as_ref().downcast_ref::<ExistingIds>() {
            Some(ids) => {
                let (uri, column) = ids.source();
                tagged(
                    IDS_TAG,
                    &IdsSpec { uri: uri.into(), column: column.into(), schema: Vec::new(), rows: None },
                    buf,
                )
            }
            None => self.inner.try_encode_table_provider(table_ref, node, buf),
        }
    }

    fn try_decode_file_format(&self, buf: &[u8], ctx: &TaskContext) -> Result<Arc<dyn FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(&self, buf: &mut Vec<u8>, node: Arc<dyn FileFormatFactory>) -> Result<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.embed.decode(name, buf).unwrap_or_else(|| self.inner.try_decode_udf(name, buf))
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        if self.embed.encode(node, buf)? { Ok(()) } else { self.inner.try_encode_udf(node, buf) }
    }
}

/// Ballista's physical codec (the scheduler's stage plans to the executors), with `embed`, the distributed
/// write and the done-ids scan.
#[derive(Debug, Default)]
pub struct EmbedPhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
    embed: EmbedFunction,
    /// On an executor: its address, under which its tasks report their shares.
    executor: Option<String>,
}

impl EmbedPhysicalCodec {
    /// The codec of a process whose `embed` calls run with `host`'s settings and add to `metrics`; `executor`
    /// names an executor (the others only plan).
    pub fn new(host: HostOptions, metrics: Arc<RunMetrics>, executor: Option<String>) -> Self {
        Self { inner: BallistaPhysicalExtensionCodec::default(), embed: EmbedFunction { host, metrics }, executor }
    }

    /// A write task as this executor runs it: its input ordered by length and embedded a model call at a time
    /// (the write path's own stages, from the job's options with this host's settings), counted per task.
    fn write_task(
        &self,
        spec: WriteSpec,
        input: Arc<dyn ExecutionPlan>,
        ctx: &TaskContext,
    ) -> Result<FragmentWriteExec> {
        let Some(executor) = &self.executor else { return Ok(FragmentWriteExec::new(input, spec, None)) };
        let mut options = EmbedOptions::from_config(ctx.session_config().options());
        self.embed.host.apply(&mut options);
        let task = Arc::new(RunMetrics::default());
        let input = crate::exec::rule::chunked_embedding(input, &options, Some(Arc::clone(&task)), None, false)?;
        let place = TaskPlace { executor: executor.clone(), process: Arc::clone(&self.embed.metrics), task };
        Ok(FragmentWriteExec::new(input, spec, Some(place)))
    }
}

impl PhysicalExtensionCodec for EmbedPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(spec) = untagged::<WriteSpec>(WRITE_TAG, buf) {
            let input =
                inputs.first().cloned().ok_or_else(|| exec_datafusion_err!("FragmentWriteExec needs one input"))?;
            return Ok(Arc::new(self.write_task(spec?, input, ctx)?));
        }
        if let Some(ids) = untagged::<IdsSpec>(IDS_TAG, buf) {
            let ids = ids?;
            let exec = ExistingIdsExec::new(&ids.uri, &ids.column, schema_from(&ids.schema)?);
            return Ok(Arc::new(exec.with_rows(ids.rows)));
        }
        self.inner.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> Result<()> {
        if let Some(write) = node.as_ref().downcast_ref::<FragmentWriteExec>() {
            return tagged(WRITE_TAG, write.spec(), buf);
        }
        if let Some(ids) = node.as_ref().downcast_ref::<ExistingIdsExec>() {
            let (uri, column) = ids.source();
            let schema = schema_bytes(node.schema().as_ref())?;
            let spec = IdsSpec { uri: uri.into(), column: column.into(), schema, rows: ids.rows() };
            return tagged(IDS_TAG, &spec, buf);
        }
        self.inner.try_encode(node, buf)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.embed.decode(name, buf).unwrap_or_else(|| self.inner.try_decode_udf(name, buf))
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        if self.embed.encode(node, buf)? { Ok(()) } else { self.inner.try_encode_udf(node, buf) }
    }
}
