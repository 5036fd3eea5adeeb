//! A campaign on one self-contained HTML page, for a person who would rather look than read: the fingerprint, the plan's length
//! histogram and truncation, each commit's rows, useful tokens/s and padding, the devices, trials and costs,
//! the lineage chain and the last `pipeline verify`. Inline SVG and CSS; no script, nothing fetched.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::cost::{CostReport, Prices, amount, cost};
use super::trial::Trial;
use super::verify::{VerifyReport, last_verify};
use crate::campaign::work_plan::{PLAN_FILE, WorkPlan};
use crate::campaign::{Fingerprint, RunRecord};
use crate::lance::records::fingerprint_of_dataset;
use crate::lance::records::{existing_versions, version_records};
use crate::lance::verify::outside_writes;
use crate::lance::{lance_err, open_dataset};
use crate::model::fit::thousands;
use crate::{Error, Result};

/// One commit of the dataset, as the page shows it.
struct Commit {
    version: u64,
    timestamp: String,
    run: Option<RunRecord>,
    /// What `pipeline index` or `pipeline optimize` did, or what another writer did, in words.
    other: Option<String>,
}

/// The page of the dataset at `location` (`path`, `path@version` or `path@tag`), as HTML, with the trials
/// `trials` priced by `prices` (placeholder prices when none).
pub async fn report(location: &str, trials: &[PathBuf], prices: Option<&Path>) -> Result<String> {
    let ds = open_dataset(location).await?;
    let version = ds.version().version;
    let uri = ds.uri().to_string();
    let fingerprint = fingerprint_of_dataset(&ds)?;
    let rows = ds.count_rows(None).await.map_err(lance_err(&uri))? as u64;
    let outside = outside_writes(&ds, version).await?;
    let mut commits = Vec::new();
    for v in existing_versions(&ds, version).await?.into_iter().rev() {
        let (run, maintenance) = version_records(&ds, v).await?;
        let timestamp = ds
            .checkout_version(v)
            .await
            .map(|d| d.version().timestamp.format("%Y-%m-%d %H:%M:%S UTC").to_string())
            .unwrap_or_default();
        let other = match (&run, maintenance, outside.iter().find(|w| w.version == v)) {
            (Some(_), _, _) => None,
            (None, Some(m), _) => Some(m.summary()),
            (None, None, Some(w)) => Some(format!("{} outside the pipeline (no run record)", w.operation)),
            (None, None, None) => None,
        };
        commits.push(Commit { version: v, timestamp, run, other });
    }
    let plan = plan_of(&uri, &commits);
    let trials = trials.iter().map(|f| Ok((f.display().to_string(), Trial::read(f)?))).collect::<Result<Vec<_>>>()?;
    let prices = prices.map(Prices::read).transpose()?;
    let costs = if trials.is_empty() { None } else { Some(cost(&trials, prices.as_ref(), None)?) };
    let lineage = crate::ops::lineage::report(location, false).await?;
    let verified = last_verify(&uri, version);

    let mut page = String::new();
    head(&mut page, &format!("{} — embedding campaign", file_name(&uri)));
    let _ = write!(page, "<h1>Embedding campaign <code>{}</code></h1>", esc(&file_name(&uri)));
    summary(&mut page, &uri, version, rows, &commits, fingerprint.as_ref(), verified.as_ref());
    fingerprint_section(&mut page, fingerprint.as_ref());
    match crate::ops::image_plan::ImagePlan::read(&crate::ops::plan::plan_dir(&uri)) {
        Ok(images) if images_only(&commits) => image_plan_section(&mut page, &images)?,
        _ => plan_section(&mut page, plan.as_ref().map(|(p, dir)| (p, dir.as_path())))?,
    }
    commits_section(&mut page, &commits)?;
    trials_section(&mut page, &trials, costs.as_ref());
    page += "<h2>Lineage</h2><table><tr><th>link</th><th>what</th><th>detail</th><th>sha256</th></tr>";
    for l in &lineage.chain {
        let hashes: Vec<String> = l
            .sha256
            .iter()
            .map(|(f, h)| format!("{} <code>{}…</code>", esc(f), esc(h.get(..12).unwrap_or(h))))
            .collect();
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&l.link),
            esc(&l.name),
            esc(&l.detail),
            hashes.join("<br>")
        );
    }
    page += "</table>";
    verify_section(&mut page, verified.as_ref(), &uri, version);
    let _ = writeln!(
        page,
        "<footer>Made by pipeline {} on {}.</footer></body></html>",
        env!("CARGO_PKG_VERSION"),
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    Ok(page)
}

