//! A model's ONNX Runtime sessions: built for the placement asked (a graph that pools on a GPU, the providers, the
//! workers that share one queue), the graph's inputs and output checked against what the pipeline feeds and reads,
//! and where its nodes really run.

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use ort::ep::ExecutionProvider;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::TensorElementType;

use crate::error::{Error, Result};
use crate::model::feed::{Feed, InputMemory};
use crate::model::onnx_pooling;
use crate::model::placement::{self, NodePlacement};
use crate::model::settings::CallSettings;
use crate::model::tokenize::TextTokenizer;
use crate::model::{Device, DeviceInfo, ModelSpec, Placement, gpu, runtime};

/// The inputs the pipeline makes for a graph: it feeds those of them the graph declares.
const FED: [&str; 4] = ["input_ids", "attention_mask", "token_type_ids", "position_ids"];

/// Which graph output carries the result. fp16 outputs are converted to float32 before pooling.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Output {
    /// Token states `[batch, seq, dim]`, pooled here.
    TokenStates(String),
    /// Pooled vectors `[batch, dim]`, produced by the graph itself.
    Sentence(String),
}

/// One ONNX Runtime session and the device it runs on. An embedder has one or more; they take batches
/// from one queue.
#[derive(Debug)]
pub(super) struct Worker {
    /// `cpu`, `cuda:0`…
    pub(super) device: String,
    pub(super) bound: Mutex<BoundSession>,
    /// Model calls this session made.
    pub(super) calls: AtomicU64,
}

/// A session and the IO binding that feeds it; used together, under one lock.
#[derive(Debug)]
pub(super) struct BoundSession {
    pub(super) session: Session,
    pub(super) feed: Feed,
}

/// The tokenizer refused when it gives token ids past the model's embedding table: found here, not as an ONNX
/// Runtime Gather error on the first text with such a token.
pub(super) fn check_vocabulary(spec: &ModelSpec, tokenizer: &TextTokenizer) -> Result<()> {
    if let (Some(rows), Some(max_id)) = (spec.vocab_size, tokenizer.max_id())
        && max_id as usize >= rows
    {
        return Err(Error::model(
            &spec.dir,
            "tokenizer.json",
            format!(
                "gives token ids up to {max_id}, but the model's embedding table has {rows} rows (vocab_size in \
                 config.json): this tokenizer belongs to another model; put the model's own tokenizer.json beside it"
            ),
        ));
    }
    Ok(())
}

/// The model's sessions on the placement's device (`sessions_per_device` on each), and what the device is.
pub(super) fn start_workers(
    spec: &ModelSpec,
    graph: &Graph,
    placement: &Placement,
    library: &Path,
) -> Result<(Vec<Worker>, DeviceInfo)> {
    let device = &placement.device;
    let device_err = |message: String| Error::device(device.name(), message, None);
    let per_device = placement.sessions_per_device.max(1);
    let mut workers = Vec::new();
    let info = match device {
        Device::Cpu => {
            for _ in 0..per_device {
                workers.push(Worker::new("cpu".into(), build_session(spec, graph, placement, None, None)?, None)?);
            }
            DeviceInfo::cpu(library, placement.intra_threads.max(1))
        }
        Device::Cuda(ids) => {
            if !ort::ep::CUDA::is_available().unwrap_or(false) {
                return Err(device_err(format!(
                    "the ONNX Runtime library {} has no CUDA execution provider (it is a CPU build). Run \
                     `scripts/setup --gpu` to install the GPU build of ONNX Runtime 1.31.1 (onnxruntime-gpu==1.31.1, \
                     built for CUDA 13 and cuDNN 9) with its CUDA libraries, or point --ort-lib at one",
                    library.display()
                )));
            }
            let system = gpu::probe().map_err(device_err)?;
            let gpus = system.select(ids).map_err(device_err)?;
            if let Some(dir) = runtime::installed_cuda_libraries() {
                ort::ep::cuda::preload_dylibs(Some(&dir), Some(&dir)).map_err(|e| {
                    let message = format!(
                        "cannot load the CUDA libraries that scripts/setup --gpu installed in {}: {e}",
                        dir.display()
                    );
                    Error::device(device.name(), message, Some(e))
                })?;
            }
            for &id in ids {
                for _ in 0..per_device {
                    workers.push(Worker::new(
                        format!("cuda:{id}"),
                        build_session(spec, graph, placement, Some(id), None)?,
                        Some(id),
                    )?);
                }
            }
            let mut info = DeviceInfo::cuda(library, gpus, &system);
            if let Some(cuda) = info.cuda.as_mut() {
                cuda.input_memory = input_memory(&workers);
            }
            info
        }
    };
    Ok((workers, info))
}

