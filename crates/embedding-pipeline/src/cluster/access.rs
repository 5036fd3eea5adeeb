//! Who may use a cluster: mutual TLS on every connection between the client, the scheduler and the executors,
//! with one set of keys per cluster.
//!
//! Ballista 54.1 has no authentication of its own, and an executor reads whatever files a plan names: anyone
//! who reaches its ports can read the hosts' files. So a cluster made with keys (`pipeline cluster-keys DIR`)
//! speaks TLS only, and both ends of each connection show a certificate of the cluster's own authority. The
//! keys are the secret: every process of the cluster (client, scheduler, executors) is given the same folder,
//! and without it a connection is refused before any request is read. The certificate names no host (the
//! clients check the name [`SERVER_NAME`]), so the same folder serves every host and address.
//!
//! Without keys a scheduler or executor listens on loopback only ([`require_keys_to_listen`]).
//!
//! Ballista builds its connections itself, with `http://` addresses; [`ClusterKeys::endpoint_override`] gives
//! it a function that remakes each as `https://` with the cluster's certificates, and the scheduler's and
//! executors' servers are started here with the same keys ([`super::process`]).

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ballista_core::extension::EndpointOverrideFn;
use ballista_core::utils::{GrpcClientConfig, create_grpc_client_endpoint};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::{Error, Result};

/// The environment variable that names a cluster's keys folder for every command (`--cluster-keys` wins).
pub const KEYS_ENV: &str = "EMBED_PIPELINE_CLUSTER_KEYS";

/// The name in every node's certificate, which clients check instead of a host name.
pub const SERVER_NAME: &str = "embedding-pipeline-cluster";

/// The cluster's authority: the certificate both ends check the other's against.
const AUTHORITY: &str = "ca.pem";
/// The certificate every node shows, and its private key (the secret).
const NODE_CERT: &str = "node.pem";
const NODE_KEY: &str = "node.key";

/// A cluster's keys, read from their folder.
#[derive(Clone)]
pub struct ClusterKeys {
    dir: PathBuf,
    authority: Certificate,
    identity: Identity,
}

impl std::fmt::Debug for ClusterKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterKeys").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl ClusterKeys {
    /// Make a new cluster's keys in `dir` (created, readable by its owner only; it must not exist or be empty):
    /// an authority, and one certificate and key signed by it that every process of the cluster uses. The
    /// authority's own key is not kept: a cluster is re-keyed by making new keys and restarting its processes.
    pub fn make(dir: &Path) -> Result<Self> {
        let refuse = |why: String| Error::Cluster(format!("cannot make cluster keys in {}: {why}", dir.display()));
        if std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) {
            return Err(refuse("the folder is not empty; name a new folder".into()));
        }
        std::fs::create_dir_all(dir).map_err(|e| refuse(e.to_string()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| refuse(e.to_string()))?;
        let (authority, cert, key) = new_keys().map_err(|e| refuse(e.to_string()))?;
        for (name, text, mode) in [(AUTHORITY, &authority, 0o644), (NODE_CERT, &cert, 0o644), (NODE_KEY, &key, 0o600)] {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(dir.join(name))
                .map_err(|e| refuse(format!("{name}: {e}")))?;
            file.write_all(text.as_bytes()).map_err(|e| refuse(format!("{name}: {e}")))?;
        }
        Self::load(dir)
    }

    /// Read a cluster's keys from the folder [`ClusterKeys::make`] wrote. The key must be readable by its owner
    /// only, as ssh asks of its keys.
    pub fn load(dir: &Path) -> Result<Self> {
        let read = |name: &str| {
            std::fs::read(dir.join(name)).map_err(|e| {
                Error::Cluster(format!(
                    "cluster keys {}: cannot read {name} ({e}); make a cluster's keys with `pipeline cluster-keys \
                     DIR` and give every process of the cluster the same folder",
                    dir.display()
                ))
            })
        };
        let (authority, cert, key) = (read(AUTHORITY)?, read(NODE_CERT)?, read(NODE_KEY)?);
        let key_path = dir.join(NODE_KEY);
        let mode = std::fs::metadata(&key_path).map_err(|e| Error::Cluster(e.to_string()))?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(Error::Cluster(format!(
                "cluster keys: {} can be read by others (mode {:o}); it is the cluster's secret: chmod 600 it",
                key_path.display(),
                mode & 0o777
            )));
        }
        for (name, text, marker) in
            [(AUTHORITY, &authority, "CERTIFICATE"), (NODE_CERT, &cert, "CERTIFICATE"), (NODE_KEY, &key, "PRIVATE KEY")]
        {
            if !String::from_utf8_lossy(text).contains(&format!("-----BEGIN {marker}-----")) {
                return Err(Error::Cluster(format!(
                    "cluster keys: {} is not a PEM {} (as `pipeline cluster-keys` writes it)",
                    dir.join(name).display(),
                    marker.to_lowercase()
                )));
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            authority: Certificate::from_pem(authority),
            identity: Identity::from_pem(cert, key),
        })
    }

    /// The folder the keys were read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A server's TLS: the node's certificate shown, a client's certificate required and checked against the
    /// cluster's authority.
    pub fn server_tls(&self) -> ServerTlsConfig {
        // tonic's server takes rustls's process-wide provider, which rustls cannot choose itself when the
        // build has two (Lance's AWS SDK brings ring as well as aws-lc-rs). Kept if one is installed already.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        ServerTlsConfig::new().identity(self.identity.clone()).client_ca_root(self.authority.clone())
    }

    /// A client's TLS: the server's certificate checked against the cluster's authority (under
    /// [`SERVER_NAME`], whatever host it was reached by), and the node's certificate shown.
    pub fn client_tls(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(self.authority.clone())
            .identity(self.identity.clone())
            .domain_name(SERVER_NAME)
    }

    /// A connection to `address` (`HOST:PORT`), over TLS with these keys; with Ballista's settings for its
    /// clients (timeouts, keep-alive, window sizes).
    pub fn endpoint(&self, address: &str) -> Result<Endpoint> {
        let config = GrpcClientConfig::default();
        create_grpc_client_endpoint(format!("https://{address}"), Some(&config))
            .and_then(|e| e.tls_config(self.client_tls()))
            .map_err(|e| Error::Cluster(format!("a connection to {address}: {e}")))
    }

    /// For Ballista's own connections (client to scheduler and executors, executor to scheduler and to other
    /// executors): each endpoint it builds as `http://HOST:PORT`, made again as [`ClusterKeys::endpoint`].
    pub fn endpoint_override(&self) -> EndpointOverrideFn {
        let keys = self.clone();
        Arc::new(move |endpoint: Endpoint| {
            let address = endpoint
                .uri()
                .authority()
                .map(|a| a.to_string())
                .ok_or_else(|| format!("a connection to {} names no host", endpoint.uri()))?;
            keys.endpoint(&address).map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        })
    }
}

