//! A trial of an image write (`pipeline trial` of a job whose first write into Lance calls `embed_image`): what
//! the write will cost on this machine's device, measured on a sample of its images.
//!
//! CLIP and SigLIP see every image at one input size, so the model's time per image is constant; the host's
//! decoding grows with the image's pixels. The trial therefore counts the corpus by decoded size (the image plan's
//! megapixel bands: `<output>.plan/images.json` when it is this write's, else a plan made now), probes
//! `embed.batch_images` on the largest images unless the job sets it, and warms the model up on the first images
//! that read, whose rate at the corpus's mean size sizes a `--minutes` sample. The sample is every image whose
//! id's hash falls on a power-of-two step (so trials of different sizes share the rows of the smaller), plus the
//! plan's largest images. Each band's share goes through the run's own write path (the job's query with only the
//! sample's ids kept, dropped before `embed_image()` as a resume drops done ones) into `<save>.lance`, band by
//! band, each call timed; each band's images/s is extrapolated to the band's images in the corpus, and the model's
//! load and the write's start and end are added as measured.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{AsArray, RecordBatch, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::{MemTable, provider_as_source};
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
use datafusion::prelude::DataFrame;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::image_plan::{
    IMAGES_FILE, ImageCounts, ImagePlan, MEGAPIXEL_BANDS, band_of, locate_rows, plan_images, read_headers,
};
use super::image_probe::{ImageProbeReport, probe_write};
use super::plan::{embedded_input, plan_dir};
use super::trial_sample::{Comparison, SampleRows, Timed, TrialOptions, compare, sample_host_share, write_timed};
use crate::campaign::metrics::HostShare;
use crate::campaign::trial::{StratumRate, extrapolate, intervals, predict, step_for};
use crate::campaign::{DeviceInfo, Fingerprint};
use crate::error::{Error, Result};
use crate::exec::resume::{SAMPLE_IDS, only_ids};
use crate::lance::dataset_uri;
use crate::lance::sink::fingerprint_of_columns;
use crate::lance::target::WriteTarget;
use crate::options::EmbedOptions;
use crate::session::EmbedSession;
use crate::udf::image_source::Located;

/// Images of the warm-up: the first that read.
const WARM_UP_IMAGES: usize = 16;
/// The plan's largest images, always in the sample: they set the host's cost.
const LARGEST_SAMPLED: usize = 8;

/// `trial.json` of an image write.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ImageTrialReport {
    /// Always `images`: tells this trial from a text write's.
    pub kind: String,
    pub tool_version: String,
    pub created: String,
    /// What `pipeline cost` calls it and looks its price up by.
    pub name: String,
    pub job: String,
    /// The campaign's output, which the trial did not touch.
    pub output: String,
    pub device: DeviceInfo,
    pub fingerprint: Fingerprint,
    pub settings: ImageTrialSettings,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ImageProbeReport>,
    /// Where the image plan came from, and how long it took when the trial made it.
    pub plan_from: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_seconds: Option<f64>,
    /// The whole corpus, as planned (its bands and formats; the largest and bad images are in the plan).
    pub corpus: ImageCorpus,
    pub sample: ImageSample,
    pub warm_up: ImageWarmUp,
    pub bands: Vec<BandRate>,
    pub prediction: ImagePrediction,
    /// How busy the model was while the sample was embedded (see the text trial's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostShare>,
    /// The sample's vectors (a Lance dataset).
    pub vectors: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
}

/// The settings the trial ran with, which the campaign must run with for the prediction to hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ImageTrialSettings {
    pub batch_images: usize,
    pub max_image_pixels: u64,
    /// `the job`, `the job (--no-probe)` or `the probe`.
    pub from: String,
    /// The SET lines that give a campaign these settings.
    pub set: Vec<String>,
}

/// The corpus's images, from the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ImageCorpus {
    pub rows: u64,
    pub null_images: u64,
    /// Images that read, and those the run would refuse (not priced: refused at once, or skipped).
    pub images: u64,
    pub bad: u64,
    pub bytes: u64,
    pub megapixels: f64,
}

