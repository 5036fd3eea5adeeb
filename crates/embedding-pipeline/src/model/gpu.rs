//! What NVIDIA GPUs this machine has, asked of the driver itself: the CUDA driver API (`libcuda.so.1`)
//! for each GPU's name, compute capability and memory, NVML (`libnvidia-ml.so.1`, through `nvml-wrapper`)
//! for the driver's version string, and the CUDA runtime and cuDNN libraries that ONNX Runtime's CUDA
//! provider loaded for their versions. All are opened at run time, so a machine without a GPU builds and
//! runs the same binary and gets a clear error here.
//!
//! Every per-GPU fact but one comes from CUDA, keyed by the CUDA ordinal (after `CUDA_VISIBLE_DEVICES`,
//! MIG instances included). The one NVML adds, the memory free now, is matched to the CUDA device by its
//! PCI location, since NVML numbers every GPU in PCI order and CUDA its visible ones fastest first.

use std::ffi::{CStr, c_char, c_int, c_uint};

use serde::{Deserialize, Serialize};

/// One GPU, as the CUDA driver numbers it (the `N` of `cuda:N`, after `CUDA_VISIBLE_DEVICES`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GpuInfo {
    /// The CUDA ordinal.
    pub index: i32,
    /// E.g. `NVIDIA RTX A6000`.
    pub name: String,
    /// E.g. `8.6`.
    pub compute_capability: String,
    /// Total memory, MiB.
    pub memory_mib: u64,
    /// Memory free when asked, MiB (from NVML; absent without NVML, or for a MIG instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_free_mib: Option<u64>,
    /// Its PCI location `[domain, bus, device]`, which finds it among NVML's devices (not recorded).
    #[serde(skip)]
    pub pci_location: Option<[u32; 3]>,
}

impl std::fmt::Display for GpuInfo {
    /// `cuda:0: NVIDIA A40 (compute 8.6, 45634 MiB)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cuda:{}: {} (compute {}, {} MiB", self.index, self.name, self.compute_capability, self.memory_mib)?;
        match self.memory_free_mib {
            Some(free) => write!(f, ", {free} MiB free)"),
            None => write!(f, ")"),
        }
    }
}

/// The GPUs and the software that drives them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GpuSystem {
    /// The NVIDIA driver's version, e.g. `580.82.07` (from NVML; `unknown` when NVML is absent).
    pub driver_version: String,
    /// The newest CUDA version the driver supports, e.g. `13.0`.
    pub cuda_driver_version: String,
    /// Every GPU the driver shows this process.
    pub gpus: Vec<GpuInfo>,
}

