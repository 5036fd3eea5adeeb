//! The SHA-256 digests campaigns identify things by: bytes as hex, and a model by its graph and the
//! external data files beside it.

use sha2::{Digest, Sha256};

/// SHA-256 of some bytes, hex.
pub fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// [`super::fingerprint::model_sha256`] from the hashes alone: the graph's, and each external data file's by
/// its location (as an export's lineage records them).
pub fn model_digest(graph_sha256: &str, external: impl IntoIterator<Item = (String, String)>) -> String {
    let mut external: Vec<_> = external.into_iter().collect();
    if external.is_empty() {
        return graph_sha256.to_string();
    }
    external.sort();
    let mut lines = format!("onnx {graph_sha256}\n");
    for (file, sha) in external {
        lines.push_str(&format!("{file} {sha}\n"));
    }
    Sha256::digest(lines.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}