/// What the sample held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ImageSample {
    pub images: u64,
    pub megapixels: f64,
    pub bytes: u64,
    /// Its share of the corpus's images.
    pub share_of_images: f64,
    /// The share asked for, and the sample's spacing: the images whose id's hash is a multiple of `step` (a power
    /// of two), so that trials of different sizes share the images of the smaller.
    pub fraction: f64,
    pub step: u64,
    /// Of the sample, the plan's largest images taken whatever their hash.
    pub largest_added: u64,
    /// Rows picked and left out: NULL images, and bad ones (the plan lists them).
    pub left_out: u64,
    /// Why this size: `--sample N`, or `--minutes M` at the warm-up's rate.
    pub chosen_by: String,
}

/// The untimed warm-up, then timed once: what sizes a `--minutes` sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ImageWarmUp {
    pub images: u64,
    pub images_per_second: f64,
    /// The model's seconds per image, and the host's (decoding and preparing over the call's threads) per
    /// megapixel decoded.
    pub model_seconds_per_image: f64,
    pub host_seconds_per_megapixel: f64,
    /// The rate these give at the corpus's mean megapixels per image.
    pub images_per_second_at_corpus_mean: f64,
}

/// One band of decoded size: its images in the corpus and in the sample, the rate measured on it, and the time it
/// will take in the full campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BandRate {
    pub band: String,
    pub corpus_images: u64,
    pub corpus_megapixels: f64,
    pub sample_images: u64,
    /// Calls timed in it (one per `embed_image` batch of the write), their images and seconds.
    pub timed_calls: u64,
    pub timed_images: u64,
    pub timed_seconds: f64,
    pub images_per_second: f64,
    /// Set when the sample held none of this band and the rate is another band's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_from_band: Option<String>,
    /// The corpus's images of this band at that rate, and the range two standard errors give.
    pub predicted_seconds: f64,
    pub low_seconds: f64,
    pub high_seconds: f64,
}

/// The full campaign's predicted wall time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ImagePrediction {
    pub seconds: f64,
    pub low_seconds: f64,
    pub high_seconds: f64,
    /// Of which: loading the vision tower, the write's start before its first call, and its end after its last.
    pub model_load_seconds: f64,
    pub startup_seconds: f64,
    pub finish_seconds: f64,
    /// The bands' seconds together.
    pub embedding_seconds: f64,
    /// The corpus's images over the predicted seconds.
    pub images_per_second: f64,
}

/// Try the image write into `target` (`sets_batch`: the job sets `embed.batch_images`).
pub(crate) async fn image_trial(
    session: &EmbedSession,
    args: &TrialOptions,
    write: &LogicalPlan,
    target: &WriteTarget,
    sets_batch: bool,
) -> Result<ImageTrialReport> {
    let ctx = session.context();
    let mut options = EmbedOptions::from_config(ctx.state().config_options());
    let inputs = embedded_input(&target.input, &options.id_column).ok_or_else(|| {
        Error::Refused(format!(
            "the write into {} is not one SELECT with embed_image() in its columns (a UNION of several, say), so the \
             trial cannot read its images beside their ids ({})",
            target.uri, options.id_column
        ))
    })?;
    let id_column = options.id_column.clone();
    let sample_of = |ids: &[String]| {
        only_ids(target.input.as_ref().clone(), ids_table(&id_column, ids)?, &id_column)?.map_err(|why| {
            Error::Refused(format!(
                "the trial keeps its sample's ids before embed_image() runs, and the write into {} cannot: {why}",
                target.uri
            ))
        })
    };
    sample_of(&[])?;
    let fingerprint = fingerprint_of_columns(target.input.schema().as_arrow())?
        .ok_or_else(|| Error::Refused(format!("the write into {} has no fingerprinted column", target.uri)))?;
    let temporary = tempfile::tempdir().map_err(|e| Error::file("cannot make a temporary directory", e))?;
    let (plan, plan_from, plan_seconds) =
        trial_plan(session, inputs.clone(), target, fingerprint, &options, temporary.path()).await?;
    if plan.counts.images == 0 {
        return Err(Error::Refused(format!("the write into {} has no image that reads to try", target.uri)));
    }

    let (from, probe) = batch_setting(session, target, args, sets_batch, &plan.counts.largest).await?;
    options = EmbedOptions::from_config(ctx.state().config_options());
    let (settings, model_load) = chosen_settings(&options, from)?;

    let warm = warm_up(session, inputs.clone(), &options, &plan.counts).await?;
    let (fraction, chosen_by) = sample_fraction(args, &plan.counts, &warm);
    let step = step_for(fraction);
    let chosen = choose(session, inputs, &options, &plan.counts, step).await?;
    if chosen.rows != plan.counts.rows {
        return Err(Error::Refused(format!(
            "{}: the plan counts {} rows, the write reads {} now: run pipeline plan again",
            plan_from, plan.counts.rows, chosen.rows
        )));
    }

    // Band by band through the run's write path, into <save>.lance.
    let vectors = args.save.with_extension("lance").display().to_string();
    let before = session.metrics().embed_stats();
    let timed = write_bands(session, write, target, &vectors, &chosen, &sample_of).await?;
    let wall = timed.iter().map(|(_, t)| t.ended.duration_since(t.first_call)).sum();
    let host = sample_host_share(session, &before, wall);
    let (bands, prediction) = rates_and_prediction(&plan.counts, &chosen, &timed, model_load);

    let comparison = match &args.reference {
        Some(reference) => Some(compare(&vectors, reference, &options.id_column, target).await),
        None => None,
    };
    let device = match session.metrics().device() {
        Some(d) => d,
        None => options.vision_embedder()?.device().clone(),
    };
    Ok(ImageTrialReport {
        kind: "images".into(),
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        name: args.name.clone().unwrap_or_else(|| device.device.clone()),
        job: args.file.display().to_string(),
        output: target.uri.clone(),
        device,
        fingerprint: plan.fingerprint.clone(),
        settings,
        probe,
        plan_from,
        plan_seconds,
        corpus: ImageCorpus::of(&plan.counts),
        sample: chosen.summary(plan.counts.images, fraction, step, chosen_by),
        warm_up: warm,
        bands,
        prediction,
        host,
        vectors: dataset_uri(&vectors),
        comparison,
    })
}