type CuResult = c_int;

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` / `_MINOR` and `_PCI_DOMAIN_ID` / `_PCI_BUS_ID` /
/// `_PCI_DEVICE_ID` of cuda.h.
const CC_MAJOR: c_int = 75;
const CC_MINOR: c_int = 76;
const PCI_ATTRIBUTES: [c_int; 3] = [50, 33, 34];

/// A function of libcuda as a typed pointer.
///
/// # Safety
/// `T` must be the function's true signature (from cuda.h), and `lib` must stay loaded while it is used.
unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, String> {
    unsafe { lib.get::<T>(name) }.map(|f| *f).map_err(|e| format!("libcuda.so.1 lacks a function: {e}"))
}

/// Ask the CUDA driver. The error says what is missing: the driver library, or a usable GPU.
pub fn probe() -> Result<GpuSystem, String> {
    // SAFETY: the signatures below are those of cuda.h (CUDA driver API, stable since CUDA 4); every
    // out-pointer points at a live local of the declared type, and name buffers are passed with their
    // true length. libcuda stays loaded for the life of the process, since CUDA state must not be
    // unloaded under ONNX Runtime.
    unsafe {
        let cuda = std::mem::ManuallyDrop::new(libloading::Library::new("libcuda.so.1").map_err(|e| {
            let e = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_else(|| e.to_string());
            format!(
                "no NVIDIA driver: libcuda.so.1 cannot be loaded ({e}). A CUDA device needs an NVIDIA GPU with its driver \
                 installed; run on the CPU with embed.device = 'cpu'"
            )
        })?);
        let cu_init: unsafe extern "C" fn(c_uint) -> CuResult = sym(&cuda, "cuInit")?;
        let driver_version: unsafe extern "C" fn(*mut c_int) -> CuResult = sym(&cuda, "cuDriverGetVersion")?;
        let count: unsafe extern "C" fn(*mut c_int) -> CuResult = sym(&cuda, "cuDeviceGetCount")?;
        let get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult = sym(&cuda, "cuDeviceGet")?;
        let get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult = sym(&cuda, "cuDeviceGetName")?;
        let total_mem: unsafe extern "C" fn(*mut usize, c_int) -> CuResult = sym(&cuda, "cuDeviceTotalMem_v2")?;
        let attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult = sym(&cuda, "cuDeviceGetAttribute")?;
        let error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult =
            sym(&cuda, "cuGetErrorString")?;
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
        let nvml = nvml_wrapper::Nvml::init().ok();
        let mut gpus = Vec::with_capacity(n.max(0) as usize);
        for index in 0..n {
            let mut device = 0;
            check("cuDeviceGet", get(&mut device, index))?;
            let mut name = [0 as c_char; 256];
            check("cuDeviceGetName", get_name(name.as_mut_ptr(), name.len() as c_int, device))?;
            let mut bytes = 0usize;
            check("cuDeviceTotalMem", total_mem(&mut bytes, device))?;
            let (mut major, mut minor) = (0, 0);
            check("cuDeviceGetAttribute", attribute(&mut major, CC_MAJOR, device))?;
            check("cuDeviceGetAttribute", attribute(&mut minor, CC_MINOR, device))?;
            let mut pci = [0; 3];
            for (value, attr) in pci.iter_mut().zip(PCI_ATTRIBUTES) {
                check("cuDeviceGetAttribute", attribute(value, attr, device))?;
            }
            gpus.push(GpuInfo {
                index,
                name: CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
                compute_capability: format!("{major}.{minor}"),
                memory_mib: bytes as u64 / (1024 * 1024),
                memory_free_mib: nvml.as_ref().and_then(|nvml| free_memory_mib(nvml, pci.map(|v| v as u32))),
                pci_location: Some(pci.map(|v| v as u32)),
            });
        }
        Ok(GpuSystem {
            driver_version: nvml.and_then(|nvml| nvml.sys_driver_version().ok()).unwrap_or_else(|| "unknown".into()),
            cuda_driver_version: format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(version),
                nvml_wrapper::cuda_driver_version_minor(version)
            ),
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

/// The NVML device at a CUDA device's PCI location.
fn nvml_device(nvml: &nvml_wrapper::Nvml, location: [u32; 3]) -> Option<nvml_wrapper::Device<'_>> {
    (0..nvml.device_count().ok()?)
        .filter_map(|i| nvml.device_by_index(i).ok())
        .find(|d| d.pci_info().is_ok_and(|p| pci_location(&p.bus_id) == Some(location)))
}

/// The memory in use on some GPUs, summed, polled by a thread of its own every millisecond, with the
/// largest sum seen since the last [`UsedMemory::reset`]. NVML's figure is the device's: the CUDA context,
/// ONNX Runtime's arena and any other process on the card.
#[derive(Debug)]
pub struct UsedMemory {
    state: std::sync::Arc<UsedState>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct UsedState {
    stop: std::sync::atomic::AtomicBool,
    now: std::sync::atomic::AtomicU64,
    peak: std::sync::atomic::AtomicU64,
    /// Free memory at the last poll, bytes, summed.
    free: std::sync::atomic::AtomicU64,
}

impl UsedMemory {
    /// Start polling the GPUs `gpus`; `None` where NVML is absent or does not list one of them (a MIG
    /// instance).
    pub fn start(gpus: &[GpuInfo]) -> Option<Self> {
        use std::sync::atomic::Ordering::Relaxed;
        let locations: Vec<[u32; 3]> = gpus.iter().map(|g| g.pci_location).collect::<Option<_>>()?;
        let nvml = nvml_wrapper::Nvml::init().ok()?;
        if locations.iter().any(|l| nvml_device(&nvml, *l).is_none()) {
            return None;
        }
        let state = std::sync::Arc::new(UsedState::default());
        let poll = move |nvml: &nvml_wrapper::Nvml, state: &UsedState| {
            let (mut used, mut free) = (0, 0);
            for l in &locations {
                if let Some(m) = nvml_device(nvml, *l).and_then(|d| d.memory_info().ok()) {
                    (used, free) = (used + m.used, free + m.free);
                }
            }
            state.now.store(used, Relaxed);
            state.free.store(free, Relaxed);
            state.peak.fetch_max(used, Relaxed);
        };
        poll(&nvml, &state);
        let shared = std::sync::Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("gpu-memory".into())
            .spawn(move || {
                while !shared.stop.load(Relaxed) {
                    poll(&nvml, &shared);
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            })
            .ok()?;
        Some(Self { state, thread: Some(thread) })
    }

    /// Memory in use now, bytes.
    pub fn now(&self) -> u64 {
        self.state.now.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Memory free now, bytes.
    pub fn free(&self) -> u64 {
        self.state.free.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The largest use seen since the last reset, bytes.
    pub fn peak(&self) -> u64 {
        self.state.peak.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Start a new peak from the use now.
    pub fn reset(&self) {
        self.state.peak.store(self.now(), std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for UsedMemory {
    fn drop(&mut self) {
        self.state.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The free memory of the GPU at a CUDA device's PCI location `(domain, bus, device)`, found among NVML's
/// devices by theirs. `None` when NVML does not list it (a MIG instance, or a GPU NVML cannot see).
fn free_memory_mib(nvml: &nvml_wrapper::Nvml, location: [u32; 3]) -> Option<u64> {
    Some(nvml_device(nvml, location)?.memory_info().ok()?.free / (1024 * 1024))
}

/// `[domain, bus, device]` of a PCI bus id in CUDA's (`0000:3b:00.0`) or NVML's (`00000000:3B:00.0`) form:
/// numbers, since the two spell them differently.
fn pci_location(bus_id: &str) -> Option<[u32; 3]> {
    let (domain, rest) = bus_id.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, _function) = rest.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some([hex(domain)?, hex(bus)?, hex(device)?])
}

/// The versions of the CUDA runtime and cuDNN that the process has loaded (ONNX Runtime's CUDA provider
/// loads `libcudart.so.13`, or `.12` for a CUDA 12 build, and `libcudnn.so.9`), e.g. `("13.0", "9.14.0")`. `None` for one not loaded.
pub fn loaded_cuda_library_versions() -> (Option<String>, Option<String>) {
    // SAFETY: RTLD_NOLOAD only finds a library already in the process and never loads one;
    // cudaRuntimeGetVersion(int*) and cudnnGetVersion(void) -> size_t are the documented signatures.
    unsafe {
        let loaded = |name: &str| {
            libloading::os::unix::Library::open(Some(name), libloading::os::unix::RTLD_NOW | libc::RTLD_NOLOAD).ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An A40 as the CUDA driver would describe it, without NVML's facts.
    fn a40() -> GpuInfo {
        GpuInfo {
            index: 0,
            name: "NVIDIA A40".into(),
            compute_capability: "8.6".into(),
            memory_mib: 46068,
            memory_free_mib: None,
            pci_location: None,
        }
    }

    #[test]
    fn selecting_gpus_names_the_missing_one_and_what_there_is() {
        let system =
            GpuSystem { driver_version: "580.82.07".into(), cuda_driver_version: "13.0".into(), gpus: vec![a40()] };
        assert_eq!(system.select(&[0]).unwrap()[0].name, "NVIDIA A40");
        let e = system.select(&[0, 1]).unwrap_err();
        assert!(e.contains("there is no cuda:1; this machine has cuda:0 NVIDIA A40"), "{e}");
        let none = GpuSystem { gpus: vec![], ..system };
        assert!(none.select(&[0]).unwrap_err().contains("shows no GPU"));
    }

    #[test]
    fn a_machine_without_the_driver_gets_a_clear_error() {
        let e = match probe() {
            // A machine with the driver (a GPU machine running the suite): the probe reads its version instead.
            Ok(system) => {
                assert!(!system.driver_version.is_empty(), "the driver's version is read: {system:?}");
                return;
            }
            Err(e) => e,
        };
        // A machine may have the driver library but no GPU: then cuInit's own message is passed on.
        if e.contains("libcuda.so.1 cannot be loaded") {
            assert!(e.contains("no NVIDIA driver") && e.contains("embed.device = 'cpu'"), "{e}");
        } else {
            assert!(e.contains("the CUDA driver failed at cuInit"), "{e}");
        }
        assert_eq!(loaded_cuda_library_versions(), (None, None));
    }

    #[test]
    fn a_machine_without_nvml_does_not_panic() {
        // SAFETY: loading libnvidia-ml runs only its initialisers; it only tells whether it is there.
        let present = unsafe { libloading::Library::new("libnvidia-ml.so.1") }.is_ok();
        let gpu = a40();
        assert!(UsedMemory::start(std::slice::from_ref(&gpu)).is_none(), "no PCI location: nothing to poll");
        if !present {
            assert!(nvml_wrapper::Nvml::init().is_err(), "an error, where NVML is absent, not a panic");
            let located = GpuInfo { pci_location: Some([0, 0x3b, 0]), ..gpu };
            assert!(UsedMemory::start(&[located]).is_none(), "no NVML: no device memory to poll");
        }
    }

    #[test]
    fn cuda_and_nvml_bus_ids_name_the_same_location() {
        assert_eq!(pci_location("0000:3b:00.0"), Some([0, 0x3b, 0]));
        assert_eq!(pci_location("0000:3b:00.0"), pci_location("00000000:3B:00.0"));
        assert_eq!(pci_location("00000001:01:1F.0"), Some([1, 1, 0x1f]));
        assert_eq!(pci_location("garbage"), None);
        let gpu = GpuInfo {
            index: 1,
            name: "NVIDIA A40".into(),
            compute_capability: "8.6".into(),
            memory_mib: 45634,
            memory_free_mib: Some(45000),
            pci_location: None,
        };
        assert_eq!(gpu.to_string(), "cuda:1: NVIDIA A40 (compute 8.6, 45634 MiB, 45000 MiB free)");
    }

    #[test]
    fn the_cuda_version_number_reads_as_major_dot_minor() {
        use nvml_wrapper::{cuda_driver_version_major as major, cuda_driver_version_minor as minor};
        let f = |v| format!("{}.{}", major(v), minor(v));
        assert_eq!(f(13000), "13.0");
        assert_eq!(f(12080), "12.8");
    }
}
