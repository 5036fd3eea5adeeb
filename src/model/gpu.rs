//! What NVIDIA GPUs this machine has, asked of the driver itself: the CUDA driver API (`libcuda.so.1`)
//! for each GPU's name, compute capability and memory, NVML (`libnvidia-ml.so.1`) for the driver's
//! version string, and the CUDA runtime and cuDNN libraries that ONNX Runtime's CUDA provider loaded for
//! their versions. All are opened at run time, so a machine without a GPU builds and runs the same
//! binary and gets a clear error here.

use std::ffi::{CStr, c_char, c_int, c_uint};

use serde::{Deserialize, Serialize};

/// One GPU, as the CUDA driver numbers it (the `N` of `cuda:N`, after `CUDA_VISIBLE_DEVICES`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The CUDA ordinal.
    pub index: i32,
    /// E.g. `NVIDIA RTX A6000`.
    pub name: String,
    /// E.g. `8.6`.
    pub compute_capability: String,
    /// Total memory, MiB.
    pub memory_mib: u64,
}

impl std::fmt::Display for GpuInfo {
    /// `cuda:0: NVIDIA A40 (compute 8.6, 45634 MiB)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cuda:{}: {} (compute {}, {} MiB)", self.index, self.name, self.compute_capability, self.memory_mib)
    }
}

/// The GPUs and the software that drives them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSystem {
    /// The NVIDIA driver's version, e.g. `580.82.07` (from NVML; `unknown` when NVML is absent).
    pub driver_version: String,
    /// The newest CUDA version the driver supports, e.g. `13.0`.
    pub cuda_driver_version: String,
    /// Every GPU the driver shows this process.
    pub gpus: Vec<GpuInfo>,
}

type CuResult = c_int;

/// Ask the CUDA driver. The error says what is missing: the driver library, or a usable GPU.
pub fn probe() -> Result<GpuSystem, String> {
    // SAFETY: the signatures below are those of cuda.h (CUDA driver API, stable since CUDA 4) and
    // nvml.h; every out-pointer points at a live local of the declared type, and name buffers are
    // passed with their true length. The libraries stay loaded for the life of the process, since CUDA
    // state must not be unloaded under ONNX Runtime.
    unsafe {
        let cuda = std::mem::ManuallyDrop::new(libloading::Library::new("libcuda.so.1").map_err(|e| {
            let e = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_else(|| e.to_string());
            format!(
                "no NVIDIA driver: libcuda.so.1 cannot be loaded ({e}). A CUDA device needs an NVIDIA GPU with its driver \
                 installed; run on the CPU with embed.device = 'cpu'"
            )
        })?);
        let sym = |name: &[u8]| -> Result<*const (), String> {
            cuda.get::<*const ()>(name).map(|s| *s).map_err(|e| format!("libcuda.so.1 lacks a function: {e}"))
        };
        let cu_init: unsafe extern "C" fn(c_uint) -> CuResult = std::mem::transmute(sym(b"cuInit\0")?);
        let driver_version: unsafe extern "C" fn(*mut c_int) -> CuResult =
            std::mem::transmute(sym(b"cuDriverGetVersion\0")?);
        let count: unsafe extern "C" fn(*mut c_int) -> CuResult = std::mem::transmute(sym(b"cuDeviceGetCount\0")?);
        let get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult = std::mem::transmute(sym(b"cuDeviceGet\0")?);
        let get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult =
            std::mem::transmute(sym(b"cuDeviceGetName\0")?);
        let total_mem: unsafe extern "C" fn(*mut usize, c_int) -> CuResult =
            std::mem::transmute(sym(b"cuDeviceTotalMem_v2\0")?);
        let attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult =
            std::mem::transmute(sym(b"cuDeviceGetAttribute\0")?);
        let error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult =
            std::mem::transmute(sym(b"cuGetErrorString\0")?);
        let check = |what: &str, code: CuResult| -> Result<(), String> {
            if code == 0 {
                return Ok(());
            }
            let mut text: *const c_char = std::ptr::null();
            let message = if error_string(code, &mut text) == 0 && !text.is_null() {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            } else {
                format!("CUDA error {code}")
            };
            Err(format!("the CUDA driver failed at {what}: {message}"))
        };

        check("cuInit", cu_init(0))?;
        let mut version = 0;
        check("cuDriverGetVersion", driver_version(&mut version))?;
        let mut n = 0;
        check("cuDeviceGetCount", count(&mut n))?;
        let mut gpus = Vec::with_capacity(n.max(0) as usize);
        for index in 0..n {
            let mut device = 0;
            check("cuDeviceGet", get(&mut device, index))?;
            let mut name = [0 as c_char; 256];
            check("cuDeviceGetName", get_name(name.as_mut_ptr(), name.len() as c_int, device))?;
            let mut bytes = 0usize;
            check("cuDeviceTotalMem", total_mem(&mut bytes, device))?;
            let (mut major, mut minor) = (0, 0);
            check("cuDeviceGetAttribute", attribute(&mut major, 75, device))?;
            check("cuDeviceGetAttribute", attribute(&mut minor, 76, device))?;
            gpus.push(GpuInfo {
                index,
                name: CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
                compute_capability: format!("{major}.{minor}"),
                memory_mib: bytes as u64 / (1024 * 1024),
            });
        }
        Ok(GpuSystem {
            driver_version: nvml_driver_version().unwrap_or_else(|| "unknown".into()),
            cuda_driver_version: format!("{}.{}", version / 1000, version % 1000 / 10),
            gpus,
        })
    }
}

