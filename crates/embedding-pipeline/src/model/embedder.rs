//! The embedding path for one model: tokenise, order by length, run ONNX Runtime in token-budget
//! batches, pool, normalise, and put every vector back at its input row.

use std::borrow::Cow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::embedded::{EmbedStats, Embedded, TextEmbedder, is_blank};
use super::sessions::{
    BoundSession, Graph, Io, Output, Worker, check_vocabulary, probe_placement, prompt_pooled, start_workers,
};
use crate::error::{Error, Result};
use crate::model::batching::{Batch, plan_batches, plan_fixed_batches};
use crate::model::dense::Dense;
use crate::model::device::CUDA_PROVIDER;
use crate::model::onnx_pooling::POOLED_OUTPUT;
use crate::model::pooling::normalize;
use crate::model::reference::{PROBE_FILE, Probe, REFUSE_BELOW, WARN_BELOW};
use crate::model::settings::{CallSettings, ORIGINAL_BATCH_ROWS, Order};
use crate::model::tokenize::{TextTokenizer, Tokenized, TruncationSide};
use crate::model::{Device, DeviceInfo, ModelSpec, Placement, runtime};

/// Each row's index in its call and its vector.
type RowVectors = Vec<(usize, Vec<f32>)>;

/// Nanoseconds one embedding call's batches spent: in the model with pooling (`model`), and in ONNX Runtime's runs
/// alone (`run`), summed over the sessions.
#[derive(Debug, Default)]
struct Busy {
    model: AtomicU64,
    run: AtomicU64,
}

/// One model: its tokenizer and its ONNX Runtime sessions, loaded once and shared.
#[derive(Debug)]
pub struct Embedder {
    spec: ModelSpec,
    device: DeviceInfo,
    tokenizer: TextTokenizer,
    workers: Vec<Worker>,
    /// Whether the graph takes an attention mask (SigLIP's text tower does not).
    with_mask: bool,
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
        let Io { with_mask, with_token_types, with_positions, output, output_f16 } = Io::of(&spec, &bound.session)?;
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
            with_mask,
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
        // SigLIP's texts are padded to a fixed length, as it was trained: every row the same, whatever the batch.
        let fixed = self.spec.image.as_ref().and_then(|i| i.text_length);
        let (rows, len) = (batch.rows.len(), fixed.map_or(batch.padded_len, |n| n.max(batch.padded_len)));
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
        let mut inputs = vec![("input_ids", &ids)];
        if self.with_mask {
            inputs.push(("attention_mask", &mask));
        }
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
