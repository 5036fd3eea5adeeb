//! Which locations this build reads and writes: local paths, and the object stores of [`REMOTE_SCHEMES`]. Asked
//! by the session's sources and stores and by the Lance side alike.

/// The URI schemes outputs and sources may use besides local paths.
pub const REMOTE_SCHEMES: [&str; 1] = ["s3"];

/// Whether `uri` names a local path (no scheme, or `file:`).
pub fn is_local(uri: &str) -> bool {
    match uri.split_once("://") {
        None => true,
        Some((scheme, _)) => scheme.eq_ignore_ascii_case("file"),
    }
}

/// Whether this build reads and writes `uri`: a local path or one of [`REMOTE_SCHEMES`].
pub fn is_supported(uri: &str) -> bool {
    is_local(uri)
        || uri
            .split_once("://")
            .is_some_and(|(scheme, _)| REMOTE_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_and_remote_uris() {
        assert!(is_local("out/docs.lance") && is_local("/data/x") && is_local("file:///data/x"));
        assert!(!is_local("s3://bucket/x.lance") && !is_local("gs://bucket/x"));
        assert!(is_supported("s3://bucket/x.lance") && is_supported("x.lance") && !is_supported("gs://bucket/x"));
    }
}
