//! `pipeline trial job.sql [--minutes M | --sample N] [--save trial.json] [--reference DATASET]`: what the
//! job's first write into Lance will cost on this machine's device, measured on a sample by
//! [`embedding_pipeline::ops::trial`], printed.

use std::path::{Path, PathBuf};

use super::ExitStatus;
use super::args::{JobVars, Runtime, at_least};
use super::printer::{Printer, out};
use embedding_pipeline::ops::cost::duration;
use embedding_pipeline::ops::image_trial::ImageTrialReport;
use embedding_pipeline::ops::trial::{Trial, TrialReport, run_trial};

/// `pipeline trial`'s arguments.
#[derive(Debug, clap::Args)]
pub struct TrialArgs {
    /// The job file (its first write into Lance is tried; the output itself is not touched).
    file: PathBuf,
    #[command(flatten)]
    vars: JobVars,
    #[command(flatten)]
    trial: TrialSampleArgs,
    /// Print trial.json.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    runtime: Runtime,
}

/// What `pipeline trial` is asked beside its job: the library's [`embedding_pipeline::ops::trial::TrialOptions`].
#[derive(Debug, Clone, clap::Args)]
pub struct TrialSampleArgs {
    /// Embedding time the sample should take, minutes (sized by the warm-up's rate).
    #[arg(long, default_value_t = embedding_pipeline::ops::trial::TrialOptions::DEFAULT_MINUTES, conflicts_with = "sample")]
    minutes: f64,
    /// About this many rows in the sample, instead of --minutes (every 2^k-th row of each length
    /// stratum, k chosen to come nearest).
    #[arg(long, value_parser = at_least::<1>)]
    sample: Option<u64>,
    /// Where the trial is saved; the sample's vectors go beside it (trial.json: trial.lance).
    #[arg(long, default_value = embedding_pipeline::ops::trial::TrialOptions::DEFAULT_SAVE)]
    save: PathBuf,
    /// A dataset (a reference run's output, or another trial's vectors) to compare the sample's
    /// vectors with, by id: they match at minimum cosine >= 0.9999. Exits 1 when they do not.
    #[arg(long, value_name = "DATASET")]
    reference: Option<String>,
    /// Memory budget for the probe, e.g. 8GiB (as pipeline probe).
    #[arg(long, value_name = "SIZE", value_parser = embedding_pipeline::process::memory::parse_size)]
    memory_budget: Option<u64>,
    /// Keep the job's batch settings; do not probe.
    #[arg(long)]
    no_probe: bool,
    /// The trial's name, which pipeline cost prints and prices it by (default: the device).
    #[arg(long)]
    name: Option<String>,
}

impl TrialSampleArgs {
    /// The library's arguments: these, for the job `file` with its variables.
    fn args(self, file: PathBuf, vars: &JobVars) -> anyhow::Result<embedding_pipeline::ops::trial::TrialOptions> {
        let Self { minutes, sample, save, reference, memory_budget, no_probe, name } = self;
        Ok(embedding_pipeline::ops::trial::TrialOptions {
            file,
            vars: vars.parse()?,
            minutes,
            sample,
            save,
            reference,
            memory_budget,
            no_probe,
            name,
        })
    }
}

/// Run the trial and print (or with `--json` print as JSON) what it found; it is saved to `--save`. Exit 1 when
/// the sample's vectors do not match the reference's.
pub async fn run(args: TrialArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    args.runtime.apply();
    let trial = args.trial.args(args.file, &args.vars)?;
    let report = run_trial(&trial).await?;
    match &report {
        _ if args.json => out!(printer, "{}", serde_json::to_string_pretty(&report)?),
        Trial::Texts(r) => print_report(r, &trial.save, printer),
        Trial::Images(r) => print_images(r, &trial.save, printer),
    }
    if let Some(why) = report.mismatch() {
        printer.error(&anyhow::anyhow!(why));
        return Ok(ExitStatus::Failure);
    }
    Ok(ExitStatus::Success)
}

