//! `pipeline verify DATASET[@VERSION] [--job job.sql]`: the checks of [`embedding_pipeline::ops::verify`], printed, the
//! report saved beside the dataset. Exit 0 when sound, 1 with findings, 2 when it cannot check.

use anyhow::anyhow;

use super::Exit;
use embedding_pipeline::campaign::DeviceInfo;
use embedding_pipeline::lance::compare::examples;
use embedding_pipeline::ops::Reporter;
use embedding_pipeline::ops::verify::{SampleFindings, VerifyArgs, VerifyReport, save, verify};

/// Says each stage on stderr as `verify: …`, unless quiet.
struct Stages {
    quiet: bool,
}

impl Reporter for Stages {
    fn note(&self, what: &str) {
        if !self.quiet {
            eprintln!("verify: {what}");
        }
    }
}

/// `pipeline verify`: print the report, save it beside the dataset, exit 1 with findings, 2 when it could not
/// check what was asked. Ctrl-C or SIGTERM stops it (exit 130) and nothing is saved: it writes nothing else.
pub async fn verify_command(args: &VerifyArgs, json: bool, quiet: bool) -> anyhow::Result<()> {
    super::stop_on_signals(super::StopSays::NothingToCommit);
    let stages = Stages { quiet };
    let result = tokio::select! {
        r = verify(args, &stages) => r.map_err(anyhow::Error::from),
        () = embedding_pipeline::campaign::interrupt::stopped() => Err(anyhow!("stopped")),
    };
    if embedding_pipeline::campaign::interrupt::stop_requested() {
        return Err(Exit::with(
            Exit::STOPPED,
            anyhow!("{}: verify stopped before its end, as asked; no result was saved", args.dataset),
        ));
    }
    let report = result.map_err(|e| Exit::with(Exit::CANNOT, e))?;
    let saved = save(&report);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", to_text(&report));
        match saved {
            Ok(Some(path)) => println!("  saved: {}", path.display()),
            Ok(None) => {}
            Err(e) => eprintln!("warning: {}", e.chain_text()),
        }
    }
    match report.verdict.as_str() {
        "findings" => {
            Err(Exit::with(Exit::DIFFER, anyhow!("{} is not sound: {}", args.dataset, report.findings.join("; "))))
        }
        "cannot check" => Err(Exit::with(
            Exit::CANNOT,
            anyhow!("{} could not be checked fully: {}", args.dataset, report.cannot_check.join("; ")),
        )),
        _ => Ok(()),
    }
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
            "  corpus ({job}): {rows} rows; missing here {missing}{}; not in the corpus {extra}{}\n",
            examples(&i.missing_examples),
            examples(&i.extra_examples)
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