/// The graph's inputs and output as the embedder feeds and reads them.
pub(super) struct Io {
    pub(super) with_mask: bool,
    pub(super) with_token_types: bool,
    pub(super) with_positions: bool,
    pub(super) output: Output,
    pub(super) output_f16: bool,
}

impl Io {
    /// Read from the session: refused when an input cannot be fed, or the output is not one the pipeline
    /// reads (or holds what the model's configs do not say).
    pub(super) fn of(spec: &ModelSpec, session: &Session) -> Result<Self> {
        let bad = |m: String| spec.onnx_error(m);
        let inputs: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        // SigLIP's text tower takes no attention mask: its texts are padded to a fixed length.
        let unmasked = spec.image.as_ref().is_some_and(|i| i.text_length.is_some());
        let required: &[&str] = if unmasked { &["input_ids"] } else { &["input_ids", "attention_mask"] };
        for &required in required {
            if !inputs.contains(&required) {
                return Err(bad(format!("has no `{required}` input (inputs: {})", inputs.join(", "))));
            }
        }
        if let Some(other) = inputs.iter().find(|n| !FED.contains(n)) {
            return Err(bad(format!("has an input `{other}` we cannot feed; expected {}", FED.join(", "))));
        }
        let with_mask = inputs.contains(&"attention_mask");
        if unmasked && with_mask {
            return Err(bad(
                "takes an attention mask, but this model's texts are fed without one (SigLIP's): export it with \
                 scripts/export-onnx"
                    .into(),
            ));
        }
        let with_token_types = inputs.contains(&"token_type_ids");
        let with_positions = inputs.contains(&"position_ids");

        let outputs: Vec<(&str, Option<i64>, Option<TensorElementType>)> = session
            .outputs()
            .iter()
            .map(|o| (o.name(), o.dtype().tensor_shape().and_then(|s| s.last().copied()), o.dtype().tensor_type()))
            .collect();
        let pick = |name: &str| outputs.iter().find(|(n, _, _)| *n == name).map(|(n, d, _)| (*n, *d));
        let (output, last_dim) = match (pick("last_hidden_state"), pick("sentence_embedding")) {
            (Some((n, d)), _) => (Output::TokenStates(n.to_string()), d),
            (None, Some((n, d))) => (Output::Sentence(n.to_string()), d),
            (None, None) => {
                let names: Vec<&str> = outputs.iter().map(|(n, _, _)| *n).collect();
                return Err(bad(format!(
                    "has neither a `last_hidden_state` nor a `sentence_embedding` output (outputs: {})",
                    names.join(", ")
                )));
            }
        };
        if matches!(output, Output::TokenStates(_)) && spec.pooling.modes().contains(&crate::model::PoolingMode::Tower)
        {
            return Err(bad("gives token states, but this image-text model's text tower must give its vectors (a \
                 `sentence_embedding` output): export it with scripts/export-onnx"
                .into()));
        }
        if let (Output::Sentence(_), Some(dense)) = (&output, spec.dense.first()) {
            return Err(bad(format!(
                "pools by itself (a `sentence_embedding` output), and modules.json has a Dense module ({}) after \
                 the pooling: whether the graph applies it cannot be told; export the transformer alone \
                 (scripts/export-onnx), whose token states the pipeline pools and projects",
                dense.folder
            )));
        }
        let graph_dim = match output {
            Output::TokenStates(_) => spec.token_dim,
            Output::Sentence(_) => spec.pooling.out_dim(spec.token_dim),
        };
        if let Some(d) = last_dim.filter(|d| *d > 0)
            && d as usize != graph_dim
        {
            return Err(bad(format!(
                "produces {d}-dimensional vectors but 1_Pooling/config.json says word_embedding_dimension {}",
                spec.token_dim
            )));
        }
        let name = match &output {
            Output::TokenStates(n) | Output::Sentence(n) => n.clone(),
        };
        let output_f16 = match outputs.iter().find(|(n, _, _)| *n == name).and_then(|(_, _, t)| *t) {
            Some(TensorElementType::Float32) | None => false,
            Some(TensorElementType::Float16) => true,
            Some(other) => {
                return Err(bad(format!(
                    "output `{name}` is {other:?}; float32 or float16 is needed: export the checkpoint with \
                     scripts/export-onnx (float32, or --dtype float16), which loads bfloat16 weights in float32"
                )));
            }
        };
        Ok(Self { with_mask, with_token_types, with_positions, output, output_f16 })
    }
}