/// Where `embed.batch_images` comes from: the job (`sets_batch`, or `--no-probe`), else the probe on the plan's
/// `largest` images, whose recommendation is set in the session.
async fn batch_setting(
    session: &EmbedSession,
    target: &WriteTarget,
    args: &TrialOptions,
    sets_batch: bool,
    largest: &[super::image_plan::PlannedImage],
) -> Result<(String, Option<ImageProbeReport>)> {
    if sets_batch || args.no_probe {
        return Ok((if sets_batch { "the job" } else { "the job (--no-probe)" }.to_string(), None));
    }
    let report = probe_write(session, target, args.memory_budget, Some(largest)).await?;
    let Some(rec) = &report.recommended else {
        return Err(Error::Refused(format!(
            "the probe found no embed.batch_images that fits the memory budget ({}); see pipeline probe",
            report.stopped
        )));
    };
    session.context().sql(&format!("SET embed.batch_images = {}", rec.batch_images)).await?.collect().await?;
    Ok(("the probe".to_string(), Some(report)))
}

/// Each band's share of the sample written into `vectors` through the run's write path (`sample_of`: the write's
/// input with only some ids kept), each write timed.
async fn write_bands(
    session: &EmbedSession,
    write: &LogicalPlan,
    target: &WriteTarget,
    vectors: &str,
    chosen: &Chosen,
    sample_of: &dyn Fn(&[String]) -> Result<LogicalPlan>,
) -> Result<Vec<(usize, Timed)>> {
    let ctx = session.context();
    let mut timed: Vec<(usize, Timed)> = Vec::new();
    for (k, ids) in chosen.ids.iter().enumerate().filter(|(_, ids)| !ids.is_empty()) {
        // The first band's write replaces an earlier trial's vectors (a preparation's session restarts every
        // write); the others add to it.
        if !timed.is_empty() {
            ctx.sql("SET embed.restart = false").await?.collect().await?;
        }
        let rows = SampleRows::Input(Arc::new(sample_of(ids)?));
        let written = write_timed(session, write, target, vectors, rows).await;
        ctx.sql("SET embed.restart = true").await?.collect().await?;
        timed.push((k, written?));
    }
    Ok(timed)
}

