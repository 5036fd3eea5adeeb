//! Describing where vectors are computed: the execution provider, the device and the ONNX Runtime
//! version that was loaded.

use std::ffi::CStr;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Where a model runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Device {
    /// ONNX Runtime's CPU provider.
    Cpu,
    /// ONNX Runtime's CUDA provider on these GPUs.
    Cuda(Vec<i32>),
}

impl Device {
    /// Parse 'cpu', 'cuda' (GPU 0), 'cuda:N' or 'cuda:N,M' (any case, spaces ignored).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase().replace(' ', "");
        match s.as_str() {
            "cpu" => Some(Self::Cpu),
            "cuda" => Some(Self::Cuda(vec![0])),
            _ => {
                let ids = s.strip_prefix("cuda:")?;
                let ids: Option<Vec<i32>> = ids.split(',').map(|i| i.parse().ok().filter(|n: &i32| *n >= 0)).collect();
                ids.filter(|v| !v.is_empty()).map(Self::Cuda)
            }
        }
    }

    /// The canonical name: `cpu`, `cuda:0`, `cuda:0,1`.
    pub fn name(&self) -> String {
        match self {
            Self::Cpu => "cpu".into(),
            Self::Cuda(ids) => format!("cuda:{}", ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")),
        }
    }
}

/// The execution side of a run. Not part of the fingerprint: the same fingerprint on another device
/// is allowed, and the run record says so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// The ONNX Runtime execution provider that ran the model.
    pub provider: String,
    /// The device, e.g. `cpu: AMD EPYC 7B13 (2 threads)`.
    pub device: String,
    /// The ONNX Runtime version the loaded library reports.
    pub onnxruntime_version: String,
    /// The library file.
    pub onnxruntime_library: String,
}

impl DeviceInfo {
    /// The CPU provider on this machine, with the loaded library's version.
    pub fn cpu(library: &Path, intra_threads: usize) -> Self {
        Self {
            provider: "CPUExecutionProvider".to_string(),
            device: format!(
                "cpu: {} ({intra_threads} intra-op threads)",
                cpu_model().unwrap_or_else(|| "unknown".into())
            ),
            onnxruntime_version: library_version(library).unwrap_or_else(|| "unknown".into()),
            onnxruntime_library: library.display().to_string(),
        }
    }
}

impl DeviceInfo {
    /// The CUDA provider on GPU `id`, with the loaded library's version.
    pub fn cuda(library: &Path, id: i32) -> Self {
        Self {
            provider: "CUDAExecutionProvider".to_string(),
            device: format!("cuda:{id}"),
            onnxruntime_version: library_version(library).unwrap_or_else(|| "unknown".into()),
            onnxruntime_library: library.display().to_string(),
        }
    }
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// Ask the library itself: `OrtGetApiBase()->GetVersionString()`.
fn library_version(library: &Path) -> Option<String> {
    // SAFETY: the library is already loaded by ort (dlopen returns the same handle); OrtGetApiBase is
    // the C entry point every ONNX Runtime build exports, and GetVersionString returns a static string.
    unsafe {
        let lib = libloading::Library::new(library).ok()?;
        let get: libloading::Symbol<unsafe extern "C" fn() -> *const ort::sys::OrtApiBase> =
            lib.get(b"OrtGetApiBase\0").ok()?;
        let base = get();
        if base.is_null() {
            return None;
        }
        let s = ((*base).GetVersionString)();
        (!s.is_null()).then(|| CStr::from_ptr(s).to_string_lossy().into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::Device;

    #[test]
    fn parses_device_settings() {
        assert_eq!(Device::parse("cpu"), Some(Device::Cpu));
        assert_eq!(Device::parse("CUDA"), Some(Device::Cuda(vec![0])));
        assert_eq!(Device::parse("cuda:1"), Some(Device::Cuda(vec![1])));
        assert_eq!(Device::parse("cuda:0, 1"), Some(Device::Cuda(vec![0, 1])));
        for bad in ["tpu", "cuda:", "cuda:x", "cuda:-1", "cuda:0,", ""] {
            assert_eq!(Device::parse(bad), None, "{bad}");
        }
        assert_eq!(Device::Cuda(vec![0, 1]).name(), "cuda:0,1");
    }
}