impl Worker {
    /// A worker for `session`, fed through pinned memory when it runs on GPU `gpu`.
    fn new(device: String, session: Session, gpu: Option<i32>) -> Result<Self> {
        let feed = Feed::new(&session, gpu)?;
        Ok(Self { device, bound: Mutex::new(BoundSession { session, feed }), calls: AtomicU64::new(0) })
    }
}

/// For the run record of a GPU run: where the workers' inputs are written (see [`InputMemory::record`]).
fn input_memory(workers: &[Worker]) -> String {
    let memories: Vec<InputMemory> =
        workers.iter().map(|w| w.bound.lock().unwrap_or_else(|e| e.into_inner()).feed.memory().clone()).collect();
    let record = InputMemory::record(&memories);
    if memories.iter().any(|m| !m.is_pinned()) {
        tracing::warn!("GPU inputs are not in pinned memory: {record}");
    }
    record
}

/// What sessions are built from: the ONNX file as it is, or its bytes with mean pooling added to the graph
/// (see [`onnx_pooling`]).
pub(super) enum Graph {
    File,
    Pooled(Vec<u8>),
}

impl Graph {
    /// On a GPU the pooled graph, so that vectors rather than token states are copied back. On the CPU there
    /// is no copy to save, and pooling on the host keeps a text's vector bit-identical whatever batch it is
    /// in (ReduceSum over a padded length sums in another order), which `check-invariance`, resume and
    /// `compare-order` rely on.
    pub(super) fn for_device(spec: &ModelSpec, device: &Device) -> Result<Self> {
        match device {
            // Only a mean-pooled model uses the added output (an `embed.pooling` override to mean then pools on
            // the host): a decoder's last-token pooling gains nothing from it, and patching means holding the
            // whole graph in memory twice more (1.76 GiB for a 0.6B decoder in float32) before the session.
            Device::Cuda(_) if spec.pooling.is_mean() => Self::load(spec),
            Device::Cpu | Device::Cuda(_) => Ok(Self::File),
        }
    }

    /// The pooled graph when the model has a `last_hidden_state` output and can take the pooling nodes.
    fn load(spec: &ModelSpec) -> Result<Self> {
        let bytes =
            std::fs::read(&spec.onnx_path).map_err(|e| spec.onnx_error(format!("cannot read: {e}")).because(e))?;
        let bad = |m: String| spec.onnx_error(m);
        if !onnx_pooling::output_names(&bytes).map_err(bad)?.iter().any(|n| n == "last_hidden_state") {
            return Ok(Self::File);
        }
        Ok(match onnx_pooling::with_mean_pooling(&bytes, "last_hidden_state").map_err(bad)? {
            Some(pooled) => Self::Pooled(pooled),
            None => Self::File,
        })
    }
}

