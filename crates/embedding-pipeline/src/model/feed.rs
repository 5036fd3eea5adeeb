//! How a batch goes into an ONNX Runtime session and its result comes back: IO binding, with the inputs
//! in pinned (page-locked) host memory on a GPU.
//!
//! On a GPU, inputs in ordinary (pageable) host memory are first copied by the driver into a pinned
//! staging buffer before the copy to the device. Inputs written straight into memory from ONNX
//! Runtime's pinned allocator skip that step. Whether that allocator is an arena (blocks reused from
//! call to call) or allocates and frees pinned memory for every batch is read from a probe tensor at
//! load and kept in the run record. The output is bound to host memory, so what the graph returns
//! (one pooled vector per text on a GPU, see [`crate::model::onnx_pooling`]) is the only thing copied
//! back, and only the bound output is computed.
//!
//! On the CPU the inputs are ordinary host tensors: the same code path, tested in CI, with nothing to
//! copy.

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, Session, SessionOutputs};
use ort::value::Tensor;

use crate::error::Result;

/// ONNX Runtime's name for pinned host memory of the CUDA provider.
const CUDA_PINNED: &str = "CudaPinned";

/// Where a session's inputs are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputMemory {
    /// Ordinary host tensors: the CPU provider reads them in place.
    Host,
    /// Memory from an ONNX Runtime allocator of the session: `CudaPinned` on a GPU.
    Allocator {
        /// ONNX Runtime's name for the memory, e.g. `CudaPinned`.
        device: String,
        /// Whether the allocator is an arena that reuses blocks across calls.
        arena: bool,
    },
    /// A GPU run whose pinned allocator could not be had or could not allocate at load; inputs are in
    /// ordinary host memory, which works, only with one more copy. The reason is kept for the record.
    PinnedUnavailable(String),
}

impl InputMemory {
    /// Whether inputs go into the CUDA provider's pinned memory.
    pub fn is_pinned(&self) -> bool {
        matches!(self, Self::Allocator { device, .. } if device == CUDA_PINNED)
    }

    /// For the run record, e.g. `pinned host memory (ONNX Runtime's arena)`.
    pub fn describe(&self) -> String {
        let how = |arena: bool| if arena { "ONNX Runtime's arena" } else { "no arena: allocated for every batch" };
        match self {
            Self::Host => "host memory".into(),
            Self::Allocator { device, arena } if device == CUDA_PINNED => {
                format!("pinned host memory ({})", how(*arena))
            }
            Self::Allocator { device, arena } => format!("{device} memory ({})", how(*arena)),
            Self::PinnedUnavailable(why) => format!("pageable host memory (no pinned allocator: {why})"),
        }
    }

    /// For the record of a run over several sessions: the first one whose inputs are not pinned, which is
    /// what a reader needs to see, or else the first one.
    pub fn record(memories: &[InputMemory]) -> String {
        memories.iter().find(|m| !m.is_pinned()).or(memories.first()).map(Self::describe).unwrap_or_default()
    }
}

/// One session's IO binding and the allocator its inputs come from. It lives beside its session, under
/// the same lock.
#[derive(Debug)]
pub struct Feed {
    binding: IoBinding,
    /// The session's allocator inputs come from (pinned on a GPU); `None`: ordinary host tensors.
    allocator: Option<Allocator>,
    memory: InputMemory,
    /// Host memory the output is bound to.
    output_memory: MemoryInfo<'static>,
}

impl Feed {
    /// The feed for `session`, with pinned inputs when it runs on GPU `gpu`. A pinned allocator that
    /// is missing, or cannot allocate, is not an error (see [`InputMemory::PinnedUnavailable`]).
    pub fn new(session: &Session, gpu: Option<i32>) -> Result<Self> {
        let Some(id) = gpu else {
            return Self::build(session, None, InputMemory::Host);
        };
        let pinned = MemoryInfo::new(AllocationDevice::CUDA_PINNED, id, AllocatorType::Device, MemoryType::CPUInput)
            .and_then(|info| Allocator::new(session, info));
        match pinned.map_err(|e| e.to_string()).and_then(probe) {
            Ok((allocator, memory)) => Self::build(session, Some(allocator), memory),
            Err(why) => Self::build(session, None, InputMemory::PinnedUnavailable(why)),
        }
    }

    /// A feed whose inputs come from `allocator`, one of the session's own. [`Feed::new`] uses this path
    /// with the pinned allocator on a GPU; tests use it with the CPU allocator of a CPU session.
    pub fn with_input_allocator(session: &Session, allocator: Allocator) -> Result<Self> {
        let (allocator, memory) = probe(allocator).map_err(crate::error::Error::onnx)?;
        Self::build(session, Some(allocator), memory)
    }

