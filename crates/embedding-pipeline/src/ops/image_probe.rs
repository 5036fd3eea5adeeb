//! Probing an image write (`pipeline probe job.sql` whose first write calls `embed_image`): the corpus's largest
//! images (by pixels, from one pass over their headers) decoded and embedded as a run does, first on the host
//! alone (decoding and resizing them: time per megapixel and memory), then in calls of `embed.batch_images`
//! doubling from 1, each measured for images/s and peak memory, until a call fails, the next would pass the
//! memory budget, or larger calls stop being faster. Memory is measured as [`super::probe`] measures it.
//!
//! CLIP and SigLIP take a fixed input size, so the model's memory per image does not depend on the file; the
//! host's decoding does, which is why the largest images are the ones probed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::image_plan::{PlannedImage, images_by_id, largest_images};
use super::plan::{JobWrites, embedded_input, load_job};
use super::probe::{MARGIN, MIN_TIMED_SECONDS, Meter, SAME_SPEED};
use crate::campaign::DeviceInfo;
use crate::error::{Error, Result};
use crate::lance::target::WriteTarget;
use crate::model::vision::{EmbedImageError, ImageSource, VisionEmbedder};
use crate::options::EmbedOptions;
use crate::process::memory::{self, mib};
use crate::session::EmbedSession;
use crate::udf::image_source::Located;

/// The largest images a probe decodes and embeds.
pub const PROBE_IMAGES: usize = 8;

/// The largest call a probe makes.
const MAX_BATCH_IMAGES: usize = 512;

/// Timed calls per step, at least, and at most.
const TIMED_CALLS: usize = 2;
const MAX_TIMED_CALLS: usize = 20;

/// What an image probe found, as `--json` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ImageProbeReport {
    /// Always `images`.
    pub kind: String,
    pub device: DeviceInfo,
    /// The images probed, largest first.
    pub largest: Vec<PlannedImage>,
    pub host: HostCost,
    pub budget_bytes: u64,
    pub budget_from: String,
    /// The memory with the vision tower loaded, before the first call, bytes; and what the figures are.
    pub loaded_bytes: u64,
    pub memory: String,
    pub steps: Vec<ImageStep>,
    /// Why the steps stopped growing.
    pub stopped: String,
    pub recommended: Option<ImageRecommendation>,
}

/// The host's share: the largest images decoded and prepared for the model, without it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HostCost {
    /// The threads a call decodes over, and the images decoded at once.
    pub threads: usize,
    pub images: usize,
    /// Their pixels, decoded.
    pub megapixels: f64,
    /// Wall time to decode and prepare them over the threads, and per megapixel of one core.
    pub seconds: f64,
    pub ms_per_megapixel: f64,
    /// How much the process's resident memory grew at the peak of that, bytes.
    pub peak_bytes: u64,
}

/// One step: calls of `batch_images` of the largest images.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ImageStep {
    pub batch_images: usize,
    /// Peak memory during the step (see [`ImageProbeReport::memory`]), and less what the loaded tower holds.
    pub peak_bytes: u64,
    pub working_bytes: u64,
    /// Images per second, whole calls (decoding and the model), and each part's seconds per image.
    pub images_per_second: f64,
    pub decode_seconds_per_image: f64,
    pub model_seconds_per_image: f64,
    pub fits: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The setting to run with, and why.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ImageRecommendation {
    pub batch_images: usize,
    pub why: String,
    /// The SET lines to paste into the job.
    pub set: Vec<String>,
}

/// Whether the first write into Lance of the job file embeds images.
pub async fn first_write_embeds_images(file: &Path, vars: &BTreeMap<String, String>) -> Result<bool> {
    let (session, statements) = load_job(file, vars)?;
    let mut writes = JobWrites::new(file, &session, &statements);
    Ok(writes.next().await?.is_some_and(|(_, plan, _)| super::plan::calls_embed_image(&plan)))
}

/// Probe the first write into Lance of the job file, an image write.
pub async fn probe_image_job(
    file: &Path,
    vars: &BTreeMap<String, String>,
    budget: Option<u64>,
) -> Result<ImageProbeReport> {
    memory::mark_before_load();
    let (session, statements) = load_job(file, vars)?;
    let mut writes = JobWrites::new(file, &session, &statements);
    let Some((stmt, _, target)) = writes.next().await? else {
        return Err(Error::Refused(format!("{} writes nothing into Lance: nothing to probe", file.display())));
    };
    probe_write(&session, &target, budget, None).await.map_err(|e| writes.fail(stmt, &e.chain_text()))
}

