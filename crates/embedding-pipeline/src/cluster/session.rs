//! A client session whose queries run on the cluster: [`EmbedSession::on_cluster`], and the state it plans its
//! writes' checks with here ([`EmbedSession::local_state`]). Kept here, not in [`crate::session`], so that the
//! session does not import the cluster that imports it.

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::SessionContext;

use super::ClusterKeys;
use crate::campaign::metrics::RunMetrics;
use crate::lance::LanceFormatFactory;
use crate::options::EmbedOptions;
use crate::session::{CLUSTER_PARTITIONS, EmbedSession, reading_state};
use crate::udf::embed_udfs;

impl EmbedSession {
    /// A session whose queries run on the Ballista cluster whose scheduler is at `url` (`df://HOST:PORT`). The
    /// client plans (so the job's tables, options and fingerprint are its own); the executors embed. A cluster
    /// started with keys (`pipeline cluster-keys`) needs the same `keys` here. `stop` asks its writes to stop
    /// (the client's side: it stops waiting and keeps the commits made).
    pub async fn on_cluster(
        url: &str,
        options: EmbedOptions,
        keys: Option<&ClusterKeys>,
        stop: crate::process::interrupt::StopToken,
    ) -> Result<Self> {
        use ballista::prelude::SessionContextExt;
        use ballista_core::extension::SessionConfigExt;
        options.check_all()?;
        super::check_reachable(url).map_err(datafusion::error::DataFusionError::from)?;
        super::check_keys_match(url, keys).await.map_err(datafusion::error::DataFusionError::from)?;
        let metrics = Arc::new(RunMetrics::stopped_by(stop));
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
            .with_ballista_logical_extension_codec(Arc::new(super::EmbedLogicalCodec::new(
                host.clone(),
                Arc::clone(&metrics),
            )))
            .with_ballista_physical_extension_codec(Arc::new(super::EmbedPhysicalCodec::new(
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
        ctx.register_udf(crate::udf::embed_image::refused_on_cluster());
        Ok(Self::from_parts(ctx, metrics, Some(url.to_string())))
    }

    /// The session's state, planning here: for the checks a client makes itself before a cluster runs a write
    /// (a local session's state as it is).
    pub fn local_state(&self) -> datafusion::execution::SessionState {
        let state = self.context().state();
        if self.cluster().is_none() {
            return state;
        }
        SessionStateBuilder::new_from_existing(state)
            .with_query_planner(Arc::new(super::write::SchedulerPlanner))
            .build()
    }
}