    fn build(session: &Session, allocator: Option<Allocator>, memory: InputMemory) -> Result<Self> {
        Ok(Self {
            binding: session.create_binding()?,
            allocator,
            memory,
            output_memory: MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Device, MemoryType::CPUOutput)?,
        })
    }

    /// Where this feed's inputs are written.
    pub fn memory(&self) -> &InputMemory {
        &self.memory
    }

    /// A `[rows, len]` int64 input tensor, zeroed, then written by `fill`.
    pub fn input(&self, rows: usize, len: usize, fill: impl FnOnce(&mut [i64])) -> Result<Tensor<i64>> {
        let mut tensor = match &self.allocator {
            // ort zeroes host-accessible memory it allocates, pinned memory included.
            Some(allocator) => Tensor::<i64>::new(allocator, [rows, len])?,
            None => Tensor::from_array(([rows, len], vec![0i64; rows * len]))?,
        };
        fill(tensor.try_extract_tensor_mut::<i64>()?.1);
        Ok(tensor)
    }

    /// Run `session` on `inputs` (by input name), computing only `output`, which comes back in host
    /// memory, and hand the outputs to `read`; with what it read, the time ONNX Runtime's run took. Inputs and output are unbound afterwards, whether the run
    /// worked or not: pinned blocks go back to the allocator, the binding keeps no copy of the output
    /// between calls, and the next call starts from an empty binding.
    pub fn run<R>(
        &mut self,
        session: &mut Session,
        inputs: &[(&str, &Tensor<i64>)],
        output: &str,
        read: impl FnOnce(&SessionOutputs<'_>) -> Result<R>,
    ) -> Result<(R, std::time::Duration)> {
        let binding = &mut self.binding;
        let bind_and_run = || {
            for (name, tensor) in inputs {
                binding.bind_input(*name, *tensor)?;
            }
            binding.bind_output_to_device(output, &self.output_memory)?;
            let started = std::time::Instant::now();
            let outputs = session.run_binding(binding)?;
            let ran = started.elapsed();
            Ok((read(&outputs)?, ran))
        };
        let result = bind_and_run();
        self.binding.clear_inputs();
        // NOTE: besides freeing the output, this matters for correctness: an output value left in the
        // binding is taken by ONNX Runtime as preallocated on the next run, which then fails whenever
        // the batch shape changes.
        self.binding.clear_outputs();
        result
    }
}

/// Check that `allocator` can allocate (a restricted container may refuse pinned memory), and read from
/// what it returns which memory it is and whether it is an arena.
fn probe(allocator: Allocator) -> std::result::Result<(Allocator, InputMemory), String> {
    let tensor = Tensor::<i64>::new(&allocator, [1usize, 1]).map_err(|e| format!("cannot allocate: {e}"))?;
    let info = tensor.memory_info();
    let memory = InputMemory::Allocator {
        device: info.allocation_device().as_str().to_string(),
        arena: info.allocator_type() == AllocatorType::Arena,
    };
    drop(tensor);
    Ok((allocator, memory))
}

#[cfg(test)]
mod tests {
    use super::InputMemory;

    #[test]
    fn the_record_names_the_first_session_without_pinned_inputs() {
        let pinned = InputMemory::Allocator { device: "CudaPinned".into(), arena: true };
        let unavailable = InputMemory::PinnedUnavailable("No requested allocator available".into());
        assert_eq!(InputMemory::record(&[pinned.clone(), pinned.clone()]), "pinned host memory (ONNX Runtime's arena)");
        assert_eq!(
            InputMemory::record(&[pinned.clone(), unavailable.clone(), InputMemory::Host]),
            "pageable host memory (no pinned allocator: No requested allocator available)"
        );
        assert_eq!(InputMemory::record(&[]), "");
        assert!(pinned.is_pinned() && !unavailable.is_pinned() && !InputMemory::Host.is_pinned());
        let no_arena = InputMemory::Allocator { device: "CudaPinned".into(), arena: false };
        assert_eq!(no_arena.describe(), "pinned host memory (no arena: allocated for every batch)");
        let cpu = InputMemory::Allocator { device: "Cpu".into(), arena: true };
        assert!(!cpu.is_pinned());
        assert_eq!(cpu.describe(), "Cpu memory (ONNX Runtime's arena)");
    }
}