/// Probe the image write into `target` (also what `pipeline trial` of an image write does first, with its plan's
/// largest images as `known`: then only their rows are read, not every header again).
pub(crate) async fn probe_write(
    session: &EmbedSession,
    target: &WriteTarget,
    budget: Option<u64>,
    known: Option<&[PlannedImage]>,
) -> Result<ImageProbeReport> {
    let options = EmbedOptions::from_config(session.context().state().config_options());
    let inputs = embedded_input(&target.input, &options.id_column).ok_or_else(|| {
        Error::Refused(format!(
            "the write into {} is not one SELECT with embed_image() in its columns, so its images cannot be read \
             to probe with",
            target.uri
        ))
    })?;
    let largest = match known {
        Some(known) => images_by_id(session, inputs, &options, &known[..known.len().min(PROBE_IMAGES)]).await?,
        None => largest_images(session, inputs, &options, PROBE_IMAGES).await?,
    };
    if largest.is_empty() {
        return Err(Error::Refused(format!("the write into {} has no image that reads to probe with", target.uri)));
    }
    tokio::task::spawn_blocking(move || probe_images(&options, largest, budget))
        .await
        .map_err(|e| Error::Internal(format!("the probe failed: {e}")))?
}

/// The host's cost, the steps and the recommendation, on `largest` (largest first).
fn probe_images(
    options: &EmbedOptions,
    largest: Vec<(PlannedImage, Located)>,
    budget: Option<u64>,
) -> Result<ImageProbeReport> {
    let vision = options.vision_embedder()?;
    let meter = Meter::for_device(vision.device());
    let loaded = meter.now();
    let (budget_bytes, budget_from) = match budget {
        Some(b) => (b, "--memory-budget".to_string()),
        None => (
            loaded + meter.available() / 10 * 9,
            format!("90% of {}, plus what the loaded model holds", meter.free_what()),
        ),
    };
    let usable = (budget_bytes as f64 * MARGIN) as u64;
    let sources: Vec<ImageSource<'_>> = largest.iter().map(|(_, l)| l.source()).collect();
    let host = host_cost(&vision, &largest, &sources, options.max_image_pixels)?;
    let mut steps: Vec<ImageStep> = Vec::new();
    let mut batch = 1;
    let stopped = loop {
        let mut step = measure(&vision, &meter, &sources, batch, options.max_image_pixels);
        step.working_bytes = step.peak_bytes.saturating_sub(loaded);
        step.fits = step.error.is_none() && step.peak_bytes <= usable;
        let (fits, failed, peak) = (step.fits, step.error.clone(), step.peak_bytes);
        steps.push(step);
        if let Some(e) = failed {
            break format!("the call of {batch} images failed: {e}");
        }
        if !fits {
            break format!(
                "the call of {batch} images peaked at {}, past {} ({:.0}% of the budget)",
                mib(peak),
                mib(usable),
                MARGIN * 100.0
            );
        }
        // The working memory grows about linearly with the images of a call.
        let next = peak + peak.saturating_sub(loaded);
        if next > usable {
            break format!("the next step ({} images) would need about {}, past {}", batch * 2, mib(next), mib(usable));
        }
        if batch * 2 > MAX_BATCH_IMAGES {
            break format!("reached {MAX_BATCH_IMAGES} images a call");
        }
        if plateau(&steps) {
            break "larger calls were no faster: the last two steps ran below the best".to_string();
        }
        batch *= 2;
    };
    let recommended = recommend(&steps, budget_bytes);
    Ok(ImageProbeReport {
        kind: "images".into(),
        device: vision.device().clone(),
        largest: largest.into_iter().map(|(p, _)| p).collect(),
        host,
        budget_bytes,
        budget_from,
        loaded_bytes: loaded,
        memory: meter.what().to_string(),
        steps,
        stopped,
        recommended,
    })
}

