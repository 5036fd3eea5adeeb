//! `pipeline verify DATASET[@VERSION] [--job job.sql]`: is this dataset the whole corpus, is every vector
//! sound, and can it be reproduced? Every id once (and, with the job, every id of its corpus, none other); no
//! NaN, infinite or zero vectors, norms as the fingerprint says; no version written around the pipeline; a
//! seeded sample, stratified by token length, embedded again with the recorded model directory and compared;
//! the lineage chain. Exit 0 when sound, 1 with findings, 2 when it cannot check.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, anyhow};
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::prelude::DataFrame;
use futures::StreamExt;
use lance::datafusion::LanceTableProvider;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Exit;
use crate::campaign::{DeviceInfo, Fingerprint};
use crate::lance::compare::{cosine_and_max_diff, distinct_ids, examples};
use crate::lance::inspect::id_counts;
use crate::lance::records::fingerprint_of_dataset;
use crate::lance::records::newest_run_record;
use crate::lance::verify::{EXAMPLES, OutsideWrite, VectorFindings, outside_writes, scan_vectors};
use crate::lance::{open_dataset, quote_ident};
use crate::model::TextEmbedder;
use crate::ops::lineage::Check;
use crate::ops::plan::{JobWrites, load_job};

/// The file beside a local dataset that keeps its verify results, one per version checked (`pipeline report`
/// shows the one of the version it shows).
pub const VERIFY_SUFFIX: &str = ".verify.json";

/// What to verify, and how.
#[derive(Debug, Clone)]
pub struct VerifyArgs {
    /// `path`, `path@version` or `path@tag`.
    pub dataset: String,
    /// The job that made it: its corpus's ids and texts.
    pub job: Option<PathBuf>,
    /// Rows to embed again (0: none).
    pub sample: u64,
    pub seed: u64,
    /// Smallest cosine between a stored vector and its re-embedding.
    pub min_cosine: f64,
    /// The model directory, where the run records do not name it.
    pub model: Option<PathBuf>,
    /// Where the sample is embedded (default cpu).
    pub device: Option<String>,
    pub id_column: String,
    pub column: String,
}

/// What `pipeline verify` found. Kept beside a local dataset in `<dataset>.verify.json`, with the results of the
/// other versions checked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerifyReport {
    pub dataset: String,
    pub version: u64,
    pub rows: u64,
    /// When it was checked (UTC, RFC 3339).
    pub checked_at: String,
    pub tool_version: String,
    pub fingerprint: Option<Fingerprint>,
    pub ids: IdFindings,
    pub vectors: VectorFindings,
    /// Versions that changed rows with no run record: written around the pipeline.
    pub outside_writes: Vec<OutsideWrite>,
    /// The re-embedded sample; null when none was drawn (no --job, or --sample 0).
    pub sample: Option<SampleFindings>,
    /// The lineage chain, each link checked.
    pub lineage: Vec<Check>,
    /// Faults found, in words.
    pub findings: Vec<String>,
    /// Checks asked for that could not be made, in words.
    pub cannot_check: Vec<String>,
    /// Checks not made, and why (nothing asked them), in words.
    pub notes: Vec<String>,
    /// 'sound', 'findings' or 'cannot check'.
    pub verdict: String,
    pub seconds: f64,
    /// The process's peak resident memory, bytes.
    pub peak_memory_bytes: u64,
}

/// The ids: each once, and with the job, the corpus's and no other.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct IdFindings {
    pub column: String,
    pub distinct: u64,
    pub null_ids: u64,
    /// Ids held more than once, and how many such ids.
    pub duplicated: u64,
    pub duplicated_examples: Vec<String>,
    /// The job whose corpus the ids were checked against.
    pub job: Option<String>,
    pub source_rows: Option<u64>,
    /// Ids of the corpus the dataset lacks.
    pub missing: Option<u64>,
    pub missing_examples: Vec<String>,
    /// Ids of the dataset the corpus lacks.
    pub extra: Option<u64>,
    pub extra_examples: Vec<String>,
}

