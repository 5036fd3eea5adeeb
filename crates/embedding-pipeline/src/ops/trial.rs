//! A trial of a job (`pipeline trial job.sql`): what the job's first write into Lance will cost on this
//! machine's device, measured on a sample.
//!
//! It takes the write's plan (`<output>.plan/` when current; else it plans now, into a temporary
//! directory), probes for a batch setting unless the job sets `embed.batch_tokens`, cuts the rows in
//! length order into [`STRATA`] strata of equal tokens, warms the model up (untimed), and embeds an evenly
//! spaced share of each stratum through the run's own write path (work list, length ordering, `embed`,
//! Lance sink) into `<save>.lance`. Each embedded chunk's time is kept; each stratum's rate is extrapolated
//! to the stratum's tokens in the whole corpus, and the model load, the write's start and its end are
//! added as measured. The sample's vectors can be compared by id with a reference dataset.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::UInt32Type;
use datafusion::logical_expr::LogicalPlan;
use datafusion::parquet::arrow::{ArrowWriter, ParquetRecordBatchStreamBuilder};
use datafusion::physical_expr::PhysicalExpr;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::image_trial::ImageTrialReport;
use super::plan::{JobWrites, UnitSize, counting_input, current_plan, load_job, make_plan, plan_dir};
use super::probe::{ProbeReport, probe, read_longest};
pub use super::trial_sample::{Comparison, MATCH_COSINE, TrialOptions};
use super::trial_sample::{SampleRows, Timed, compare, write_timed};
use crate::campaign::metrics::HostShare;
use crate::campaign::trial::Prediction;
use crate::campaign::trial::{
    STRATA, StratumRate, extrapolate, intervals, picked, predict, step_for, strata, stratum_step,
};
use crate::campaign::work_plan::{Histogram, PLAN_FILE, Totals, UNIT_COLUMN, Unit, WORK_LIST_FILE, WorkPlan};
use crate::campaign::{DeviceInfo, Fingerprint};
use crate::error::{Error, Result};
use crate::exec::length_order::TOKEN_COUNT;
use crate::lance::dataset_uri;
use crate::lance::target::WriteTarget;
use crate::model::TextEmbedder;
use crate::options::EmbedOptions;
use crate::session::EmbedSession;

/// Texts of the warm-up, spread evenly over the length order.
const WARM_UP_TEXTS: usize = 128;
/// Fewest rows a stratum's sample takes, whatever the share: fewer give no rate.
const MIN_STRATUM_ROWS: usize = 8;

/// `trial.json`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TrialReport {
    pub tool_version: String,
    /// When the trial ran (UTC, RFC 3339).
    pub created: String,
    /// What `pipeline cost` calls it and looks its price up by.
    pub name: String,
    pub job: String,
    /// The campaign's output, which the trial did not touch.
    pub output: String,
    pub device: DeviceInfo,
    pub fingerprint: Fingerprint,
    pub settings: TrialSettingsReport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeReport>,
    /// Where the plan came from, and how long planning took when the trial planned.
    pub plan_from: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_seconds: Option<f64>,
    /// The whole corpus, as planned.
    pub corpus: Totals,
    pub sample: SampleSummary,
    pub warm_up: WarmUp,
    pub strata: Vec<StratumRate>,
    /// The full campaign, from its plan, on this device with these settings.
    pub prediction: Prediction,
    /// How busy the model was while the sample was embedded (from its first call to the write's end), and on a
    /// GPU that waited for the host, how many cores would have kept it busy. Absent in reports from before it was
    /// measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostShare>,
    /// The sample's vectors (a Lance dataset).
    pub vectors: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
}

/// The batch and session settings the trial ran with, which the campaign must run with for the
/// prediction to hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TrialSettingsReport {
    pub batch_tokens: usize,
    pub max_batch_rows: usize,
    pub sessions_per_device: usize,
    pub intra_threads: usize,
    /// `the job` or `the probe`.
    pub from: String,
    /// The SET lines that give a campaign these settings.
    pub set: Vec<String>,
}