impl GpuSystem {
    /// The GPUs `ids` names, or an error that says which ones this machine does not have.
    pub fn select(&self, ids: &[i32]) -> Result<Vec<GpuInfo>, String> {
        ids.iter()
            .map(|&id| {
                self.gpus.iter().find(|g| g.index == id).cloned().ok_or_else(|| {
                    let have: Vec<String> = self.gpus.iter().map(|g| format!("cuda:{} {}", g.index, g.name)).collect();
                    if have.is_empty() {
                        "the NVIDIA driver shows no GPU to this process (check CUDA_VISIBLE_DEVICES)".to_string()
                    } else {
                        format!("there is no cuda:{id}; this machine has {}", have.join(", "))
                    }
                })
            })
            .collect()
    }
}

/// `nvmlSystemGetDriverVersion`, e.g. `580.82.07`.
fn nvml_driver_version() -> Option<String> {
    // SAFETY: nvml.h signatures; the buffer is 96 bytes, above NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE (80).
    unsafe {
        let nvml = libloading::Library::new("libnvidia-ml.so.1").ok()?;
        let init: libloading::Symbol<unsafe extern "C" fn() -> c_int> = nvml.get(b"nvmlInit_v2\0").ok()?;
        let version: libloading::Symbol<unsafe extern "C" fn(*mut c_char, c_uint) -> c_int> =
            nvml.get(b"nvmlSystemGetDriverVersion\0").ok()?;
        let shutdown: libloading::Symbol<unsafe extern "C" fn() -> c_int> = nvml.get(b"nvmlShutdown\0").ok()?;
        if init() != 0 {
            return None;
        }
        let mut buf = [0 as c_char; 96];
        let ok = version(buf.as_mut_ptr(), buf.len() as c_uint) == 0;
        shutdown();
        ok.then(|| CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned())
    }
}

/// The versions of the CUDA runtime and cuDNN that the process has loaded (ONNX Runtime's CUDA provider
/// loads `libcudart.so.13`, or `.12` for a CUDA 12 build, and `libcudnn.so.9`), e.g. `("13.0", "9.14.0")`. `None` for one not loaded.
pub fn loaded_cuda_library_versions() -> (Option<String>, Option<String>) {
    // SAFETY: RTLD_NOLOAD only finds a library already in the process and never loads one;
    // cudaRuntimeGetVersion(int*) and cudnnGetVersion(void) -> size_t are the documented signatures.
    unsafe {
        let loaded = |name: &str| {
            libloading::os::unix::Library::open(Some(name), libloading::os::unix::RTLD_NOW | libc_rtld_noload()).ok()
        };
        let runtime = loaded("libcudart.so.13").or_else(|| loaded("libcudart.so.12")).and_then(|lib| {
            let f: libloading::os::unix::Symbol<unsafe extern "C" fn(*mut c_int) -> c_int> =
                lib.get(b"cudaRuntimeGetVersion\0").ok()?;
            let mut v = 0;
            (f(&mut v) == 0).then(|| format!("{}.{}", v / 1000, v % 1000 / 10))
        });
        let cudnn = loaded("libcudnn.so.9").and_then(|lib| {
            let f: libloading::os::unix::Symbol<unsafe extern "C" fn() -> usize> =
                lib.get(b"cudnnGetVersion\0").ok()?;
            let v = f();
            Some(format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100))
        });
        (runtime, cudnn)
    }
}

/// glibc's RTLD_NOLOAD.
const fn libc_rtld_noload() -> c_int {
    0x4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selecting_gpus_names_the_missing_one_and_what_there_is() {
        let system = GpuSystem {
            driver_version: "580.82.07".into(),
            cuda_driver_version: "13.0".into(),
            gpus: vec![GpuInfo {
                index: 0,
                name: "NVIDIA A40".into(),
                compute_capability: "8.6".into(),
                memory_mib: 46068,
            }],
        };
        assert_eq!(system.select(&[0]).unwrap()[0].name, "NVIDIA A40");
        let e = system.select(&[0, 1]).unwrap_err();
        assert!(e.contains("there is no cuda:1; this machine has cuda:0 NVIDIA A40"), "{e}");
        let none = GpuSystem { gpus: vec![], ..system };
        assert!(none.select(&[0]).unwrap_err().contains("shows no GPU"));
    }

    #[test]
    fn a_machine_without_the_driver_gets_a_clear_error() {
        let Err(e) = probe() else {
            eprintln!("skipped: this machine has an NVIDIA driver");
            return;
        };
        // A machine may have the driver library but no GPU: then cuInit's own message is passed on.
        if e.contains("libcuda.so.1 cannot be loaded") {
            assert!(e.contains("no NVIDIA driver") && e.contains("embed.device = 'cpu'"), "{e}");
        } else {
            assert!(e.contains("the CUDA driver failed at cuInit"), "{e}");
        }
        assert_eq!(loaded_cuda_library_versions(), (None, None));
    }
}
