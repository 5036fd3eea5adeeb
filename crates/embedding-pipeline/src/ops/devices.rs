//! What this machine can run on (`pipeline devices`), and the versions `pipeline --version` prints: found out
//! without failing, every missing part reported as such.

use ort::ep::ExecutionProvider;
use serde::Serialize;

use crate::error::plain;
use crate::model::device::library_version;
use crate::model::gpu::{self, GpuSystem};
use crate::model::runtime;

/// The machine's execution side.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Devices {
    /// The ONNX Runtime library that would be loaded...
    pub onnxruntime_library: Option<String>,
    /// ...or why none can be.
    pub onnxruntime_error: Option<String>,
    /// Its version.
    pub onnxruntime_version: Option<String>,
    /// Whether that build has the CUDA execution provider.
    pub cuda_provider: bool,
    /// Where `scripts/setup --gpu` put the CUDA 13 and cuDNN 9 libraries, if it did.
    pub cuda_libraries: Option<String>,
    /// The NVIDIA driver and GPUs...
    pub nvidia: Option<GpuSystem>,
    /// ...or why there are none.
    pub nvidia_error: Option<String>,
}

/// Find out, without failing: every part that is missing is reported as such.
pub fn devices() -> Devices {
    let loaded = runtime::environment().map(|_| runtime::loaded_library().map(|p| p.to_path_buf()).unwrap_or_default());
    let cuda_provider = loaded.is_ok() && ort::ep::CUDA::is_available().unwrap_or(false);
    let nvidia = gpu::probe();
    let version = loaded.as_ref().ok().and_then(|lib| library_version(lib));
    Devices {
        onnxruntime_library: loaded.as_ref().ok().map(|p| p.display().to_string()),
        onnxruntime_error: loaded.err().map(|e| e.to_string()),
        onnxruntime_version: version,
        cuda_provider,
        cuda_libraries: runtime::installed_cuda_libraries().map(|d| d.display().to_string()),
        nvidia_error: nvidia.as_ref().err().cloned(),
        nvidia: nvidia.ok(),
    }
}

/// The versions `pipeline --version` prints: this program, the engines it is built on, and the ONNX Runtime
/// library it would load (which is found at run time, so it may be missing).
pub fn versions() -> String {
    let d = devices();
    let ort = match (d.onnxruntime_version, d.onnxruntime_library, d.onnxruntime_error) {
        (Some(v), Some(lib), _) => format!("{v} ({lib})"),
        (None, Some(lib), _) => format!("unknown version ({lib})"),
        (_, _, Some(e)) => format!("not loaded: {}", plain(&e)),
        _ => "not loaded".into(),
    };
    format!(
        "pipeline {}\nDataFusion {}\nLance {}\nONNX Runtime {ort}, through ort {} (C API {})",
        env!("CARGO_PKG_VERSION"),
        datafusion::DATAFUSION_VERSION,
        LANCE_VERSION,
        ORT_CRATE_VERSION,
        ort::sys::ORT_API_VERSION,
    )
}

/// The Lance crate this build uses (pinned in Cargo.toml; a unit test holds the two together).
pub const LANCE_VERSION: &str = "14.0.2";
/// The ort crate this build uses (pinned in Cargo.toml; a unit test holds the two together).
pub const ORT_CRATE_VERSION: &str = "2.0.0-rc.15";

#[cfg(test)]
mod tests {
    /// The versions `--version` prints are the ones the library's Cargo.toml pins.
    #[test]
    fn printed_versions_are_the_pinned_ones() {
        let manifest = include_str!("../../Cargo.toml");
        assert!(
            manifest.contains(&format!("lance = {{ version = \"={}\"", super::LANCE_VERSION)),
            "Cargo.toml pins another lance"
        );
        assert!(
            manifest.contains(&format!("ort = {{ version = \"={}\"", super::ORT_CRATE_VERSION)),
            "Cargo.toml pins another ort"
        );
    }
}