/// The sample embedded again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SampleFindings {
    pub model_dir: String,
    pub seed: u64,
    /// Rows asked for, and rows compared.
    pub requested: u64,
    pub rows: u64,
    pub min_cosine_threshold: f64,
    /// Where the stored vectors were made (the newest run record's device), and where the sample was.
    pub made_on: Option<DeviceInfo>,
    pub checked_on: DeviceInfo,
    /// Same execution provider and device: the vectors should agree to rounding.
    pub same_device: bool,
    pub strata: Vec<StratumCheck>,
    /// Sampled ids whose re-embedding is below the threshold.
    pub below: u64,
    pub below_examples: Vec<String>,
    /// Sampled ids of the corpus that the dataset lacks or holds a NULL vector for (its text is not NULL).
    pub not_stored: u64,
    /// Over the whole sample.
    pub min_cosine: Option<f64>,
    pub max_abs_diff: Option<f64>,
}

/// The sample's rows in one band of token lengths.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StratumCheck {
    /// E.g. `33-64 tokens`, or `past the 256-token limit`.
    pub name: String,
    /// Texts of the corpus's candidate subset in the band, and rows compared from it.
    pub candidates: u64,
    pub rows: u64,
    pub min_cosine: Option<f64>,
    pub mean_cosine: Option<f64>,
    pub max_abs_diff: Option<f64>,
    pub below: u64,
}

