//! Object stores. DataFusion reads `s3://` sources through a store made on first use from the usual
//! `AWS_*` environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT` for an S3-compatible server, `AWS_ALLOW_HTTP` for a plain-HTTP one), as datafusion-cli
//! does. Lance opens its own `s3://` stores from the same variables.

use std::sync::Arc;

use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use object_store::ObjectStore;
use url::Url;

use crate::uri::{is_local, is_supported, s3_store};

/// DataFusion's registry, which also makes an `s3://` bucket's store when it is first asked for.
#[derive(Debug, Default)]
pub struct StoreRegistry {
    registered: DefaultObjectStoreRegistry,
}

impl ObjectStoreRegistry for StoreRegistry {
    fn register_store(&self, url: &Url, store: Arc<dyn ObjectStore>) -> Option<Arc<dyn ObjectStore>> {
        self.registered.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        self.registered.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        match self.registered.get_store(url) {
            Ok(store) => Ok(store),
            Err(_) if is_supported(url.as_str()) && !is_local(url.as_str()) => {
                let store = s3_store(url)?;
                self.registered.register_store(url, Arc::clone(&store));
                Ok(store)
            }
            Err(_) => Err(exec_datafusion_err!(
                "{url}: {}:// locations are not supported; this build reads local paths and s3:// (set the AWS_* \
                 environment variables for the bucket)",
                url.scheme()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_schemes_are_refused_by_name() {
        let e = StoreRegistry::default().get_store(&Url::parse("gs://bucket/corpus.jsonl").unwrap()).unwrap_err();
        assert!(e.to_string().contains("gs:// locations are not supported"), "{e}");
    }
}