/// What the sample held.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SampleSummary {
    pub rows: u64,
    pub useful_tokens: u64,
    /// Its share of the corpus's useful tokens.
    pub share_of_tokens: f64,
    /// The share asked for (by `--sample` or `--minutes`), and the sample's spacing: every `step`-th row
    /// of each stratum in length order (a power of two, smaller in a stratum too small for the minimum
    /// rows), so that trials of different sizes share the rows of the smaller.
    pub fraction: f64,
    pub step: u64,
    /// Why this size: `--sample N`, or `--minutes M` at the warm-up's rate.
    pub chosen_by: String,
    /// The sample's token counts (as fed to the model) and the corpus's, in the plan's bins.
    pub histogram: Histogram,
    pub corpus_histogram: Histogram,
    /// The largest difference between a bin's share of the sample's texts and of the corpus's.
    pub largest_bin_difference: f64,
}

/// The untimed warm-up, whose rate sizes a `--minutes` sample.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WarmUp {
    pub texts: u64,
    pub useful_tokens_per_second: f64,
}

impl TrialReport {
    /// A saved trial of a text write ([`Trial::read`] reads either kind).
    pub fn read(path: &Path) -> Result<Self> {
        match Trial::read(path)? {
            Trial::Texts(t) => Ok(*t),
            Trial::Images(_) => Err(Error::Refused(format!("{} is an image write's trial", path.display()))),
        }
    }

    /// Why the trial's vectors do not match the reference, when a reference was given and they do not.
    pub fn mismatch(&self) -> Option<String> {
        self.comparison.as_ref()?.mismatch()
    }
}

/// A saved trial: of a text write, or of an image write.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Trial {
    Texts(Box<TrialReport>),
    Images(Box<ImageTrialReport>),
}

/// What a trial's corpus holds: its rows, and the work priced (useful tokens, or images).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    pub rows: u64,
    pub amount: u64,
    /// `useful tokens` or `images`.
    pub unit: &'static str,
}

impl Trial {
    /// A saved trial of either kind.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::file(format!("cannot read trial {}", path.display()), e))?;
        let refused = |e: serde_json::Error| {
            Error::Refused(format!(
                "{} is not a trial.json this version can read ({e}); run pipeline trial again",
                path.display()
            ))
        };
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(refused)?;
        Ok(match value.get("kind").and_then(|k| k.as_str()) {
            Some("images") => Trial::Images(Box::new(serde_json::from_slice(&bytes).map_err(refused)?)),
            _ => Trial::Texts(Box::new(serde_json::from_slice(&bytes).map_err(refused)?)),
        })
    }

    pub fn name(&self) -> &str {
        match self {
            Trial::Texts(t) => &t.name,
            Trial::Images(t) => &t.name,
        }
    }

    pub fn device(&self) -> &DeviceInfo {
        match self {
            Trial::Texts(t) => &t.device,
            Trial::Images(t) => &t.device,
        }
    }

    /// The predicted seconds of the whole campaign, with the range's low and high ends.
    pub fn seconds(&self) -> (f64, f64, f64) {
        match self {
            Trial::Texts(t) => (t.prediction.seconds, t.prediction.low_seconds, t.prediction.high_seconds),
            Trial::Images(t) => (t.prediction.seconds, t.prediction.low_seconds, t.prediction.high_seconds),
        }
    }

    /// The predicted rate of the whole campaign, in [`Work::unit`]s per second.
    pub fn rate(&self) -> f64 {
        match self {
            Trial::Texts(t) => t.prediction.useful_tokens_per_second,
            Trial::Images(t) => t.prediction.images_per_second,
        }
    }

    pub fn work(&self) -> Work {
        match self {
            Trial::Texts(t) => Work { rows: t.corpus.rows, amount: t.corpus.useful_tokens, unit: "useful tokens" },
            Trial::Images(t) => Work { rows: t.corpus.rows, amount: t.corpus.images, unit: "images" },
        }
    }

    pub fn comparison(&self) -> Option<&Comparison> {
        match self {
            Trial::Texts(t) => t.comparison.as_ref(),
            Trial::Images(t) => t.comparison.as_ref(),
        }
    }

    /// How the model splits over a 48 GB and an 80 GB card, from the trial's probe (a text write's).
    pub fn memory_split(&self) -> Option<&crate::model::fit::MemorySplit> {
        match self {
            Trial::Texts(t) => t.probe.as_ref().and_then(|p| p.split.as_ref()),
            Trial::Images(_) => None,
        }
    }

    /// Why the trial's vectors do not match the reference, when a reference was given and they do not.
    pub fn mismatch(&self) -> Option<String> {
        self.comparison()?.mismatch()
    }
}

