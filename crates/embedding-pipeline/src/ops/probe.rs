//! Probing a job (`pipeline probe job.sql`): find the batch setting a campaign can afford on this machine's
//! device before it runs. It takes the corpus's longest texts (from the head of the
//! plan's work list when `pipeline plan` made one for this write and the corpus is unchanged since; else
//! one streaming tokenising pass, the top kept by DataFusion's sort with a limit), makes real model calls on them at full length
//! with `embed.batch_tokens` doubling, and measures each call's peak memory and useful tokens/s, until
//! the next step would pass the memory budget, a call fails, or larger calls stop being faster. It then
//! recommends the fastest setting that fits with a margin, and tries the session layout.
//!
//! Memory on the CPU is the process's peak resident set (`VmHWM`, reset before each step through
//! `/proc/self/clear_refs`): the model, ONNX Runtime's arena and the call's tensors together, which is
//! what a run's own peak is made of.
//!
//! The recommendation carries the budget as `SET embed.memory_budget`, so that the run records its peak
//! against it and warns when it comes within 10%.
//!
//! On CUDA the memory is the GPUs' memory in use, polled through NVML every millisecond (ONNX Runtime's
//! arena keeps what it took, so use only grows during a step); where NVML cannot see the GPU, the host's,
//! and the report says so.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::UInt32Type;
use datafusion::parquet::arrow::ParquetRecordBatchStreamBuilder;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::sorts::sort::SortExec;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::plan::{JobWrites, counting_input, load_job};
use crate::campaign::work_plan::WORK_LIST_FILE;
use crate::campaign::{DeviceInfo, Fingerprint};
use crate::error::{Error, Result};
use crate::exec::TokenCountExec;
use crate::exec::length_order::{TOKEN_COUNT, longest_first};
use crate::lance::target::WriteTarget;
use crate::model::fit::MemorySplit;
use crate::model::onnx_weights::read_weights;
use crate::model::{CallSettings, Device, TextEmbedder};
use crate::options::EmbedOptions;
use crate::process::memory::{self, mib};
use crate::udf::embed::string_values;

/// The smallest `embed.batch_tokens` tried.
const FIRST_BATCH_TOKENS: usize = 512;
/// How many of the longest texts are kept to build the calls from (cycled when a call needs more).
const LONGEST_TEXTS: usize = 512;
/// Share of the budget a recommended setting may take: the rest is the run's own (reading, ordering,
/// rows held for the sink).
pub(crate) const MARGIN: f64 = 0.8;
/// Rates within this share of each other count as the same: timing noise.
pub const SAME_SPEED: f64 = 0.03;
/// The most noise steps are judged by: a spread wider than this (a machine under other load) is stated, but steps
/// further apart are told apart anyway.
pub const MOST_NOISE: f64 = 0.10;
/// Timed calls per step, at least, after one untimed call of the same shape; more until they have taken
/// [`MIN_TIMED_SECONDS`] (a CPU's small calls take a tenth of a second, and two of them are noise).
const TIMED_CALLS: u32 = 2;
pub(crate) const MIN_TIMED_SECONDS: f64 = 1.0;
/// Most timed calls per step.
const MAX_TIMED_CALLS: u32 = 50;

/// What a probe found, as `--json` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProbeReport {
    /// Where the calls ran.
    pub device: DeviceInfo,
    /// Token count of the longest text (after truncation): every call is padded to about this.
    pub longest_tokens: usize,
    /// Where the longest texts came from: a plan's work list, or a tokenising pass.
    pub longest_from: String,
    /// The memory budget, bytes, and where it came from.
    pub budget_bytes: u64,
    pub budget_from: String,
    /// The memory with the model loaded, before the first call, bytes.
    pub loaded_bytes: u64,
    /// What the memory figures are: the process's resident set, or the GPU's memory in use.
    #[serde(default)]
    pub memory: String,
    pub steps: Vec<Step>,
    /// Why the steps stopped growing.
    pub stopped: String,
    pub recommended: Option<Recommendation>,
    /// Session layouts tried at the recommended setting.
    pub layouts: Vec<Layout>,
    /// The layout advised over the default (sessions per device, intra-op threads), when one is (see
    /// [`faster_layout`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advised_layout: Option<(usize, usize)>,
    /// How a 48 GB and an 80 GB card divide between this model and its calls (absent in reports from
    /// before it was measured, and when no step fitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<MemorySplit>,
}