/// `pipeline verify`: print the report, save it beside the dataset, exit 1 with findings, 2 when it could not
/// check what was asked. Ctrl-C or SIGTERM stops it (exit 130) and nothing is saved: it writes nothing else.
pub async fn verify_command(args: &VerifyArgs, json: bool, quiet: bool) -> anyhow::Result<()> {
    super::stop_on_signals(super::StopSays::NothingToCommit);
    let stage = |what: &str| {
        if !quiet {
            eprintln!("verify: {what}");
        }
    };
    let result = tokio::select! {
        r = verify(args, &stage) => r,
        () = crate::campaign::interrupt::stopped() => Err(anyhow!("stopped")),
    };
    if crate::campaign::interrupt::stop_requested() {
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
        print!("{}", report.to_text());
        match saved {
            Ok(Some(path)) => println!("  saved: {}", path.display()),
            Ok(None) => {}
            Err(e) => eprintln!("warning: {e:#}"),
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

/// Keep the report beside a local dataset with those of the other versions checked: the newest check of each
/// version, so that checking an old version does not hide the newest's result.
fn save(report: &VerifyReport) -> anyhow::Result<Option<PathBuf>> {
    let Some(path) = verify_path(&report.dataset) else { return Ok(None) };
    let mut kept = saved_results(&path);
    kept.retain(|r| r.version != report.version);
    kept.push(report.clone());
    kept.sort_by_key(|r| r.version);
    // Written whole, then renamed over the old file: an interrupted save leaves the old results.
    let partial = path.with_extension("json.partial");
    std::fs::write(&partial, serde_json::to_string_pretty(&kept)?)
        .and_then(|()| std::fs::rename(&partial, &path))
        .with_context(|| format!("cannot save the result to {}", path.display()))?;
    Ok(Some(path))
}

/// The file beside a local dataset (its real place, a link resolved, so that each of its names finds the same
/// file) that keeps its verify results; none for a dataset in an object store.
pub fn verify_path(uri: &str) -> Option<PathBuf> {
    if !crate::stores::is_local(uri) {
        return None;
    }
    let path = uri.strip_prefix("file://").unwrap_or(uri);
    let path = Path::new(path.trim_end_matches('/'));
    let mut file = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()).into_os_string();
    file.push(VERIFY_SUFFIX);
    Some(file.into())
}

/// The verify results kept in `file`, oldest version first (none when there is no file or it cannot be read).
fn saved_results(file: &Path) -> Vec<VerifyReport> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Saved {
        Versions(Vec<VerifyReport>),
        One(Box<VerifyReport>),
    }
    match std::fs::read(file).ok().and_then(|b| serde_json::from_slice::<Saved>(&b).ok()) {
        Some(Saved::Versions(v)) => v,
        Some(Saved::One(r)) => vec![*r],
        None => Vec::new(),
    }
}

/// The result of the newest check of `version` or of the newest version before it, kept beside the dataset at
/// `uri`.
pub fn last_verify(uri: &str, version: u64) -> Option<VerifyReport> {
    saved_results(&verify_path(uri)?).into_iter().filter(|r| r.version <= version).max_by_key(|r| r.version)
}

/// Check the dataset, saying each stage through `stage`.
pub async fn verify(args: &VerifyArgs, stage: &dyn Fn(&str)) -> anyhow::Result<VerifyReport> {
    crate::memory::mark_before_load();
    let started = Instant::now();
    let ds = open_dataset(&args.dataset).await?;
    let version = ds.version().version;
    let uri = ds.uri().trim_end_matches('/').to_string();
    let fp = fingerprint_of_dataset(&ds)?.ok_or_else(|| {
        anyhow!(
            "{}: the dataset holds no fingerprint (it was not written by embed()), so there is nothing to check its \
             vectors against",
            args.dataset
        )
    })?;
    if ds.schema().field(&args.id_column).is_none() {
        return Err(anyhow!("{}: has no id column `{}` (give it with --id-column)", args.dataset, args.id_column));
    }
    let mut findings = Vec::new();
    let (mut cannot_check, mut notes) = (Vec::new(), Vec::new());

    // The corpus: its ids against the dataset's, and the sample's texts.
    let mut ids = IdFindings { column: args.id_column.clone(), ..Default::default() };
    let mut drawn = None;
    match &args.job {
        Some(job) => {
            stage(&format!("reading the corpus of {}", job.display()));
            let (source_ids, candidates) = read_job(job, args, &uri, &ds, &mut notes, &mut cannot_check).await?;
            ids.job = Some(job.display().to_string());
            (ids.source_rows, ids.missing, ids.missing_examples, ids.extra, ids.extra_examples) = source_ids;
            if !candidates.is_empty() {
                stage(&format!("counting the tokens of {} candidates for the sample", candidates.len()));
                match prepare_sample(args, &ds, &fp, candidates).await {
                    Ok(Ok(d)) => drawn = Some(d),
                    Ok(Err(finding)) if args.model.is_none() => findings.push(finding),
                    Ok(Err(why)) => cannot_check.push(format!("the sample: --model {why}")),
                    Err(e) => cannot_check.push(format!("the sample cannot be embedded again: {e:#}")),
                }
            }
        }
        None => notes.push(
            "the ids were not checked against the corpus, and no sample was embedded again: give the job that made \
             the dataset with --job"
                .into(),
        ),
    }

    // One pass over the vectors, keeping the sample's.
    let wanted: HashSet<String> = drawn.iter().flat_map(|d: &Drawn| d.rows.iter().map(|r| r.id.clone())).collect();
    stage(&format!("reading the ids and vectors of version {version}"));
    let scan = scan_vectors(&ds, &args.id_column, &args.column, fp.normalize, &wanted).await?;
    if scan.vectors.dim != fp.dim {
        findings.push(format!("the vectors have {} values, the fingerprint says {}", scan.vectors.dim, fp.dim));
    }
    findings.extend(scan.vectors.faults());
    let counts = id_counts(Arc::new(ds.clone()), &args.id_column, EXAMPLES).await?;
    (ids.distinct, ids.null_ids, ids.duplicated, ids.duplicated_examples) =
        (counts.distinct, counts.nulls, counts.duplicated, counts.duplicated_examples);
    if ids.null_ids > 0 {
        findings.push(format!("{} rows have a NULL id", ids.null_ids));
    }
    if ids.duplicated > 0 {
        findings.push(format!("{} ids are held more than once{}", ids.duplicated, examples(&ids.duplicated_examples)));
    }
    if let Some(n) = ids.missing.filter(|n| *n > 0) {
        findings.push(format!("{n} ids of the corpus are missing{}", examples(&ids.missing_examples)));
    }
    if let Some(n) = ids.extra.filter(|n| *n > 0) {
        findings.push(format!("{n} ids are not in the corpus{}", examples(&ids.extra_examples)));
    }

    let outside = outside_writes(&ds, version).await?;
    for w in &outside {
        findings.push(format!(
            "version {} ({}, {}) changed rows outside the pipeline (it has no run record), so nothing says how its \
             vectors were made",
            w.version, w.operation, w.timestamp
        ));
    }

    let sample = match drawn {
        Some(d) => {
            stage(&format!("embedding {} sampled rows again on {}", d.rows.len(), d.embedder.device().device));
            let s = compare_sample(d, &scan.stored, &fp, args).await?;
            if s.below > 0 {
                findings.push(format!(
                    "{} of {} sampled vectors differ from their re-embedding (cosine below {}){}",
                    s.below,
                    s.rows,
                    s.min_cosine_threshold,
                    examples(&s.below_examples)
                ));
            }
            if s.not_stored > 0 {
                findings.push(format!("{} sampled texts have no vector in the dataset", s.not_stored));
            }
            Some(s)
        }
        None => None,
    };

    stage("checking the lineage");
    let lineage = crate::ops::lineage::report(&args.dataset, true).await?;
    let gone = lineage.model_dir.as_deref().filter(|d| !Path::new(d).exists()).map(str::to_string);
    let lineage = lineage.checks;
    for c in &lineage {
        match c.status.as_str() {
            "BROKEN" if c.link == "model directory" && gone.is_some() => cannot_check.push(format!(
                "lineage: the model directory {} is gone, so its files cannot be checked",
                gone.as_deref().unwrap_or_default()
            )),
            "BROKEN" => findings.push(format!("lineage broken at {}: {}", c.link, c.detail)),
            "unchecked" => notes.push(format!("lineage: {} unchecked: {}", c.link, c.detail)),
            _ => {}
        }
    }

    let verdict = if !findings.is_empty() {
        "findings"
    } else if !cannot_check.is_empty() {
        "cannot check"
    } else {
        "sound"
    };
    Ok(VerifyReport {
        dataset: uri,
        version,
        rows: scan.vectors.rows,
        checked_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        fingerprint: Some(fp),
        ids,
        vectors: scan.vectors,
        outside_writes: outside,
        sample,
        lineage,
        findings,
        cannot_check,
        notes,
        verdict: verdict.to_string(),
        seconds: started.elapsed().as_secs_f64(),
        peak_memory_bytes: crate::memory::peak().unwrap_or(0),
    })
}

/// What the corpus's ids say: rows, then missing and extra ids with examples.
type SourceIds = (Option<u64>, Option<u64>, Vec<String>, Option<u64>, Vec<String>);

/// A text of the corpus that may be sampled: its id, its text, and its place in the seeded order.
struct Candidate {
    id: String,
    text: String,
    rank: u64,
}

/// The job's write into this dataset (else its first write into Lance): its ids against the dataset's, and the
/// candidates for the sample (the texts of the ids lowest in the seeded order, 16 times the sample at most).
async fn read_job(
    job: &Path,
    args: &VerifyArgs,
    uri: &str,
    ds: &lance::Dataset,
    notes: &mut Vec<String>,
    cannot_check: &mut Vec<String>,
) -> anyhow::Result<(SourceIds, Vec<Candidate>)> {
    let (session, statements) = load_job(job)?;
    let mut writes = JobWrites::new(job, &session, &statements);
    let real = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
    let mut chosen = None;
    while let Some((stmt, write, target)) = writes.next().await? {
        let here = real(&target.uri) == real(uri);
        if chosen.is_none() || here {
            chosen = Some((stmt, write, target));
        }
        if here {
            break;
        }
    }
    let Some((stmt, _, target)) = chosen else {
        return Err(anyhow!(
            "{} writes nothing into Lance (COPY … STORED AS LANCE): it is not a campaign",
            job.display()
        ));
    };
    if real(&target.uri) != real(uri) {
        notes.push(format!(
            "the job does not write this dataset (its first write is into {}); that write's corpus was checked against it",
            target.uri
        ));
    }
    let ctx = session.context();
    let id = quote_ident(&args.id_column);
    let source = DataFrame::new(ctx.state(), target.input.as_ref().clone())
        .select_columns(&[args.id_column.as_str()])
        .map_err(|e| writes.fail(stmt, &e))?;
    ctx.register_table("__verify_source", source.into_view())?;
    ctx.register_table("__verify_dataset", Arc::new(LanceTableProvider::new(Arc::new(ds.clone()), false, false)))?;
    let (missing, missing_ex) = distinct_ids(
        ctx,
        &format!(
            "SELECT DISTINCT s.{id} FROM __verify_source s LEFT ANTI JOIN __verify_dataset d ON s.{id} = d.{id} \
             WHERE s.{id} IS NOT NULL"
        ),
    )
    .await
    .map_err(|e| writes.fail(stmt, &e))?;
    let (extra, extra_ex) = distinct_ids(
        ctx,
        &format!(
            "SELECT DISTINCT d.{id} FROM __verify_dataset d LEFT ANTI JOIN __verify_source s ON d.{id} = s.{id} \
             WHERE d.{id} IS NOT NULL"
        ),
    )
    .await?;
    let source_rows = ctx.sql("SELECT count(*) FROM __verify_source").await?.collect().await?;
    let source_rows = source_rows
        .first()
        .and_then(|b| b.column(0).as_primitive_opt::<datafusion::arrow::datatypes::Int64Type>())
        .map_or(0, |a| a.value(0).max(0) as u64);
    let ids = (Some(source_rows), Some(missing), missing_ex, Some(extra), extra_ex);
    if args.sample == 0 {
        return Ok((ids, Vec::new()));
    }

    // The texts, as the write's query computes them beside its ids.
    let Some(texts) = texts_plan(&target.input, &args.id_column) else {
        cannot_check.push(format!(
            "the sample: the write into {} is not one SELECT with embed() in its columns (a UNION of several, say), so \
             its texts cannot be read beside their ids",
            target.uri
        ));
        return Ok((ids, Vec::new()));
    };
    let keep = 16 * args.sample as usize;
    let mut lowest = std::collections::BinaryHeap::new();
    let mut stream = DataFrame::new(ctx.state(), texts).execute_stream().await.map_err(|e| writes.fail(stmt, &e))?;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| writes.fail(stmt, &e))?;
        let ids = cast(batch.column(0), &DataType::Utf8)?;
        let ids = ids.as_string::<i32>();
        let texts = crate::udf::embed::string_values(batch.column(1))?;
        for (i, t) in texts.into_iter().enumerate() {
            let (Some(t), true) = (t, ids.is_valid(i)) else { continue };
            let rank = seeded_rank(args.seed, ids.value(i));
            if lowest.len() < keep || lowest.peek().is_some_and(|c: &Candidate| rank < c.rank) {
                lowest.push(Candidate { id: ids.value(i).to_string(), text: t.to_string(), rank });
                if lowest.len() > keep {
                    lowest.pop();
                }
            }
        }
    }
    Ok((ids, lowest.into_vec()))
}