/// Run the trial of the job's first write into Lance (a text write, or an image write: see
/// [`super::image_trial`]), and save it to `args.save` (its vectors beside it). A trial whose vectors do not match
/// the reference is returned as found (see [`Trial::mismatch`]).
pub async fn run_trial(args: &TrialOptions) -> Result<Trial> {
    crate::process::memory::mark_before_load();
    let file = &args.file;
    if args.minutes.is_nan() || args.minutes <= 0.0 {
        return Err(Error::Refused(format!("--minutes must be above 0, not {}", args.minutes)));
    }
    if args.save.extension().is_some_and(|e| e == "lance") {
        return Err(Error::Refused(format!(
            "--save {} names the trial's JSON file; its vectors go beside it, as a .lance dataset",
            args.save.display()
        )));
    }
    let (session, statements) = load_job(file, &args.vars)?;
    let sets = |key: &str| {
        statements.iter().any(|s| {
            let sql = s.sql.to_ascii_lowercase();
            sql.trim_start().starts_with("set") && sql.contains(key)
        })
    };
    let mut writes = JobWrites::new(file, &session, &statements);
    let Some((stmt, write, target)) = writes.next().await? else {
        return Err(Error::Refused(format!(
            "{} writes nothing into Lance (COPY … STORED AS LANCE, INSERT INTO a Lance table): nothing to try",
            file.display()
        )));
    };
    let report = if super::plan::calls_embed_image(&write) {
        let sets_batch = sets("embed.batch_images");
        super::image_trial::image_trial(&session, args, &write, &target, sets_batch)
            .await
            .map(|t| Trial::Images(Box::new(t)))
    } else {
        trial(&session, args, &write, &target, sets("embed.batch_tokens")).await.map(|t| Trial::Texts(Box::new(t)))
    }
    .map_err(|e| writes.fail(stmt, &e.chain_text()))?;
    if let Some(dir) = args.save.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::file(format!("cannot create {}", dir.display()), e))?;
    }
    std::fs::write(&args.save, serde_json::to_string_pretty(&report)?)
        .map_err(|e| Error::file(format!("cannot write {}", args.save.display()), e))?;
    Ok(report)
}