/// The plan the newest run executed (its record names it), else the one beside the dataset.
fn plan_of(uri: &str, commits: &[Commit]) -> Option<(WorkPlan, PathBuf)> {
    let recorded = commits.iter().rev().filter_map(|c| c.run.as_ref()?.plan.as_ref()).map(|p| PathBuf::from(&p.path));
    let beside = std::iter::once(crate::ops::plan::plan_dir(uri));
    recorded
        .chain(beside)
        .filter(|d| d.join(PLAN_FILE).is_file())
        .find_map(|d| WorkPlan::read(&d).ok().map(|(p, _)| (p, d)))
}

fn file_name(uri: &str) -> String {
    uri.trim_end_matches('/').rsplit('/').next().unwrap_or(uri).to_string()
}

/// HTML-escaped text.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn head(page: &mut String, title: &str) {
    let _ = write!(
        page,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>\
         body{{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}}\
         h1{{font-size:1.6em}}h2{{margin-top:1.8em;border-bottom:1px solid #ccc}}\
         table{{border-collapse:collapse;margin:.6em 0}}td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left;\
         vertical-align:top}}th{{background:#f2f2f2}}td.n{{text-align:right}}code{{font-size:.9em}}\
         .sound{{color:#1a7f37;font-weight:bold}}.bad{{color:#c62828;font-weight:bold}}\
         .chart svg{{max-width:100%;height:auto}}footer{{margin-top:3em;color:#777;font-size:.85em}}\
         </style></head><body>",
        esc(title)
    );
}

fn summary(
    page: &mut String,
    uri: &str,
    version: u64,
    rows: u64,
    commits: &[Commit],
    fp: Option<&Fingerprint>,
    verified: Option<&VerifyReport>,
) {
    let runs: Vec<&RunRecord> = commits.iter().filter_map(|c| c.run.as_ref()).collect();
    let useful: u64 = runs.iter().map(|r| r.useful_tokens).sum();
    let processed: u64 = runs.iter().map(|r| r.processed_tokens).sum();
    let wall: f64 = runs.iter().map(|r| r.wall_seconds).sum();
    let mut devices: Vec<String> =
        runs.iter().filter_map(|r| r.device.as_ref()).map(|d| format!("{} ({})", d.device, d.provider)).collect();
    devices.dedup();
    let rate = |n: u64| if wall > 0.0 { thousands((n as f64 / wall) as u64) } else { "n/a".into() };
    // What was embedded: images (embed_image) where the runs made no tokens, else tokens.
    let embedded = if images_only(commits) {
        let sum = |f: fn(&RunRecord) -> u64| runs.iter().map(|r| f(r)).sum::<u64>();
        format!(
            "<tr><th>images embedded</th><td>{} ({} bad ones skipped), {:.1} megapixels decoded from {:.1} MB of \
             files</td></tr><tr><th>embedding wall time</th><td>{}</td></tr><tr><th>images/s (whole)</th><td>{}</td></tr>",
            thousands(sum(|r| r.images)),
            thousands(sum(|r| r.skipped_images)),
            sum(|r| r.image_pixels) as f64 / 1e6,
            sum(|r| r.image_bytes) as f64 / 1e6,
            super::cost::duration(wall),
            rate(sum(|r| r.images)),
        )
    } else {
        format!(
            "<tr><th>useful tokens embedded</th><td>{} (padding efficiency {:.1}%)</td></tr>\
             <tr><th>embedding wall time</th><td>{}</td></tr><tr><th>useful tokens/s (whole)</th><td>{}</td></tr>",
            thousands(useful),
            if processed > 0 { 100.0 * useful as f64 / processed as f64 } else { 0.0 },
            super::cost::duration(wall),
            rate(useful),
        )
    };
    let _ = write!(
        page,
        "<table class=\"summary\"><tr><th>dataset</th><td><code>{}</code></td></tr>\
         <tr><th>version</th><td>{version} ({} versions)</td></tr><tr><th>rows</th><td>{}</td></tr>\
         <tr><th>model</th><td>{}</td></tr>{embedded}\
         <tr><th>devices</th><td>{}</td></tr><tr><th>last verify</th><td>{}</td></tr></table>",
        esc(uri),
        commits.len(),
        thousands(rows),
        fp.map_or("none (not written by embed())".into(), |f| esc(&format!(
            "{} ({}, {} dims)",
            f.model, f.model_dtype, f.dim
        ))),
        esc(&devices.join("; ")),
        match verified {
            Some(v) => verdict(v, version),
            None => format!("none (<code>pipeline verify {}</code>)", esc(uri)),
        }
    );
}

/// The verdict of a verify of `v.version`, on a page showing `shown`.
fn verdict(v: &VerifyReport, shown: u64) -> String {
    let class = if v.verdict == "sound" { "sound" } else { "bad" };
    let older = if v.version < shown {
        format!(" (an older version: version {shown}, shown here, is not verified)")
    } else {
        String::new()
    };
    format!(
        "<span class=\"{class}\">{}</span> at version {}, {}{older}",
        esc(&v.verdict.to_uppercase()),
        v.version,
        esc(&v.checked_at)
    )
}

fn fingerprint_section(page: &mut String, fp: Option<&Fingerprint>) {
    *page += "<h2>Fingerprint</h2>";
    let Some(fp) = fp else {
        *page += "<p>The dataset holds no fingerprint: its vectors were not written by embed().</p>";
        return;
    };
    *page += "<table>";
    for (k, v) in fp.fields() {
        let _ = write!(page, "<tr><th>{}</th><td><code>{}</code></td></tr>", esc(&k), esc(&v));
    }
    *page += "</table>";
}

/// An image campaign's plan: its images by decoded size as a chart and a table, the largest, and the bad ones.
fn image_plan_section(page: &mut String, plan: &crate::ops::image_plan::ImagePlan) -> Result<()> {
    let c = &plan.counts;
    *page += "<h2>Corpus: images by decoded size</h2>";
    let labels: Vec<String> = c.bands.iter().map(|b| b.name.replace(" megapixels", " MP")).collect();
    let counts: Vec<f64> = c.bands.iter().map(|b| b.images as f64).collect();
    let _ = write!(
        page,
        "<p>From the plan <code>{}</code> ({}): {} rows, {} images ({} NULL, {} bad), {:.1} MB of files, {:.1} \
         megapixels to decode.</p><div class=\"chart\" id=\"histogram\">{}</div>",
        esc(&plan.output),
        esc(&plan.created),
        thousands(c.rows),
        thousands(c.images),
        thousands(c.null_images),
        thousands(c.bad),
        c.bytes as f64 / 1e6,
        c.pixels as f64 / 1e6,
        inline_svg(&bars("Images per band of decoded size", &labels, &counts, "images")?),
    );
    *page += "<table><tr><th>band</th><th>images</th><th>MB of files</th><th>megapixels</th></tr>";
    for b in &c.bands {
        let _ = write!(
            page,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td><td class=\"n\">{:.1}</td></tr>",
            esc(&b.name),
            thousands(b.images),
            b.bytes as f64 / 1e6,
            b.pixels as f64 / 1e6
        );
    }
    *page += "</table>";
    if let Some(l) = c.largest.first() {
        let _ =
            write!(page, "<p>Largest: <code>{}</code>, {}x{} ({}).</p>", esc(&l.id), l.width, l.height, esc(&l.format));
    }
    if c.bad > 0 {
        let listed: Vec<String> =
            c.bad_images.iter().take(20).map(|b| format!("<code>{}</code> ({})", esc(&b.id), esc(&b.why))).collect();
        let _ = write!(page, "<p>Bad images: {}: {}.</p>", thousands(c.bad), listed.join("; "));
    }
    Ok(())
}

fn plan_section(page: &mut String, plan: Option<(&WorkPlan, &Path)>) -> Result<()> {
    *page += "<h2>Corpus: token lengths and truncation</h2>";
    let Some((plan, dir)) = plan else {
        *page += "<p>No plan was found (<code>pipeline plan job.sql</code> makes one beside the output).</p>";
        return Ok(());
    };
    let (h, t) = (&plan.histogram, &plan.totals);
    let caption = crate::ops::histogram::caption(h, t);
    let svg = crate::ops::histogram::histogram_svg_text(h.bin_width, &h.bins, h.limit, &caption)
        .map_err(|e| Error::Internal(format!("the histogram: {e}")))?;
    let _ = write!(
        page,
        "<p>From the plan <code>{}</code> ({}).</p><div class=\"chart\" id=\"histogram\">{}</div>\
         <table><tr><th>rows</th><td class=\"n\">{}</td></tr><tr><th>texts</th><td class=\"n\">{}</td></tr>\
         <tr><th>NULL texts</th><td class=\"n\">{}</td></tr>\
         <tr><th>tokens in the texts</th><td class=\"n\">{}</td></tr><tr><th>tokens fed to the model</th><td class=\"n\">{}</td></tr>\
         <tr><th>texts truncated</th><td class=\"n\">{} ({:.1}%)</td></tr><tr><th>tokens dropped</th><td class=\"n\">{} ({:.1}%)</td></tr>\
         <tr><th>limit</th><td class=\"n\">{} tokens</td></tr></table>",
        esc(&dir.display().to_string()),
        esc(&plan.created),
        inline_svg(&svg),
        thousands(t.rows),
        thousands(t.documents),
        thousands(t.null_texts),
        thousands(t.tokens_before_truncation),
        thousands(t.useful_tokens),
        thousands(t.truncated_documents),
        100.0 * h.documents_over_limit,
        thousands(t.dropped_tokens),
        100.0 * h.tokens_over_limit,
        t.max_tokens
    );
    Ok(())
}

/// An SVG document as an element to put in the page (without its XML declaration).
fn inline_svg(svg: &str) -> &str {
    svg.find("<svg").map_or(svg, |i| &svg[i..])
}

/// Whether the dataset's runs embedded images and no texts (then its page counts images, not tokens).
fn images_only(commits: &[Commit]) -> bool {
    let runs = || commits.iter().filter_map(|c| c.run.as_ref());
    runs().any(|r| r.images > 0) && runs().all(|r| r.processed_tokens == 0)
}

fn commits_section(page: &mut String, commits: &[Commit]) -> Result<()> {
    *page += "<h2>Commits</h2>";
    if images_only(commits) {
        return image_commits_section(page, commits);
    }
    let runs: Vec<(u64, &RunRecord)> = commits.iter().filter_map(|c| Some((c.version, c.run.as_ref()?))).collect();
    if !runs.is_empty() {
        let labels: Vec<String> = runs.iter().map(|(v, _)| format!("v{v}")).collect();
        let rows: Vec<f64> = runs.iter().map(|(_, r)| r.rows_written as f64).collect();
        let rate: Vec<f64> = runs.iter().map(|(_, r)| r.useful_tokens_per_second).collect();
        let padding: Vec<f64> = runs.iter().map(|(_, r)| 100.0 * r.padding_efficiency).collect();
        let _ = write!(
            page,
            "<div class=\"chart\" id=\"timeline\">{}{}{}</div>",
            inline_svg(&bars("Rows written per commit", &labels, &rows, "rows")?),
            inline_svg(&bars("Useful tokens per second, per commit", &labels, &rate, "useful tokens/s")?),
            inline_svg(&bars("Padding efficiency per commit (useful / processed tokens)", &labels, &padding, "%")?),
        );
    }
    *page += "<table><tr><th>version</th><th>committed</th><th>rows written</th><th>useful tokens</th>\
              <th>useful tokens/s</th><th>padding efficiency</th><th>truncated</th><th>wall</th><th>device</th>\
              <th>note</th></tr>";
    for c in commits {
        match &c.run {
            Some(r) => {
                let _ = write!(
                    page,
                    "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                     <td class=\"n\">{:.1}%</td><td class=\"n\">{}</td><td class=\"n\">{:.1} s</td><td>{}</td><td>{}</td></tr>",
                    c.version,
                    esc(&c.timestamp),
                    thousands(r.rows_written),
                    thousands(r.useful_tokens),
                    thousands(r.useful_tokens_per_second as u64),
                    100.0 * r.padding_efficiency,
                    thousands(r.truncated_documents),
                    r.wall_seconds,
                    esc(&r.device.as_ref().map_or(String::new(), |d| format!("{} ({})", d.device, d.provider))),
                    match (r.interrupted, r.last_commit) {
                        (true, _) => "a write stopped here (interrupted)",
                        (false, true) => "end of a write",
                        (false, false) => "",
                    }
                );
            }
            None => {
                let _ = write!(
                    page,
                    "<tr><td>{}</td><td>{}</td><td colspan=\"8\">{}</td></tr>",
                    c.version,
                    esc(&c.timestamp),
                    esc(c.other.as_deref().unwrap_or("no run record"))
                );
            }
        }
    }
    *page += "</table>";
    Ok(())
}

/// The commits of an image campaign: rows, images/s, megapixels and bad images skipped per commit.
fn image_commits_section(page: &mut String, commits: &[Commit]) -> Result<()> {
    let runs: Vec<(u64, &RunRecord)> = commits.iter().filter_map(|c| Some((c.version, c.run.as_ref()?))).collect();
    let per_second = |r: &RunRecord| if r.wall_seconds > 0.0 { r.images as f64 / r.wall_seconds } else { 0.0 };
    let labels: Vec<String> = runs.iter().map(|(v, _)| format!("v{v}")).collect();
    let rows: Vec<f64> = runs.iter().map(|(_, r)| r.rows_written as f64).collect();
    let rate: Vec<f64> = runs.iter().map(|(_, r)| per_second(r)).collect();
    let _ = write!(
        page,
        "<div class=\"chart\" id=\"timeline\">{}{}</div>",
        inline_svg(&bars("Rows written per commit", &labels, &rows, "rows")?),
        inline_svg(&bars("Images per second, per commit", &labels, &rate, "images/s")?),
    );
    *page += "<table><tr><th>version</th><th>committed</th><th>rows written</th><th>images</th><th>images/s</th>\
              <th>megapixels decoded</th><th>MB of files</th><th>bad ones skipped</th><th>wall</th><th>device</th></tr>";
    for c in commits {
        let Some(r) = &c.run else {
            let other = esc(c.other.as_deref().unwrap_or("no run record"));
            let _ = write!(
                page,
                "<tr><td>{}</td><td>{}</td><td colspan=\"8\">{other}</td></tr>",
                c.version,
                esc(&c.timestamp)
            );
            continue;
        };
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td>\
             <td class=\"n\">{:.1}</td><td class=\"n\">{:.1}</td><td class=\"n\">{}</td><td class=\"n\">{:.1} s</td><td>{}</td></tr>",
            c.version,
            esc(&c.timestamp),
            thousands(r.rows_written),
            thousands(r.images),
            per_second(r),
            r.image_pixels as f64 / 1e6,
            r.image_bytes as f64 / 1e6,
            thousands(r.skipped_images),
            r.wall_seconds,
            esc(&r.device.as_ref().map_or(String::new(), |d| format!("{} ({})", d.device, d.provider))),
        );
    }
    *page += "</table>";
    Ok(())
}

/// A bar per label, SVG text: each bar on its own segment of the x axis, labelled at its centre (every label up to
/// 20 bars; a spaced subset past that).
fn bars(title: &str, labels: &[String], values: &[f64], unit: &str) -> Result<String> {
    let err = |e: &dyn std::fmt::Display| Error::Internal(format!("chart {title}: {e}"));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 300)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let top = values.iter().copied().fold(0.0, f64::max).max(1e-9) * 1.15;
        // A discrete range holds both its ends: 0..n-1 is n segments. One bar sits in the middle of three, since a
        // range of one value has no width.
        let n = labels.len().max(1) as u32;
        let (first, last) = if n == 1 { (1, 2) } else { (0, n - 1) };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(80)
            .build_cartesian_2d((0u32..last).into_segmented(), 0f64..top)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels((last as usize + 1).min(20))
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) if *i >= first => {
                    labels.get((*i - first) as usize).cloned().unwrap_or_default()
                }
                _ => String::new(),
            })
            .y_label_formatter(&|y| if top >= 10.0 { thousands(*y as u64) } else { format!("{y:.2}") })
            .light_line_style(WHITE)
            .y_desc(unit)
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(|e| err(&e))?;
        chart
            .draw_series(values.iter().zip(first..).map(|(v, i)| {
                let mut bar =
                    Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), *v)], BAR.filled());
                bar.set_margin(0, 0, 8, 8);
                bar
            }))
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// The bars' colour.
const BAR: RGBColor = RGBColor(70, 110, 180);

