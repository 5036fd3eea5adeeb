//! Campaigns on an Apache DataFusion Ballista cluster: the scheduler and executor processes with this
//! tool's pieces registered, and a client session whose queries run there.
//!
//! What each side needs:
//! - every side: the `embed.*` options as a config extension, so that a job's `SET embed.…` reaches the
//!   scheduler and the executors with its queries (Ballista drops the keys of an unregistered extension);
//! - the codecs ([`codec`]): `embed` travels as the fingerprint the client planned with, and each executor
//!   embeds with the job's options and its own device, after checking that its model gives that fingerprint;
//! - the scheduler and executors: `embed` and `embed_dim` in their function registries.

pub mod access;
pub mod codec;
pub mod process;
pub mod session;
pub mod write;

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use ballista_core::extension::SessionConfigExt;
use datafusion::prelude::SessionConfig;

pub use access::ClusterKeys;
pub use codec::{EmbedLogicalCodec, EmbedPhysicalCodec};
pub use process::{ExecutorOptions, executor_id_layer, run_executor, run_scheduler};

use crate::options::{EmbedConfig, EmbedOptions};

/// The port a scheduler listens on unless told otherwise (Ballista's).
pub const DEFAULT_SCHEDULER_PORT: u16 = 50050;

/// The session config every side of a cluster starts from: Ballista's, with the `embed.*` options, reaching
/// the cluster's other processes with its keys where it has them.
pub fn cluster_config(keys: Option<&ClusterKeys>) -> SessionConfig {
    let config = SessionConfig::new_with_ballista().with_option_extension(EmbedConfig(EmbedOptions::default()));
    match keys {
        Some(keys) => config
            .with_ballista_use_tls(true)
            .with_ballista_override_create_grpc_client_endpoint(keys.endpoint_override()),
        None => config,
    }
}

/// A scheduler's address from `df://HOST:PORT` (or `HOST:PORT`, or `HOST`, port 50050), as `HOST:PORT`.
pub fn scheduler_address(url: &str) -> crate::Result<String> {
    let rest = match url.split_once("://") {
        Some(("df", rest)) => rest,
        Some((scheme, _)) => {
            return Err(crate::Error::Cluster(format!(
                "the cluster {url} has the scheme {scheme}://; name a Ballista scheduler as df://HOST:PORT"
            )));
        }
        None => url,
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') {
        return Err(crate::Error::Cluster(format!("the cluster {url} is not df://HOST:PORT")));
    }
    Ok(if rest.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
        rest.to_string()
    } else {
        format!("{rest}:{DEFAULT_SCHEDULER_PORT}")
    })
}

/// Check that something listens at a scheduler's address, so that a wrong address fails at once, before any
/// statement runs, rather than at the first query.
pub fn check_reachable(url: &str) -> crate::Result<SocketAddr> {
    let address = scheduler_address(url)?;
    let unreachable = |why: String| {
        crate::Error::Cluster(format!(
            "no scheduler answers at {url} ({why}); start one with `pipeline scheduler --bind {address}`, or give \
             the address it listens on"
        ))
    };
    let addrs: Vec<SocketAddr> = address.to_socket_addrs().map_err(|e| unreachable(e.to_string()))?.collect();
    let mut last = String::from("the name resolves to no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(_) => return Ok(addr),
            Err(e) => last = e.to_string(),
        }
    }
    Err(unreachable(last))
}

/// Check that the scheduler at `url` answers gRPC over the connection these keys make (TLS with them; plain
/// without), so that a client or executor whose keys do not match the cluster's is told so at once, by name,
/// rather than by a transport error at its first query.
pub async fn check_keys_match(url: &str, keys: Option<&ClusterKeys>) -> crate::Result<()> {
    use ballista_core::serde::protobuf::GetJobStatusParams;
    use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
    let endpoint = scheduler_endpoint(&scheduler_address(url)?, keys)?;
    let asked = async {
        let channel = endpoint.connect().await.map_err(|e| tonic::Status::unavailable(error_chain(&e)))?;
        // A job id no job has: any answer from the scheduler itself will do.
        SchedulerGrpcClient::new(channel).get_job_status(GetJobStatusParams { job_id: String::new() }).await
    };
    match asked.await {
        Ok(_) => Ok(()),
        // A status the server sent (any: this is a question with no right answer) carries no source; one made
        // here from a failed connection does (plain HTTP/2 to a TLS server is an h2 protocol error, Internal).
        Err(status)
            if std::error::Error::source(&status).is_none()
                && !matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown) =>
        {
            Ok(())
        }
        Err(status) => Err(crate::Error::Cluster(match keys {
            None => format!(
                "the scheduler at {url} does not answer without the cluster's keys ({}); a cluster started with \
                 --cluster-keys takes only clients and executors with the same keys: give --cluster-keys DIR (or \
                 {})",
                refusal(&status),
                access::KEYS_ENV
            ),
            Some(keys) => format!(
                "the scheduler at {url} does not answer over TLS with the keys in {} ({}): it was started with \
                 other keys, or without keys; give every process of the cluster the same keys folder",
                keys.dir().display(),
                refusal(&status)
            ),
        })),
    }
}

/// A connection to the scheduler at `address` (`HOST:PORT`): over TLS with the cluster's keys, plain without,
/// with Ballista's settings for its clients either way.
pub fn scheduler_endpoint(address: &str, keys: Option<&ClusterKeys>) -> crate::Result<tonic::transport::Endpoint> {
    match keys {
        Some(keys) => keys.endpoint(address),
        None => ballista_core::utils::create_grpc_client_endpoint(
            format!("http://{address}"),
            Some(&ballista_core::utils::GrpcClientConfig::default()),
        )
        .map_err(|e| crate::Error::Cluster(format!("a connection to {address}: {e}"))),
    }
}

/// Why a connection failed, from a status made of it: its own message is only "h2 protocol error" or
/// "transport error", the cause is in its source.
fn refusal(status: &tonic::Status) -> String {
    match std::error::Error::source(status) {
        Some(source) => error_chain(source),
        None => status.message().to_string(),
    }
}

/// An error and its sources, as one line (a TLS refusal is named only in the innermost).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        text.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_addresses_take_the_default_port_and_refuse_other_schemes() {
        assert_eq!(scheduler_address("df://10.0.0.5:50060").unwrap(), "10.0.0.5:50060");
        assert_eq!(scheduler_address("df://gpu-host").unwrap(), "gpu-host:50050");
        assert_eq!(scheduler_address("127.0.0.1:7000").unwrap(), "127.0.0.1:7000");
        assert!(scheduler_address("http://h:1").unwrap_err().to_string().contains("df://HOST:PORT"));
        assert!(scheduler_address("df://h:1/x").is_err());
    }

    #[test]
    fn nothing_listening_is_named_with_what_to_do() {
        // A port just freed: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = check_reachable(&format!("df://127.0.0.1:{port}")).unwrap_err().to_string();
        assert!(e.contains("no scheduler answers") && e.contains("pipeline scheduler --bind"), "{e}");
    }
}