async fn trial(
    session: &EmbedSession,
    args: &TrialOptions,
    write: &LogicalPlan,
    target: &WriteTarget,
    sets_batch: bool,
) -> Result<TrialReport> {
    let ctx = session.context();
    let mut options = EmbedOptions::from_config(ctx.state().config_options());
    let (input_text, text) = counting_input(session, write, target).await?;
    drop(input_text);

    // The plan: the write's own when current, else one made now in a temporary directory.
    let temporary = tempfile::tempdir().map_err(|e| Error::file("cannot make a temporary directory", e))?;
    let (plan, dir, plan_from, plan_seconds) = trial_plan(session, write, target, &options, temporary.path()).await?;
    if plan.totals.documents == 0 {
        return Err(Error::Refused(format!("the write into {} has no text to try", target.uri)));
    }

    // The batch setting: the job's, or the probe's.
    let (from, probe_report) = if sets_batch || args.no_probe {
        (if sets_batch { "the job" } else { "the job (--no-probe)" }.to_string(), None)
    } else {
        let report = probe_and_set(ctx, &options, args.memory_budget, &dir, &text, &plan_from).await?;
        options = EmbedOptions::from_config(ctx.state().config_options());
        (probed_from(&report), Some(report))
    };
    let (settings, model_load) = chosen_settings(&options, from)?;

    // The corpus's token counts in length order, and the warm-up texts spread over them.
    let (counts, warm_texts) = read_counts(&dir, &text).await?;
    let ranges = strata(&counts, STRATA);

    // Warm-up, untimed, then once more timed: its rate sizes a --minutes sample.
    let warm = warm_up(&options, warm_texts).await?;
    let corpus_tokens: u64 = counts.iter().map(|c| u64::from(*c)).sum();
    let (fraction, chosen_by) = sample_fraction(args, counts.len(), corpus_tokens, warm);

    // The sample's work list, a unit per stratum, in a plan directory of its own.
    let sample_dir = temporary.path().join("sample");
    let chosen = write_sample(&dir, &sample_dir, &plan, &counts, &ranges, fraction).await?;

    // The sample through the run's own write path, into <save>.lance, each embedded chunk timed.
    let vectors = args.save.with_extension("lance").display().to_string();
    let uri = dataset_uri(&vectors);
    let timed = write_timed(session, write, target, &vectors, SampleRows::WorkList(&sample_dir)).await?;
    let (rates, prediction) = rates_and_prediction(&counts, &ranges, &chosen, &timed, model_load);

    let comparison = match &args.reference {
        Some(reference) => Some(compare(&vectors, reference, &options.id_column, target).await),
        None => None,
    };
    let device = match session.metrics().device() {
        Some(d) => d,
        None => options.embedder()?.device().clone(),
    };
    let sample = summary(chosen, corpus_tokens, fraction, chosen_by);
    Ok(TrialReport {
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        name: args.name.clone().unwrap_or_else(|| device.device.clone()),
        job: args.file.display().to_string(),
        output: target.uri.clone(),
        device,
        fingerprint: plan.fingerprint.clone(),
        settings,
        probe: probe_report,
        plan_from,
        plan_seconds,
        corpus: plan.totals.clone(),
        sample,
        warm_up: WarmUp { texts: WARM_UP_TEXTS.min(counts.len()) as u64, useful_tokens_per_second: warm },
        strata: rates,
        prediction,
        host: timed.host.clone(),
        vectors: uri,
        comparison,
    })
}

/// Each stratum's rate, measured on its share of the sample and extrapolated to its share of the corpus, and
/// the prediction for the whole corpus they make with the model's load and the write's start and end.
fn rates_and_prediction(
    counts: &[u32],
    ranges: &[std::ops::Range<usize>],
    chosen: &Chosen,
    timed: &Timed,
    model_load: f64,
) -> (Vec<StratumRate>, Prediction) {
    let mut rates: Vec<StratumRate> = ranges
        .iter()
        .enumerate()
        .map(|(k, r)| StratumRate::new(k, counts, r.clone(), chosen.units[k].rows, chosen.units[k].useful_tokens))
        .collect();
    let sample_ends: Vec<u64> = chosen
        .units
        .iter()
        .scan(0, |sum, u| {
            *sum += u.useful_tokens;
            Some(*sum)
        })
        .collect();
    extrapolate(&mut rates, &sample_ends, &intervals(&timed.tokens()));
    let prediction = predict(
        &rates,
        model_load,
        timed.first_call.duration_since(timed.started).as_secs_f64(),
        timed.ended.duration_since(timed.last).as_secs_f64(),
    );
    (rates, prediction)
}

/// The sample as the report shows it.
fn summary(chosen: Chosen, corpus_tokens: u64, fraction: f64, chosen_by: String) -> SampleSummary {
    let sample_tokens: u64 = chosen.units.iter().map(|u| u.useful_tokens).sum();
    SampleSummary {
        rows: chosen.units.iter().map(|u| u.rows).sum(),
        useful_tokens: sample_tokens,
        share_of_tokens: sample_tokens as f64 / corpus_tokens.max(1) as f64,
        fraction,
        step: step_for(fraction) as u64,
        chosen_by,
        largest_bin_difference: largest_bin_difference(&chosen.histogram, &chosen.corpus_histogram),
        histogram: chosen.histogram,
        corpus_histogram: chosen.corpus_histogram,
    }
}