fn trials_section(page: &mut String, trials: &[(String, Trial)], costs: Option<&CostReport>) {
    let Some((_, first)) = trials.first() else { return };
    let unit = first.work().unit;
    let _ = write!(
        page,
        "<h2>Trials and costs</h2><table><tr><th>trial</th><th>device</th><th>{unit}/s</th>\
         <th>predicted hours (range)</th><th>cost</th><th>per million {unit}</th><th>vectors match</th></tr>"
    );
    for (i, (_, t)) in trials.iter().enumerate() {
        let row = costs.and_then(|c| c.rows.get(i));
        let money = |x: Option<f64>| x.map_or("unpriced".into(), amount);
        let (seconds, low, high) = t.seconds();
        let rate = match t {
            Trial::Texts(_) => thousands(t.rate() as u64),
            Trial::Images(_) => format!("{:.1}", t.rate()),
        };
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{} ({}–{})</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td>{}</td></tr>",
            esc(t.name()),
            esc(&format!("{} ({})", t.device().device, t.device().provider)),
            rate,
            amount(seconds / 3600.0),
            amount(low / 3600.0),
            amount(high / 3600.0),
            money(row.and_then(|r| r.cost)),
            row.and_then(|r| r.per_million_tokens.or(r.per_million_images)).map_or("unpriced".into(), amount),
            match t.comparison() {
                Some(c) if c.passed => "yes".to_string(),
                Some(_) => "<span class=\"bad\">NO</span>".to_string(),
                None => "not compared".to_string(),
            }
        );
    }
    *page += "</table>";
    if let Some(c) = costs {
        let _ = write!(
            page,
            "<p>Currency {}{}.</p>",
            esc(&c.currency),
            if c.placeholder_prices { " (placeholder prices)" } else { "" }
        );
    }
}

