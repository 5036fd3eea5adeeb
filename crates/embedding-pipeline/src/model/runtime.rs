//! Finding and loading the ONNX Runtime shared library, once per process.
//!
//! Search order: an explicit path (`--ort-lib`), then `ORT_DYLIB_PATH`, then where `scripts/setup`
//! installs it (`$EMBED_PIPELINE_HOME/onnxruntime-gpu/<version>/` after `scripts/setup --gpu`, else
//! `$EMBED_PIPELINE_HOME/onnxruntime/<version>/`; by default under `~/.local/share/embedding-pipeline`). `ort` would panic on a bad implicit load; going through
//! `ort::init_from` turns every failure into an [`Error`] that says what to run.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;

use crate::error::{Error, Result};

/// The ONNX Runtime version this build targets (ort's `api-31`).
pub const ORT_VERSION: &str = "1.31.1";
/// The library's file name inside the `onnxruntime` wheel.
pub const ORT_LIB_NAME: &str = "libonnxruntime.so.1.31.1";

static EXPLICIT: Mutex<Option<PathBuf>> = Mutex::new(None);
static ENV: OnceLock<Loaded> = OnceLock::new();
static LOADING: Mutex<()> = Mutex::new(());

struct Loaded {
    env: Environment,
    path: PathBuf,
}

/// Use this library file instead of searching (the CLI's `--ort-lib`). Takes effect only before the
/// runtime is first loaded.
pub fn set_library_path(path: impl Into<PathBuf>) {
    *EXPLICIT.lock().unwrap_or_else(|e| e.into_inner()) = Some(path.into());
}

/// The directory `scripts/setup` installs into.
pub fn install_home() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("EMBED_PIPELINE_HOME") {
        return Some(PathBuf::from(h));
    }
    if let Some(d) = std::env::var_os("XDG_DATA_HOME") {
        return Some(PathBuf::from(d).join("embedding-pipeline"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share/embedding-pipeline"))
}

/// Where `scripts/setup` puts the library: the GPU build when `scripts/setup --gpu` installed it (it
/// runs on the CPU as well), else the CPU build.
pub fn installed_library() -> Option<PathBuf> {
    let home = install_home()?;
    let gpu = home.join("onnxruntime-gpu").join(ORT_VERSION).join(ORT_LIB_NAME);
    if gpu.is_file() {
        return Some(gpu);
    }
    Some(home.join("onnxruntime").join(ORT_VERSION).join(ORT_LIB_NAME))
}

/// Where `scripts/setup --gpu` puts the CUDA 13 and cuDNN 9 libraries, if it did.
pub fn installed_cuda_libraries() -> Option<PathBuf> {
    install_home().map(|h| h.join("cuda").join("lib")).filter(|d| d.join("libcudart.so.13").is_file())
}

/// The candidates in search order: the first that is set wins, and must exist.
fn candidate() -> std::result::Result<PathBuf, Vec<String>> {
    if let Some(p) = EXPLICIT.lock().unwrap_or_else(|e| e.into_inner()).clone() {
        return Ok(p);
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    match installed_library() {
        Some(p) if p.is_file() => Ok(p),
        Some(p) => {
            Err(vec!["--ort-lib (not given)".into(), "ORT_DYLIB_PATH (not set)".into(), p.display().to_string()])
        }
        None => Err(vec!["--ort-lib (not given)".into(), "ORT_DYLIB_PATH (not set)".into()]),
    }
}

/// The process-wide ONNX Runtime environment, loading the library on first use.
pub fn environment() -> Result<&'static Environment> {
    Ok(&loaded()?.env)
}

/// The library file that was loaded, once it has been.
pub fn loaded_library() -> Option<&'static Path> {
    ENV.get().map(|l| l.path.as_path())
}

fn loaded() -> Result<&'static Loaded> {
    if let Some(l) = ENV.get() {
        return Ok(l);
    }
    let _guard = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = ENV.get() {
        return Ok(l);
    }
    let path = candidate().map_err(|tried| Error::RuntimeNotFound { wanted: ORT_VERSION, tried: tried.join(", ") })?;
    if !path.is_file() {
        return Err(Error::RuntimeNotFound {
            wanted: ORT_VERSION,
            tried: format!("{} (no such file)", path.display()),
        });
    }
    let load_err = |message: String| Error::RuntimeLoad { path: path.clone(), message, wanted: ORT_VERSION };
    let builder = ort::init_from(&path).map_err(|e| load_err(e.to_string()))?;
    let env = builder.with_name("embedding-pipeline").build().map_err(|e| load_err(e.to_string()))?;
    // NOTE: ONNX Runtime also logs every error it returns, as a raw ANSI-coloured line on stderr; the error
    // reaches the user through our own message, so only fatal ones are logged.
    env.set_log_level(ort::logging::LogLevel::Fatal);
    Ok(ENV.get_or_init(|| Loaded { env, path }))
}