/// The write's ids and texts: its query with `embed(text)` replaced by `text` (the id first, the text second),
/// where the query is one projection holding the call.
fn texts_plan(input: &LogicalPlan, id_column: &str) -> Option<LogicalPlan> {
    let LogicalPlan::Projection(p) = input else { return None };
    let (mut id, mut text) = (None, None);
    let id_column = p.schema.fields().iter().position(|f| f.name() == id_column);
    for (i, e) in p.expr.iter().enumerate() {
        let e = e.clone().unalias();
        if Some(i) == id_column {
            id = Some(e.clone());
        }
        if let Expr::ScalarFunction(f) = &e
            && f.name() == "embed"
        {
            text = f.args.first().cloned();
        }
    }
    LogicalPlanBuilder::from(p.input.as_ref().clone())
        .project(vec![id?.alias("__verify_id"), text?.alias("__verify_text")])
        .ok()?
        .build()
        .ok()
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.rank == other.rank
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    /// By seeded rank, so that a max-heap drops the highest.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank.cmp(&other.rank)
    }
}

/// An id's place in the seeded order: the first 8 bytes of SHA-256 of the seed and the id (the same on every
/// machine and in every version).
pub(crate) fn seeded_rank(seed: u64, id: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(id.as_bytes());
    u64::from_be_bytes(h.finalize()[..8].try_into().unwrap_or_default())
}

