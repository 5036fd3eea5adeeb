//! Describing where vectors are computed: the execution provider, the device and the ONNX Runtime
//! version that was loaded.

use std::ffi::CStr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::model::gpu::{GpuInfo, GpuSystem, loaded_cuda_library_versions};
use crate::model::placement::NodePlacement;

/// ONNX Runtime's name for its CUDA execution provider.
pub const CUDA_PROVIDER: &str = "CUDAExecutionProvider";

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
                let distinct = |v: &Vec<i32>| v.iter().enumerate().all(|(i, id)| !v[..i].contains(id));
                ids.filter(|v| !v.is_empty() && distinct(v)).map(Self::Cuda)
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

/// Above these bytes of weights, a GPU gets one ONNX Runtime session, not two, when the number is left
/// automatic (`embed.sessions_per_device = 0`). Each session holds its own copy of the weights on the card (on
/// an H200, a 415 MiB XLM-R took 1,132 MiB of GPU memory loaded in one session and 2,240 MiB in two), and a
/// second session buys little where the device's work dwarfs the host's (1.09x for a 0.6B decoder there): for a
/// model past 4 GiB (a 1B-parameter model in float32, 2B in float16) the second copy costs more card than it
/// gives back.
pub const TWO_SESSIONS_UP_TO_BYTES: u64 = 4 << 30;

/// Sessions per GPU when left automatic, for a model of `weight_bytes`: two (one session's host work overlaps
/// the other's device work) up to [`TWO_SESSIONS_UP_TO_BYTES`], one above.
pub fn auto_sessions_per_gpu(weight_bytes: u64) -> usize {
    if weight_bytes > TWO_SESSIONS_UP_TO_BYTES { 1 } else { 2 }
}

/// How a model is placed: on which device, in how many ONNX Runtime sessions, with how many threads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Placement {
    /// Where.
    pub device: Device,
    /// Sessions on each device (on each GPU of a `cuda:0,1` list); they share the batches.
    pub sessions_per_device: usize,
    /// ONNX Runtime intra-op threads per session.
    pub intra_threads: usize,
    /// On CUDA, whether nodes the provider cannot run may run on the CPU.
    pub allow_cpu_fallback: bool,
}

impl Placement {
    /// One CPU session with this many threads.
    pub fn cpu(intra_threads: usize) -> Self {
        Self { device: Device::Cpu, sessions_per_device: 1, intra_threads, allow_cpu_fallback: false }
    }

    /// ONNX Runtime sessions in all: `sessions_per_device` on each device.
    pub fn sessions(&self) -> usize {
        let devices = match &self.device {
            Device::Cpu => 1,
            Device::Cuda(ids) => ids.len().max(1),
        };
        self.sessions_per_device.max(1) * devices
    }
}

/// The execution side of a run. Not part of the fingerprint: the same fingerprint on another device
/// is allowed, and the run record says so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeviceInfo {
    /// The ONNX Runtime execution provider that ran the model.
    pub provider: String,
    /// The device, e.g. `cpu: AMD EPYC 7B13 (2 threads)`.
    pub device: String,
    /// The ONNX Runtime version the loaded library reports.
    pub onnxruntime_version: String,
    /// The library file.
    pub onnxruntime_library: String,
    /// On CUDA: the GPUs that ran the model, and the driver, CUDA and cuDNN versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<CudaInfo>,
    /// On CUDA: how many nodes each provider ran in a profiled probe batch, and the nodes doing real
    /// work that fell back to the CPU (only with embed.allow_cpu_fallback; otherwise the run stops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodePlacement>,
}

impl std::fmt::Display for DeviceInfo {
    /// `CUDAExecutionProvider on cuda:0: NVIDIA A40 (compute 8.6, 45634 MiB), ONNX Runtime 1.31.1, driver
    /// 580.82.07 (CUDA 13.0), CUDA runtime 13.0, cuDNN 9.14.0`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on {}, ONNX Runtime {}", self.provider, self.device, self.onnxruntime_version)?;
        if let Some(c) = &self.cuda {
            write!(f, ", driver {} (CUDA {})", c.driver_version, c.cuda_driver_version)?;
            if let Some(v) = &c.cuda_runtime_version {
                write!(f, ", CUDA runtime {v}")?;
            }
            if let Some(v) = &c.cudnn_version {
                write!(f, ", cuDNN {v}")?;
            }
            if !c.input_memory.is_empty() {
                write!(f, ", inputs in {}", c.input_memory)?;
            }
        }
        if let Some(n) = &self.nodes {
            write!(f, " ({}", n.summary())?;
            if !n.fallback_nodes.is_empty() {
                write!(f, "; {} nodes doing real work fell back to the CPU", n.fallback_nodes.len())?;
            }
            write!(f, ")")?;
        }
        Ok(())
    }
}