/// One step: calls of `batch_tokens` padded tokens on the longest texts.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Step {
    pub batch_tokens: usize,
    pub rows: usize,
    pub padded_length: usize,
    /// Peak memory during the step, bytes (see [`ProbeReport::memory`]).
    pub peak_bytes: u64,
    /// The step's working memory: its peak less the memory with the model loaded, bytes.
    #[serde(default)]
    pub working_bytes: u64,
    pub useful_tokens_per_second: f64,
    /// How far its timed calls' rates spread: (fastest - slowest) / fastest (0 in reports from before).
    #[serde(default)]
    pub spread: f64,
    /// Whether the peak stayed within the budget's margin.
    pub fits: bool,
    /// The failure of the step's call, if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The setting to run with, and why.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Recommendation {
    pub batch_tokens: usize,
    /// Set when the default `embed.max_batch_rows` would cut the recommended calls short.
    pub max_batch_rows: Option<usize>,
    pub why: String,
    /// The settings that ran as fast as it within the noise (it among them): a probe run again may pick any of
    /// them (empty in reports from before).
    #[serde(default)]
    pub alike: Vec<usize>,
    /// The noise they were judged by: the larger of [`SAME_SPEED`] and the spread of the fitting steps' calls,
    /// at most [`MOST_NOISE`].
    #[serde(default)]
    pub noise: f64,
    /// The SET lines to paste into the job.
    pub set: Vec<String>,
}

/// A session layout and its rate.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Layout {
    pub sessions_per_device: usize,
    pub intra_threads: usize,
    /// The median of its rounds' rates.
    pub useful_tokens_per_second: f64,
    /// The highest peak of its rounds (see [`ProbeReport::memory`]).
    pub peak_bytes: u64,
    /// Each round's useful tokens per second: the layouts are timed in turn, [`LAYOUT_ROUNDS`] times, so that
    /// a change of load on the machine reaches both (absent in reports from before).
    #[serde(default)]
    pub rates: Vec<f64>,
    /// Its working memory: the highest peak less the memory in use when its round began, bytes.
    #[serde(default)]
    pub working_bytes: u64,
    /// Why it was not timed, or not timed again: its sessions would pass, or passed, the memory budget's margin.
    /// Such a layout is never advised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// How many times each layout is timed, in turn.
pub const LAYOUT_ROUNDS: usize = 3;

impl Layout {
    /// A layout before its first round.
    fn untimed(sessions_per_device: usize, intra_threads: usize) -> Self {
        Self {
            sessions_per_device,
            intra_threads,
            useful_tokens_per_second: 0.0,
            peak_bytes: 0,
            rates: Vec::new(),
            working_bytes: 0,
            skipped: None,
        }
    }

    /// Its slowest and fastest round.
    pub fn spread(&self) -> (f64, f64) {
        let rates =
            if self.rates.is_empty() { std::slice::from_ref(&self.useful_tokens_per_second) } else { &self.rates };
        rates.iter().fold((f64::MAX, 0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)))
    }
}

/// The layout to advise over the first (the default), if any: one whose slowest round beat the default's
/// fastest by more than [`SAME_SPEED`], so that the advice is not the machine's noise, and whose every round fitted
/// the memory budget (as did the default's). With it, how much faster
/// (its slowest round over the default's fastest, and its fastest over the default's slowest).
pub fn faster_layout(layouts: &[Layout]) -> Option<(&Layout, f64, f64)> {
    let [current, other, ..] = layouts else { return None };
    if [current, other].iter().any(|l| l.skipped.is_some() || l.rates.len() < LAYOUT_ROUNDS) {
        return None;
    }
    let ((c_lo, c_hi), (o_lo, o_hi)) = (current.spread(), other.spread());
    (o_lo > c_hi * (1.0 + SAME_SPEED)).then(|| (other, o_lo / c_hi.max(1e-9), o_hi / c_lo.max(1e-9)))
}

