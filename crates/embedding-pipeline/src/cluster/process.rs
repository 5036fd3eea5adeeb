//! `pipeline scheduler` and `pipeline executor`: Ballista's processes, with this tool's options, functions and
//! codecs registered. One executor per GPU is the unit of a deployment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::error::BallistaError;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::protobuf::executor_status::Status;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::scheduler_grpc_server::SchedulerGrpcServer;
use ballista_core::serde::protobuf::{ExecutorStatus, HeartBeatParams};
use ballista_core::utils::{
    GrpcServerConfig, create_grpc_server, create_grpc_server_incoming, default_session_builder,
};
use ballista_executor::ArrowFlightServerProvider;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_executor::executor_server::TERMINATING;
use ballista_executor::flight_service::BallistaFlightService;
use ballista_executor::shutdown::Shutdown;
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::create_scheduler;
use ballista_scheduler::scheduler_server::SchedulerServer;
use datafusion::execution::FunctionRegistry;
use datafusion::execution::session_state::SessionState;
use datafusion::prelude::SessionConfig;
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};

use super::access::{ClusterKeys, require_keys_to_listen};
use super::cluster_config;
use super::codec::{EmbedLogicalCodec, EmbedPhysicalCodec};
use crate::campaign::metrics::RunMetrics;
use crate::error::{Error, Result};
use crate::options::EmbedOptions;
use crate::udf::embed::HostOptions;
use crate::udf::embed_udfs;

/// A cluster error from a format string.
macro_rules! cluster_error {
    ($($arg:tt)*) => { Error::Cluster(format!($($arg)*)) };
}

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

/// Run a scheduler listening on `bind` until the process is stopped; with `keys`, over TLS to clients and
/// executors that hold the same keys only. `listening` is told, in a line, where it listens once it does.
pub async fn run_scheduler(
    bind: SocketAddr,
    executor_timeout_seconds: u64,
    keys: Option<ClusterKeys>,
    listening: impl FnOnce(&str),
) -> Result<()> {
    if executor_timeout_seconds < 2 * HEARTBEAT_SECONDS {
        return Err(Error::Cluster(format!(
            "--executor-timeout {executor_timeout_seconds}: executors send word every {HEARTBEAT_SECONDS} s, so a \
             live executor would be taken for lost; give {} seconds or more",
            2 * HEARTBEAT_SECONDS
        )));
    }
    require_keys_to_listen("scheduler", bind, keys.as_ref())?;
    let metrics = Arc::new(RunMetrics::default());
    let session_metrics = Arc::clone(&metrics);
    let producer_keys = keys.clone();
    let config = SchedulerConfig {
        bind_host: bind.ip().to_string(),
        bind_port: bind.port(),
        external_host: bind.ip().to_string(),
        executor_timeout_seconds,
        // Executors ask for tasks: after an executor is lost, its reset tasks go to the next that asks. (Pushed, they
        // waited for an event that idle executors never sent, and the job hung.)
        scheduling_policy: TaskSchedulingPolicy::PullStaged,
        override_config_producer: Some(Arc::new(move || cluster_config(producer_keys.as_ref()))),
        override_session_builder: Some(Arc::new(move |config| session_with_embed(config, &session_metrics))),
        override_logical_codec: Some(Arc::new(EmbedLogicalCodec::new(HostOptions::default(), Arc::clone(&metrics)))),
        override_physical_codec: Some(Arc::new(EmbedPhysicalCodec::new(HostOptions::default(), metrics, None))),
        override_create_grpc_client_endpoint: keys.as_ref().map(ClusterKeys::endpoint_override),
        use_tls: keys.is_some(),
        ..SchedulerConfig::default()
    };
    let (max_decoding, max_encoding) =
        (config.grpc_server_max_decoding_message_size as usize, config.grpc_server_max_encoding_message_size as usize);
    let cluster = BallistaCluster::new_from_config(&config).await.map_err(|e| cluster_error!("scheduler: {e}"))?;
    let grpc = GrpcServerConfig::default();
    let incoming = create_grpc_server_incoming(bind, &grpc)
        .map_err(|e| cluster_error!("scheduler: cannot listen on {bind}: {e}"))?;
    let scheduler: SchedulerServer<LogicalPlanNode, PhysicalPlanNode> =
        create_scheduler(cluster, Arc::new(config)).await.map_err(|e| cluster_error!("scheduler: {e}"))?;
    let service = SchedulerGrpcServer::new(scheduler)
        .max_decoding_message_size(max_decoding)
        .max_encoding_message_size(max_encoding);
    // Ballista's start_server serves the same service, without TLS; its REST API and Flight SQL proxy, which
    // this tool does not use, are left out.
    let mut server = create_grpc_server(&grpc);
    if let Some(keys) = &keys {
        server = server.tls_config(keys.server_tls()).map_err(|e| cluster_error!("scheduler: TLS: {e}"))?;
    }
    listening(&match &keys {
        Some(keys) => format!(
            "pipeline scheduler listening on {bind} over TLS, keys {} (clients: --cluster df://{bind} --cluster-keys \
             DIR)",
            keys.dir().display()
        ),
        None => format!("pipeline scheduler listening on {bind} (clients: --cluster df://{bind})"),
    });
    server
        .add_service(service)
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| cluster_error!("scheduler on {bind}: {e}"))
}

