//! The embedding path for one model: tokenise, order by length, run ONNX Runtime in token-budget
//! batches, pool, normalise, and put every vector back at its input row.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ort::ep::ExecutionProvider;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::TensorElementType;

use crate::error::{Error, Result};
use crate::model::batching::{Batch, plan_batches, plan_fixed_batches};
use crate::model::dense::Dense;
use crate::model::device::CUDA_PROVIDER;
use crate::model::feed::{Feed, InputMemory};
use crate::model::onnx_pooling::{self, POOLED_OUTPUT};
use crate::model::placement::{self, NodePlacement};
use crate::model::pooling::normalize;
use crate::model::reference::{PROBE_FILE, Probe, REFUSE_BELOW, WARN_BELOW};
use crate::model::settings::{CallSettings, ORIGINAL_BATCH_ROWS, Order};
use crate::model::tokenize::{TextTokenizer, Tokenized, TruncationSide};
use crate::model::{Device, DeviceInfo, ModelSpec, Placement, gpu, runtime};

/// Each row's index in its call and its vector.
type RowVectors = Vec<(usize, Vec<f32>)>;

/// The inputs the pipeline makes for a graph: it feeds those of them the graph declares.
const FED: [&str; 4] = ["input_ids", "attention_mask", "token_type_ids", "position_ids"];

/// Counters of one embedding call; they add up across calls.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EmbedStats {
    /// Texts embedded (NULLs excluded).
    pub docs: u64,
    /// NULL texts, which get a NULL vector.
    pub nulls: u64,
    /// Texts with nothing to embed (empty, or only whitespace and zero-width characters), counted among `docs`:
    /// each gets the model's vector of no text, one and the same for all.
    pub blank: u64,
    /// Real tokens fed to the model (the attention-mask sum).
    pub useful_tokens: u64,
    /// Tokens the model processed, padding included (rows x padded length, summed over calls).
    pub processed_tokens: u64,
    /// Texts cut at `max_tokens`.
    pub truncated_docs: u64,
    /// Tokens those cuts removed.
    pub dropped_tokens: u64,
    /// Model calls made.
    pub model_calls: u64,
    /// Time spent tokenising.
    pub tokenize_time: Duration,
    /// Time spent in ONNX Runtime, pooling included.
    pub model_time: Duration,
    /// Time with a model call in flight: ONNX Runtime's runs alone (not building their inputs, nor pooling), summed
    /// over the sessions.
    pub run_time: Duration,
    /// The model sessions that made the calls (the most seen; they share the calls).
    pub sessions: u64,
}

impl EmbedStats {
    /// What was done since `earlier`, a snapshot of the same counters.
    pub fn since(&self, earlier: &EmbedStats) -> EmbedStats {
        EmbedStats {
            docs: self.docs - earlier.docs,
            nulls: self.nulls - earlier.nulls,
            blank: self.blank - earlier.blank,
            useful_tokens: self.useful_tokens - earlier.useful_tokens,
            processed_tokens: self.processed_tokens - earlier.processed_tokens,
            truncated_docs: self.truncated_docs - earlier.truncated_docs,
            dropped_tokens: self.dropped_tokens - earlier.dropped_tokens,
            model_calls: self.model_calls - earlier.model_calls,
            tokenize_time: self.tokenize_time.saturating_sub(earlier.tokenize_time),
            model_time: self.model_time.saturating_sub(earlier.model_time),
            run_time: self.run_time.saturating_sub(earlier.run_time),
            sessions: self.sessions,
        }
    }

    /// Add another call's counters to these.
    pub fn add(&mut self, o: &EmbedStats) {
        self.docs += o.docs;
        self.nulls += o.nulls;
        self.blank += o.blank;
        self.useful_tokens += o.useful_tokens;
        self.processed_tokens += o.processed_tokens;
        self.truncated_docs += o.truncated_docs;
        self.dropped_tokens += o.dropped_tokens;
        self.model_calls += o.model_calls;
        self.tokenize_time += o.tokenize_time;
        self.model_time += o.model_time;
        self.run_time += o.run_time;
        self.sessions = self.sessions.max(o.sessions);
    }

