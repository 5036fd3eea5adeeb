//! A DataFusion session with the pipeline's pieces registered: the `embed.*` options, the `embed`
//! and `embed_dim` functions, Lance tables, and Lance as a COPY target; and what it reads through:
//! [`sources`] (folders of JSON lines) and [`stores`] (object stores, `s3://`).

pub mod sources;
pub mod stores;

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::campaign::metrics::RunMetrics;
use crate::exec::EmbedWriteRule;
use crate::exec::guard::CheckedPlanner;
use crate::exec::resume::ResumeRule;
use crate::lance::{LanceFormatFactory, LanceTableFactory};
use crate::options::{EmbedConfig, EmbedOptions};
use crate::process::interrupt::StopToken;
use crate::udf::embed_udfs;
use sources::{CsvTableFactory, JsonTableFactory};
use stores::StoreRegistry;

/// `datafusion.execution.target_partitions` on a cluster: the partitions a query's scan is cut into there.
pub const CLUSTER_PARTITIONS: usize = 16;

/// A SQL session for embedding campaigns, and what it has done so far.
#[derive(Clone)]
pub struct EmbedSession {
    ctx: SessionContext,
    metrics: Arc<RunMetrics>,
    cluster: Option<String>,
}

impl EmbedSession {
    /// A session with default `embed.*` options.
    pub fn new() -> Result<Self> {
        Self::with_options(EmbedOptions::default())
    }

    /// A session starting from these `embed.*` options (SQL `SET` can still change them).
    pub fn with_options(options: EmbedOptions) -> Result<Self> {
        Self::stopped_by(options, StopToken::new())
    }

    /// [`EmbedSession::with_options`], asked to stop by `stop` (which a signal handler holds): its writes commit
    /// what they have and end, and no model call starts.
    pub fn stopped_by(options: EmbedOptions, stop: StopToken) -> Result<Self> {
        options.check_all()?;
        let metrics = Arc::new(RunMetrics::stopped_by(stop));
        let mut state = reading_state(&options, &metrics)?
            .with_physical_optimizer_rule(Arc::new(EmbedWriteRule::new(Arc::clone(&metrics))))
            .with_query_planner(Arc::new(CheckedPlanner::new(Arc::clone(&metrics))))
            .build();
        state.register_file_format(Arc::new(LanceFormatFactory::new(Arc::clone(&metrics))), true)?;
        let ctx = SessionContext::new_with_state(state);
        ctx.add_analyzer_rule(Arc::new(ResumeRule));
        for udf in embed_udfs(&options, Arc::clone(&metrics)) {
            ctx.register_udf(udf);
        }
        for udf in crate::udf::embed_image_udfs(&options, Arc::clone(&metrics)) {
            ctx.register_udf(udf);
        }
        ctx.register_udtf("embed_search", Arc::new(crate::udf::EmbedSearchFunc));
        ctx.register_udtf("image_files", Arc::new(crate::udf::ImageFilesFunc));
        Ok(Self { ctx, metrics, cluster: None })
    }

    /// A session of these parts: its context, its counters, and the cluster it runs on (built by
    /// [`crate::cluster::session`] for a cluster).
    #[cfg(feature = "cluster")]
    pub(crate) fn from_parts(ctx: SessionContext, metrics: Arc<RunMetrics>, cluster: Option<String>) -> Self {
        Self { ctx, metrics, cluster }
    }

    /// The session's request to stop.
    pub fn stop(&self) -> &StopToken {
        self.metrics.stop()
    }

    /// The cluster (`df://HOST:PORT`) this session's queries run on; `None` when they run here.
    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// The session's state, planning here (a build without the cluster has no other; with it, see
    /// `cluster::session`).
    #[cfg(not(feature = "cluster"))]
    pub fn local_state(&self) -> datafusion::execution::SessionState {
        self.context().state()
    }

    /// A session that reads what a campaign reads and writes (its sources and Lance datasets, local or on
    /// an object store), without `embed()`, which needs a model: for commands that only look.
    pub fn for_reading() -> Result<SessionContext> {
        let state = reading_state(&EmbedOptions::default(), &Arc::new(RunMetrics::default()))?.build();
        Ok(SessionContext::new_with_state(state))
    }

    /// The DataFusion context, for `sql()`, `register_*` and the rest of its API.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Counters of the embedding calls and Lance writes made through this session.
    pub fn metrics(&self) -> &Arc<RunMetrics> {
        &self.metrics
    }
}

/// What every session has: the `embed.*` options and information_schema, the object stores, and the Lance
/// JSON and CSV table factories.
pub(crate) fn reading_state(options: &EmbedOptions, metrics: &Arc<RunMetrics>) -> Result<SessionStateBuilder> {
    let config = SessionConfig::new().with_information_schema(true).with_option_extension(EmbedConfig(options.clone()));
    let runtime = RuntimeEnvBuilder::new().with_object_store_registry(Arc::new(StoreRegistry::default())).build()?;
    Ok(SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(Arc::new(runtime))
        .with_default_features()
        .with_table_factory("LANCE".into(), Arc::new(LanceTableFactory::new(Arc::clone(metrics))))
        .with_table_factory("JSON".into(), Arc::new(JsonTableFactory::default()))
        .with_table_factory("CSV".into(), Arc::new(CsvTableFactory::default())))
}
