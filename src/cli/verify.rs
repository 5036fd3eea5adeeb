//! `pipeline verify DATASET[@VERSION] [--job job.sql]`: the checks of [`embedding_pipeline::ops::verify`], printed, the
//! report saved beside the dataset. Exit 0 when sound, 1 with findings, 2 when it cannot check.

use std::path::PathBuf;

use anyhow::anyhow;

use super::ExitStatus;
use super::args::{Columns, JobVars, Runtime};
use super::printer::{Printer, err, out, out_text};
use super::signals::{StopSays, stop_on_signals};
use embedding_pipeline::campaign::DeviceInfo;
use embedding_pipeline::ops::Reporter;
use embedding_pipeline::ops::compare::examples;
use embedding_pipeline::ops::verify::{SampleFindings, VerifyReport, save, verify};
use embedding_pipeline::process::interrupt::StopToken;

/// `pipeline verify`'s arguments.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The Lance dataset: `path`, `path@version` or `path@tag`.
    dataset: String,
    /// The job that made it: its corpus's ids, and the sample's texts.
    #[arg(long, value_name = "FILE")]
    job: Option<PathBuf>,
    #[command(flatten)]
    vars: JobVars,
    /// Rows of the corpus to embed again (with --job; 0: none).
    #[arg(long, default_value_t = embedding_pipeline::ops::verify::VerifyOptions::DEFAULT_SAMPLE)]
    sample: u64,
    /// The sample's seed: the same seed draws the same rows.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Smallest acceptable cosine between a stored vector and its re-embedding.
    #[arg(long, default_value_t = embedding_pipeline::ops::verify::VerifyOptions::DEFAULT_MIN_COSINE)]
    min_cosine: f64,
    /// The model directory, where the run records do not name it.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Where the sample is embedded again: cpu, cuda or cuda:N.
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    #[command(flatten)]
    columns: Columns,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    runtime: Runtime,
}

/// Says each stage on stderr as `verify: …`, unless quiet.
struct Stages {
    printer: Printer,
}

impl Reporter for Stages {
    fn note(&self, what: &str) {
        if !self.printer.quiet() {
            err!(self.printer, "verify: {what}");
        }
    }
}