/// Probe the first write into Lance of the job file. A report with no recommendation is returned as found:
/// no setting fitted the budget (see [`ProbeReport::no_fit`]).
pub async fn probe_job(
    file: &Path,
    vars: &BTreeMap<String, String>,
    budget: Option<u64>,
    max_batch_tokens: usize,
) -> Result<ProbeReport> {
    memory::mark_before_load();
    let (session, statements) = load_job(file, vars)?;
    let mut writes = JobWrites::new(file, &session, &statements);
    let Some((stmt, plan, target)) = writes.next().await? else {
        return Err(Error::Refused(format!(
            "{} writes nothing into Lance (COPY … STORED AS LANCE, INSERT INTO a Lance table): nothing to probe",
            file.display()
        )));
    };
    let options = EmbedOptions::from_config(session.context().state().config_options());
    let (longest, longest_from) = async {
        let (input, text) = counting_input(&session, &plan, &target).await?;
        let dir = super::plan::plan_dir(&target.uri);
        if let Some(longest) = longest_from_plan(&dir, &target, &options, &text).await? {
            return Ok((longest, format!("the plan {}", dir.display())));
        }
        let counter: Arc<dyn ExecutionPlan> =
            Arc::new(TokenCountExec::try_new(input, Arc::clone(&text), options.clone())?);
        let top = SortExec::new(longest_first(&counter.schema())?, counter).with_fetch(Some(LONGEST_TEXTS));
        let mut stream = top.execute(0, session.context().task_ctx())?;
        let mut longest = Vec::new();
        while let Some(batch) = stream.next().await {
            longest.extend(texts_and_counts(&batch?, &text)?);
        }
        Ok::<_, Error>((longest, "a tokenising pass over the corpus".to_string()))
    }
    .await
    .map_err(|e| writes.fail(stmt, &e.chain_text()))?;
    if longest.is_empty() {
        return Err(Error::Refused(format!(
            "{}: the write into {} has no text to probe with",
            file.display(),
            target.uri
        )));
    }
    let mut report = tokio::task::spawn_blocking(move || probe(&options, &longest, budget, max_batch_tokens))
        .await
        .map_err(|e| Error::Internal(format!("the probe failed: {e}")))??;
    report.longest_from = longest_from;
    Ok(report)
}

impl ProbeReport {
    /// Why no setting was recommended, when none was: the smallest call did not fit the budget.
    pub fn no_fit(&self) -> Option<String> {
        let first = self.steps.first()?;
        self.recommended.is_none().then(|| {
            format!(
                "no setting fits the memory budget of {}: the smallest call ({} tokens) peaked at {}; free memory or \
                 raise --memory-budget",
                mib(self.budget_bytes),
                first.batch_tokens,
                mib(first.peak_bytes)
            )
        })
    }
}

/// The texts of a batch that holds [`TOKEN_COUNT`], with their counts; NULL texts left out.
fn texts_and_counts(batch: &RecordBatch, text: &Arc<dyn PhysicalExpr>) -> Result<Vec<(String, usize)>> {
    let texts = text.evaluate(batch)?.into_array(batch.num_rows())?;
    let counts = batch
        .column_by_name(TOKEN_COUNT)
        .ok_or_else(|| Error::Internal(format!("no {TOKEN_COUNT} column")))?
        .as_primitive_opt::<UInt32Type>()
        .ok_or_else(|| Error::Internal(format!("a bad {TOKEN_COUNT} column")))?
        .clone();
    Ok(string_values(&texts)?
        .into_iter()
        .zip(counts.values().iter())
        .filter_map(|(t, n)| Some((t?.to_string(), *n as usize)))
        .collect())
}

/// The longest texts from the head of the plan's work list (ordered longest first), when the plan in
/// `dir` is this write's (same query, fingerprint and sources): no tokenising pass is needed then.
async fn longest_from_plan(
    dir: &Path,
    target: &WriteTarget,
    options: &EmbedOptions,
    text: &Arc<dyn PhysicalExpr>,
) -> Result<Option<Vec<(String, usize)>>> {
    if super::plan::current_plan(dir, target, options).await?.is_none() {
        return Ok(None);
    }
    read_longest(dir, text).await
}

/// The texts and token counts of the first rows of the work list in the plan directory `dir`: the
/// longest; `None` when there is no work list.
pub async fn read_longest(dir: &Path, text: &Arc<dyn PhysicalExpr>) -> Result<Option<Vec<(String, usize)>>> {
    let Ok(file) = tokio::fs::File::open(dir.join(WORK_LIST_FILE)).await else { return Ok(None) };
    let mut rows = ParquetRecordBatchStreamBuilder::new(file).await?.with_limit(LONGEST_TEXTS).build()?;
    let mut longest = Vec::new();
    while let Some(batch) = rows.next().await {
        longest.extend(texts_and_counts(&batch?, text)?);
    }
    Ok(Some(longest))
}