/// How busy the model was during the sample, and what that means for the prediction.
fn print_host(host: Option<&embedding_pipeline::campaign::metrics::HostShare>, printer: Printer) {
    let Some(h) = host else { return };
    out!(printer, "  while the sample was embedded: {}", h.describe());
    if h.cores_to_keep_busy.is_some() {
        out!(
            printer,
            "  the prediction holds for this machine's {} cores: one with more would run faster, up to the model's \
             own rate",
            h.cores
        );
    }
}

/// The strata: each one's lengths, tokens, timed calls, rate and predicted time.
fn print_strata(r: &TrialReport, printer: Printer) {
    out!(printer, "  stratum  tokens/text  corpus tokens  sample tokens  calls  useful tokens/s   predicted");
    for st in &r.strata {
        let rate = match st.rate_from_stratum {
            Some(k) => format!("{:.0} (of {k})", st.useful_tokens_per_second),
            None => format!("{:.0}", st.useful_tokens_per_second),
        };
        out!(
            printer,
            "  {:>7} {:>12} {:>14} {:>14} {:>6} {:>16} {:>11}",
            st.stratum,
            format!("{}-{}", st.shortest, st.longest),
            st.corpus_tokens,
            st.sample_tokens,
            st.timed_calls,
            rate,
            duration(st.predicted_seconds)
        );
    }
}

fn print_report(r: &TrialReport, save: &Path, printer: Printer) {
    out!(printer, "trial of {} on {}", r.job, r.device);
    let s = &r.settings;
    out!(
        printer,
        "  settings (from {}): embed.batch_tokens = {}, embed.max_batch_rows = {}, {} session(s) x {} thread(s)",
        s.from,
        s.batch_tokens,
        s.max_batch_rows,
        s.sessions_per_device,
        s.intra_threads
    );
    if let Some(p) = &r.probe {
        out!(printer, "  probe: {} steps, {}", p.steps.len(), p.stopped);
    }
    out!(printer, "  plan: {}", r.plan_from);
    let c = &r.corpus;
    out!(printer, "  corpus: {} rows, {} useful tokens", c.rows, c.useful_tokens);
    let m = &r.sample;
    out!(
        printer,
        "  sample: {} rows, {} useful tokens ({:.1}% of the corpus's), for {}; its length mix is within {:.1} points \
         of the corpus's in every bin",
        m.rows,
        m.useful_tokens,
        100.0 * m.share_of_tokens,
        m.chosen_by,
        100.0 * m.largest_bin_difference
    );
    print_strata(r, printer);
    let p = &r.prediction;
    out!(
        printer,
        "predicted for the whole corpus from its plan: {} ({} to {}), {:.0} useful tokens/s",
        duration(p.seconds),
        duration(p.low_seconds),
        duration(p.high_seconds),
        p.useful_tokens_per_second
    );
    out!(
        printer,
        "  of which model load {:.1} s, start {:.1} s, finish {:.1} s; the range is two standard errors of each \
         stratum's rate, not the machine's drift",
        p.model_load_seconds,
        p.startup_seconds,
        p.finish_seconds
    );
    print_host(r.host.as_ref(), printer);
    if let Some(t) = r.plan_seconds {
        out!(printer, "  a run without a plan also counts the corpus first: planning took {t:.1} s here");
    }
    print_ending(&s.set, r.comparison.as_ref(), save, &r.vectors, printer);
}

/// A trial's last lines, either kind's: the SET lines to run with, the comparison, and where it was saved.
fn print_ending(
    set: &[String],
    comparison: Option<&embedding_pipeline::ops::trial::Comparison>,
    save: &Path,
    vectors: &str,
    printer: Printer,
) {
    out!(printer, "  run the campaign with:");
    for line in set {
        out!(printer, "    {line}");
    }
    print_comparison(comparison, printer);
    out!(printer, "saved {} (vectors: {})", save.display(), vectors);
}

