//! `pipeline devices [--json]`: what this machine can run on, before a campaign is started on it.

use ort::ep::ExecutionProvider;
use serde::Serialize;

use crate::model::device::library_version;
use crate::model::gpu::{self, GpuSystem};
use crate::model::runtime;

/// The machine's execution side.
#[derive(Debug, Serialize)]
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

/// Print the report.
pub fn print(json: bool) -> anyhow::Result<()> {
    let d = devices();
    if json {
        println!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(());
    }
    match (&d.onnxruntime_library, &d.onnxruntime_error) {
        (Some(lib), _) => println!(
            "ONNX Runtime {} from {lib}: {}",
            d.onnxruntime_version.as_deref().unwrap_or("(unknown version)"),
            if d.cuda_provider {
                "CPU and CUDA providers"
            } else {
                "CPU provider only (run scripts/setup --gpu for CUDA)"
            }
        ),
        (None, e) => println!("ONNX Runtime: {}", e.as_deref().unwrap_or("not loaded")),
    }
    println!("CUDA libraries from scripts/setup --gpu: {}", d.cuda_libraries.as_deref().unwrap_or("none"));
    match (&d.nvidia, &d.nvidia_error) {
        (Some(s), _) => {
            println!("NVIDIA driver {} (CUDA {}), {} GPU(s)", s.driver_version, s.cuda_driver_version, s.gpus.len());
            for g in &s.gpus {
                println!("  {g}");
            }
        }
        (None, e) => println!("GPUs: none usable: {}", e.as_deref().unwrap_or("unknown")),
    }
    Ok(())
}