/// The share of the corpus to sample, and why: `--sample N` rows, else the tokens `--minutes` takes at the
/// warm-up's rate `warm`.
fn sample_fraction(args: &TrialOptions, rows: usize, corpus_tokens: u64, warm: f64) -> (f64, String) {
    match args.sample {
        Some(n) => ((n as f64 / rows as f64).min(1.0), format!("--sample {n}")),
        None => {
            let tokens = warm * args.minutes * 60.0;
            (
                (tokens / corpus_tokens.max(1) as f64).min(1.0),
                format!("--minutes {} at the warm-up's {warm:.0} useful tokens/s", args.minutes),
            )
        }
    }
}

/// The settings the trial runs under (`from`: where the batch setting came from), as the report shows them
/// and as SET lines for the campaign; and the seconds a fresh load of the model with them takes (a campaign
/// loads it once).
fn chosen_settings(options: &EmbedOptions, from: String) -> Result<(TrialSettingsReport, f64)> {
    let placement = options.placement()?;
    // Timed on a fresh load with the chosen layout (the shared one was loaded by the planning).
    let started = Instant::now();
    drop(crate::model::Embedder::load(crate::model::ModelSpec::load(options.model_dir())?, &placement)?);
    let model_load = started.elapsed().as_secs_f64();
    let mut set = vec![
        format!("SET embed.batch_tokens = {};", options.batch_tokens),
        format!("SET embed.max_batch_rows = {};", options.max_batch_rows),
        format!("SET embed.sessions_per_device = {};", placement.sessions_per_device),
        format!("SET embed.intra_threads = {};", placement.intra_threads),
    ];
    if let Ok(Some(b)) = options.memory_budget_bytes() {
        set.push(format!("SET embed.memory_budget = '{}MiB';", b >> 20));
    }
    let settings = TrialSettingsReport {
        batch_tokens: options.batch_tokens,
        max_batch_rows: options.max_batch_rows,
        sessions_per_device: placement.sessions_per_device,
        intra_threads: placement.intra_threads,
        from,
        set,
    };
    Ok((settings, model_load))
}

/// The write's plan when it is current, else one made now under `temporary`: the plan, its directory, where
/// it came from in words, and the seconds making it took.
async fn trial_plan(
    session: &EmbedSession,
    write: &LogicalPlan,
    target: &WriteTarget,
    options: &EmbedOptions,
    temporary: &Path,
) -> Result<(WorkPlan, PathBuf, String, Option<f64>)> {
    let beside = plan_dir(&target.uri);
    Ok(match current_plan(&beside, target, options).await? {
        Some(plan) => (plan, beside.clone(), format!("the plan {}", beside.display()), None),
        None => {
            let started = Instant::now();
            let dir = temporary.join("plan");
            let (plan, _) = make_plan(session, write, target, UnitSize::Tokens(u64::MAX), &dir).await?;
            let why = if beside.exists() {
                "the plan beside the output is not this job's, or its sources changed"
            } else {
                "no plan beside the output"
            };
            (plan, dir, format!("a plan made now ({why})"), Some(started.elapsed().as_secs_f64()))
        }
    })
}

/// Probe the device on the plan's longest texts and set what it recommends in the session (and the other
/// session layout, when it is faster); refused when no setting fits the memory budget.
async fn probe_and_set(
    ctx: &datafusion::prelude::SessionContext,
    options: &EmbedOptions,
    budget: Option<u64>,
    dir: &Path,
    text: &Arc<dyn PhysicalExpr>,
    plan_from: &str,
) -> Result<ProbeReport> {
    let longest = read_longest(dir, text).await?.unwrap_or_default();
    let o = options.clone();
    let mut report = tokio::task::spawn_blocking(move || probe(&o, &longest, budget, 262_144))
        .await
        .map_err(|e| Error::Internal(format!("the probe failed: {e}")))??;
    report.longest_from = plan_from.to_string();
    let Some(rec) = report.recommended.clone() else {
        return Err(Error::Refused(format!(
            "the probe found no batch setting that fits the memory budget ({}); see pipeline probe",
            report.stopped
        )));
    };
    let mut set = rec.set.clone();
    if let Some((other, _, _)) = super::probe::faster_layout(&report.layouts) {
        set.push(format!("SET embed.sessions_per_device = {};", other.sessions_per_device));
        set.push(format!("SET embed.intra_threads = {};", other.intra_threads));
    }
    for line in &set {
        ctx.sql(line).await?.collect().await?;
    }
    Ok(report)
}

