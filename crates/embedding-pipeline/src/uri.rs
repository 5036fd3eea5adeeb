//! Which locations this build reads and writes: local paths, and the object stores of [`REMOTE_SCHEMES`]. Asked
//! by the session's sources and stores and by the Lance side alike; and the `s3://` stores themselves.

use std::sync::Arc;

use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use url::Url;

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

/// The store of the bucket in an `s3://` URL, made from the environment once per process and bucket (for the
/// images `embed_image` reads by their URIs, outside DataFusion's registry).
pub fn bucket_store(url: &Url) -> Result<Arc<dyn ObjectStore>> {
    type Stores = std::sync::Mutex<std::collections::HashMap<String, Arc<dyn ObjectStore>>>;
    static STORES: std::sync::LazyLock<Stores> = std::sync::LazyLock::new(Default::default);
    let key = format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default());
    let mut stores = STORES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(store) = stores.get(&key) {
        return Ok(Arc::clone(store));
    }
    let store = s3_store(url)?;
    stores.insert(key, Arc::clone(&store));
    Ok(store)
}

/// The store of the bucket in `url`, configured from the environment.
pub fn s3_store(url: &Url) -> Result<Arc<dyn ObjectStore>> {
    let bucket =
        url.host_str().filter(|b| !b.is_empty()).ok_or_else(|| exec_datafusion_err!("{url} names no bucket"))?;
    let store = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .build()
        .map_err(|e| exec_datafusion_err!("cannot reach s3://{bucket}: {e} (check the AWS_* environment variables)"))?;
    Ok(Arc::new(store))
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