/// The largest images decoded and prepared at once over the call's threads, without the model.
fn host_cost(
    vision: &VisionEmbedder,
    largest: &[(PlannedImage, Located)],
    sources: &[ImageSource<'_>],
    max_pixels: u64,
) -> Result<HostCost> {
    let before = memory::resident().unwrap_or(0);
    memory::reset_peak();
    let (took, prepared) = vision.prepare_only(sources, max_pixels);
    let peak_bytes = memory::peak().unwrap_or(0).saturating_sub(before);
    for ((image, _), p) in largest.iter().zip(&prepared) {
        if let Err(e) = p {
            return Err(Error::Refused(format!("the image of id {} {e}", image.id)));
        }
    }
    let megapixels: f64 = largest.iter().map(|(p, _)| p.width as f64 * p.height as f64 / 1e6).sum();
    let threads = vision.threads().min(largest.len()).max(1);
    Ok(HostCost {
        threads,
        images: largest.len(),
        megapixels,
        seconds: took.as_secs_f64(),
        ms_per_megapixel: took.as_secs_f64() * 1e3 * threads as f64 / megapixels.max(1e-9),
        peak_bytes,
    })
}

/// Calls of `batch` of the largest images: one untimed, then timed ones for a second at least.
fn measure(
    vision: &VisionEmbedder,
    meter: &Meter,
    sources: &[ImageSource<'_>],
    batch: usize,
    max_pixels: u64,
) -> ImageStep {
    let images: Vec<Option<ImageSource<'_>>> = (0..batch).map(|i| Some(sources[i % sources.len()])).collect();
    let call = || {
        vision.embed(&images, batch, max_pixels, false, &|| false).map_err(|e| match e {
            EmbedImageError::Bad(b) => format!("the image at row {} {}", b.row, b.error),
            EmbedImageError::Other(e) => e.to_string(),
        })
    };
    meter.reset();
    let timed = (|| -> std::result::Result<(f64, f64, f64), String> {
        call()?;
        let started = Instant::now();
        let (mut calls, mut decode, mut model) = (0usize, 0f64, 0f64);
        while calls < TIMED_CALLS || (started.elapsed().as_secs_f64() < MIN_TIMED_SECONDS && calls < MAX_TIMED_CALLS) {
            let made = call()?;
            (calls, decode, model) = (
                calls + 1,
                decode + made.stats.tokenize_time.as_secs_f64(),
                model + made.stats.model_time.as_secs_f64(),
            );
        }
        let n = (calls * batch) as f64;
        Ok((n / started.elapsed().as_secs_f64().max(1e-9), decode / n, model / n))
    })();
    let peak_bytes = meter.peak();
    let ((rate, decode, model), error) = match timed {
        Ok(r) => (r, None),
        Err(e) => ((0.0, 0.0, 0.0), Some(crate::error::plain(&e))),
    };
    ImageStep {
        batch_images: batch,
        peak_bytes,
        working_bytes: 0,
        images_per_second: rate,
        decode_seconds_per_image: decode,
        model_seconds_per_image: model,
        fits: false,
        error,
    }
}

/// Whether the last two steps both ran slower than the best before them (beyond noise).
fn plateau(steps: &[ImageStep]) -> bool {
    super::probe::plateau_of(&steps.iter().map(|s| s.images_per_second).collect::<Vec<_>>())
}

/// The fastest step that fits; among steps within [`SAME_SPEED`] of it, the smallest.
fn recommend(steps: &[ImageStep], budget_bytes: u64) -> Option<ImageRecommendation> {
    let fitting: Vec<&ImageStep> = steps.iter().filter(|s| s.fits).collect();
    let best = fitting.iter().map(|s| s.images_per_second).fold(0.0, f64::max);
    let chosen = fitting.iter().find(|s| s.images_per_second >= best * (1.0 - SAME_SPEED))?;
    Some(ImageRecommendation {
        batch_images: chosen.batch_images,
        why: format!(
            "{:.1} images/s of the largest images, peak {} (the fastest that fits, or within {:.0}% of it and smaller)",
            chosen.images_per_second,
            mib(chosen.peak_bytes),
            SAME_SPEED * 100.0
        ),
        set: vec![
            format!("SET embed.batch_images = {};", chosen.batch_images),
            format!("SET embed.memory_budget = '{}MiB';", budget_bytes >> 20),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(batch_images: usize, rate: f64, fits: bool) -> ImageStep {
        ImageStep {
            batch_images,
            peak_bytes: 1 << 30,
            working_bytes: 0,
            images_per_second: rate,
            decode_seconds_per_image: 0.0,
            model_seconds_per_image: 0.0,
            fits,
            error: None,
        }
    }

    #[test]
    fn the_smallest_batch_as_fast_as_the_fastest_that_fits_is_chosen() {
        let steps = [step(1, 10.0, true), step(2, 19.9, true), step(4, 20.0, true), step(8, 40.0, false)];
        let r = recommend(&steps, 8 << 30).unwrap();
        assert_eq!(r.batch_images, 2);
        assert_eq!(r.set[0], "SET embed.batch_images = 2;");
        assert!(plateau(&[step(1, 10.0, true), step(2, 9.0, true), step(4, 9.5, true)]));
        assert!(!plateau(&[step(1, 10.0, true), step(2, 11.0, true), step(4, 9.5, true)]));
        assert!(recommend(&[step(1, 10.0, false)], 1).is_none());
    }
}