/// Where the probe's settings came from, in words: it says so when the layout is not the default, which the probe
/// found slower in every round.
fn probed_from(report: &ProbeReport) -> String {
    match super::probe::faster_layout(&report.layouts) {
        Some(_) => "the probe, with the session layout it found faster in every round".into(),
        None => "the probe".into(),
    }
}

/// The warm-up: `texts` embedded untimed, then once more timed; its useful tokens per second.
async fn warm_up(options: &EmbedOptions, texts: Vec<String>) -> Result<f64> {
    let embedder = options.embedder()?;
    let (call, _) = Fingerprint::for_options(options)?;
    tokio::task::spawn_blocking(move || -> crate::Result<f64> {
        let texts: Vec<Option<&str>> = texts.iter().map(|t| Some(t.as_str())).collect();
        embedder.embed(&texts, &call)?;
        let started = Instant::now();
        let useful = embedder.embed(&texts, &call)?.stats.useful_tokens;
        Ok(useful as f64 / started.elapsed().as_secs_f64().max(1e-9))
    })
    .await
    .map_err(|e| Error::Internal(format!("the warm-up failed: {e}")))?
}

/// The token count of every row of the work list in `dir`, in its order (longest first), and the texts
/// of [`WARM_UP_TEXTS`] rows spread evenly over it.
async fn read_counts(dir: &Path, text: &Arc<dyn PhysicalExpr>) -> Result<(Vec<u32>, Vec<String>)> {
    let rows = total_rows(dir).await?;
    let step = (rows / WARM_UP_TEXTS).max(1);
    let mut stream = work_list(dir).await?;
    let (mut counts, mut texts) = (Vec::with_capacity(rows), Vec::new());
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let c = token_counts(&batch)?;
        let values = text.evaluate(&batch)?.into_array(batch.num_rows())?;
        let values = crate::udf::embed::string_values(&values)?;
        for (i, n) in c.values().iter().enumerate() {
            if picked(counts.len(), step)
                && let Some(t) = values[i]
            {
                texts.push(t.to_string());
            }
            counts.push(*n);
        }
    }
    Ok((counts, texts))
}

async fn total_rows(dir: &Path) -> Result<usize> {
    let file = tokio::fs::File::open(dir.join(WORK_LIST_FILE)).await?;
    let builder = ParquetRecordBatchStreamBuilder::new(file).await?;
    Ok(builder.metadata().file_metadata().num_rows() as usize)
}

async fn work_list(
    dir: &Path,
) -> Result<datafusion::parquet::arrow::async_reader::ParquetRecordBatchStream<tokio::fs::File>> {
    let path = dir.join(WORK_LIST_FILE);
    let file =
        tokio::fs::File::open(&path).await.map_err(|e| Error::file(format!("cannot read {}", path.display()), e))?;
    Ok(ParquetRecordBatchStreamBuilder::new(file).await?.build()?)
}

fn token_counts(batch: &RecordBatch) -> Result<UInt32Array> {
    Ok(batch
        .column_by_name(TOKEN_COUNT)
        .and_then(|c| c.as_primitive_opt::<UInt32Type>())
        .ok_or_else(|| Error::Refused(format!("the work list has no {TOKEN_COUNT} column; run pipeline plan again")))?
        .clone())
}

/// What the sample took: a unit per stratum, and histograms of it and of the corpus.
struct Chosen {
    units: Vec<Unit>,
    histogram: Histogram,
    corpus_histogram: Histogram,
}

