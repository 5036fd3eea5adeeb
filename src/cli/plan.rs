//! `pipeline plan job.sql [--json] [--units N | --unit-tokens T]` and `pipeline inspect <output>.plan`: the
//! plans [`embedding_pipeline::ops::plan`] makes, printed.

use std::path::{Path, PathBuf};

use anyhow::anyhow;

use super::ExitStatus;
use super::args::{JobVars, Runtime, at_least};
use super::printer::{Printer, out};
use embedding_pipeline::campaign::work_plan::{HISTOGRAM_FILE, WORK_LIST_FILE, WorkPlan};
use embedding_pipeline::ops::image_plan::{IMAGES_FILE, ImagePlan};
use embedding_pipeline::ops::plan::{Planned, UnitSize, plan_job_for, source_changes};

/// `pipeline plan`'s arguments.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// The job file.
    file: PathBuf,
    #[command(flatten)]
    vars: JobVars,
    /// Print the plans as JSON.
    #[arg(long)]
    json: bool,
    /// At most this many work units, of equal tokens.
    #[arg(long, conflicts_with = "unit_tokens", value_parser = at_least::<1>)]
    units: Option<u64>,
    /// About this many useful tokens per work unit (a unit ends with the row that reaches it).
    #[arg(long, default_value_t = embedding_pipeline::ops::plan::DEFAULT_UNIT_TOKENS, value_parser = at_least::<1>)]
    unit_tokens: u64,
    /// Plan for a run on this device (cpu, cuda, cuda:N…; sets embed.device, a SET in the job wins), from any
    /// machine: for a GPU, with the model it will use there (the float16 default), without a GPU here.
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    #[command(flatten)]
    runtime: Runtime,
}

/// Plan every write into Lance of the job file, and print what was found.
pub async fn run(args: PlanArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    args.runtime.apply();
    let size = args.units.map_or(UnitSize::Tokens(args.unit_tokens), UnitSize::Count);
    let plans = plan_job_for(&args.file, &args.vars.parse()?, size, args.device.as_deref()).await?;
    if args.json {
        out!(printer, "{}", serde_json::to_string_pretty(&plans.iter().map(|(p, _)| p).collect::<Vec<_>>())?);
    } else {
        for (plan, dir) in &plans {
            match plan {
                Planned::Texts(plan) => print_summary(plan, dir, printer),
                Planned::Images(plan) => print_images(plan, dir, printer),
            }
        }
    }
    Ok(ExitStatus::Success)
}

/// `pipeline inspect <output>.plan`: the plan's summary and its units, or with `json` its plan.json.
pub async fn inspect_plan(dir: &Path, json: bool, printer: Printer) -> anyhow::Result<ExitStatus> {
    if dir.join(IMAGES_FILE).is_file() {
        let plan = ImagePlan::read(dir)?;
        match json {
            true => out!(printer, "{}", serde_json::to_string_pretty(&plan)?),
            false => print_images(&plan, dir, printer),
        }
        return Ok(ExitStatus::Success);
    }
    let (plan, digest) = WorkPlan::read(dir).map_err(|e| anyhow!(e))?;
    if json {
        out!(printer, "{}", serde_json::to_string_pretty(&plan)?);
        return Ok(ExitStatus::Success);
    }
    print_summary(&plan, dir, printer);
    out!(printer, "  made {} by version {}; fingerprint: {}", plan.created, plan.tool_version, plan.fingerprint.model);
    out!(printer, "  plan.json sha256: {digest}");
    for source in &plan.sources {
        let what = match (&source.lance, &source.unchecked) {
            (Some(l), _) => format!("Lance {} at version {}", l.uri, l.version),
            (None, Some(why)) => format!("not checked: {why}"),
            (None, None) => {
                format!("{} file(s), {} bytes", source.files.len(), source.files.iter().map(|f| f.bytes).sum::<u64>())
            }
        };
        out!(printer, "  source {}: {what}", source.table);
    }
    match source_changes(&plan).await.as_slice() {
        [] => out!(printer, "  sources: unchanged since the plan"),
        changes => {
            out!(printer, "  sources: changed since the plan; run pipeline plan again:");
            changes.iter().for_each(|c| out!(printer, "    {c}"));
        }
    }
    out!(printer, "  unit   first row       rows   useful tokens   longest  shortest");
    for u in &plan.units {
        out!(
            printer,
            "  {:>4} {:>11} {:>10} {:>15} {:>9} {:>9}",
            u.unit,
            u.first_row,
            u.rows,
            u.useful_tokens,
            u.longest,
            u.shortest
        );
    }
    Ok(ExitStatus::Success)
}