    /// The share of `wall` each session had a model call in flight, on average over the sessions: near 1 when the
    /// model sets the pace, low when it waits for the host (reading, tokenising, pooling, writing). `None` without
    /// calls or time.
    pub fn model_busy(&self, wall: Duration) -> Option<f64> {
        (self.sessions > 0 && !wall.is_zero())
            .then(|| self.run_time.as_secs_f64() / (self.sessions as f64 * wall.as_secs_f64()))
    }
}

/// Whether a text has nothing to embed: empty, or only whitespace and zero-width characters (which tokenizers
/// drop), so that it gets the vector of no text at all.
pub fn is_blank(text: &str) -> bool {
    text.chars()
        .all(|c| c.is_whitespace() || matches!(c, '\u{200B}' | '\u{200C}' | '\u{200D}' | '\u{2060}' | '\u{FEFF}'))
}

/// Vectors for a batch of texts, in input order.
#[derive(Debug, Clone)]
pub struct Embedded {
    /// `rows * dim` floats; a NULL row holds zeros (and is marked in `valid`).
    pub vectors: Vec<f32>,
    /// Whether each row had a text.
    pub valid: Vec<bool>,
    /// What the call did.
    pub stats: EmbedStats,
}

/// What the `embed` function needs from a model; kept small so the DataFusion side stays free of `ort`.
pub trait TextEmbedder: Send + Sync + std::fmt::Debug {
    /// The model's description.
    fn spec(&self) -> &ModelSpec;
    /// Where it runs.
    fn device(&self) -> &DeviceInfo;
    /// Embed texts; `None` rows give no vector.
    fn embed(&self, texts: &[Option<&str>], settings: &CallSettings) -> Result<Embedded> {
        self.embed_with_progress(texts, settings, &|_, _| {}, &|| false)
    }
    /// [`TextEmbedder::embed`], calling `progress(texts, useful_tokens)` after each model call, and asking
    /// `stop()` before each: when it says true, no further model call starts and the result is
    /// [`Error::Stopped`].
    fn embed_with_progress(
        &self,
        texts: &[Option<&str>],
        settings: &CallSettings,
        progress: &dyn Fn(u64, u64),
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<Embedded> {
        self.embed_tokenized(texts, None, settings, progress, stop)
    }
    /// [`TextEmbedder::embed_with_progress`], with each text's tokens, when given, already made by
    /// [`TextEmbedder::tokenize_texts`] under the same settings (`None` where the text is NULL), so that a text is
    /// tokenised once on the write path. Given tokens must be those of these texts: a NULL where a text is present,
    /// or the reverse, is refused.
    fn embed_tokenized(
        &self,
        texts: &[Option<&str>],
        tokens: Option<Vec<Option<Tokenized>>>,
        settings: &CallSettings,
        progress: &dyn Fn(u64, u64),
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<Embedded>;
    /// Each text as the model will see it (after the prefix and truncation, special tokens included); `None` for
    /// NULL. What the length ordering counts, and hands on to [`TextEmbedder::embed_tokenized`].
    fn tokenize_texts(&self, texts: &[Option<&str>], settings: &CallSettings) -> Result<Vec<Option<Tokenized>>>;
}

/// Which graph output carries the result. fp16 outputs are converted to float32 before pooling.
#[derive(Debug, Clone, PartialEq)]
enum Output {
    /// Token states `[batch, seq, dim]`, pooled here.
    TokenStates(String),
    /// Pooled vectors `[batch, dim]`, produced by the graph itself.
    Sentence(String),
}

/// Nanoseconds one embedding call's batches spent: in the model with pooling (`model`), and in ONNX Runtime's runs
/// alone (`run`), summed over the sessions.
#[derive(Debug, Default)]
struct Busy {
    model: AtomicU64,
    run: AtomicU64,
}

/// One ONNX Runtime session and the device it runs on. An embedder has one or more; they take batches
/// from one queue.
#[derive(Debug)]
struct Worker {
    /// `cpu`, `cuda:0`…
    device: String,
    bound: Mutex<BoundSession>,
    /// Model calls this session made.
    calls: AtomicU64,
}

/// A session and the IO binding that feeds it; used together, under one lock.
#[derive(Debug)]
struct BoundSession {
    session: Session,
    feed: Feed,
}

/// One model: its tokenizer and its ONNX Runtime sessions, loaded once and shared.
#[derive(Debug)]
pub struct Embedder {
    spec: ModelSpec,
    device: DeviceInfo,
    tokenizer: TextTokenizer,
    workers: Vec<Worker>,
    with_token_types: bool,
    /// The graph takes `position_ids` (0, 1, … for each text's tokens; padding is on the right).
    with_positions: bool,
    /// The Dense modules after the pooling, in order.
    dense: Vec<Dense>,
    output: Output,
    /// The output is float16 (an fp16 export); it is converted to float32 before pooling.
    output_f16: bool,
    /// The sessions' graph computes mean pooling itself ([`onnx_pooling`]).
    pooled_in_graph: bool,
    /// Which session a call with a single batch goes to (round robin, so that small concurrent calls from
    /// several partitions spread over the sessions).
    next_worker: AtomicUsize,
    /// Texts tokenised so far (a text is tokenised once on the write path; see [`Embedder::texts_tokenized`]).
    tokenized: AtomicU64,
}

impl Embedder {
    /// Load the tokenizer and build the ONNX Runtime sessions the placement asks for, checking that the
    /// model's inputs and outputs are ones we can serve.
    pub fn load(spec: ModelSpec, placement: &Placement) -> Result<Self> {
        let tokenizer = TextTokenizer::from_file(&spec.tokenizer_path, &spec.dir)?;
        let dense = spec.dense.iter().map(|d| Dense::load(d, &spec.dir)).collect::<Result<Vec<_>>>()?;
        check_vocabulary(&spec, &tokenizer)?;
        // Loads the ONNX Runtime library (with a clear error when it is missing) before anything asks
        // ort about it.
        runtime::environment()?;
        let library = runtime::loaded_library().unwrap_or(Path::new("")).to_path_buf();
        let device = &placement.device;
        let device_err = |message: String| Error::device(device.name(), message, None);
        let graph = Graph::for_device(&spec, device)?;
        let pooled_in_graph = matches!(graph, Graph::Pooled(_));
        let (workers, mut info) = start_workers(&spec, &graph, placement, &library)?;

        let bound = workers[0].bound.lock().unwrap_or_else(|e| e.into_inner());
        let Io { with_token_types, with_positions, output, output_f16 } = Io::of(&spec, &bound.session)?;
        drop(bound);
        // Only now that the model's inputs are known to be ones we feed: where its nodes really run.
        if let Device::Cuda(_) = device {
            let nodes = probe_placement(&spec, &graph, placement, CUDA_PROVIDER)?;
            if let Some(refusal) = nodes.refusal(CUDA_PROVIDER)
                && !placement.allow_cpu_fallback
            {
                return Err(device_err(refusal));
            }
            info.nodes = Some(nodes);
        }
        let states_output = matches!(output, Output::TokenStates(_));
        let embedder = Self {
            spec,
            device: info,
            tokenizer,
            workers,
            with_token_types,
            with_positions,
            dense,
            output,
            output_f16,
            pooled_in_graph: pooled_in_graph && states_output,
            next_worker: AtomicUsize::new(0),
            tokenized: AtomicU64::new(0),
        };
        embedder.check_probe()?;
        // The probe's call was the model's, not the caller's.
        embedder.workers.iter().for_each(|w| w.calls.store(0, Ordering::Relaxed));
        Ok(embedder)
    }

    /// Embed the sentences of the model's `probe.json`, if it has one, under the model's own settings,
    /// and refuse the model when its vectors drift from the reference (see [`reference`](super::reference)).
    fn check_probe(&self) -> Result<()> {
        let Some(probe) = Probe::load(&self.spec.dir)? else { return Ok(()) };
        let settings = CallSettings {
            order: Order::Length,
            max_tokens: self.spec.max_seq_length,
            truncation: self.spec.truncation_side,
            pooling: self.spec.pooling,
            normalize: self.spec.normalize,
            batch_tokens: 1 << 20,
            max_batch_rows: probe.texts.len(),
            prefix: String::new(),
            pool_prefix: true,
            truncate_dim: 0,
            refuse_blank: false,
        };
        let texts: Vec<Option<&str>> = probe.texts.iter().map(|t| Some(t.as_str())).collect();
        let embedded = self.embed_with_progress(&texts, &settings, &|_, _| {}, &|| false)?;
        let (cosine, text) = probe.worst(&embedded.vectors, self.spec.dim);
        if cosine < REFUSE_BELOW {
            return Err(Error::model(
                &self.spec.dir,
                "onnx/model.onnx",
                format!(
                    "its vectors are not the model's: on \"{text}\" the cosine with the reference in {PROBE_FILE} is \
                     {cosine:.4} (an intact model gives above {WARN_BELOW}). The weights are damaged or belong to \
                     another model: reinstall it (scripts/setup for the default model), or delete {PROBE_FILE} if the \
                     model was changed on purpose"
                ),
            ));
        }
        if cosine < WARN_BELOW {
            tracing::warn!(
                "model {}: on \"{text}\" the cosine with the reference in {PROBE_FILE} is {cosine:.6}, below {WARN_BELOW}",
                self.spec.dir.display()
            );
        }
        Ok(())
    }

    /// Model calls per session so far, as (device, calls), in session order.
    pub fn calls_per_session(&self) -> Vec<(String, u64)> {
        self.workers.iter().map(|w| (w.device.clone(), w.calls.load(Ordering::Relaxed))).collect()
    }

    /// Run one batch on one session; the pooled (not yet normalised) vector of each of its rows.
    fn run_batch(
        &self,
        worker: &Worker,
        tokens: &[Tokenized],
        batch: &Batch,
        settings: &CallSettings,
        stop: &(dyn Fn() -> bool + Sync),
        busy: &Busy,
    ) -> Result<RowVectors> {
        let (rows, len) = (batch.rows.len(), batch.padded_len);
        let mut bound = worker.bound.lock().unwrap_or_else(|e| e.into_inner());
        // Asked once the session is ours, so that a call queued behind another never starts after a stop.
        if stop() {
            return Err(Error::Stopped);
        }
        // Model time counts from here: not the wait for a session another call holds.
        let started = Instant::now();
        let out = self.run_bound(&mut bound, tokens, batch, settings, rows, len);
        busy.model.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        worker.calls.fetch_add(out.is_ok() as u64, Ordering::Relaxed);
        let (out, ran) = out?;
        busy.run.fetch_add(ran.as_nanos() as u64, Ordering::Relaxed);
        Ok(out)
    }

    /// [`Embedder::run_batch`] on the session it holds.
    fn run_bound(
        &self,
        bound: &mut BoundSession,
        tokens: &[Tokenized],
        batch: &Batch,
        settings: &CallSettings,
        rows: usize,
        len: usize,
    ) -> Result<(RowVectors, Duration)> {
        let BoundSession { session, feed } = bound;
        let ids =
            feed.input(rows, len, |d| fill_rows(d, tokens, batch, len, |t, j| t.ids[j] as i64, self.spec.pad_id))?;
        let mask = feed.input(rows, len, |d| fill_rows(d, tokens, batch, len, |_, _| 1, 0))?;
        let types;
        let mut inputs = vec![("input_ids", &ids), ("attention_mask", &mask)];
        if self.with_token_types {
            types = feed.input(rows, len, |d| fill_rows(d, tokens, batch, len, |t, j| t.type_ids[j] as i64, 0))?;
            inputs.push(("token_type_ids", &types));
        }
        let positions;
        if self.with_positions {
            positions = feed.input(rows, len, |d| fill_rows(d, tokens, batch, len, |_, j| j as i64, 0))?;
            inputs.push(("position_ids", &positions));
        }
        // Compute and copy back only the output used: with mean pooling in the graph, one vector per
        // row instead of every token's state.
        let in_graph = self.pooled_in_graph && settings.pooling.is_mean() && prompt_pooled(settings);
        let wanted = match &self.output {
            Output::TokenStates(_) if in_graph => POOLED_OUTPUT,
            Output::TokenStates(name) | Output::Sentence(name) => name.as_str(),
        };
        let mask = mask.try_extract_tensor::<i64>()?.1;
        let out = feed
            .run(session, &inputs, wanted, |outputs| self.read_output(outputs, wanted, batch, len, mask, settings))?;
        Ok(out)
    }

    /// The pooled vector of each row of `batch` from the session's one output, `wanted`: token states
    /// `[rows, len, dim]` pooled here, or vectors `[rows, dim]` the graph made (its own sentence
    /// embedding, or the mean pooling added on a GPU, which is float32 whatever the model's type).
    fn read_output(
        &self,
        outputs: &ort::session::SessionOutputs<'_>,
        wanted: &str,
        batch: &Batch,
        len: usize,
        mask: &[i64],
        settings: &CallSettings,
    ) -> Result<RowVectors> {
        let (rows, dim) = (batch.rows.len(), self.spec.token_dim);
        let in_graph = wanted == POOLED_OUTPUT;
        let (shape, data) = self.extract(&outputs[wanted], self.output_f16 && !in_graph)?;
        let states = matches!(self.output, Output::TokenStates(_)) && !in_graph;
        // Pooled here, by the graph's mean (on a GPU), or by the graph itself under the model's own pooling (any
        // other is refused before the call): the pooling's length in every case.
        let pooled_dim = settings.pooling.out_dim(dim);
        let expected = if states { vec![rows, len, dim] } else { vec![rows, pooled_dim] };
        if shape.iter().map(|&d| d as usize).ne(expected.iter().copied()) {
            return Err(Error::onnx(format!("output `{wanted}` has shape {shape:?}, expected {expected:?}")));
        }
        // A prompt left out of the pooling (include_prompt: false): its tokens, at the start of every row (the
        // pipeline pads on the right), get a zero in the pooling's mask, as in sentence-transformers.
        let skip = match prompt_pooled(settings) {
            true => 0,
            false => self.tokenizer.prompt_tokens(&settings.prefix)?.min(len),
        };
        let mut pooling_mask = Vec::new();
        let pooled = batch.rows.iter().enumerate().map(|(r, &row)| {
            if !states {
                return (row, data[r * pooled_dim..(r + 1) * pooled_dim].to_vec());
            }
            let mut v = vec![0.0; pooled_dim];
            let (tokens, mut row_mask) = (&data[r * len * dim..(r + 1) * len * dim], &mask[r * len..(r + 1) * len]);
            if skip > 0 {
                pooling_mask.clear();
                pooling_mask.extend_from_slice(row_mask);
                pooling_mask[..skip].fill(0);
                row_mask = &pooling_mask;
            }
            settings.pooling.pool_row(tokens, row_mask, dim, &mut v);
            (row, v)
        });
        Ok(pooled.collect())
    }

    /// Run every batch, each session taking the next batch as it frees up, and put each pooled vector
    /// at its row. `progress` is called on this thread after each batch.
    fn run_batches(
        &self,
        tokens: &[Tokenized],
        batches: &[Batch],
        settings: &CallSettings,
        progress: &dyn Fn(&Batch),
        stop: &(dyn Fn() -> bool + Sync),
        busy: &Busy,
    ) -> Result<Vec<Vec<f32>>> {
        let mut pooled = vec![Vec::new(); tokens.len()];
        let mut place = |rows: RowVectors| {
            for (row, v) in rows {
                pooled[row] = v;
            }
        };
        if self.workers.len() == 1 || batches.len() <= 1 {
            let worker = &self.workers[self.next_worker.fetch_add(1, Ordering::Relaxed) % self.workers.len()];
            for batch in batches {
                place(self.run_batch(worker, tokens, batch, settings, stop, busy)?);
                progress(batch);
            }
            return Ok(pooled);
        }
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let mut first_error = None;
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel();
            for worker in &self.workers {
                let (tx, next, failed) = (tx.clone(), &next, &failed);
                scope.spawn(move || {
                    while !failed.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(batch) = batches.get(i) else { break };
                        let result = self.run_batch(worker, tokens, batch, settings, stop, busy);
                        failed.fetch_or(result.is_err(), Ordering::Relaxed);
                        if tx.send((i, result)).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            for (i, result) in rx {
                match result {
                    Ok(rows) => {
                        place(rows);
                        progress(&batches[i]);
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        });
        match first_error {
            Some(e) => Err(e),
            None => Ok(pooled),
        }
    }
}

/// The tokenizer refused when it gives token ids past the model's embedding table: found here, not as an ONNX
/// Runtime Gather error on the first text with such a token.
fn check_vocabulary(spec: &ModelSpec, tokenizer: &TextTokenizer) -> Result<()> {
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
fn start_workers(
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
struct Io {
    with_token_types: bool,
    with_positions: bool,
    output: Output,
    output_f16: bool,
}

impl Io {
    /// Read from the session: refused when an input cannot be fed, or the output is not one the pipeline
    /// reads (or holds what the model's configs do not say).
    fn of(spec: &ModelSpec, session: &Session) -> Result<Self> {
        let bad = |m: String| spec.onnx_error(m);
        let inputs: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        for required in ["input_ids", "attention_mask"] {
            if !inputs.contains(&required) {
                return Err(bad(format!("has no `{required}` input (inputs: {})", inputs.join(", "))));
            }
        }
        if let Some(other) = inputs.iter().find(|n| !FED.contains(n)) {
            return Err(bad(format!("has an input `{other}` we cannot feed; expected {}", FED.join(", "))));
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
        Ok(Self { with_token_types, with_positions, output, output_f16 })
    }
}

impl Worker {
    /// A worker for `session`, fed through pinned memory when it runs on GPU `gpu`.
    fn new(device: String, session: Session, gpu: Option<i32>) -> Result<Self> {
        let feed = Feed::new(&session, gpu)?;
        Ok(Self { device, bound: Mutex::new(BoundSession { session, feed }), calls: AtomicU64::new(0) })
    }
}

/// Write one `[rows, len]` input of `batch`: each row's `value(text, position)` for its tokens, then `pad`.
fn fill_rows(
    data: &mut [i64],
    tokens: &[Tokenized],
    batch: &Batch,
    len: usize,
    value: impl Fn(&Tokenized, usize) -> i64,
    pad: impl Into<i64>,
) {
    let pad = pad.into();
    for (r, &row) in batch.rows.iter().enumerate() {
        let t = &tokens[row];
        for (j, slot) in data[r * len..(r + 1) * len].iter_mut().enumerate() {
            *slot = if j < t.ids.len() { value(t, j) } else { pad };
        }
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
enum Graph {
    File,
    Pooled(Vec<u8>),
}

impl Graph {
    /// On a GPU the pooled graph, so that vectors rather than token states are copied back. On the CPU there
    /// is no copy to save, and pooling on the host keeps a text's vector bit-identical whatever batch it is
    /// in (ReduceSum over a padded length sums in another order), which `check-invariance`, resume and
    /// `compare-order` rely on.
    fn for_device(spec: &ModelSpec, device: &Device) -> Result<Self> {
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
fn prompt_pooled(settings: &CallSettings) -> bool {
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
fn probe_placement(
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

impl Embedder {
    /// An output tensor as float32, converting float16.
    fn extract<'a>(&self, value: &'a ort::value::DynValue, f16: bool) -> Result<(Vec<i64>, Cow<'a, [f32]>)> {
        if f16 {
            let (shape, data) = value.try_extract_tensor::<half::f16>()?;
            Ok((shape.to_vec(), Cow::Owned(data.iter().map(|x| x.to_f32()).collect())))
        } else {
            let (shape, data) = value.try_extract_tensor::<f32>()?;
            Ok((shape.to_vec(), Cow::Borrowed(data)))
        }
    }

    /// Each text's token count as the model will see it (after the prefix and truncation, special
    /// tokens included); 0 for NULL. This is what the length ordering sorts by.
    pub fn token_lengths(&self, texts: &[Option<&str>], settings: &CallSettings) -> Result<Vec<usize>> {
        Ok(self.token_counts(texts, settings)?.into_iter().map(|(kept, _)| kept).collect())
    }

    /// Each text's token count as the model will see it, and the tokens truncation cuts from it (with
    /// truncation 'error', the excess); (0, 0) for NULL.
    pub fn token_counts(&self, texts: &[Option<&str>], settings: &CallSettings) -> Result<Vec<(usize, usize)>> {
        let tokens = self.tokenize_texts(texts, settings)?;
        Ok(tokens.iter().map(|t| t.as_ref().map_or((0, 0), |t| (t.ids.len(), t.dropped))).collect())
    }

    /// How many texts this model has tokenised since it was loaded.
    pub fn texts_tokenized(&self) -> u64 {
        self.tokenized.load(Ordering::Relaxed)
    }

    /// The present texts with the call's prefix, tokenised and cut at its limit.
    fn tokenize_present(&self, present: &[&str], settings: &CallSettings) -> Result<Vec<Tokenized>> {
        self.tokenized.fetch_add(present.len() as u64, Ordering::Relaxed);
        let prefixed: Vec<String>;
        let strs: Vec<&str> = if settings.prefix.is_empty() {
            present.to_vec()
        } else {
            prefixed = present.iter().map(|t| format!("{}{t}", settings.prefix)).collect();
            prefixed.iter().map(String::as_str).collect()
        };
        self.tokenizer.tokenize(&strs, settings.max_tokens, settings.truncation)
    }
}

impl TextEmbedder for Embedder {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn device(&self) -> &DeviceInfo {
        &self.device
    }

    fn tokenize_texts(&self, texts: &[Option<&str>], settings: &CallSettings) -> Result<Vec<Option<Tokenized>>> {
        let present: Vec<&str> = texts.iter().flatten().copied().collect();
        let mut tokens = self.tokenize_present(&present, settings)?.into_iter();
        Ok(texts.iter().map(|t| t.and_then(|_| tokens.next())).collect())
    }

    fn embed_tokenized(
        &self,
        texts: &[Option<&str>],
        given: Option<Vec<Option<Tokenized>>>,
        settings: &CallSettings,
        progress: &dyn Fn(u64, u64),
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<Embedded> {
        if settings.pooling != self.spec.pooling && matches!(self.output, Output::Sentence(_)) {
            return Err(Error::Option {
                key: "pooling".into(),
                value: settings.pooling.name(),
                message: "this model's graph pools by itself (it has only a sentence_embedding output)".into(),
            });
        }
        let mut stats = EmbedStats::default();
        let present: Vec<(usize, &str)> = texts.iter().enumerate().filter_map(|(i, t)| t.map(|t| (i, t))).collect();
        stats.docs = present.len() as u64;
        stats.nulls = (texts.len() - present.len()) as u64;
        if let Some((row, _)) = present.iter().find(|(_, t)| is_blank(t)) {
            if settings.refuse_blank {
                return Err(Error::BlankText { row: *row });
            }
            stats.blank = present.iter().filter(|(_, t)| is_blank(t)).count() as u64;
        }

        if !prompt_pooled(settings) && matches!(self.output, Output::Sentence(_)) {
            return Err(self.spec.onnx_error(
                "pools by itself (a `sentence_embedding` output), and the model's Pooling config leaves the prompt \
                 out of the pooling (include_prompt: false), which such a graph cannot do; export the transformer \
                 alone (scripts/export-onnx), or SET embed.prompt_name = 'none'"
                    .to_string(),
            ));
        }
        let tokens = self.tokens_of(&present, given, settings, &mut stats)?;

        let busy = Busy::default();
        let lengths: Vec<usize> = tokens.iter().map(|t| t.ids.len()).collect();
        let batches = match settings.order {
            Order::Length => plan_batches(&lengths, settings.batch_tokens, settings.max_batch_rows),
            Order::Original => plan_fixed_batches(&lengths, ORIGINAL_BATCH_ROWS),
        };
        for batch in &batches {
            stats.processed_tokens += (batch.rows.len() * batch.padded_len) as u64;
            stats.model_calls += 1;
        }
        let pooled = self.run_batches(
            &tokens,
            &batches,
            settings,
            &|batch| progress(batch.rows.len() as u64, batch.rows.iter().map(|&r| lengths[r] as u64).sum()),
            stop,
            &busy,
        )?;
        let (vectors, valid) = self.assemble(texts.len(), &present, pooled, settings);
        stats.model_time = Duration::from_nanos(busy.model.load(Ordering::Relaxed));
        stats.run_time = Duration::from_nanos(busy.run.load(Ordering::Relaxed));
        stats.sessions = self.workers.len() as u64;
        Ok(Embedded { vectors, valid, stats })
    }
}

impl Embedder {
    /// The present texts (`(row, text)`) tokenized with the call's prefix, cut at its limit (refused past it
    /// under truncation 'error', by row), counted into `stats`; with `given`, the tokens made for them before
    /// (one per text, `None` for a NULL one).
    fn tokens_of(
        &self,
        present: &[(usize, &str)],
        given: Option<Vec<Option<Tokenized>>>,
        settings: &CallSettings,
        stats: &mut EmbedStats,
    ) -> Result<Vec<Tokenized>> {
        let tokens = match given {
            Some(given) => {
                let rows = present.last().map_or(0, |(row, _)| row + 1).max(given.len());
                let mut is_present = vec![false; rows];
                present.iter().for_each(|(row, _)| is_present[*row] = true);
                if let Some(row) = (0..rows).find(|&r| given.get(r).is_some_and(Option::is_some) != is_present[r]) {
                    return Err(Error::Tokenizer(format!(
                        "the tokens handed to the model do not match its texts at row {row} (a text without tokens, \
                         or tokens without a text); this is a defect of the pipeline, please report it"
                    )));
                }
                given.into_iter().flatten().collect()
            }
            None => {
                let started = Instant::now();
                let strs: Vec<&str> = present.iter().map(|(_, t)| *t).collect();
                let tokens = self.tokenize_present(&strs, settings)?;
                stats.tokenize_time = started.elapsed();
                tokens
            }
        };
        if settings.truncation == TruncationSide::Error
            && let Some((i, t)) = tokens.iter().enumerate().find(|(_, t)| t.dropped > 0)
        {
            return Err(Error::TooLong { row: present[i].0, tokens: t.ids.len(), max_tokens: settings.max_tokens });
        }
        for t in &tokens {
            stats.useful_tokens += t.ids.len() as u64;
            if t.dropped > 0 {
                stats.truncated_docs += 1;
                stats.dropped_tokens += t.dropped as u64;
            }
        }
        Ok(tokens)
    }

    /// The pooled vectors of the present rows through the Dense modules, cut to the call's dimensions and
    /// normalised, placed at their rows among `rows`; and which rows have one.
    fn assemble(
        &self,
        rows: usize,
        present: &[(usize, &str)],
        pooled: Vec<Vec<f32>>,
        settings: &CallSettings,
    ) -> (Vec<f32>, Vec<bool>) {
        let dim = settings.out_dim(&self.spec);
        let mut vectors = vec![0.0f32; rows * dim];
        let mut valid = vec![false; rows];
        for ((row, _), pooled) in present.iter().zip(pooled) {
            // The Dense modules, in modules.json order, then the cut and the Normalize module.
            let mut v = self.dense.iter().fold(pooled, |v, dense| dense.apply(&v));
            // Cut before normalising: a Matryoshka prefix is a unit vector of its own.
            v.truncate(dim);
            if settings.normalize {
                normalize(&mut v);
            }
            vectors[row * dim..(row + 1) * dim].copy_from_slice(&v);
            valid[*row] = true;
        }
        (vectors, valid)
    }
}
