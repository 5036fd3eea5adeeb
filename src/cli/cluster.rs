//! `pipeline scheduler`, `pipeline executor` and `pipeline cluster-keys DIR`: a Ballista cluster's processes and
//! its keys ([`embedding_pipeline::cluster`]), with the `cluster` feature.

use std::path::PathBuf;

use embedding_pipeline::cluster::{ClusterKeys, ExecutorOptions, run_executor, run_scheduler};
use embedding_pipeline::udf::embed::HostOptions;

use super::ExitStatus;
use super::args::{Runtime, at_least};
use super::printer::{Printer, out};

/// `pipeline scheduler`'s arguments.
#[derive(Debug, clap::Args)]
pub struct SchedulerArgs {
    /// Address to listen on.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50050")]
    bind: std::net::SocketAddr,
    /// Seconds without word from an executor after which it counts as lost and its tasks run elsewhere.
    /// Executors send word every 5 s, busy or not; 10 at least.
    #[arg(long, value_name = "SECONDS", default_value_t = 180)]
    executor_timeout: u64,
    #[command(flatten)]
    keys: KeysDir,
}

/// `pipeline executor`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ExecutorArgs {
    /// The scheduler's address.
    #[arg(long, value_name = "HOST:PORT")]
    scheduler: String,
    /// Address to serve results on (Arrow Flight). The executor asks the scheduler for tasks, so only this
    /// port need be reachable (from the client and the other executors).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50051")]
    bind: std::net::SocketAddr,
    /// The name or address other hosts reach this one by (default: the --bind address, or this host's name
    /// when that is 0.0.0.0).
    #[arg(long, value_name = "HOST")]
    external_host: Option<String>,
    /// This executor's device (cpu, cuda:N), over each job's embed.device.
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    /// Tasks at once.
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = at_least::<1>)]
    concurrent_tasks: u64,
    /// ONNX Runtime intra-op threads, over each job's embed.intra_threads (0: one per core).
    #[arg(long, value_name = "N")]
    intra_threads: Option<usize>,
    /// Directory for shuffle files (default: a directory under the system's temporary directory).
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    #[command(flatten)]
    keys: KeysDir,
    #[command(flatten)]
    runtime: Runtime,
}

/// `pipeline cluster-keys`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ClusterKeysArgs {
    /// The folder to make.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

/// The cluster's keys, for its scheduler and executors.
#[derive(Debug, Clone, clap::Args)]
pub struct KeysDir {
    /// The cluster's keys (`pipeline cluster-keys DIR`): serve and connect over TLS with them, and take only
    /// clients and executors that hold the same keys. Needed to listen on an address other hosts can reach.
    #[arg(long, value_name = "DIR", env = "EMBED_PIPELINE_CLUSTER_KEYS")]
    cluster_keys: Option<PathBuf>,
}

/// Run the scheduler until stopped, saying where it listens.
pub async fn scheduler(args: SchedulerArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let SchedulerArgs { bind, executor_timeout, keys: KeysDir { cluster_keys } } = args;
    let keys = cluster_keys.as_deref().map(ClusterKeys::load).transpose()?;
    run_scheduler(bind, executor_timeout, keys, move |line| out!(printer, "{line}")).await?;
    Ok(ExitStatus::Success)
}

/// Make the cluster's keys, and say what to do with them.
pub fn cluster_keys(args: ClusterKeysArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let keys = ClusterKeys::make(&args.dir)?;
    out!(
        printer,
        "made the cluster's keys in {}: copy the folder to every host of the cluster and to its clients (it is the \
         secret: whoever holds it can use the cluster), and give it as --cluster-keys {}",
        keys.dir().display(),
        keys.dir().display()
    );
    Ok(ExitStatus::Success)
}

/// Run an executor until stopped, saying where it serves.
pub async fn executor(args: ExecutorArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let ExecutorArgs {
        scheduler,
        bind,
        external_host,
        device,
        concurrent_tasks,
        intra_threads,
        work_dir,
        keys: KeysDir { cluster_keys },
        runtime,
    } = args;
    runtime.apply();
    let work_dir = work_dir.unwrap_or_else(|| std::env::temp_dir().join(format!("pipeline-executor-{}", bind.port())));
    let settings = ExecutorOptions {
        scheduler,
        bind,
        external_host,
        concurrent_tasks: concurrent_tasks as usize,
        host: HostOptions { device, intra_threads, name: None },
        work_dir,
        keys: cluster_keys.as_deref().map(ClusterKeys::load).transpose()?,
    };
    run_executor(settings, move |line| out!(printer, "{line}")).await?;
    Ok(ExitStatus::Success)
}