fn print_summary(plan: &WorkPlan, dir: &Path, printer: Printer) {
    let t = &plan.totals;
    let pct = |a: u64, b: u64| if b > 0 { 100.0 * a as f64 / b as f64 } else { 0.0 };
    out!(printer, "plan for {}: {}", plan.output, dir.display());
    out!(printer, "  rows: {} ({} documents, {} NULL texts)", t.rows, t.documents, t.null_texts);
    out!(
        printer,
        "  tokens: {} in the texts, {} fed to the model (embed.max_tokens = {})",
        t.tokens_before_truncation,
        t.useful_tokens,
        t.max_tokens
    );
    out!(
        printer,
        "  truncation: {} documents ({:.1}%) cut, {} tokens ({:.1}%) dropped",
        t.truncated_documents,
        pct(t.truncated_documents, t.documents),
        t.dropped_tokens,
        pct(t.dropped_tokens, t.tokens_before_truncation)
    );
    out!(printer, "  units: {} of about {} useful tokens", plan.units.len(), plan.unit_tokens);
    out!(printer, "  work list: {}", dir.join(WORK_LIST_FILE).display());
    out!(printer, "  histogram: {}", dir.join(HISTOGRAM_FILE).display());
}

/// An image write's plan: its images by size and format, the largest, and the bad ones.
fn print_images(plan: &ImagePlan, dir: &Path, printer: Printer) {
    let c = &plan.counts;
    out!(printer, "plan for {} (images): {}", plan.output, dir.join(IMAGES_FILE).display());
    out!(printer, "  rows: {} ({} images whose headers read, {} NULL, {} bad)", c.rows, c.images, c.null_images, c.bad);
    let formats: Vec<String> = c.formats.iter().map(|(f, n)| format!("{f} {n}")).collect();
    out!(
        printer,
        "  files: {:.1} MB, {:.1} megapixels to decode ({})",
        c.bytes as f64 / 1e6,
        c.pixels as f64 / 1e6,
        formats.join(", ")
    );
    for b in c.bands.iter().filter(|b| b.images > 0) {
        out!(
            printer,
            "  {:<24} {:>9} images {:>10.1} MB {:>10.1} megapixels",
            b.name,
            b.images,
            b.bytes as f64 / 1e6,
            b.pixels as f64 / 1e6
        );
    }
    if let Some(l) = c.largest.first() {
        out!(printer, "  largest: {} ({}x{}, {} {:.1} MB)", l.id, l.width, l.height, l.format, l.bytes as f64 / 1e6);
    }
    if c.bad > 0 {
        let listed: Vec<String> = c.bad_images.iter().take(5).map(|b| format!("{} ({})", b.id, b.why)).collect();
        let policy = match plan.bad_image_policy.eq_ignore_ascii_case("skip") {
            true => "embed.bad_images = 'skip': the run leaves them out and lists them",
            false => {
                "embed.bad_images = 'error': the run stops at the first; fix or remove them, or SET embed.bad_images = 'skip'"
            }
        };
        out!(
            printer,
            "  bad images: {} ({policy}): {}{}",
            c.bad,
            listed.join("; "),
            if c.bad > 5 { "; …" } else { "" }
        );
    }
}
