//! How a batch goes into an ONNX Runtime session and its result comes back: IO binding, with the inputs
//! in pinned (page-locked) host memory on a GPU.
//!
//! On a GPU, inputs in ordinary (pageable) host memory are first copied by the driver into a pinned
//! staging buffer, and the copy to the device waits for that. Inputs written straight into memory
//! from ONNX Runtime's pinned allocator (an arena, so the blocks are reused from call to call) skip
//! that step. The output is bound to host memory, so what the graph returns (one pooled vector per
//! text on a GPU, see [`crate::model::onnx_pooling`]) is the only thing copied back, and only the
//! bound output is computed.
//!
//! On the CPU the inputs are ordinary host tensors: the same code path, tested in CI, with nothing to
//! copy.

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, Session, SessionOutputs};
use ort::value::Tensor;

use crate::error::Result;

/// Where a session's inputs are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputMemory {
    /// Ordinary host memory: the CPU provider reads it in place.
    Host,
    /// ONNX Runtime's pinned host memory for GPU `n`.
    Pinned(i32),
    /// A GPU run whose pinned allocator could not be had; inputs are in ordinary host memory, which
    /// works, only with one more copy. The reason is kept for the run record.
    PinnedUnavailable(String),
}

impl InputMemory {
    /// For the run record: `pinned host memory` or `pageable host memory (…why…)`.
    pub fn describe(&self) -> String {
        match self {
            Self::Host => "host memory".into(),
            Self::Pinned(_) => "pinned host memory".into(),
            Self::PinnedUnavailable(why) => format!("pageable host memory (no pinned allocator: {why})"),
        }
    }
}

/// One session's IO binding and the allocator its inputs come from. It lives beside its session, under
/// the same lock.
#[derive(Debug)]
pub struct Feed {
    binding: IoBinding,
    /// ONNX Runtime's pinned allocator on a GPU; `None`: inputs are ordinary host tensors.
    pinned: Option<Allocator>,
    memory: InputMemory,
    /// Host memory the output is bound to.
    output_memory: MemoryInfo<'static>,
}

impl Feed {
    /// The feed for `session`, with pinned inputs when it runs on GPU `gpu`. A missing pinned allocator
    /// is not an error (see [`InputMemory::PinnedUnavailable`]).
    pub fn new(session: &Session, gpu: Option<i32>) -> Result<Self> {
        let (pinned, memory) = match gpu {
            None => (None, InputMemory::Host),
            Some(id) => match pinned_allocator(session, id) {
                Ok(a) => (Some(a), InputMemory::Pinned(id)),
                Err(e) => (None, InputMemory::PinnedUnavailable(e.to_string())),
            },
        };
        Ok(Self {
            binding: session.create_binding()?,
            pinned,
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
        let mut tensor = match &self.pinned {
            Some(pinned) => {
                let mut t = Tensor::<i64>::new(pinned, [rows, len])?;
                t.try_extract_tensor_mut::<i64>()?.1.fill(0);
                t
            }
            None => Tensor::from_array(([rows, len], vec![0i64; rows * len]))?,
        };
        fill(tensor.try_extract_tensor_mut::<i64>()?.1);
        Ok(tensor)
    }

    /// Run `session` on `inputs` (by input name), computing only `output`, which comes back in host
    /// memory, and hand the outputs to `read`. The inputs are unbound afterwards, so pinned blocks go
    /// back to the arena before the next call takes its own.
    pub fn run<R>(
        &mut self,
        session: &mut Session,
        inputs: &[(&str, &Tensor<i64>)],
        output: &str,
        read: impl FnOnce(&SessionOutputs<'_>) -> Result<R>,
    ) -> Result<R> {
        let result = self.bind_and_run(session, inputs, output, read);
        self.binding.clear_inputs();
        result
    }

    fn bind_and_run<R>(
        &mut self,
        session: &mut Session,
        inputs: &[(&str, &Tensor<i64>)],
        output: &str,
        read: impl FnOnce(&SessionOutputs<'_>) -> Result<R>,
    ) -> Result<R> {
        for (name, tensor) in inputs {
            self.binding.bind_input(*name, *tensor)?;
        }
        // NOTE: bound anew on every call. After a run the binding holds that run's output value, and
        // ONNX Runtime treats it as preallocated on the next run: with another batch shape the run fails.
        self.binding.clear_outputs();
        self.binding.bind_output_to_device(output, &self.output_memory)?;
        let outputs = session.run_binding(&self.binding)?;
        read(&outputs)
    }
}

/// ONNX Runtime's pinned host allocator for GPU `id`, as registered by the session's CUDA provider.
fn pinned_allocator(session: &Session, id: i32) -> ort::Result<Allocator> {
    Allocator::new(
        session,
        MemoryInfo::new(AllocationDevice::CUDA_PINNED, id, AllocatorType::Device, MemoryType::CPUInput)?,
    )
}
