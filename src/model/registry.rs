//! One loaded model per (directory, thread count, device) for the whole process: the ONNX session and the
//! tokenizer are loaded on first use and shared by every query and partition after that.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::Result;
use crate::model::{Device, Embedder, ModelSpec};
use crate::options::EmbedOptions;

type Key = (PathBuf, usize, Device, bool);

static MODELS: OnceLock<Mutex<HashMap<Key, Arc<Embedder>>>> = OnceLock::new();

/// The shared embedder for the model and device that `options` name, loading it on first use.
pub fn for_options(options: &EmbedOptions) -> Result<Arc<Embedder>> {
    get_or_load(
        Path::new(&options.model),
        options.resolved_intra_threads(),
        options.resolved_device()?,
        options.allow_cpu_fallback,
    )
}

/// The shared embedder for a model directory on a device, loading it on first use.
pub fn get_or_load(
    dir: &Path,
    intra_threads: usize,
    device: Device,
    allow_cpu_fallback: bool,
) -> Result<Arc<Embedder>> {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let key = (canonical, intra_threads, device.clone(), allow_cpu_fallback);
    let models = MODELS.get_or_init(Default::default);
    // Loading happens under the lock so that two partitions never load the same model twice.
    let mut map = models.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = map.get(&key) {
        return Ok(Arc::clone(e));
    }
    let embedder = Arc::new(Embedder::load(ModelSpec::load(dir)?, intra_threads, &device, allow_cpu_fallback)?);
    map.insert(key, Arc::clone(&embedder));
    Ok(embedder)
}