/// How often an executor tells the scheduler it is alive, seconds.
pub const HEARTBEAT_SECONDS: u64 = 5;

/// How `pipeline executor` runs.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
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
    /// The cluster's keys: served over TLS, and the scheduler and other executors reached with them.
    pub keys: Option<ClusterKeys>,
}

/// Run an executor until the process is stopped (SIGTERM or ctrl-C; the scheduler then runs its tasks elsewhere).
/// `started` is told, in a line, what it serves once it is set up.
pub async fn run_executor(settings: ExecutorOptions, started: impl FnOnce(&str)) -> Result<()> {
    let (scheduler_host, scheduler_port) = settings
        .scheduler
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| cluster_error!("--scheduler {}: give it as HOST:PORT", settings.scheduler))?;
    require_keys_to_listen("executor", settings.bind, settings.keys.as_ref())?;
    super::check_keys_match(&settings.scheduler, settings.keys.as_ref()).await?;
    std::fs::create_dir_all(&settings.work_dir)
        .map_err(|e| cluster_error!("executor: cannot make its work directory {}: {e}", settings.work_dir.display()))?;
    let metrics = Arc::new(RunMetrics::default());
    let keys = settings.keys.clone();
    let registry = BallistaFunctionRegistry::from(&session_with_embed(cluster_config(keys.as_ref()), &metrics)?);
    let grpc_port =
        settings.bind.port().checked_add(1).ok_or_else(|| {
            cluster_error!("--bind {}: the gRPC port is the next one; pick a lower port", settings.bind)
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
        override_config_producer: Some(Arc::new({
            let keys = keys.clone();
            move || cluster_config(keys.as_ref())
        })),
        override_logical_codec: Some(Arc::new(EmbedLogicalCodec::new(host.clone(), Arc::clone(&metrics)))),
        override_physical_codec: Some(Arc::new(EmbedPhysicalCodec::new(host, metrics, Some(label)))),
        override_create_grpc_client_endpoint: keys.as_ref().map(ClusterKeys::endpoint_override),
        override_arrow_flight_service: keys.as_ref().map(flight_over_tls),
        ..ExecutorProcessConfig::default()
    };
    tokio::spawn(keep_alive(settings.scheduler.clone(), keys));
    started(&format!(
        "pipeline executor on {}, scheduler {}, device {}, {} task(s) at once",
        settings.bind,
        settings.scheduler,
        settings.host.device.as_deref().unwrap_or("as each job sets (embed.device)"),
        settings.concurrent_tasks
    ));
    start_executor_process(Arc::new(config)).await.map_err(|e| cluster_error!("executor: {e}"))
}