/// The image plan beside the output when it is this write's (same output, fingerprint and pixel limit), else one
/// made now under `temporary`: the plan, where it came from in words, and the seconds making it took.
async fn trial_plan(
    session: &EmbedSession,
    inputs: LogicalPlan,
    target: &WriteTarget,
    fingerprint: Fingerprint,
    options: &EmbedOptions,
    temporary: &std::path::Path,
) -> Result<(ImagePlan, String, Option<f64>)> {
    let beside = plan_dir(&target.uri);
    let why = match ImagePlan::read(&beside) {
        Ok(p)
            if p.output == target.uri
                && p.fingerprint == fingerprint
                && p.max_image_pixels == options.max_image_pixels =>
        {
            return Ok((p, format!("the plan {}", beside.join(IMAGES_FILE).display()), None));
        }
        Ok(_) => "the image plan beside the output is another write's, model's or pixel limit's",
        Err(_) if beside.exists() => "the plan beside the output is not an image plan this version reads",
        Err(_) => "no plan beside the output",
    };
    let started = Instant::now();
    let plan = plan_images(session, inputs, target, fingerprint, &temporary.join("plan")).await?;
    Ok((plan, format!("a plan made now ({why})"), Some(started.elapsed().as_secs_f64())))
}

/// The settings as the report shows them and as SET lines, and the seconds a fresh load of the vision tower takes
/// (a campaign loads it once).
fn chosen_settings(options: &EmbedOptions, from: String) -> Result<(ImageTrialSettings, f64)> {
    let placement = options.placement()?;
    let started = Instant::now();
    drop(crate::model::vision::VisionEmbedder::load(&crate::model::ModelSpec::load(options.model_dir())?, &placement)?);
    let model_load = started.elapsed().as_secs_f64();
    let mut set = vec![format!("SET embed.batch_images = {};", options.batch_images)];
    if let Ok(Some(b)) = options.memory_budget_bytes() {
        set.push(format!("SET embed.memory_budget = '{}MiB';", b >> 20));
    }
    let settings = ImageTrialSettings {
        batch_images: options.batch_images,
        max_image_pixels: options.max_image_pixels,
        from,
        set,
    };
    Ok((settings, model_load))
}

/// The warm-up: the first [`WARM_UP_IMAGES`] images that read, embedded untimed, then once more timed.
async fn warm_up(
    session: &EmbedSession,
    inputs: LogicalPlan,
    options: &EmbedOptions,
    corpus: &ImageCounts,
) -> Result<ImageWarmUp> {
    let images = first_images(session, inputs, options, WARM_UP_IMAGES).await?;
    let vision = options.vision_embedder()?;
    let (batch, max_pixels) = (options.batch_images, options.max_image_pixels);
    let mean_megapixels = corpus.pixels as f64 / 1e6 / corpus.images.max(1) as f64;
    tokio::task::spawn_blocking(move || -> Result<ImageWarmUp> {
        let sources: Vec<_> = images.iter().map(|l| Some(l.source())).collect();
        let embed = || {
            vision.embed(&sources, batch, max_pixels, true, &|| false).map_err(|e| match e {
                crate::model::vision::EmbedImageError::Bad(b) => Error::Refused(b.error.to_string()),
                crate::model::vision::EmbedImageError::Other(e) => e,
            })
        };
        embed()?;
        let started = Instant::now();
        let stats = embed()?.stats;
        let seconds = started.elapsed().as_secs_f64().max(1e-9);
        let n = stats.images.max(1) as f64;
        let model = stats.model_time.as_secs_f64() / n;
        let host = stats.tokenize_time.as_secs_f64() / (stats.image_pixels as f64 / 1e6).max(1e-9);
        let at_mean = model + host * mean_megapixels;
        Ok(ImageWarmUp {
            images: stats.images,
            images_per_second: stats.images as f64 / seconds,
            model_seconds_per_image: model,
            host_seconds_per_megapixel: host,
            images_per_second_at_corpus_mean: if at_mean > 0.0 { 1.0 / at_mean } else { 0.0 },
        })
    })
    .await
    .map_err(|e| Error::Internal(format!("the warm-up failed: {e}")))?
}