/// The steps, the recommendation and the layouts, on `longest` (text, token count), longest first.
pub fn probe(
    options: &EmbedOptions,
    longest: &[(String, usize)],
    budget: Option<u64>,
    max_batch_tokens: usize,
) -> Result<ProbeReport> {
    // The process before the command loaded its model (noted at its start): what loading added is the session's
    // share on the CPU.
    let before_load = memory::before_load().unwrap_or(0);
    let placement = options.placement()?;
    let embedder = options.embedder()?;
    let (settings, _) = Fingerprint::for_options(options)?;
    let longest_tokens = longest[0].1.max(1);
    let meter = Meter::for_device(embedder.device());
    let loaded = meter.now();
    let (budget_bytes, budget_from) = match budget {
        Some(b) => (b, "--memory-budget".to_string()),
        None => (
            loaded + meter.available() / 10 * 9,
            format!("90% of {}, plus what the loaded model holds", meter.free_what()),
        ),
    };
    let room = Room { loaded, usable: (budget_bytes as f64 * MARGIN) as u64, sessions: placement.sessions_per_device };
    let (mut steps, stopped) = climb(embedder.as_ref(), &meter, &settings, longest, &room, max_batch_tokens);
    let mut recommended = recommend(&steps, &stopped, longest_tokens, options.max_batch_rows);
    if let Some(r) = recommended.as_mut() {
        r.set.push(format!("SET embed.memory_budget = '{}MiB';", budget_bytes >> 20));
    }
    for step in &mut steps {
        step.working_bytes = step.peak_bytes.saturating_sub(loaded);
    }
    let split = memory_split(embedder.as_ref(), &meter, &steps, loaded, before_load, longest_tokens)?;
    let device = embedder.device().clone();
    // The steps' memory (the model's arena keeps what its largest call took) is not carried into the layouts,
    // nor into the run a trial makes next.
    drop(embedder);
    crate::model::registry::release(&options.model_dir(), &placement);
    memory::give_back();
    let mut layouts = Vec::new();
    if let Some(r) = &recommended {
        let working = steps.iter().find(|s| s.batch_tokens == r.batch_tokens).map_or(0, |s| s.working_bytes);
        let per_session = loaded.saturating_sub(meter.now()) / room.sessions.max(1) as u64;
        layouts =
            try_layouts(options, &meter, &settings, longest, r.batch_tokens, (per_session + working, room.usable))?;
    }
    Ok(ProbeReport {
        device,
        longest_tokens,
        longest_from: String::new(),
        budget_bytes,
        budget_from,
        loaded_bytes: loaded,
        memory: meter.what().to_string(),
        steps,
        stopped,
        recommended,
        advised_layout: faster_layout(&layouts).map(|(l, _, _)| (l.sessions_per_device, l.intra_threads)),
        layouts,
        split,
    })
}

/// The memory a probe's steps may take: `loaded` held with the model loaded (its run's `sessions` sessions), and
/// `usable`, the budget's share a setting may reach.
struct Room {
    loaded: u64,
    usable: u64,
    sessions: usize,
}

impl Room {
    /// What a run needs at a step that peaked at `peak` with one call in flight: each of its sessions makes
    /// such calls at once, so every session but the one measured adds the step's working memory.
    fn need(&self, peak: u64) -> u64 {
        peak + (self.sessions.max(1) as u64 - 1) * peak.saturating_sub(self.loaded)
    }

    /// "peaked at X" for one session; with more, what they need together.
    fn peaked(&self, peak: u64) -> String {
        match self.sessions {
            0 | 1 => format!("peaked at {}", mib(peak)),
            n => format!(
                "peaked at {}, about {} with the run's {n} sessions calling at once",
                mib(peak),
                mib(self.need(peak))
            ),
        }
    }
}

/// Calls of the longest texts, doubling their tokens from the first step, until one fails, passes the
/// usable memory (with each of the run's sessions making such a call at once), would pass it at the next step,
/// reaches `max_batch_tokens`, or runs no faster: each step measured, and why it stopped.
fn climb(
    embedder: &dyn TextEmbedder,
    meter: &Meter,
    settings: &CallSettings,
    longest: &[(String, usize)],
    room: &Room,
    max_batch_tokens: usize,
) -> (Vec<Step>, String) {
    let mut steps: Vec<Step> = Vec::new();
    let mut batch_tokens = FIRST_BATCH_TOKENS.max(longest[0].1.max(1)).next_power_of_two();
    let margin = format!("({:.0}% of the budget)", MARGIN * 100.0);
    let stopped = loop {
        let mut step = measure(embedder, meter, settings, longest, batch_tokens);
        step.fits = step.error.is_none() && room.need(step.peak_bytes) <= room.usable;
        let (fits, failed, peak) = (step.fits, step.error.clone(), step.peak_bytes);
        steps.push(step);
        if let Some(e) = failed {
            break format!("the call of {batch_tokens} tokens failed: {e}");
        }
        if !fits {
            break format!(
                "the call of {batch_tokens} tokens {}, past {} {margin}",
                room.peaked(peak),
                mib(room.usable)
            );
        }
        // Memory grows about linearly with the tokens of a call: doubling them adds what they took.
        let previous = steps.iter().rev().nth(1).map_or(room.loaded, |s| s.peak_bytes);
        let next = room.need(peak + peak.saturating_sub(previous).max(peak.saturating_sub(room.loaded)));
        if next > room.usable {
            break format!(
                "the next step ({} tokens) would need about {}, past {} {margin}",
                batch_tokens * 2,
                mib(next),
                mib(room.usable),
            );
        }
        if batch_tokens * 2 > max_batch_tokens {
            break format!("reached --max-batch-tokens {max_batch_tokens}");
        }
        if plateau(&steps) {
            break "larger calls were no faster: the last two steps ran below the best".to_string();
        }
        batch_tokens *= 2;
    };
    (steps, stopped)
}

