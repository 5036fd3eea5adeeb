//! Where `embed_image` reads an image named by a path: a relative path against `embed.image_base` (a folder, or
//! an `s3://` prefix) or the current directory, an absolute path as it is, an `s3://` URI from its bucket. Local
//! files are read by the vision tower's own threads, beside decoding; object-store images are fetched here,
//! several at once, before the call.

use futures::StreamExt;
use object_store::ObjectStoreExt;
use url::Url;

use crate::model::image::ImageError;
use crate::model::vision::ImageSource;
use crate::uri::{bucket_store, is_local, is_supported};

/// Images fetched from an object store at once.
const FETCHES_IN_FLIGHT: usize = 16;

/// One image named by a path, ready for the vision tower: a local file to read, an object's bytes, or why it
/// could not be fetched.
/// Cloning shares fetched bytes.
#[derive(Debug, Clone)]
pub enum Located {
    File(String),
    Fetched(bytes::Bytes),
    Failed(ImageError),
}

impl Located {
    /// What the vision tower reads.
    pub fn source(&self) -> ImageSource<'_> {
        match self {
            Self::File(path) => ImageSource::Path(path),
            Self::Fetched(bytes) => ImageSource::Bytes(bytes),
            Self::Failed(e) => ImageSource::Failed(e),
        }
    }
}

/// `path` as read: against `base` when relative (a URI with a scheme and an absolute path are kept as they are).
pub fn resolve(path: &str, base: &str) -> String {
    let relative = !path.contains("://") && !path.starts_with('/');
    if !relative || base.is_empty() {
        return path.to_string();
    }
    let base = base.strip_prefix("file://").filter(|_| is_local(base)).unwrap_or(base);
    format!("{}/{}", base.trim_end_matches('/'), path.trim_start_matches("./"))
}

/// Each path resolved against `base`, and the object-store ones fetched (NULL stays NULL).
pub async fn locate(paths: Vec<Option<String>>, base: &str) -> Vec<Option<Located>> {
    let base = base.to_string();
    futures::stream::iter(paths)
        .map(|p| {
            let base = base.clone();
            async move {
                let path = resolve(&p?, &base);
                Some(if is_local(&path) {
                    Located::File(path.strip_prefix("file://").map(str::to_string).unwrap_or(path))
                } else {
                    fetch(&path).await.map_or_else(Located::Failed, Located::Fetched)
                })
            }
        })
        .buffered(FETCHES_IN_FLIGHT)
        .collect()
        .await
}

/// The bytes of the object at `uri`; a missing object, an unsupported scheme or an unreachable store in words.
async fn fetch(uri: &str) -> Result<bytes::Bytes, ImageError> {
    let failed = |why: String| ImageError::File(format!("{uri}: {why}"));
    if !is_supported(uri) {
        let scheme = uri.split_once("://").map_or("", |(s, _)| s);
        return Err(failed(format!("{scheme}:// is not supported; this build reads local paths and s3://")));
    }
    let url = Url::parse(uri).map_err(|e| failed(e.to_string()))?;
    let store = bucket_store(&url).map_err(|e| failed(crate::error::plain(&e.to_string())))?;
    let key = object_store::path::Path::from_url_path(url.path()).map_err(|e| failed(e.to_string()))?;
    let got = async { store.get(&key).await?.bytes().await };
    got.await.map_err(|e| match e {
        object_store::Error::NotFound { .. } => failed("no such object".into()),
        e => failed(crate::error::plain(&crate::error::chain_text(&e))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_read_against_the_base_and_others_as_they_are() {
        assert_eq!(resolve("a/b.jpg", ""), "a/b.jpg");
        assert_eq!(resolve("a/b.jpg", "/data/photos/"), "/data/photos/a/b.jpg");
        assert_eq!(resolve("./b.jpg", "/data/photos"), "/data/photos/b.jpg");
        assert_eq!(resolve("b.jpg", "file:///data/photos"), "/data/photos/b.jpg");
        assert_eq!(resolve("b.jpg", "s3://bucket/photos/"), "s3://bucket/photos/b.jpg");
        assert_eq!(resolve("/abs/b.jpg", "s3://bucket/photos"), "/abs/b.jpg");
        assert_eq!(resolve("s3://other/b.jpg", "/data"), "s3://other/b.jpg");
    }

    #[tokio::test]
    async fn an_unsupported_scheme_is_named_per_image() {
        let got = locate(vec![Some("gs://bucket/b.jpg".into()), None], "").await;
        assert!(got[1].is_none());
        match &got[0] {
            Some(Located::Failed(e)) => {
                assert!(e.to_string().contains("gs://bucket/b.jpg: gs:// is not supported"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