/// The first `n` images of `inputs` whose header reads within the pixel limit (only their rows' objects fetched).
async fn first_images(
    session: &EmbedSession,
    inputs: LogicalPlan,
    options: &EmbedOptions,
    n: usize,
) -> Result<Vec<Located>> {
    let mut found = Vec::new();
    let mut stream = DataFrame::new(session.context().state(), inputs).execute_stream().await?;
    while found.len() < n
        && let Some(batch) = stream.next().await
    {
        let batch = batch?;
        let column = batch.column(1);
        let mut start = 0;
        while found.len() < n && start < batch.num_rows() {
            let end = (start + n - found.len()).min(batch.num_rows());
            let rows: Vec<u32> = (start..end).filter(|r| column.is_valid(*r)).map(|r| r as u32).collect();
            let located = locate_rows(column, &rows, &options.image_base).await?;
            let headers = read_headers(&located).await?;
            for (l, h) in located.into_iter().zip(headers) {
                if let (Some(l), Some(Ok((h, _)))) = (l, h)
                    && h.pixels() <= options.max_image_pixels
                {
                    found.push(l);
                }
            }
            start = end;
        }
    }
    Ok(found)
}

/// The share of the corpus's images to sample, and why: `--sample N` images, else the images `--minutes` takes at
/// the warm-up's rate for an image of the corpus's mean size.
fn sample_fraction(args: &TrialOptions, corpus: &ImageCounts, warm: &ImageWarmUp) -> (f64, String) {
    let images = corpus.images.max(1) as f64;
    match args.sample {
        Some(n) => ((n as f64 / images).min(1.0), format!("--sample {n}")),
        None => {
            let rate = warm.images_per_second_at_corpus_mean;
            (
                (rate * args.minutes * 60.0 / images).min(1.0),
                format!("--minutes {} at the warm-up's {rate:.1} images/s for the corpus's mean size", args.minutes),
            )
        }
    }
}

/// The sample's ids by band, and what it holds.
#[derive(Debug, Default)]
struct Chosen {
    /// The write's rows, all of them (to check the plan against).
    rows: u64,
    ids: Vec<Vec<String>>,
    pixels: Vec<u64>,
    bytes: u64,
    largest_added: u64,
    left_out: u64,
}

impl Chosen {
    fn images(&self) -> u64 {
        self.ids.iter().map(|i| i.len() as u64).sum()
    }

    /// The sample as the report shows it, of a corpus of `images`.
    fn summary(&self, images: u64, fraction: f64, step: usize, chosen_by: String) -> ImageSample {
        ImageSample {
            images: self.images(),
            megapixels: self.pixels.iter().sum::<u64>() as f64 / 1e6,
            bytes: self.bytes,
            share_of_images: self.images() as f64 / images.max(1) as f64,
            fraction,
            step: step as u64,
            largest_added: self.largest_added,
            left_out: self.left_out,
            chosen_by,
        }
    }
}

impl ImageCorpus {
    fn of(c: &ImageCounts) -> Self {
        ImageCorpus {
            rows: c.rows,
            null_images: c.null_images,
            images: c.images,
            bad: c.bad,
            bytes: c.bytes,
            megapixels: c.pixels as f64 / 1e6,
        }
    }
}

/// A stable hash of an id: which sample steps take it.
fn id_hash(id: &str) -> u64 {
    let digest = sha2::Sha256::digest(id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// One pass over the write's ids: those whose hash is a multiple of `step`, and the plan's largest images, read
/// (only theirs) and put in their bands.
async fn choose(
    session: &EmbedSession,
    inputs: LogicalPlan,
    options: &EmbedOptions,
    corpus: &ImageCounts,
    step: usize,
) -> Result<Chosen> {
    let largest: HashSet<&str> = corpus.largest.iter().take(LARGEST_SAMPLED).map(|p| p.id.as_str()).collect();
    let mut chosen = Chosen {
        ids: vec![Vec::new(); MEGAPIXEL_BANDS.len()],
        pixels: vec![0; MEGAPIXEL_BANDS.len()],
        ..Chosen::default()
    };
    let mut stream = DataFrame::new(session.context().state(), inputs).execute_stream().await?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        chosen.rows += batch.num_rows() as u64;
        let ids = cast(batch.column(0), &DataType::Utf8)?;
        let ids = ids.as_string::<i32>();
        let mut rows = Vec::new();
        for (r, id) in ids.iter().enumerate() {
            let Some(id) = id else { continue };
            let by_hash = id_hash(id).is_multiple_of(step.max(1) as u64);
            if by_hash || largest.contains(id) {
                rows.push(r as u32);
                chosen.largest_added += u64::from(!by_hash);
            }
        }
        let located = locate_rows(batch.column(1), &rows, &options.image_base).await?;
        for (r, header) in rows.iter().zip(read_headers(&located).await?) {
            match header {
                Some(Ok((h, bytes))) if h.pixels() <= options.max_image_pixels => {
                    let k = band_of(h.pixels());
                    chosen.ids[k].push(ids.value(*r as usize).to_string());
                    chosen.pixels[k] += h.pixels();
                    chosen.bytes += bytes;
                }
                _ => chosen.left_out += 1,
            }
        }
    }
    Ok(chosen)
}

/// The ids to keep, as a table of one text column named `column`, scanned as [`SAMPLE_IDS`].
fn ids_table(column: &str, ids: &[String]) -> Result<LogicalPlan> {
    let schema = Arc::new(Schema::new(vec![Field::new(column, DataType::Utf8, false)]));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(StringArray::from(ids.to_vec()))])?;
    let table = MemTable::try_new(schema, vec![vec![batch]])?;
    Ok(LogicalPlanBuilder::scan(SAMPLE_IDS, provider_as_source(Arc::new(table)), None)?.build()?)
}