/// `pipeline verify`: print the report, save it beside the dataset, exit 1 with findings, 2 when it could not
/// check what was asked. Ctrl-C or SIGTERM stops it (exit 130) and nothing is saved: it writes nothing else.
pub async fn run(args: VerifyArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let VerifyArgs { dataset, job, vars, sample, seed, min_cosine, model, device, columns, json, runtime } = args;
    runtime.apply();
    let args = embedding_pipeline::ops::verify::VerifyOptions {
        dataset,
        job,
        vars: vars.parse()?,
        sample,
        seed,
        min_cosine,
        model,
        device,
        id_column: columns.id_column,
        column: columns.column,
        stop: StopToken::new(),
    };
    stop_on_signals(StopSays::NothingToCommit, printer, args.stop.clone());
    let stages = Stages { printer };
    let result = tokio::select! {
        r = verify(&args, &stages) => r.map_err(anyhow::Error::from),
        () = args.stop.stopped() => Err(anyhow!("stopped")),
    };
    if args.stop.requested() {
        let stopped = anyhow!("{}: verify stopped before its end, as asked; no result was saved", args.dataset);
        return Ok(ExitStatus::Stopped.with_error(printer, stopped));
    }
    let report = match result {
        Ok(report) => report,
        Err(e) => return Ok(ExitStatus::Cannot.with_error(printer, e)),
    };
    let saved = save(&report);
    if json {
        out!(printer, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        out_text!(printer, "{}", to_text(&report));
        match saved {
            Ok(Some(path)) => out!(printer, "  saved: {}", path.display()),
            Ok(None) => {}
            Err(e) => err!(printer, "warning: {}", e.chain_text()),
        }
    }
    Ok(match report.verdict.as_str() {
        "findings" => {
            let findings = anyhow!("{} is not sound: {}", args.dataset, report.findings.join("; "));
            ExitStatus::Failure.with_error(printer, findings)
        }
        "cannot check" => {
            let partial = anyhow!("{} could not be checked fully: {}", args.dataset, report.cannot_check.join("; "));
            ExitStatus::Cannot.with_error(printer, partial)
        }
        _ => ExitStatus::Success,
    })
}

/// The report as the command prints it.
pub fn to_text(r: &VerifyReport) -> String {
    let mut out = format!("verify {}@{} ({} rows)\n", r.dataset, r.version, r.rows);
    if let Some(fp) = &r.fingerprint {
        out += &format!(
            "  fingerprint: {} ({}, {} dims, {} pooling, normalised {})\n",
            fp.model, fp.model_dtype, fp.dim, fp.pooling, fp.normalize
        );
    }
    let i = &r.ids;
    out += &format!(
        "  ids: {} distinct, {} NULL, {} held more than once{}\n",
        i.distinct,
        i.null_ids,
        i.duplicated,
        examples(&i.duplicated_examples)
    );
    if let (Some(job), Some(rows), Some(missing), Some(extra)) = (&i.job, i.source_rows, i.missing, i.extra) {
        out += &format!(
            "  corpus ({job}): {rows} rows; missing here {missing}{}; not in the corpus {extra}{}{}\n",
            examples(&i.missing_examples),
            examples(&i.extra_examples),
            i.skipped.filter(|n| *n > 0).map_or(String::new(), |n| format!(
                "; bad images skipped by a run {n}{}",
                examples(&i.skipped_examples)
            ))
        );
    }
    let v = &r.vectors;
    let norm = |x: Option<f64>| x.map_or("n/a".into(), |n| format!("{n:.6}"));
    out += &format!(
        "  vectors: {} NULL, {} NaN or infinite, {} zero, {} off length 1 (normalised: {}); norms {} to {}\n",
        v.null_vectors,
        v.non_finite,
        v.zero,
        v.off_norm,
        v.normalized,
        norm(v.min_norm),
        norm(v.max_norm)
    );
    out += &format!("  versions written around the pipeline: {}\n", r.outside_writes.len());
    if let Some(s) = &r.sample {
        out += &sample_text(s);
    }
    for c in &r.lineage {
        out += &format!("  lineage {}: {} ({})\n", c.link, c.status, c.detail);
    }
    for n in &r.notes {
        out += &format!("  note: {n}\n");
    }
    for c in &r.cannot_check {
        out += &format!("  CANNOT CHECK: {c}\n");
    }
    for f in &r.findings {
        out += &format!("  FINDING: {f}\n");
    }
    out += &format!("  {} ({:.1} s)\n", r.verdict.to_uppercase(), r.seconds);
    out
}

/// The sample's lines of the report.
fn sample_text(s: &SampleFindings) -> String {
    let mut out = String::new();
    let device =
        |d: &Option<DeviceInfo>| d.as_ref().map_or("unknown".into(), |d| format!("{} {}", d.provider, d.device));
    out += &format!(
        "  sample: {} rows (seed {}), embedded again with {} on {}; made on {}{}\n",
        s.rows,
        s.seed,
        s.model_dir,
        device(&Some(s.checked_on.clone())),
        device(&s.made_on),
        if s.same_device || s.made_on.is_none() {
            ""
        } else {
            " (another device or provider: differences beyond rounding are possible)"
        }
    );
    if s.unreadable + s.bad_skipped > 0 {
        out += &format!(
            "    images not readable now: {} with a vector{}, {} without (bad images the run skipped)\n",
            s.unreadable,
            examples(&s.unreadable_examples),
            s.bad_skipped
        );
    }
    for k in s.strata.iter().filter(|k| k.candidates > 0) {
        let f = |x: Option<f64>| x.map_or("n/a".into(), |c| format!("{c:.7}"));
        out += &format!(
            "    {:<28} {:>5} rows  min cosine {}  max abs difference {}\n",
            k.name,
            k.rows,
            f(k.min_cosine),
            k.max_abs_diff.map_or("n/a".into(), |d| format!("{d:.2e}"))
        );
    }
    out
}