/// An executor's Arrow Flight service (where the client and other executors fetch its results) over TLS with
/// the cluster's keys: Ballista's own service, in a server of its settings.
fn flight_over_tls(keys: &ClusterKeys) -> Arc<ArrowFlightServerProvider> {
    let tls = keys.server_tls();
    let max = ExecutorProcessConfig::default();
    let (max_decoding, max_encoding) =
        (max.grpc_max_decoding_message_size as usize, max.grpc_max_encoding_message_size as usize);
    Arc::new(move |work_dir: String, address: SocketAddr, mut shutdown: Shutdown, grpc: GrpcServerConfig| {
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = FlightServiceServer::new(BallistaFlightService::new(work_dir))
                .max_decoding_message_size(max_decoding)
                .max_encoding_message_size(max_encoding);
            create_grpc_server(&grpc)
                .tls_config(tls)
                .map_err(BallistaError::TonicError)?
                .add_service(service)
                .serve_with_shutdown(address, shutdown.recv())
                .await
                .map_err(BallistaError::TonicError)
        })
    })
}

/// Where Ballista logs the id it gives an executor ("Executor id: …").
const EXECUTOR_START_LOG: &str = "ballista_executor::executor_process";

/// The id Ballista gave this process's executor. Ballista 54.1 makes it inside `start_executor_process` and
/// shows it only in its start-up log line, which [`executor_id_layer`] reads.
static EXECUTOR_ID: OnceLock<String> = OnceLock::new();

/// A tracing layer that keeps the id from Ballista's "Executor id: …" line, whatever the log filter shows; the
/// binary installs it so that `pipeline executor` can send heartbeats under that id.
pub fn executor_id_layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer;
    ExecutorIdLayer
        .with_filter(tracing_subscriber::filter::Targets::new().with_target(EXECUTOR_START_LOG, tracing::Level::INFO))
}

struct ExecutorIdLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ExecutorIdLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(Option<String>);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = Some(format!("{value:?}"));
                }
            }
        }
        let mut message = Message(None);
        event.record(&mut message);
        if let Some(id) = message.0.as_deref().and_then(|m| m.strip_prefix("Executor id: ")) {
            let _ = EXECUTOR_ID.set(id.trim().to_string());
        }
    }
}

/// Tell the scheduler every [`HEARTBEAT_SECONDS`] that this executor is alive, also while all its task slots are
/// busy. Under pull scheduling Ballista 54.1's executor speaks to the scheduler only when it asks for work, which
/// it does only with a slot free: a task longer than the scheduler's `--executor-timeout` got its executor taken
/// for lost, and was reset and restarted for ever. Stops at a stop signal or once Ballista is terminating, so
/// that its last word to the scheduler (terminating) stays the last.
async fn keep_alive(scheduler: String, keys: Option<ClusterKeys>) {
    let endpoint = match super::scheduler_endpoint(&scheduler, keys.as_ref()) {
        Ok(endpoint) => endpoint,
        Err(e) => {
            tracing::warn!("executor: no heartbeat while busy ({e})");
            return;
        }
    };
    let waited = std::time::Instant::now();
    let id = loop {
        if let Some(id) = EXECUTOR_ID.get() {
            break id.clone();
        }
        if waited.elapsed() > Duration::from_secs(30) {
            tracing::warn!(
                "executor: cannot tell which id Ballista gave this executor, so it sends no heartbeat while busy; \
                 give the scheduler an --executor-timeout longer than the longest task"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let stop = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::pin!(stop);
    let period = Duration::from_secs(HEARTBEAT_SECONDS);
    // The first beat a period on: Ballista's first ask for work registers the executor.
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client = None;
    loop {
        tokio::select! {
            _ = beat.tick() => {}
            () = &mut stop => return,
        }
        if TERMINATING.load(Ordering::Acquire) {
            return;
        }
        if client.is_none() {
            client = match endpoint.connect().await {
                Ok(channel) => Some(SchedulerGrpcClient::new(channel)),
                Err(_) => None,
            };
        }
        let Some(connected) = client.as_mut() else { continue };
        let params = HeartBeatParams {
            executor_id: id.clone(),
            metrics: Vec::new(),
            status: Some(ExecutorStatus { status: Some(Status::Active(String::new())) }),
            // Without it, an executor the scheduler has dropped is not registered again here: that is Ballista's
            // ask for work to do, with the executor's whole description.
            metadata: None,
        };
        if let Err(e) = connected.heart_beat_from_executor(params).await {
            tracing::debug!("executor: heartbeat to {scheduler}: {e}");
            client = None;
        }
    }
}

/// This host's name, as other hosts may know it.
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0)?;
    (rc == 0 && end > 0).then(|| String::from_utf8_lossy(&buf[..end]).into_owned())
}