/// Each band's rate, measured on its writes' calls and extrapolated to its images in the corpus, and the
/// prediction they make with the model's load, the first write's start and the last one's end.
fn rates_and_prediction(
    corpus: &ImageCounts,
    chosen: &Chosen,
    timed: &[(usize, Timed)],
    model_load: f64,
) -> (Vec<BandRate>, ImagePrediction) {
    // The text trial's arithmetic, with images where it has tokens: each band a stratum.
    let mut strata: Vec<StratumRate> = corpus
        .bands
        .iter()
        .enumerate()
        .map(|(k, b)| {
            let mut s = StratumRate::new(k, &[], 0..0, chosen.ids[k].len() as u64, chosen.ids[k].len() as u64);
            (s.corpus_rows, s.corpus_tokens) = (b.images, b.images);
            s
        })
        .collect();
    let mut calls = Vec::new();
    let mut ends = Vec::with_capacity(strata.len());
    let mut done = 0;
    for k in 0..strata.len() {
        if let Some((_, t)) = timed.iter().find(|(band, _)| *band == k) {
            calls.extend(intervals(&t.points.iter().map(|p| (p.0, p.2)).collect::<Vec<_>>()));
            done += t.points.last().map_or(0, |p| p.2);
        }
        ends.push(done);
    }
    extrapolate(&mut strata, &ends, &calls);
    let startup = timed.first().map_or(0.0, |(_, t)| t.first_call.duration_since(t.started).as_secs_f64());
    let finish = timed.last().map_or(0.0, |(_, t)| t.ended.duration_since(t.last).as_secs_f64());
    let p = predict(&strata, model_load, startup, finish);
    let bands = strata
        .iter()
        .zip(&corpus.bands)
        .map(|(s, b)| BandRate {
            band: b.name.clone(),
            corpus_images: b.images,
            corpus_megapixels: b.pixels as f64 / 1e6,
            sample_images: s.sample_rows,
            timed_calls: s.timed_calls,
            timed_images: s.timed_tokens,
            timed_seconds: s.timed_seconds,
            images_per_second: s.useful_tokens_per_second,
            rate_from_band: s.rate_from_stratum.map(|j| MEGAPIXEL_BANDS[j].1.to_string()),
            predicted_seconds: s.predicted_seconds,
            low_seconds: s.low_seconds,
            high_seconds: s.high_seconds,
        })
        .collect();
    let prediction = ImagePrediction {
        seconds: p.seconds,
        low_seconds: p.low_seconds,
        high_seconds: p.high_seconds,
        model_load_seconds: p.model_load_seconds,
        startup_seconds: p.startup_seconds,
        finish_seconds: p.finish_seconds,
        embedding_seconds: p.embedding_seconds,
        images_per_second: p.useful_tokens_per_second,
    };
    (bands, prediction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_steps_nest_by_the_ids_hash() {
        let ids: Vec<String> = (0..4000).map(|i| format!("img/{i}.jpg")).collect();
        let at = |step: u64| -> HashSet<&str> {
            ids.iter().filter(|i| id_hash(i).is_multiple_of(step)).map(String::as_str).collect()
        };
        let (a, b) = (at(8), at(16));
        assert!(b.is_subset(&a) && !b.is_empty() && b.len() < a.len());
        // About one in eight.
        assert!((a.len() as f64 - 500.0).abs() < 100.0, "{}", a.len());
    }
}
