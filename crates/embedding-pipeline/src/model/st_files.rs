//! The small files every sentence-transformers directory has, read the same way for text and image-text models.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// One entry of modules.json.
#[derive(Deserialize)]
pub(super) struct Module {
    #[serde(rename = "type")]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) path: String,
}

/// A JSON file of the directory, each error naming it.
pub(super) fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, file: &str) -> Result<T> {
    let path = dir.join(file);
    let text =
        std::fs::read_to_string(&path).map_err(|e| Error::model(dir, file, format!("cannot read: {e}")).because(e))?;
    serde_json::from_str(&text).map_err(|e| Error::model(dir, file, format!("invalid: {e}")).because(e))
}