/// The sample's vectors against the reference's, when one was given.
fn print_comparison(c: Option<&embedding_pipeline::ops::trial::Comparison>, printer: Printer) {
    if let Some(c) = c {
        let f = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.6}"));
        out!(
            printer,
            "against {}: {} ids, minimum cosine {}, mean {}, largest difference {}: {}",
            c.reference,
            c.matched,
            f(c.min_cosine),
            f(c.mean_cosine),
            f(c.max_abs_diff),
            if c.passed { "the vectors match".to_string() } else { format!("NO MATCH ({})", c.failures.join("; ")) }
        );
    }
}

/// The bands: each one's images in the corpus and the sample, timed calls, rate and predicted time.
fn print_bands(r: &ImageTrialReport, printer: Printer) {
    out!(
        printer,
        "  {:<24} {:>13} {:>13} {:>6} {:>9} {:>11}",
        "band",
        "corpus images",
        "sample images",
        "calls",
        "images/s",
        "predicted"
    );
    for b in &r.bands {
        out!(
            printer,
            "  {:<24} {:>13} {:>13} {:>6} {:>9.1} {:>11}{}",
            b.band,
            b.corpus_images,
            b.sample_images,
            b.timed_calls,
            b.images_per_second,
            duration(b.predicted_seconds),
            b.rate_from_band.as_ref().map_or(String::new(), |from| format!("  (the rate of {from})"))
        );
    }
}

/// An image write's trial: the corpus and sample by band, each band's rate, the prediction.
fn print_images(r: &ImageTrialReport, save: &Path, printer: Printer) {
    out!(printer, "trial of {} (images) on {}", r.job, r.device);
    let s = &r.settings;
    out!(printer, "  settings (from {}): embed.batch_images = {}", s.from, s.batch_images);
    if let Some(p) = &r.probe {
        out!(printer, "  probe: {} steps, {}", p.steps.len(), p.stopped);
    }
    out!(printer, "  plan: {}", r.plan_from);
    let c = &r.corpus;
    out!(
        printer,
        "  corpus: {} rows, {} images ({:.1} megapixels, {:.1} MB), {} NULL, {} bad (not priced)",
        c.rows,
        c.images,
        c.megapixels,
        c.bytes as f64 / 1e6,
        c.null_images,
        c.bad
    );
    let w = &r.warm_up;
    out!(
        printer,
        "  warm-up: {} images, {:.1} images/s; model {:.1} ms per image, host {:.1} ms per megapixel",
        w.images,
        w.images_per_second,
        w.model_seconds_per_image * 1e3,
        w.host_seconds_per_megapixel * 1e3
    );
    let m = &r.sample;
    out!(
        printer,
        "  sample: {} images ({:.1}% of the corpus's, {:.1} megapixels; every image whose id hashes to a multiple of {}, \
         and {} of the largest), for {}",
        m.images,
        100.0 * m.share_of_images,
        m.megapixels,
        m.step,
        m.largest_added,
        m.chosen_by
    );
    print_bands(r, printer);
    let p = &r.prediction;
    out!(
        printer,
        "predicted for the whole corpus from its plan: {} ({} to {}), {:.1} images/s",
        duration(p.seconds),
        duration(p.low_seconds),
        duration(p.high_seconds),
        p.images_per_second
    );
    out!(
        printer,
        "  of which model load {:.1} s, start {:.1} s, finish {:.1} s; the range is two standard errors of each \
         band's rate, not the machine's drift",
        p.model_load_seconds,
        p.startup_seconds,
        p.finish_seconds
    );
    print_host(r.host.as_ref(), printer);
    if let Some(t) = r.plan_seconds {
        out!(printer, "  the trial read every image's header first: {t:.1} s here (pipeline plan does it beforehand)");
    }
    print_ending(&s.set, r.comparison.as_ref(), save, &r.vectors, printer);
}
