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
use crate::cluster::ClusterKeys;
use crate::exec::EmbedWriteRule;
use crate::lance::guard::CheckedPlanner;
use crate::lance::resume::ResumeRule;
use crate::lance::{LanceFormatFactory, LanceTableFactory};
use crate::options::{EmbedConfig, EmbedOptions};
use crate::udf::embed_udfs;
use sources::JsonTableFactory;
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
        options.check_all()?;
        let metrics = Arc::new(RunMetrics::default());
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
        ctx.register_udtf("embed_search", Arc::new(crate::udf::EmbedSearchFunc));
        Ok(Self { ctx, metrics, cluster: None })
    }

    /// A session whose queries run on the Ballista cluster whose scheduler is at `url` (`df://HOST:PORT`). The
    /// client plans (so the job's tables, options and fingerprint are its own); the executors embed. A cluster
    /// started with keys (`pipeline cluster-keys`) needs the same `keys` here.
    pub async fn on_cluster(url: &str, options: EmbedOptions, keys: Option<&ClusterKeys>) -> Result<Self> {
        use ballista::prelude::SessionContextExt;
        use ballista_core::extension::SessionConfigExt;
        options.check_all()?;
        crate::cluster::check_reachable(url).map_err(datafusion::error::DataFusionError::from)?;
        crate::cluster::check_keys_match(url, keys).await.map_err(datafusion::error::DataFusionError::from)?;
        let metrics = Arc::new(RunMetrics::default());
        let host = crate::udf::embed::HostOptions::default();
        let mut builder = reading_state(&options, &metrics)?;
        let mut config = builder.config().take().unwrap_or_default();
        if let Some(keys) = keys {
            config = config
                .with_ballista_use_tls(true)
                .with_ballista_override_create_grpc_client_endpoint(keys.endpoint_override());
        }
        let config = config
            // Tasks for the whole cluster rather than this machine's cores (Ballista's own default); a job's SET wins.
            .with_target_partitions(CLUSTER_PARTITIONS)
            .with_ballista_logical_extension_codec(Arc::new(crate::cluster::EmbedLogicalCodec::new(
                host.clone(),
                Arc::clone(&metrics),
            )))
            .with_ballista_physical_extension_codec(Arc::new(crate::cluster::EmbedPhysicalCodec::new(
                host,
                Arc::clone(&metrics),
                None,
            )));
        let mut state = builder.with_config(config).build();
        state.register_file_format(Arc::new(LanceFormatFactory::new(Arc::clone(&metrics))), true)?;
        let ctx = SessionContext::remote_with_state(url, state).await?;
        // Ballista's session keeps its own functions only: embed and embed_dim go back in.
        for udf in embed_udfs(&options, Arc::clone(&metrics)) {
            ctx.register_udf(udf);
        }
        Ok(Self { ctx, metrics, cluster: Some(url.to_string()) })
    }

    /// The session's state, planning here: for the checks a client makes itself before a cluster runs a write
    /// (a local session's state as it is).
    pub fn local_state(&self) -> datafusion::execution::SessionState {
        let state = self.ctx.state();
        if self.cluster.is_none() {
            return state;
        }
        SessionStateBuilder::new_from_existing(state)
            .with_query_planner(Arc::new(crate::cluster::write::SchedulerPlanner))
            .build()
    }

    /// The cluster (`df://HOST:PORT`) this session's queries run on; `None` when they run here.
    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
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
/// and JSON table factories.
fn reading_state(options: &EmbedOptions, metrics: &Arc<RunMetrics>) -> Result<SessionStateBuilder> {
    let config = SessionConfig::new().with_information_schema(true).with_option_extension(EmbedConfig(options.clone()));
    let runtime = RuntimeEnvBuilder::new().with_object_store_registry(Arc::new(StoreRegistry::default())).build()?;
    Ok(SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(Arc::new(runtime))
        .with_default_features()
        .with_table_factory("LANCE".into(), Arc::new(LanceTableFactory::new(Arc::clone(metrics))))
        .with_table_factory("JSON".into(), Arc::new(JsonTableFactory::default())))
}