/// Whether every token of a text is pooled: false when a prefix applies whose tokens the model's pooling
/// leaves out (`include_prompt: false`).
pub(super) fn prompt_pooled(settings: &CallSettings) -> bool {
    settings.pool_prefix || settings.prefix.is_empty()
}

/// One ONNX Runtime session for the model, on the CPU or on GPU `gpu`; profiling into `profile` (a
/// file-name prefix) when given.
fn build_session(
    spec: &ModelSpec,
    graph: &Graph,
    placement: &Placement,
    gpu: Option<i32>,
    profile: Option<&Path>,
) -> Result<Session> {
    let commit = |mut b: ort::session::builder::SessionBuilder| match graph {
        Graph::File => b.commit_from_file(&spec.onnx_path),
        Graph::Pooled(bytes) => b.commit_from_memory(bytes),
    };
    let env = runtime::environment()?;
    let bad = |m: String, e: ort::Error| spec.onnx_error(m).because(e);
    let device_err = |message: String, e: ort::Error| Error::device(placement.device.name(), message, Some(e));
    let mut builder = Session::builder(env)
        .and_then(|b| Ok(b.with_optimization_level(GraphOptimizationLevel::All)?))
        .and_then(|b| Ok(b.with_intra_threads(placement.intra_threads.max(1))?))
        // NOTE: ONNX Runtime's memory pattern caches an allocation plan per input shape; batches here
        // change shape with every length, so it only piled up plans (140 MiB more peak RSS at 1,000
        // documents, and slower).
        .and_then(|b| Ok(b.with_memory_pattern(false)?))
        .map_err(|e: ort::Error| bad(format!("cannot load: {e}"), e))?;
    if let Some(prefix) = profile {
        builder = builder.with_profiling(prefix).map_err(|e| bad(format!("cannot profile: {e}"), e.into()))?;
    }
    let Some(id) = gpu else {
        return commit(builder).map_err(|e| bad(format!("cannot load: {e}"), e));
    };
    // CPU fallback is judged by `placement` on a profiled probe batch, not by ONNX Runtime's
    // disable_cpu_ep_fallback switch, which also refuses the shape arithmetic the CUDA provider leaves
    // to the CPU on purpose (see model::placement).
    let cuda = ort::ep::CUDA::default().with_device_id(id).build().error_on_failure();
    builder = builder.with_execution_providers([cuda]).map_err(|e| {
        let message = format!(
            "the CUDA execution provider could not start on cuda:{id}: {e}. Check the NVIDIA driver and the CUDA 13 \
             and cuDNN 9 libraries"
        );
        device_err(message, e.into())
    })?;
    commit(builder).map_err(|e| device_err(format!("the model could not be loaded on cuda:{id}: {e}"), e))
}

/// Where the nodes of the model run under `placement` (on its first GPU for CUDA), judged against
/// `wanted_provider`: one probe batch under ONNX Runtime's profiler.
pub fn node_placement(spec: &ModelSpec, placement: &Placement, wanted_provider: &str) -> Result<NodePlacement> {
    probe_placement(spec, &Graph::for_device(spec, &placement.device)?, placement, wanted_provider)
}

/// [`node_placement`] for a graph already read.
pub(super) fn probe_placement(
    spec: &ModelSpec,
    graph: &Graph,
    placement: &Placement,
    wanted_provider: &str,
) -> Result<NodePlacement> {
    let gpu = match &placement.device {
        Device::Cpu => None,
        Device::Cuda(ids) => ids.first().copied(),
    };
    let dir = tempfile::tempdir().map_err(|e| Error::file("cannot make a folder for the device probe's profile", e))?;
    let mut session = build_session(spec, graph, placement, gpu, Some(&dir.path().join("probe")))?;
    placement::probe(&mut session, spec.pad_id, wanted_provider, dir.path())
        .map_err(|message| Error::device(placement.device.name(), message, None))
}