fn verify_section(page: &mut String, v: Option<&VerifyReport>, uri: &str, shown: u64) {
    *page += "<h2>Last verify</h2>";
    let Some(v) = v else {
        let _ = write!(page, "<p>Not verified yet: <code>pipeline verify {} --job job.sql</code>.</p>", esc(uri));
        return;
    };
    let _ = write!(
        page,
        "<p>{} ({} rows, {:.1} s). Ids: {} distinct, {} held more than once{}.</p>",
        verdict(v, shown),
        thousands(v.rows),
        v.seconds,
        thousands(v.ids.distinct),
        thousands(v.ids.duplicated),
        match (v.ids.missing, v.ids.extra) {
            (Some(m), Some(e)) => format!("; against the corpus: {} missing, {} extra", thousands(m), thousands(e)),
            _ => String::new(),
        }
    );
    if let Some(s) = &v.sample {
        let _ = write!(
            page,
            "<p>Sample of {} rows (seed {}) embedded again on {}; the vectors were made on {}.</p>\
             <table><tr><th>stratum</th><th>rows</th><th>min cosine</th><th>max abs difference</th><th>below {}</th></tr>",
            s.rows,
            s.seed,
            esc(&s.checked_on.device),
            esc(&s.made_on.as_ref().map_or("unknown".into(), |d| d.device.clone())),
            s.min_cosine_threshold
        );
        for k in s.strata.iter().filter(|k| k.candidates > 0) {
            let _ = write!(
                page,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&k.name),
                k.rows,
                k.min_cosine.map_or("n/a".into(), |c| format!("{c:.7}")),
                k.max_abs_diff.map_or("n/a".into(), |d| format!("{d:.2e}")),
                k.below
            );
        }
        *page += "</table>";
    }
    let lines = v.findings.iter().map(|f| ("bad", "FINDING", f)).chain(
        v.cannot_check.iter().map(|c| ("bad", "CANNOT CHECK", c)).chain(v.notes.iter().map(|n| ("", "note", n))),
    );
    let mut any = false;
    for (class, label, text) in lines {
        if !any {
            *page += "<ul>";
            any = true;
        }
        let _ = write!(page, "<li><span class=\"{class}\">{label}</span>: {}</li>", esc(text));
    }
    if any {
        *page += "</ul>";
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_commit_bar_is_labelled_at_its_centre() {
        // Issue 53: the commit charts labelled only "v1".
        for n in [1, 2, 3, 7, 20] {
            let labels: Vec<String> = (1..=n).map(|v| format!("v{v}")).collect();
            let values: Vec<f64> = (1..=n).map(|v| v as f64 * 100.0).collect();
            let svg = bars("Rows written per commit", &labels, &values, "rows").unwrap();
            for l in &labels {
                assert_eq!(svg.matches(&format!("\n{l}\n</text>")).count(), 1, "{l} of {n}: {svg}");
            }
        }
        // One bar: its label under its centre, half way along the axis (90 to 989 pixels).
        for n in 1..4 {
            let labels: Vec<String> = (1..=n).map(|v| format!("v{v}")).collect();
            let svg = bars("Rows", &labels, &vec![5.0; n], "rows").unwrap();
            for (i, l) in labels.iter().enumerate() {
                let at = svg.split("<text").find(|t| t.contains(&format!("\n{l}\n"))).unwrap();
                let x: f64 = at.split("x=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
                // The plotting area runs from 90 to 989 pixels.
                let centre = 90.0 + 899.0 * (i as f64 + 0.5) / n as f64;
                assert!((x - centre).abs() < 3.0, "{l} of {n} at x = {x}, not {centre}");
            }
        }
        // Past 20 bars, a spaced subset, each once.
        let labels: Vec<String> = (1..=60).map(|v| format!("v{v}")).collect();
        let svg = bars("Rows", &labels, &vec![1.0; 60], "rows").unwrap();
        let shown = labels.iter().filter(|l| svg.contains(&format!("\n{l}\n</text>"))).count();
        assert!((5..=21).contains(&shown), "{shown} labels of 60");
    }
}