/// The CUDA side of a GPU run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CudaInfo {
    /// The GPUs used, each with name, compute capability and memory.
    pub gpus: Vec<GpuInfo>,
    /// The NVIDIA driver's version.
    pub driver_version: String,
    /// The newest CUDA version the driver supports.
    pub cuda_driver_version: String,
    /// The CUDA runtime ONNX Runtime loaded.
    pub cuda_runtime_version: Option<String>,
    /// The cuDNN ONNX Runtime loaded.
    pub cudnn_version: Option<String>,
    /// Where the model's inputs are written before the copy to the GPU: `pinned host memory`, or why
    /// not. Empty in records written before it was kept.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub input_memory: String,
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
            cuda: None,
            nodes: None,
        }
    }

    /// The CUDA provider on these GPUs, with the loaded library's version and the driver's. Call it
    /// after the session is built, when ONNX Runtime has loaded the CUDA runtime and cuDNN.
    pub fn cuda(library: &Path, gpus: Vec<GpuInfo>, system: &GpuSystem) -> Self {
        let (cuda_runtime_version, cudnn_version) = loaded_cuda_library_versions();
        Self {
            provider: CUDA_PROVIDER.to_string(),
            device: gpus.iter().map(GpuInfo::to_string).collect::<Vec<_>>().join("; "),
            onnxruntime_version: library_version(library).unwrap_or_else(|| "unknown".into()),
            onnxruntime_library: library.display().to_string(),
            cuda: Some(CudaInfo {
                gpus,
                driver_version: system.driver_version.clone(),
                cuda_driver_version: system.cuda_driver_version.clone(),
                cuda_runtime_version,
                cudnn_version,
                input_memory: String::new(),
            }),
            nodes: None,
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
pub(crate) fn library_version(library: &Path) -> Option<String> {
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
    use super::{CudaInfo, Device, DeviceInfo};
    use crate::model::gpu::GpuInfo;

    #[test]
    fn a_gpu_record_says_where_inputs_were_written_and_older_records_still_read() {
        let older = r#"{"provider": "CUDAExecutionProvider", "device": "cuda:0: NVIDIA A40 (compute 8.6, 45634 MiB)",
            "onnxruntime_version": "1.31.1", "onnxruntime_library": "/x/libonnxruntime.so",
            "cuda": {"gpus": [{"index": 0, "name": "NVIDIA A40", "compute_capability": "8.6", "memory_mib": 45634}],
                     "driver_version": "580.82.07", "cuda_driver_version": "13.0",
                     "cuda_runtime_version": "13.0", "cudnn_version": "9.14.0"}}"#;
        let mut info: DeviceInfo = serde_json::from_str(older).unwrap();
        let cuda: &mut CudaInfo = info.cuda.as_mut().unwrap();
        assert_eq!(cuda.input_memory, "", "records written before input_memory was kept");
        assert_eq!(
            cuda.gpus[0],
            GpuInfo {
                index: 0,
                name: "NVIDIA A40".into(),
                compute_capability: "8.6".into(),
                memory_mib: 45634,
                memory_free_mib: None,
                pci_location: None
            }
        );
        assert!(!info.to_string().contains("inputs in"), "{info}");
        assert!(!serde_json::to_string(&info).unwrap().contains("input_memory"), "an empty field is not written");
        info.cuda.as_mut().unwrap().input_memory = "pinned host memory".into();
        assert!(info.to_string().ends_with("cuDNN 9.14.0, inputs in pinned host memory"), "{info}");
        let back: DeviceInfo = serde_json::from_str(&serde_json::to_string(&info).unwrap()).unwrap();
        assert_eq!(back, info);
    }

    #[test]
    fn parses_device_settings() {
        assert_eq!(Device::parse("cpu"), Some(Device::Cpu));
        assert_eq!(Device::parse("CUDA"), Some(Device::Cuda(vec![0])));
        assert_eq!(Device::parse("cuda:1"), Some(Device::Cuda(vec![1])));
        assert_eq!(Device::parse("cuda:0, 1"), Some(Device::Cuda(vec![0, 1])));
        for bad in ["tpu", "cuda:", "cuda:x", "cuda:-1", "cuda:0,", "cuda:1,1", ""] {
            assert_eq!(Device::parse(bad), None, "{bad}");
        }
        assert_eq!(Device::Cuda(vec![0, 1]).name(), "cuda:0,1");
    }
}