/// The 48 GB split from the probe's figures: the weights' exact bytes from the graph, what loading added, and
/// the working memory per padded token of the largest call that fitted (none when none fitted).
fn memory_split(
    embedder: &dyn TextEmbedder,
    meter: &Meter,
    steps: &[Step],
    loaded: u64,
    before_load: u64,
    longest_tokens: usize,
) -> Result<Option<MemorySplit>> {
    let Some(largest) = steps.iter().filter(|s| s.fits && s.error.is_none()).max_by_key(|s| s.batch_tokens) else {
        return Ok(None);
    };
    let spec = embedder.spec();
    let weights = read_weights(&spec.onnx_path).map_err(|e| spec.onnx_error(e))?;
    let on_gpu = matches!(meter, Meter::Device(_));
    let session = if on_gpu { loaded } else { loaded.saturating_sub(before_load) };
    let per_token = (largest.working_bytes / largest.batch_tokens.max(1) as u64).max(1);
    let measured_on = format!("{} ({})", embedder.device().device, meter.what());
    Ok(Some(MemorySplit::new(
        weights.bytes.into_iter().map(|(t, b)| (t.to_string(), b)).collect(),
        session,
        per_token,
        longest_tokens as u64,
        measured_on,
        on_gpu,
    )))
}

/// Calls of `batch_tokens` padded tokens on the longest texts: one untimed, then [`TIMED_CALLS`] timed. Whether
/// the step fits is the caller's to say.
fn measure(
    embedder: &dyn TextEmbedder,
    meter: &Meter,
    settings: &CallSettings,
    longest: &[(String, usize)],
    batch_tokens: usize,
) -> Step {
    let padded = longest[0].1.max(1);
    let rows = (batch_tokens / padded).max(1);
    let texts: Vec<Option<&str>> = (0..rows).map(|i| Some(longest[i % longest.len()].0.as_str())).collect();
    let settings = CallSettings { batch_tokens, max_batch_rows: rows, ..settings.clone() };
    meter.reset();
    let timed = (|| -> crate::Result<(f64, f64)> {
        embedder.embed(&texts, &settings)?;
        let started = Instant::now();
        let (mut useful, mut rates) = (0, Vec::new());
        while rates.len() < TIMED_CALLS as usize
            || (started.elapsed().as_secs_f64() < MIN_TIMED_SECONDS && rates.len() < MAX_TIMED_CALLS as usize)
        {
            let call = Instant::now();
            let tokens = embedder.embed(&texts, &settings)?.stats.useful_tokens;
            rates.push(tokens as f64 / call.elapsed().as_secs_f64().max(1e-9));
            useful += tokens;
        }
        let (lo, hi) = rates.iter().fold((f64::MAX, 0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        Ok((useful as f64 / started.elapsed().as_secs_f64().max(1e-9), (hi - lo) / hi.max(1e-9)))
    })();
    let peak_bytes = meter.peak();
    let ((rate, spread), error) = match timed {
        Ok(r) => (r, None),
        Err(e) => ((0.0, 0.0), Some(crate::error::plain(&e.to_string()))),
    };
    Step {
        batch_tokens,
        rows,
        padded_length: padded,
        peak_bytes,
        working_bytes: 0,
        useful_tokens_per_second: rate,
        spread,
        fits: false,
        error,
    }
}

/// Whether the last two steps both ran slower than the best before them (beyond noise).
fn plateau(steps: &[Step]) -> bool {
    plateau_of(&steps.iter().map(|s| s.useful_tokens_per_second).collect::<Vec<_>>())
}

/// Whether the last two of the steps' `rates` both ran slower than the best before them (beyond noise); shared
/// with the image probe.
pub(crate) fn plateau_of(rates: &[f64]) -> bool {
    let n = rates.len();
    if n < 3 {
        return false;
    }
    let best = rates[..n - 2].iter().copied().fold(0.0, f64::max);
    rates[n - 2..].iter().all(|r| *r < best * (1.0 + SAME_SPEED))
}

/// The fastest step that fits; among steps within noise of it, the smallest (less memory for the same speed). The
/// noise is the calls' own spread where it is wider than [`SAME_SPEED`] (up to [`MOST_NOISE`]), and the steps
/// within it are named: on a device whose speed hardly depends on the setting, which of them a probe picks is
/// chance.
fn recommend(steps: &[Step], stopped: &str, longest_tokens: usize, max_batch_rows: usize) -> Option<Recommendation> {
    let fitting: Vec<&Step> = steps.iter().filter(|s| s.fits).collect();
    let best = fitting.iter().map(|s| s.useful_tokens_per_second).fold(0.0, f64::max);
    let noise = fitting.iter().map(|s| s.spread).fold(SAME_SPEED, f64::max).min(MOST_NOISE);
    let alike: Vec<&Step> =
        fitting.iter().copied().filter(|s| s.useful_tokens_per_second >= best * (1.0 - noise)).collect();
    let pick = *alike.first()?;
    let largest_fitting = fitting.last().is_some_and(|s| s.batch_tokens == pick.batch_tokens);
    let mut why = if largest_fitting && (steps.len() > fitting.len() || stopped.contains("budget")) {
        format!("the largest setting that fits the memory budget with a margin ({stopped})")
    } else if largest_fitting {
        format!("the fastest setting tried ({stopped})")
    } else {
        format!(
            "the fastest that fits: larger calls ran no faster (within {:.0}%), so they would only take more memory",
            noise * 100.0
        )
    };
    if alike.len() > 1 {
        let last = alike.last().map_or(pick.batch_tokens, |s| s.batch_tokens);
        why.push_str(&format!(
            "; the {} settings from {} to {last} tokens ran within {:.0}% of each other, the calls' own noise, so \
             the speed hardly depends on the setting here and a probe run again may pick another of them",
            alike.len(),
            pick.batch_tokens,
            noise * 100.0
        ));
    }
    let rows = (pick.batch_tokens / longest_tokens).max(1);
    let max_rows = (rows > max_batch_rows).then_some(rows);
    let mut set = vec![format!("SET embed.batch_tokens = {};", pick.batch_tokens)];
    if let Some(r) = max_rows {
        set.push(format!("SET embed.max_batch_rows = {r};"));
    }
    Some(Recommendation {
        batch_tokens: pick.batch_tokens,
        max_batch_rows: max_rows,
        why,
        alike: alike.iter().map(|s| s.batch_tokens).collect(),
        noise,
        set,
    })
}

/// The layouts worth comparing on this device, timed in turn [`LAYOUT_ROUNDS`] times: each round loads the layout,
/// warms it up on one call, times four calls of `batch_tokens`, and frees it before the next. A layout is not
/// loaded where its sessions would pass `usable` (each needing `per_session`: its model and a call's working
/// memory), nor loaded again once a round of it peaked past it; such a layout says why and is never advised.
fn try_layouts(
    options: &EmbedOptions,
    meter: &Meter,
    settings: &CallSettings,
    longest: &[(String, usize)],
    batch_tokens: usize,
    (per_session, usable): (u64, u64),
) -> Result<Vec<Layout>> {
    let placement = options.placement()?;
    let threads = placement.intra_threads.max(1);
    let candidates: Vec<(usize, usize)> = match placement.device {
        Device::Cpu if threads >= 2 => vec![(1, threads), (2, threads / 2)],
        Device::Cpu => return Ok(Vec::new()),
        Device::Cuda(_) => vec![(1, threads), (2, threads)],
    };
    let padded = longest[0].1.max(1);
    let rows = (batch_tokens / padded).max(1);
    let texts: Vec<Option<&str>> = (0..rows * 4).map(|i| Some(longest[i % longest.len()].0.as_str())).collect();
    let settings = CallSettings { batch_tokens, max_batch_rows: rows, ..settings.clone() };
    let mut layouts: Vec<Layout> = candidates.iter().map(|&(s, t)| Layout::untimed(s, t)).collect();
    for _ in 0..LAYOUT_ROUNDS {
        for l in layouts.iter_mut().filter(|l| l.skipped.is_none()) {
            let before = meter.now();
            let need = before + l.sessions_per_device as u64 * per_session;
            if need > usable {
                l.skipped = Some(format!("not timed: it would need about {}, past {}", mib(need), mib(usable)));
                continue;
            }
            let options = EmbedOptions {
                sessions_per_device: l.sessions_per_device,
                intra_threads: l.intra_threads,
                ..options.clone()
            };
            meter.reset();
            let embedder = options.embedder()?;
            embedder.embed(&texts[..rows], &settings)?;
            let started = Instant::now();
            let useful = embedder.embed(&texts, &settings)?.stats.useful_tokens;
            l.rates.push(useful as f64 / started.elapsed().as_secs_f64().max(1e-9));
            let peak = meter.peak();
            drop(embedder);
            crate::model::registry::release(&options.model_dir(), &options.placement()?);
            memory::give_back();
            l.peak_bytes = l.peak_bytes.max(peak);
            l.working_bytes = l.working_bytes.max(peak.saturating_sub(before));
            if peak > usable {
                l.skipped = Some(format!("peaked at {}, past {}: not timed again", mib(peak), mib(usable)));
            }
        }
    }
    for l in layouts.iter_mut().filter(|l| !l.rates.is_empty()) {
        let mut sorted = l.rates.clone();
        sorted.sort_by(f64::total_cmp);
        l.useful_tokens_per_second = sorted[sorted.len() / 2];
    }
    Ok(layouts)
}

/// What the probe measures memory with.
pub(crate) enum Meter {
    /// The process's resident set (`VmHWM`, reset before each step).
    Host,
    /// The GPUs' memory in use, from NVML.
    Device(crate::model::gpu::UsedMemory),
}

impl Meter {
    /// The GPUs' meter for a model on CUDA, where NVML sees them; else the host's.
    pub(crate) fn for_device(device: &DeviceInfo) -> Self {
        device
            .cuda
            .as_ref()
            .and_then(|c| crate::model::gpu::UsedMemory::start(&c.gpus))
            .map_or(Meter::Host, Meter::Device)
    }

    pub(crate) fn now(&self) -> u64 {
        match self {
            Meter::Host => memory::resident().unwrap_or(0),
            Meter::Device(gpu) => gpu.now(),
        }
    }

    pub(crate) fn reset(&self) {
        match self {
            Meter::Host => memory::reset_peak(),
            Meter::Device(gpu) => gpu.reset(),
        }
    }

    pub(crate) fn peak(&self) -> u64 {
        match self {
            Meter::Host => memory::peak().unwrap_or(0),
            Meter::Device(gpu) => gpu.peak(),
        }
    }

    /// Memory that could still be taken, bytes.
    pub(crate) fn available(&self) -> u64 {
        match self {
            Meter::Host => memory::available().unwrap_or(0),
            Meter::Device(gpu) => gpu.free(),
        }
    }

    pub(crate) fn free_what(&self) -> &'static str {
        match self {
            Meter::Host => "the memory available",
            Meter::Device(_) => "the GPU's free memory",
        }
    }

    pub(crate) fn what(&self) -> &'static str {
        match self {
            Meter::Host => "the process's resident memory (VmHWM)",
            Meter::Device(_) => "the GPU's memory in use (NVML)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(batch_tokens: usize, rate: f64, fits: bool) -> Step {
        Step {
            batch_tokens,
            rows: batch_tokens / 256,
            padded_length: 256,
            peak_bytes: 0,
            working_bytes: 0,
            useful_tokens_per_second: rate,
            spread: 0.0,
            fits,
            error: None,
        }
    }

    fn layout(sessions: usize, rates: &[f64]) -> Layout {
        Layout {
            sessions_per_device: sessions,
            intra_threads: 2 / sessions,
            useful_tokens_per_second: rates.get(rates.len() / 2).copied().unwrap_or(4000.0),
            peak_bytes: 0,
            rates: rates.to_vec(),
            working_bytes: 0,
            skipped: None,
        }
    }

    #[test]
    fn a_layout_is_advised_only_when_it_wins_every_round_beyond_the_noise() {
        // Issue 53: a median 1.45x faster, with rounds that overlap the default's, is the machine's noise.
        let noisy = [layout(1, &[4000.0, 5500.0, 4400.0]), layout(2, &[3900.0, 6400.0, 7000.0])];
        assert!(faster_layout(&noisy).is_none());
        // Within 3% of the default's fastest round: no advice either.
        let close = [layout(1, &[4000.0, 4100.0, 4050.0]), layout(2, &[4200.0, 4220.0, 4210.0])];
        assert!(faster_layout(&close).is_none());
        let clear = [layout(1, &[4000.0, 4100.0, 4050.0]), layout(2, &[5000.0, 5200.0, 5100.0])];
        let (advised, least, most) = faster_layout(&clear).unwrap();
        assert_eq!(advised.sessions_per_device, 2);
        assert!((least - 5000.0 / 4100.0).abs() < 1e-9 && (most - 5200.0 / 4000.0).abs() < 1e-9);
        // A report from before the rounds: its one rate is its spread.
        let old = [layout(1, &[]), layout(2, &[])];
        assert!(faster_layout(&old).is_none());
        // Issue 53: a layout whose sessions passed the memory budget is never advised, however fast.
        let mut over = clear.clone();
        over[1].skipped = Some("peaked at 20000 MiB, past 16000 MiB: not timed again".into());
        assert!(faster_layout(&over).is_none());
        let mut cut = clear.clone();
        cut[1].rates.truncate(1);
        assert!(faster_layout(&cut).is_none(), "one round is not every round");
    }

    #[test]
    fn each_of_a_runs_sessions_adds_a_calls_working_memory() {
        // Issue 53: sized for one session, a setting may not fit the two a GPU run gets by default.
        let one = Room { loaded: 1000, usable: 5000, sessions: 1 };
        let two = Room { sessions: 2, ..one };
        assert_eq!(one.need(3000), 3000);
        assert_eq!(two.need(3000), 5000);
        assert!(two.peaked(3000).contains("with the run's 2 sessions"), "{}", two.peaked(3000));
        assert_eq!(Room { sessions: 0, ..two }.need(3000), 3000);
    }

    #[test]
    fn the_recommendation_names_the_settings_within_the_noise() {
        // Issue 53: on a CPU, 1,024 to 8,192 tokens ran within a few percent, and four probes picked four of them.
        let mut steps = vec![step(1024, 5000.0, true), step(2048, 5200.0, true), step(4096, 5100.0, true)];
        steps.push(step(8192, 4000.0, true));
        steps[1].spread = 0.06;
        let r = recommend(&steps, "larger calls were no faster", 256, 256).unwrap();
        assert_eq!(r.batch_tokens, 1024, "5000 is within the calls' 6% of 5200");
        assert_eq!(r.alike, [1024, 2048, 4096]);
        assert!((r.noise - 0.06).abs() < 1e-9);
        assert!(r.why.contains("the 3 settings from 1024 to 4096 tokens ran within 6% of each other"), "{}", r.why);
        // A spread past the cap is stated but does not erase real differences.
        steps[1].spread = 0.5;
        let r = recommend(&steps, "larger calls were no faster", 256, 256).unwrap();
        assert_eq!(r.noise, MOST_NOISE);
        assert_eq!(r.alike, [1024, 2048, 4096]);
        // One setting alone: nothing to say about the others.
        let r = recommend(&steps[..1], "reached --max-batch-tokens 1024", 256, 256).unwrap();
        assert!(!r.why.contains("of each other"), "{}", r.why);
    }

    #[test]
    fn the_fastest_fitting_step_is_recommended_not_the_largest() {
        let steps =
            [step(512, 3000.0, true), step(1024, 3900.0, true), step(2048, 4000.0, true), step(4096, 3700.0, true)];
        let r = recommend(&steps, "larger calls were no faster", 256, 256).unwrap();
        // 1024 is within 3% of 2048's rate, and takes less memory.
        assert_eq!(r.batch_tokens, 1024);
        assert!(r.why.contains("larger calls ran no faster"), "{}", r.why);
        assert_eq!(r.set, ["SET embed.batch_tokens = 1024;"]);
    }

    #[test]
    fn a_memory_limit_is_named_and_max_batch_rows_raised_where_it_binds() {
        let steps = [step(512, 1000.0, true), step(1024, 2000.0, true), step(2048, 3000.0, false)];
        // Texts of 4 tokens: 1,024-token calls hold 256 rows, past a max_batch_rows of 128.
        let r = recommend(&steps, "the call of 2048 tokens peaked past the budget", 4, 128).unwrap();
        assert_eq!(r.batch_tokens, 1024);
        assert!(r.why.contains("the largest setting that fits the memory budget"), "{}", r.why);
        assert_eq!(r.max_batch_rows, Some(256));
        assert_eq!(r.set, ["SET embed.batch_tokens = 1024;", "SET embed.max_batch_rows = 256;"]);
        assert!(recommend(&[step(512, 10.0, false)], "", 256, 256).is_none(), "nothing fits: no recommendation");
    }

    #[test]
    fn growth_stops_after_two_steps_below_the_best() {
        let mut steps = vec![step(512, 3000.0, true), step(1024, 4000.0, true), step(2048, 3950.0, true)];
        assert!(!plateau(&steps));
        steps.push(step(4096, 4050.0, true));
        assert!(plateau(&steps), "4050 is within noise of 4000");
        steps.push(step(8192, 5000.0, true));
        assert!(!plateau(&steps));
    }
}