/// The sample drawn, by stratum, with the embedder that makes it again.
struct Drawn {
    rows: Vec<SampleRow>,
    strata: Vec<(String, u64)>,
    embedder: Arc<crate::model::Embedder>,
    settings: crate::model::CallSettings,
    model_dir: PathBuf,
    made_on: Option<DeviceInfo>,
}

struct SampleRow {
    id: String,
    text: String,
    stratum: usize,
}

/// Load the recorded model (refused with a finding when it no longer gives the dataset's fingerprint), count
/// the candidates' tokens, and take the sample: bands of token length doubling up to the limit, and the texts
/// past it, each given an equal share, lowest seeded rank first.
async fn prepare_sample(
    args: &VerifyArgs,
    ds: &lance::Dataset,
    fp: &Fingerprint,
    candidates: Vec<Candidate>,
) -> anyhow::Result<Result<Drawn, String>> {
    let newest = newest_run_record(ds, ds.version().version, |r| r.model_dir.is_some()).await?;
    let made_on =
        newest_run_record(ds, ds.version().version, |r| r.device.is_some()).await?.and_then(|(_, r)| r.device);
    let model_dir = match (&args.model, newest.and_then(|(_, r)| r.model_dir)) {
        (Some(dir), _) => dir.clone(),
        (None, Some(dir)) => PathBuf::from(dir),
        (None, None) => {
            return Err(anyhow!(
                "the run records do not say where the model is (written by an older version); give it with --model DIR"
            ));
        }
    };
    if !model_dir.is_dir() {
        return Err(anyhow!("the model directory {} is gone; give it with --model DIR", model_dir.display()));
    }
    let mut options = crate::lance::search::options_for(fp, &model_dir);
    if let Some(device) = &args.device {
        options.device = device.clone();
    }
    let (settings, now) = crate::campaign::Fingerprint::for_options(&options)
        .with_context(|| format!("the model directory {}", model_dir.display()))?;
    let differences = fp.differences(&now);
    if !differences.is_empty() {
        let fields: Vec<String> =
            differences.iter().map(|(k, a, b)| format!("{k} (the dataset's {a}, now {b})")).collect();
        return Ok(Err(format!(
            "the model directory {} no longer makes these vectors: {}",
            model_dir.display(),
            fields.join("; ")
        )));
    }
    let embedder = options.embedder()?;
    let texts: Vec<Option<&str>> = candidates.iter().map(|c| Some(c.text.as_str())).collect();
    let counts = {
        let (e, s) = (Arc::clone(&embedder), settings.clone());
        let texts: Vec<Option<String>> = texts.iter().map(|t| t.map(str::to_string)).collect();
        tokio::task::spawn_blocking(move || {
            let refs: Vec<Option<&str>> = texts.iter().map(|t| t.as_deref()).collect();
            e.token_counts(&refs, &s)
        })
        .await??
    };
    let limit = fp.max_tokens.max(1);
    let mut bands: Vec<(usize, usize)> = Vec::new();
    let mut low = 1;
    let mut high = 16.min(limit);
    loop {
        bands.push((low, high));
        if high >= limit {
            break;
        }
        (low, high) = (high + 1, (high * 2).min(limit));
    }
    let mut names: Vec<String> = bands.iter().map(|(a, b)| format!("{a}-{b} tokens")).collect();
    names.push(format!("past the {limit}-token limit"));
    let stratum_of = |(kept, dropped): (usize, usize)| {
        if dropped > 0 { bands.len() } else { bands.iter().position(|(_, b)| kept <= *b).unwrap_or(bands.len() - 1) }
    };
    let mut by_stratum: Vec<Vec<(u64, usize)>> = vec![Vec::new(); names.len()];
    for (i, c) in candidates.iter().enumerate() {
        by_stratum[stratum_of(counts[i])].push((c.rank, i));
    }
    let quotas = shares(&by_stratum.iter().map(Vec::len).collect::<Vec<_>>(), args.sample as usize);
    let mut rows = Vec::new();
    let mut strata = Vec::new();
    let mut candidates: Vec<Option<Candidate>> = candidates.into_iter().map(Some).collect();
    for (k, mut members) in by_stratum.into_iter().enumerate() {
        strata.push((names[k].clone(), members.len() as u64));
        members.sort_unstable();
        for (_, i) in members.into_iter().take(quotas[k]) {
            if let Some(c) = candidates[i].take() {
                rows.push(SampleRow { id: c.id, text: c.text, stratum: k });
            }
        }
    }
    Ok(Ok(Drawn { rows, strata, embedder, settings, model_dir, made_on }))
}

