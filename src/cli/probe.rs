//! `pipeline probe job.sql [--memory-budget SIZE] [--json]`: the batch setting a campaign can afford on this
//! machine's device, found by [`embedding_pipeline::ops::probe`], printed.

use std::path::PathBuf;

use super::ExitStatus;
use super::args::{JobVars, Runtime, at_least};
use super::printer::{Printer, out};
use embedding_pipeline::model::fit::{MemorySplit, gib};
use embedding_pipeline::ops::image_probe;
use embedding_pipeline::ops::probe::{LAYOUT_ROUNDS, ProbeReport, SAME_SPEED, faster_layout, probe_job};
use embedding_pipeline::process::memory::mib;

/// `pipeline probe`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The job file (its first write into Lance is probed).
    file: PathBuf,
    #[command(flatten)]
    vars: JobVars,
    /// Most memory the process may use, e.g. 8GiB or 900MB (default: 90% of the available memory,
    /// plus what the loaded model holds).
    #[arg(long, value_name = "SIZE", value_parser = embedding_pipeline::process::memory::parse_size)]
    memory_budget: Option<u64>,
    /// Largest embed.batch_tokens tried.
    #[arg(long, default_value_t = 262_144, value_parser = at_least::<512>)]
    max_batch_tokens: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    runtime: Runtime,
}

/// Probe the first write into Lance of the job file, and print what was found.
pub async fn run(args: ProbeArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    args.runtime.apply();
    let max_batch_tokens = args.max_batch_tokens as usize;
    let vars = args.vars.parse()?;
    if image_probe::first_write_embeds_images(&args.file, &vars).await? {
        let report = image_probe::probe_image_job(&args.file, &vars, args.memory_budget).await?;
        match args.json {
            true => out!(printer, "{}", serde_json::to_string_pretty(&report)?),
            false => print_image_report(&report, printer),
        }
        if report.recommended.is_none() {
            anyhow::bail!(
                "no batch of images fits the memory budget of {}: {}; free memory or raise --memory-budget",
                mib(report.budget_bytes),
                report.stopped
            );
        }
        return Ok(ExitStatus::Success);
    }
    let report = probe_job(&args.file, &vars, args.memory_budget, max_batch_tokens).await?;
    if args.json {
        out!(printer, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report, printer);
    }
    if let Some(why) = report.no_fit() {
        anyhow::bail!(why);
    }
    Ok(ExitStatus::Success)
}

/// The 48 GB split, as `probe` and `cost` print it.
pub fn print_split(s: &MemorySplit, printer: Printer) {
    let by_type: Vec<String> = s.weights.iter().map(|(t, b)| format!("{t} {}", gib(*b))).collect();
    out!(printer, "memory split, measured on {}:", s.measured_on);
    out!(
        printer,
        "  weights {} ({}, exact from the graph); the session after load {}; working memory {} KiB a padded token",
        gib(s.weights_bytes),
        by_type.join(", "),
        gib(s.session_bytes),
        s.working_bytes_per_token.div_ceil(1024)
    );
    for line in s.statements() {
        out!(printer, "  {line}");
    }
}

