//! One loaded model per (directory, placement) for the whole process: the ONNX session and the
//! tokenizer are loaded on first use and shared by every query and partition after that.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::Result;
use crate::model::{Embedder, ModelSpec, Placement};

type Key = (PathBuf, Placement);

static MODELS: OnceLock<Mutex<HashMap<Key, Arc<Embedder>>>> = OnceLock::new();

/// The shared embedder for a model directory and placement, loading it on first use.
pub fn get_or_load(dir: &Path, placement: Placement) -> Result<Arc<Embedder>> {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let key = (canonical, placement);
    let models = MODELS.get_or_init(Default::default);
    // Loading happens under the lock so that two partitions never load the same model twice.
    let mut map = models.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = map.get(&key) {
        return Ok(Arc::clone(e));
    }
    let embedder = Arc::new(Embedder::load(ModelSpec::load(dir)?, &key.1)?);
    map.insert(key, Arc::clone(&embedder));
    Ok(embedder)
}

/// Forget the shared embedder for a model directory and placement: it is freed (its session and the memory
/// its calls took) once no query holds it, and the next [`get_or_load`] loads it again. For a caller that
/// measures memory step by step and must not carry one step's memory into the next.
pub fn release(dir: &Path, placement: &Placement) {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    if let Some(models) = MODELS.get() {
        models.lock().unwrap_or_else(|e| e.into_inner()).remove(&(canonical, placement.clone()));
    }
}