/// Rows to take from strata of `sizes` rows for a sample of `n`: equal shares, what a small stratum cannot
/// fill going to the others.
fn shares(sizes: &[usize], n: usize) -> Vec<usize> {
    let mut out = vec![0; sizes.len()];
    let mut order: Vec<usize> = (0..sizes.len()).filter(|&k| sizes[k] > 0).collect();
    order.sort_by_key(|&k| sizes[k]);
    let mut left = n;
    for (j, &k) in order.iter().enumerate() {
        let share = left.div_ceil(order.len() - j);
        out[k] = share.min(sizes[k]);
        left -= out[k].min(left);
    }
    out
}

/// Embed the sample again and compare it with the stored vectors, stratum by stratum.
async fn compare_sample(
    d: Drawn,
    stored: &HashMap<String, Option<Vec<f32>>>,
    fp: &Fingerprint,
    args: &VerifyArgs,
) -> anyhow::Result<SampleFindings> {
    let Drawn { rows, strata, embedder, settings, model_dir, made_on } = d;
    let texts: Vec<String> = rows.iter().map(|r| r.text.clone()).collect();
    let e = Arc::clone(&embedder);
    let vectors = tokio::task::spawn_blocking(move || {
        let refs: Vec<Option<&str>> = texts.iter().map(|t| Some(t.as_str())).collect();
        e.embed_with_progress(&refs, &settings, &|_, _| {}, &crate::campaign::interrupt::stop_requested)
    })
    .await??;
    let dim = if rows.is_empty() { 1 } else { vectors.vectors.len() / rows.len() };
    let mut checks: Vec<StratumCheck> = strata
        .into_iter()
        .map(|(name, candidates)| StratumCheck {
            name,
            candidates,
            rows: 0,
            min_cosine: None,
            mean_cosine: None,
            max_abs_diff: None,
            below: 0,
        })
        .collect();
    let mut sums = vec![0f64; checks.len()];
    let (mut below, mut below_examples, mut not_stored) = (0u64, Vec::new(), 0u64);
    // float16 storage: the fresh vector is rounded as the stored one was.
    let round = fp.dtype == "float16";
    for (i, row) in rows.iter().enumerate() {
        let Some(Some(old)) = stored.get(&row.id) else {
            not_stored += 1;
            continue;
        };
        let mut new = vectors.vectors[i * dim..(i + 1) * dim].to_vec();
        if round {
            new.iter_mut().for_each(|x| *x = half::f16::from_f32(*x).to_f32());
        }
        let (cos, diff) = cosine_and_max_diff(old, &new);
        let s = &mut checks[row.stratum];
        s.rows += 1;
        s.min_cosine = Some(s.min_cosine.map_or(cos, |m| m.min(cos)));
        s.max_abs_diff = Some(s.max_abs_diff.map_or(diff, |m| m.max(diff)));
        sums[row.stratum] += cos;
        if cos < args.min_cosine {
            s.below += 1;
            below += 1;
            if below_examples.len() < EXAMPLES {
                below_examples.push(row.id.clone());
            }
        }
    }
    for (s, sum) in checks.iter_mut().zip(sums) {
        if s.rows > 0 {
            s.mean_cosine = Some(sum / s.rows as f64);
        }
    }
    let checked_on = embedder.device().clone();
    let same_device =
        made_on.as_ref().is_some_and(|m| m.provider == checked_on.provider && m.device == checked_on.device);
    let min = |f: fn(&StratumCheck) -> Option<f64>, pick: fn(f64, f64) -> f64| checks.iter().filter_map(f).reduce(pick);
    Ok(SampleFindings {
        model_dir: model_dir.display().to_string(),
        seed: args.seed,
        requested: args.sample,
        rows: checks.iter().map(|s| s.rows).sum(),
        min_cosine_threshold: args.min_cosine,
        made_on,
        checked_on,
        same_device,
        min_cosine: min(|s| s.min_cosine, f64::min),
        max_abs_diff: min(|s| s.max_abs_diff, f64::max),
        strata: checks,
        below,
        below_examples,
        not_stored,
    })
}