fn print_report(r: &ProbeReport, printer: Printer) {
    out!(printer, "probe on {}", r.device);
    out!(
        printer,
        "  longest texts: {} tokens (from {}); memory budget {} ({}); {} with the model loaded",
        r.longest_tokens,
        r.longest_from,
        mib(r.budget_bytes),
        r.budget_from,
        mib(r.loaded_bytes)
    );
    out!(
        printer,
        "  memory: {}",
        if r.memory.is_empty() { "the process's resident memory (VmHWM)" } else { &r.memory }
    );
    out!(printer, "  batch_tokens   rows  padded length    peak memory     working  useful tokens/s");
    for s in &r.steps {
        let note = match (&s.error, s.fits) {
            (Some(e), _) => format!("  failed: {e}"),
            (None, false) => "  past the budget's margin".to_string(),
            (None, true) => String::new(),
        };
        out!(
            printer,
            "  {:>12} {:>6} {:>14} {:>14} {:>11} {:>16.0}{note}",
            s.batch_tokens,
            s.rows,
            s.padded_length,
            mib(s.peak_bytes),
            mib(s.working_bytes),
            s.useful_tokens_per_second
        );
    }
    out!(printer, "  stopped: {}", r.stopped);
    if let Some(split) = &r.split {
        print_split(split, printer);
    }
    let Some(rec) = &r.recommended else { return };
    out!(printer, "recommended: embed.batch_tokens = {}: {}", rec.batch_tokens, rec.why);
    for line in &rec.set {
        out!(printer, "  {line}");
    }
    if r.layouts.len() >= 2 {
        out!(printer, "session layouts at {} tokens a call, timed in turn {LAYOUT_ROUNDS} times:", rec.batch_tokens);
        for l in &r.layouts {
            let what = format!("  {} session(s) x {} thread(s)", l.sessions_per_device, l.intra_threads);
            let skipped = l.skipped.as_deref().map(|why| format!(" ({why})")).unwrap_or_default();
            if l.rates.is_empty() {
                out!(printer, "{what}:{skipped}");
                continue;
            }
            let (lo, hi) = l.spread();
            out!(
                printer,
                "{what}: {:.0} useful tokens/s (rounds {lo:.0}–{hi:.0}), working memory {}{skipped}",
                l.useful_tokens_per_second,
                mib(l.working_bytes)
            );
        }
        match faster_layout(&r.layouts) {
            Some((other, least, most)) => out!(
                printer,
                "  {least:.2}x–{most:.2}x faster in every round: SET embed.sessions_per_device = {}; SET \
                 embed.intra_threads = {};",
                other.sessions_per_device,
                other.intra_threads
            ),
            None if r.layouts.iter().any(|l| l.skipped.is_some()) => {
                out!(printer, "  a layout that does not fit the memory budget is not advised: keep the default layout")
            }
            None => out!(
                printer,
                "  no layout beat the default in every round by more than {:.0}% (the rounds' spread is this \
                 machine's noise): keep the default layout",
                SAME_SPEED * 100.0
            ),
        }
    }
}

/// An image probe as the command prints it.
fn print_image_report(r: &image_probe::ImageProbeReport, printer: Printer) {
    out!(printer, "probe on {}", r.device);
    if let Some(l) = r.largest.first() {
        out!(
            printer,
            "  the {} largest images (a pass over the headers); the largest {} ({}x{}, {})",
            r.largest.len(),
            l.id,
            l.width,
            l.height,
            l.format
        );
    }
    let h = &r.host;
    out!(
        printer,
        "  host: decoding and preparing them ({:.1} megapixels) over {} threads took {:.2} s, {:.1} ms per megapixel \
         of one core; memory grew by {} at the peak",
        h.megapixels,
        h.threads,
        h.seconds,
        h.ms_per_megapixel,
        mib(h.peak_bytes)
    );
    out!(printer, "  memory: {} (budget {}: {})", r.memory, mib(r.budget_bytes), r.budget_from);
    out!(printer, "  batch_images   images/s   decode s/image   model s/image        peak     working  fits");
    for s in &r.steps {
        out!(
            printer,
            "  {:>12} {:>10.1} {:>16.4} {:>15.4} {:>11} {:>11}  {}{}",
            s.batch_images,
            s.images_per_second,
            s.decode_seconds_per_image,
            s.model_seconds_per_image,
            mib(s.peak_bytes),
            mib(s.working_bytes),
            if s.fits { "yes" } else { "no" },
            s.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default()
        );
    }
    out!(printer, "  stopped: {}", r.stopped);
    if let Some(rec) = &r.recommended {
        out!(printer, "  recommended: batch_images {}: {}", rec.batch_images, rec.why);
        for line in &rec.set {
            out!(printer, "    {line}");
        }
    }
}
