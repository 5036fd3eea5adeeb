//! `pipeline scheduler` and `pipeline executor`: Ballista's processes, with this tool's options, functions and
//! codecs registered. One executor per GPU is the unit of a deployment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::utils::default_session_builder;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::execution::FunctionRegistry;
use datafusion::execution::session_state::SessionState;
use datafusion::prelude::SessionConfig;

use super::codec::{EmbedLogicalCodec, EmbedPhysicalCodec};
use super::config_producer;
use crate::metrics::RunMetrics;
use crate::options::EmbedOptions;
use crate::udf::embed::HostOptions;
use crate::udf::embed_udfs;

/// A scheduler or executor session: Ballista's, with `embed` and `embed_dim` (for the job's options, as the
/// config a client sent holds them).
fn session_with_embed(config: SessionConfig, metrics: &Arc<RunMetrics>) -> datafusion::common::Result<SessionState> {
    let options = EmbedOptions::from_config(config.options());
    let state = default_session_builder(config)?;
    let mut state = datafusion::execution::session_state::SessionStateBuilder::new_from_existing(state)
        .with_query_planner(Arc::new(super::write::SchedulerPlanner))
        .build();
    for udf in embed_udfs(&options, Arc::clone(metrics)) {
        state.register_udf(Arc::new(udf))?;
    }
    Ok(state)
}

/// Run a scheduler listening on `bind` until the process is stopped.
pub async fn run_scheduler(bind: SocketAddr, executor_timeout_seconds: u64) -> anyhow::Result<()> {
    let metrics = Arc::new(RunMetrics::default());
    let session_metrics = Arc::clone(&metrics);
    let config = SchedulerConfig {
        bind_host: bind.ip().to_string(),
        bind_port: bind.port(),
        external_host: bind.ip().to_string(),
        executor_timeout_seconds,
        // Executors ask for tasks: after an executor is lost, its reset tasks go to the next that asks. (Pushed, they
        // waited for an event that idle executors never sent, and the job hung.)
        scheduling_policy: TaskSchedulingPolicy::PullStaged,
        override_config_producer: Some(Arc::new(config_producer)),
        override_session_builder: Some(Arc::new(move |config| session_with_embed(config, &session_metrics))),
        override_logical_codec: Some(Arc::new(EmbedLogicalCodec::new(HostOptions::default(), Arc::clone(&metrics)))),
        override_physical_codec: Some(Arc::new(EmbedPhysicalCodec::new(HostOptions::default(), metrics, None))),
        ..SchedulerConfig::default()
    };
    let cluster = BallistaCluster::new_from_config(&config).await.map_err(|e| anyhow::anyhow!("scheduler: {e}"))?;
    // The listener is bound inside start_server: say where it will listen, and fail plainly when it cannot.
    std::net::TcpListener::bind(bind).map_err(|e| anyhow::anyhow!("scheduler: cannot listen on {bind}: {e}"))?;
    println!("pipeline scheduler listening on {bind} (clients: --cluster df://{bind})");
    start_server(cluster, bind, Arc::new(config)).await.map_err(|e| anyhow::anyhow!("scheduler on {bind}: {e}"))
}

/// How often an executor tells the scheduler it is alive, seconds.
pub const HEARTBEAT_SECONDS: u64 = 5;

/// How `pipeline executor` runs.
#[derive(Debug, Clone)]
pub struct ExecutorSettings {
    /// The scheduler's `HOST:PORT`.
    pub scheduler: String,
    /// Where the executor serves its results (Arrow Flight).
    pub bind: SocketAddr,
    /// The name other hosts reach this one by (default: the bind address).
    pub external_host: Option<String>,
    /// Tasks at once.
    pub concurrent_tasks: usize,
    /// Device and threads over each job's options.
    pub host: HostOptions,
    /// Shuffle files.
    pub work_dir: PathBuf,
}

/// Run an executor until the process is stopped (SIGTERM or ctrl-C; the scheduler then runs its tasks elsewhere).
pub async fn run_executor(settings: ExecutorSettings) -> anyhow::Result<()> {
    let (scheduler_host, scheduler_port) = settings
        .scheduler
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| anyhow::anyhow!("--scheduler {}: give it as HOST:PORT", settings.scheduler))?;
    std::fs::create_dir_all(&settings.work_dir).map_err(|e| {
        anyhow::anyhow!("executor: cannot make its work directory {}: {e}", settings.work_dir.display())
    })?;
    let metrics = Arc::new(RunMetrics::default());
    let registry = BallistaFunctionRegistry::from(&session_with_embed(config_producer(), &metrics)?);
    let grpc_port =
        settings.bind.port().checked_add(1).ok_or_else(|| {
            anyhow::anyhow!("--bind {}: the gRPC port is the next one; pick a lower port", settings.bind)
        })?;
    let external_host = settings.external_host.clone().or_else(|| {
        if settings.bind.ip().is_unspecified() { host_name() } else { Some(settings.bind.ip().to_string()) }
    });
    let label = format!("{}:{}", external_host.as_deref().unwrap_or("localhost"), settings.bind.port());
    let mut host = settings.host.clone();
    host.name = Some(label.clone());
    let config = ExecutorProcessConfig {
        bind_host: settings.bind.ip().to_string(),
        external_host,
        port: settings.bind.port(),
        grpc_port,
        scheduler_host,
        scheduler_port,
        concurrent_tasks: settings.concurrent_tasks,
        task_scheduling_policy: TaskSchedulingPolicy::PullStaged,
        // Often enough that a scheduler with a short --executor-timeout does not take a live executor for lost.
        executor_heartbeat_interval_seconds: HEARTBEAT_SECONDS,
        work_dir: Some(settings.work_dir.display().to_string()),
        override_function_registry: Some(Arc::new(registry)),
        override_config_producer: Some(Arc::new(config_producer)),
        override_logical_codec: Some(Arc::new(EmbedLogicalCodec::new(host.clone(), Arc::clone(&metrics)))),
        override_physical_codec: Some(Arc::new(EmbedPhysicalCodec::new(host, metrics, Some(label)))),
        ..ExecutorProcessConfig::default()
    };
    println!(
        "pipeline executor on {}, scheduler {}, device {}, {} task(s) at once",
        settings.bind,
        settings.scheduler,
        settings.host.device.as_deref().unwrap_or("as each job sets (embed.device)"),
        settings.concurrent_tasks
    );
    start_executor_process(Arc::new(config)).await.map_err(|e| anyhow::anyhow!("executor: {e}"))
}

/// This host's name, as other hosts may know it.
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0)?;
    (rc == 0 && end > 0).then(|| String::from_utf8_lossy(&buf[..end]).into_owned())
}