impl VerifyReport {
    /// The human-readable form.
    pub fn to_text(&self) -> String {
        let mut out = format!("verify {}@{} ({} rows)\n", self.dataset, self.version, self.rows);
        if let Some(fp) = &self.fingerprint {
            out += &format!(
                "  fingerprint: {} ({}, {} dims, {} pooling, normalised {})\n",
                fp.model, fp.model_dtype, fp.dim, fp.pooling, fp.normalize
            );
        }
        let i = &self.ids;
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
        let v = &self.vectors;
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
        out += &format!("  versions written around the pipeline: {}\n", self.outside_writes.len());
        if let Some(s) = &self.sample {
            let device = |d: &Option<DeviceInfo>| {
                d.as_ref().map_or("unknown".into(), |d| format!("{} {}", d.provider, d.device))
            };
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
        }
        for c in &self.lineage {
            out += &format!("  lineage {}: {} ({})\n", c.link, c.status, c.detail);
        }
        for n in &self.notes {
            out += &format!("  note: {n}\n");
        }
        for c in &self.cannot_check {
            out += &format!("  CANNOT CHECK: {c}\n");
        }
        for f in &self.findings {
            out += &format!("  FINDING: {f}\n");
        }
        out += &format!("  {} ({:.1} s)\n", self.verdict.to_uppercase(), self.seconds);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::seeded_rank;

    #[test]
    fn a_small_stratum_leaves_its_share_to_the_others() {
        assert_eq!(super::shares(&[30, 5000, 0, 5000], 1000), vec![30, 485, 0, 485]);
        assert_eq!(super::shares(&[3, 4], 1000), vec![3, 4]);
        assert_eq!(super::shares(&[100, 100, 100], 10), vec![4, 3, 3]);
        assert_eq!(super::shares(&[], 10), Vec::<usize>::new());
    }

    #[test]
    fn the_seeded_order_is_fixed_and_depends_on_the_seed() {
        assert_eq!(seeded_rank(0, "a"), seeded_rank(0, "a"));
        assert_ne!(seeded_rank(0, "a"), seeded_rank(1, "a"));
        assert_ne!(seeded_rank(0, "a"), seeded_rank(0, "b"));
    }
}