/// Write the sample's work list (a unit per stratum) and its plan into `sample_dir`.
async fn write_sample(
    dir: &Path,
    sample_dir: &Path,
    plan: &WorkPlan,
    counts: &[u32],
    ranges: &[std::ops::Range<usize>],
    fraction: f64,
) -> Result<Chosen> {
    std::fs::create_dir_all(sample_dir)?;
    let step = step_for(fraction);
    let steps: Vec<usize> = ranges.iter().map(|r| stratum_step(step, r.len(), MIN_STRATUM_ROWS)).collect();
    let mut units: Vec<Unit> = (0..ranges.len()).map(|k| Unit { unit: k as u32, ..Unit::default() }).collect();
    let (mut histogram, mut corpus_histogram) =
        (Histogram::new(plan.totals.max_tokens), Histogram::new(plan.totals.max_tokens));
    let mut stream = work_list(dir).await?;
    let mut writer: Option<ArrowWriter<std::fs::File>> = None;
    let (mut row, mut stratum, mut taken) = (0usize, 0usize, 0u64);
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let mut keep = Vec::with_capacity(batch.num_rows());
        let mut unit_of = Vec::new();
        for _ in 0..batch.num_rows() {
            while row >= ranges[stratum].end {
                stratum += 1;
            }
            let r = &ranges[stratum];
            let tokens = counts[row];
            corpus_histogram.add(u64::from(tokens));
            let take = picked(row - r.start, steps[stratum]);
            if take {
                let u = &mut units[stratum];
                if u.rows == 0 {
                    (u.first_row, u.longest, u.shortest) = (taken, tokens, tokens);
                }
                u.rows += 1;
                u.useful_tokens += u64::from(tokens);
                u.shortest = u.shortest.min(tokens);
                histogram.add(u64::from(tokens));
                unit_of.push(stratum as u32);
                taken += 1;
            }
            keep.push(take);
            row += 1;
        }
        let kept = filter_record_batch(&batch, &keep.into())?;
        if kept.num_rows() == 0 {
            continue;
        }
        // The work list's own unit column gives way to the strata.
        let unit_index = kept.schema().index_of(UNIT_COLUMN)?;
        let mut columns = kept.columns().to_vec();
        columns[unit_index] = Arc::new(UInt32Array::from(unit_of));
        let kept = RecordBatch::try_new(kept.schema(), columns)?;
        let w = match &mut writer {
            Some(w) => w,
            None => writer.insert(ArrowWriter::try_new(
                std::fs::File::create(sample_dir.join(WORK_LIST_FILE))?,
                kept.schema(),
                None,
            )?),
        };
        w.write(&kept)?;
    }
    writer.ok_or_else(|| Error::Refused("the sample is empty".into()))?.close()?;
    let mut sample_plan = plan.clone();
    sample_plan.units = units.clone();
    sample_plan.totals.rows = taken;
    std::fs::write(sample_dir.join(PLAN_FILE), serde_json::to_string_pretty(&sample_plan)?)?;
    Ok(Chosen { units, histogram, corpus_histogram })
}

/// The largest difference between a bin's share of one histogram's texts and of the other's.
fn largest_bin_difference(a: &Histogram, b: &Histogram) -> f64 {
    let (na, nb) = (a.bins.iter().sum::<u64>().max(1) as f64, b.bins.iter().sum::<u64>().max(1) as f64);
    a.bins.iter().zip(&b.bins).map(|(x, y)| (*x as f64 / na - *y as f64 / nb).abs()).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bin_differences_are_shares_of_each_histograms_texts() {
        let h = |bins: Vec<u64>| Histogram { bin_width: 8, bins, ..Histogram::default() };
        assert_eq!(largest_bin_difference(&h(vec![10, 30]), &h(vec![1, 3])), 0.0);
        assert!((largest_bin_difference(&h(vec![10, 30]), &h(vec![2, 2])) - 0.25).abs() < 1e-12);
    }
}