/// A new authority, and a node certificate and key signed by it, as PEM text.
fn new_keys() -> std::result::Result<(String, String, String), rcgen::Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let authority_key = KeyPair::generate()?;
    let mut authority = CertificateParams::new(Vec::<String>::new())?;
    authority.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    authority.distinguished_name.push(DnType::CommonName, "embedding-pipeline cluster authority");
    authority.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let authority_cert = authority.self_signed(&authority_key)?;

    let node_key = KeyPair::generate()?;
    let mut node = CertificateParams::new(vec![SERVER_NAME.to_string()])?;
    node.distinguished_name.push(DnType::CommonName, "embedding-pipeline cluster node");
    node.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    node.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let node_cert = node.signed_by(&node_key, &Issuer::new(authority, authority_key))?;
    Ok((authority_cert.pem(), node_cert.pem(), node_key.serialize_pem()))
}

/// Refuse to listen on an address other hosts can reach without keys: without them anyone who reaches the
/// port can have the cluster read any file its processes can.
pub fn require_keys_to_listen(what: &str, bind: SocketAddr, keys: Option<&ClusterKeys>) -> Result<()> {
    if keys.is_some() || bind.ip().is_loopback() {
        return Ok(());
    }
    Err(Error::Cluster(format!(
        "{what}: will not listen on {bind} without the cluster's keys: anyone who reaches it could have the cluster \
         read any file it can. Make keys once with `pipeline cluster-keys DIR`, copy the folder to every host of \
         the cluster and the client, and give it as --cluster-keys DIR (or {KEYS_ENV}); or listen on 127.0.0.1"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_made_once_into_an_owner_only_folder_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        let keys = ClusterKeys::make(&dir).unwrap();
        assert_eq!(keys.dir(), dir);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(NODE_KEY)), 0o600);
        ClusterKeys::load(&dir).unwrap();
        // Not over keys already made.
        let e = ClusterKeys::make(&dir).unwrap_err().to_string();
        assert!(e.contains("not empty"), "{e}");
    }

    #[test]
    fn keys_that_others_can_read_or_that_are_missing_are_refused_with_what_to_do() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        ClusterKeys::make(&dir).unwrap();
        std::fs::set_permissions(dir.join(NODE_KEY), std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ClusterKeys::load(&dir).unwrap_err().to_string();
        assert!(e.contains("chmod 600") && e.contains(NODE_KEY), "{e}");

        std::fs::remove_file(dir.join(NODE_CERT)).unwrap();
        let e = ClusterKeys::load(&dir).unwrap_err().to_string();
        assert!(e.contains(NODE_CERT) && e.contains("pipeline cluster-keys"), "{e}");

        let other = tmp.path().join("other");
        std::fs::create_dir(&other).unwrap();
        for name in [AUTHORITY, NODE_CERT] {
            std::fs::write(other.join(name), "not a certificate").unwrap();
        }
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(other.join(NODE_KEY)).unwrap();
        let e = ClusterKeys::load(&other).unwrap_err().to_string();
        assert!(e.contains("not a PEM certificate"), "{e}");
    }

    #[test]
    fn only_loopback_is_listened_on_without_keys() {
        for bind in ["127.0.0.1:50050", "[::1]:50050"] {
            require_keys_to_listen("scheduler", bind.parse().unwrap(), None).unwrap();
        }
        for bind in ["0.0.0.0:50050", "10.0.0.5:50050", "[::]:50050"] {
            let e = require_keys_to_listen("scheduler", bind.parse().unwrap(), None).unwrap_err().to_string();
            assert!(e.contains("--cluster-keys") && e.contains(bind), "{e}");
        }
        let tmp = tempfile::tempdir().unwrap();
        let keys = ClusterKeys::make(&tmp.path().join("k")).unwrap();
        require_keys_to_listen("scheduler", "0.0.0.0:50050".parse().unwrap(), Some(&keys)).unwrap();
    }

    #[test]
    fn ballista_endpoints_are_made_again_over_tls_to_the_same_address() {
        let tmp = tempfile::tempdir().unwrap();
        let keys = ClusterKeys::make(&tmp.path().join("k")).unwrap();
        let made = (keys.endpoint_override())(Endpoint::from_static("http://10.0.0.5:50051")).unwrap();
        assert_eq!(made.uri().to_string(), "https://10.0.0.5:50051/");
    }
}
