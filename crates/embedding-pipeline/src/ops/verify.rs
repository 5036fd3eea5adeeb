//! Verify a dataset: is it the whole corpus, is every vector sound, and can it be reproduced? Every id once
//! (and, with the job, every id of its corpus, none other); no NaN, infinite or zero vectors, norms as the
//! fingerprint says; no version written around the pipeline; a seeded sample, stratified by token length,
//! embedded again with the recorded model directory and compared; the lineage chain.
//!
//! [`verify`] → [`VerifyReport`], whose verdict is `sound`, `findings` or `cannot check`; [`save`] keeps it
//! beside a local dataset, where [`last_verify`] finds it (`pipeline report` shows it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::DataFrame;
use futures::StreamExt;
use lance::datafusion::LanceTableProvider;
use serde::{Deserialize, Serialize};

use super::Reporter;
use super::image_plan::{MEGAPIXEL_BANDS, band_of};
use super::lineage::Check;
use super::plan::{JobWrites, embedded_input, load_job};
use super::sample::{Lowest, seeded_rank};
use crate::campaign::{DeviceInfo, Fingerprint};
use crate::lance::records::{existing_versions, fingerprint_of_dataset, newest_run_record, version_records};
use crate::lance::verify::{EXAMPLES, OutsideWrite, VectorFindings, outside_writes, scan_vectors};
use crate::lance::{open_dataset, quote_ident};
use crate::model::TextEmbedder;
use crate::ops::compare::{cosine_and_max_diff, examples};
use crate::ops::inspect::id_counts;
use crate::options::EmbedOptions;
use crate::process::interrupt::StopToken;
use crate::udf::image_source::Located;
use crate::{Error, Result};

/// The file beside a local dataset that keeps its verify results, one per version checked (`pipeline report`
/// shows the one of the version it shows).
pub const VERIFY_SUFFIX: &str = ".verify.json";

/// What to verify, and how.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// `path`, `path@version` or `path@tag`.
    pub dataset: String,
    /// The job that made it: its corpus's ids and texts.
    pub job: Option<PathBuf>,
    /// Values of the job's `${NAME}` variables (`--var`).
    pub vars: BTreeMap<String, String>,
    /// Rows to embed again (0: none).
    pub sample: u64,
    pub seed: u64,
    /// Smallest cosine between a stored vector and its re-embedding.
    pub min_cosine: f64,
    /// The model directory, where the run records do not name it.
    pub model: Option<PathBuf>,
    /// Where the sample is embedded (default cpu).
    pub device: Option<String>,
    /// The id column (default: the one the dataset was written with, else `id`).
    pub id_column: Option<String>,
    pub column: String,
    /// Asks the sample's re-embedding to stop before its next model call (a signal handler holds a clone).
    pub stop: StopToken,
}

impl VerifyOptions {
    /// Rows of the corpus embedded again, by default.
    pub const DEFAULT_SAMPLE: u64 = 1000;
    /// The smallest cosine allowed between a stored vector and its re-embedding, by default.
    pub const DEFAULT_MIN_COSINE: f64 = 0.9999;

    /// Verify `dataset` with the defaults `pipeline verify` has: no job, a sample of 1,000 with seed 0, a
    /// minimum cosine of 0.9999, ids in `id` and vectors in `embedding`.
    pub fn new(dataset: impl Into<String>) -> Self {
        Self {
            dataset: dataset.into(),
            job: None,
            vars: BTreeMap::new(),
            sample: Self::DEFAULT_SAMPLE,
            seed: 0,
            min_cosine: Self::DEFAULT_MIN_COSINE,
            model: None,
            device: None,
            id_column: None,
            column: "embedding".into(),
            stop: StopToken::new(),
        }
    }

    /// The id column: as given, or (once [`open_checked`] has resolved it) the dataset's.
    fn id(&self) -> &str {
        self.id_column.as_deref().unwrap_or("id")
    }
}

/// What `pipeline verify` found. Kept beside a local dataset in `<dataset>.verify.json`, with the results of the
/// other versions checked.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// Ids of the corpus the dataset lacks because a run skipped them as bad images (`embed.bad_images =
    /// 'skip'`; its run record lists them), not counted in `missing`.
    #[serde(default)]
    pub skipped: Option<u64>,
    #[serde(default)]
    pub skipped_examples: Vec<String>,
}

/// The sample embedded again.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// Sampled images that cannot be read now (a file changed or gone): with a stored vector, and without one (a
    /// bad image the run skipped).
    #[serde(default)]
    pub unreadable: u64,
    #[serde(default)]
    pub unreadable_examples: Vec<String>,
    #[serde(default)]
    pub bad_skipped: u64,
    /// Over the whole sample.
    pub min_cosine: Option<f64>,
    pub max_abs_diff: Option<f64>,
}

/// The sample's rows in one band of token lengths.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StratumCheck {
    /// E.g. `33-64 tokens`, `past the 256-token limit`, or for images `1-4 megapixels`.
    pub name: String,
    /// Texts of the corpus's candidate subset in the band, and rows compared from it.
    pub candidates: u64,
    pub rows: u64,
    pub min_cosine: Option<f64>,
    pub mean_cosine: Option<f64>,
    pub max_abs_diff: Option<f64>,
    pub below: u64,
}

/// Keep the report beside a local dataset with those of the other versions checked: the newest check of each
/// version, so that checking an old version does not hide the newest's result.
pub fn save(report: &VerifyReport) -> Result<Option<PathBuf>> {
    let Some(path) = verify_path(&report.dataset) else { return Ok(None) };
    let mut kept = saved_results(&path);
    kept.retain(|r| r.version != report.version);
    kept.push(report.clone());
    kept.sort_by_key(|r| r.version);
    // Written whole, then renamed over the old file: an interrupted save leaves the old results.
    let partial = path.with_extension("json.partial");
    std::fs::write(&partial, serde_json::to_string_pretty(&kept)?)
        .and_then(|()| std::fs::rename(&partial, &path))
        .map_err(|e| Error::file(format!("cannot save the result to {}", path.display()), e))?;
    Ok(Some(path))
}

/// The file beside a local dataset (its real place, a link resolved, so that each of its names finds the same
/// file) that keeps its verify results; none for a dataset in an object store.
pub fn verify_path(uri: &str) -> Option<PathBuf> {
    if !crate::uri::is_local(uri) {
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

/// Check the dataset, telling `reporter` each stage as a note. It writes nothing: [`save`] keeps the report.
pub async fn verify(args: &VerifyOptions, reporter: &dyn Reporter) -> Result<VerifyReport> {
    if args.job.is_none() && !args.vars.is_empty() {
        return Err(Error::Refused(
            "variables were given, but no job to give them to: give the job that made the dataset (--job), or leave \
             the variables out"
                .into(),
        ));
    }
    let stage = |what: &str| reporter.note(what);
    crate::process::memory::mark_before_load();
    let started = Instant::now();
    let (ds, fp, id_column) = open_checked(args).await?;
    let args = &VerifyOptions { id_column: Some(id_column), ..args.clone() };
    let version = ds.version().version;
    let uri = ds.uri().trim_end_matches('/').to_string();
    let mut words = Words::default();

    // The corpus: its ids against the dataset's, and the sample's texts.
    let mut ids = IdFindings { column: args.id().to_string(), ..Default::default() };
    let drawn = match &args.job {
        Some(job) => corpus(job, args, (&uri, &ds, &fp), &mut ids, &mut words, &stage).await?,
        None => {
            words.notes.push(
                "the ids were not checked against the corpus, and no sample was embedded again: give the job that \
                 made the dataset with --job"
                    .into(),
            );
            None
        }
    };

    // One pass over the vectors, keeping the sample's.
    let wanted: HashSet<String> = drawn.iter().flat_map(|d: &Drawn| d.rows.iter().map(|r| r.id.clone())).collect();
    stage(&format!("reading the ids and vectors of version {version}"));
    let scan = scan_vectors(&ds, args.id(), &args.column, fp.normalize, &wanted).await?;
    if scan.vectors.dim != fp.dim {
        words.findings.push(format!("the vectors have {} values, the fingerprint says {}", scan.vectors.dim, fp.dim));
    }
    words.findings.extend(scan.vectors.faults());
    check_ids(&ds, &mut ids, &mut words.findings).await?;

    let outside = outside_writes(&ds, version).await?;
    for w in &outside {
        words.findings.push(format!(
            "version {} ({}, {}) changed rows outside the pipeline (it has no run record), so nothing says how its \
             vectors were made",
            w.version, w.operation, w.timestamp
        ));
    }

    let sample = match drawn {
        Some(d) => {
            stage(&format!("embedding {} sampled rows again on {}", d.rows.len(), d.embedder.device().device));
            Some(check_sample(d, &scan.stored, &fp, args, &mut words).await?)
        }
        None => None,
    };

    stage("checking the lineage");
    let lineage = check_lineage(&args.dataset, &mut words).await?;
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
        verdict: words.verdict().to_string(),
        findings: words.findings,
        cannot_check: words.cannot_check,
        notes: words.notes,
        seconds: started.elapsed().as_secs_f64(),
        peak_memory_bytes: crate::process::memory::peak().unwrap_or(0),
    })
}

/// What the checks say in words: faults found, checks asked for that could not be made, checks not made.
#[derive(Default)]
struct Words {
    findings: Vec<String>,
    cannot_check: Vec<String>,
    notes: Vec<String>,
}

impl Words {
    fn verdict(&self) -> &'static str {
        if !self.findings.is_empty() {
            "findings"
        } else if !self.cannot_check.is_empty() {
            "cannot check"
        } else {
            "sound"
        }
    }
}

/// The dataset, its fingerprint and its id column, refused where it has no fingerprint or no such column.
async fn open_checked(args: &VerifyOptions) -> Result<(lance::Dataset, Fingerprint, String)> {
    let ds = open_dataset(&args.dataset).await?;
    let fp = fingerprint_of_dataset(&ds)?.ok_or_else(|| {
        Error::Refused(format!(
            "{}: the dataset holds no fingerprint (it was not written by embed()), so there is nothing to check its \
             vectors against",
            args.dataset
        ))
    })?;
    let id_column = crate::lance::records::id_column_of(&ds, args.id_column.as_deref());
    if ds.schema().field(&id_column).is_none() {
        return Err(Error::Refused(format!(
            "{}: has no id column `{id_column}` (give it with --id-column)",
            args.dataset
        )));
    }
    Ok((ds, fp, id_column))
}

/// The job's corpus: its ids against the dataset's (into `ids`), and the sample drawn from its texts, with the
/// model that makes them again (none when no sample is asked, or it cannot be made: `words` says why).
async fn corpus(
    job: &Path,
    args: &VerifyOptions,
    (uri, ds, fp): (&str, &lance::Dataset, &Fingerprint),
    ids: &mut IdFindings,
    words: &mut Words,
    stage: &dyn Fn(&str),
) -> Result<Option<Drawn>> {
    stage(&format!("reading the corpus of {}", job.display()));
    let (source_ids, candidates) = read_job(job, args, uri, ds, words).await?;
    ids.job = Some(job.display().to_string());
    ids.source_rows = Some(source_ids.rows);
    (ids.missing, ids.missing_examples) = (Some(source_ids.missing.0), source_ids.missing.1);
    (ids.extra, ids.extra_examples) = (Some(source_ids.extra.0), source_ids.extra.1);
    (ids.skipped, ids.skipped_examples) = source_ids.skipped.map_or((None, Vec::new()), |(n, e)| (Some(n), e));
    if let Some(n) = ids.skipped.filter(|n| *n > 0) {
        words.notes.push(format!(
            "{n} ids of the corpus are bad images a run skipped (embed.bad_images = 'skip'; its run record says why){}: \
             replace or remove those files and run the job again",
            examples(&ids.skipped_examples)
        ));
    }
    if candidates.items.is_empty() {
        return Ok(None);
    }
    stage(&match candidates.images {
        Some(_) => format!("reading the headers of {} sampled images", candidates.items.len()),
        None => format!("counting the tokens of {} candidates for the sample", candidates.items.len()),
    });
    match prepare_sample(args, ds, fp, candidates).await {
        Ok(Ok(d)) => return Ok(Some(d)),
        Ok(Err(finding)) if args.model.is_none() => words.findings.push(finding),
        Ok(Err(why)) => words.cannot_check.push(format!("the sample: --model {why}")),
        Err(e) => words.cannot_check.push(format!("the sample cannot be embedded again: {}", e.chain_text())),
    }
    Ok(None)
}

/// Each id once, none NULL; and with the job, the corpus's ids, none missing and none other.
async fn check_ids(ds: &lance::Dataset, ids: &mut IdFindings, findings: &mut Vec<String>) -> Result<()> {
    let counts = id_counts(Arc::new(ds.clone()), &ids.column, EXAMPLES).await?;
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
    Ok(())
}

/// The sample embedded again and compared; what differs is a finding, an image that cannot be read now cannot be
/// checked.
async fn check_sample(
    d: Drawn,
    stored: &HashMap<String, Option<Vec<f32>>>,
    fp: &Fingerprint,
    args: &VerifyOptions,
    words: &mut Words,
) -> Result<SampleFindings> {
    let s = compare_sample(d, stored, fp, args).await?;
    if s.unreadable > 0 {
        words.cannot_check.push(format!(
            "{} sampled images have vectors but cannot be read now (changed or gone since the run?){}",
            s.unreadable,
            examples(&s.unreadable_examples)
        ));
    }
    let findings = &mut words.findings;
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
    Ok(s)
}

/// The lineage chain, each link checked: a broken link is a finding, a model directory gone cannot be checked.
async fn check_lineage(dataset: &str, words: &mut Words) -> Result<Vec<Check>> {
    let lineage = super::lineage::report(dataset, true).await?;
    let gone = lineage.model_dir.as_deref().filter(|d| !Path::new(d).exists()).map(str::to_string);
    for c in &lineage.checks {
        match c.status.as_str() {
            "BROKEN" if c.link == "model directory" && gone.is_some() => words.cannot_check.push(format!(
                "lineage: the model directory {} is gone, so its files cannot be checked",
                gone.as_deref().unwrap_or_default()
            )),
            "BROKEN" => words.findings.push(format!("lineage broken at {}: {}", c.link, c.detail)),
            "unchecked" => words.notes.push(format!("lineage: {} unchecked: {}", c.link, c.detail)),
            _ => {}
        }
    }
    Ok(lineage.checks)
}

/// What the corpus's ids say: rows, then missing and extra ids with examples; and for images, the ids missing
/// because a run skipped them as bad images.
struct SourceIds {
    rows: u64,
    missing: Counted,
    extra: Counted,
    skipped: Option<Counted>,
}

/// A row of the corpus that may be sampled: its id, what it is embedded from, and its place in the seeded order.
struct Candidate {
    id: String,
    content: Content,
    rank: u64,
}

/// What a sampled row is embedded from: a text, or an image (its bytes, or its path until it is located).
#[derive(Debug)]
enum Content {
    Text(String),
    Image(Located),
    ImagePath(String),
}

/// The candidates for the sample, and for an image write (`embed_image`), the job's options at that write (its
/// image base, batch and pixel limit).
struct Candidates {
    items: Vec<Candidate>,
    images: Option<EmbedOptions>,
}

/// The job's write into this dataset (else its first write into Lance): its ids against the dataset's, and the
/// candidates for the sample (the texts of the ids lowest in the seeded order, 16 times the sample at most).
async fn read_job(
    job: &Path,
    args: &VerifyOptions,
    uri: &str,
    ds: &lance::Dataset,
    words: &mut Words,
) -> Result<(SourceIds, Candidates)> {
    let (session, statements) = load_job(job, &args.vars)?;
    let mut writes = JobWrites::new(job, &session, &statements);
    let real = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
    let mut chosen = None;
    while let Some((stmt, write, target)) = writes.next().await? {
        let here = real(&target.uri) == real(uri);
        if chosen.is_none() || here {
            // The options in force at this write (a later SET does not reach it).
            let options = EmbedOptions::from_config(session.context().state().config_options());
            chosen = Some((stmt, write, target, options));
        }
        if here {
            break;
        }
    }
    let Some((stmt, _, target, options)) = chosen else {
        return Err(Error::Refused(format!(
            "{} writes nothing into Lance (COPY … STORED AS LANCE): it is not a campaign",
            job.display()
        )));
    };
    if real(&target.uri) != real(uri) {
        words.notes.push(format!(
            "the job does not write this dataset (its first write is into {}); that write's corpus was checked against it",
            target.uri
        ));
    }
    let ctx = session.context();
    let fail = |e: datafusion::error::DataFusionError| writes.fail(stmt, &e);
    let images = crate::ops::plan::calls_embed_image(&target.input);
    // Bad images a run skipped are missing on purpose: their run records list them.
    let skipped = if images { skipped_images(ds).await? } else { HashSet::new() };
    // The corpus is read twice at most: once for the ids on either side only, once for the texts (which counts its
    // rows on the way) or, when no sample is drawn, for the count.
    let differences = id_differences(ctx, &target.input, args.id(), ds, &skipped, &fail).await?;
    // The texts (or images), as the write's query computes them beside its ids.
    let texts = if args.sample == 0 { None } else { embedded_input(&target.input, args.id()) };
    if args.sample > 0 && texts.is_none() {
        words.cannot_check.push(format!(
            "the sample: the write into {} is not one SELECT with embed() or embed_image() in its columns (a UNION of \
             several, say), so what it embeds cannot be read beside its ids",
            target.uri
        ));
    }
    let images = images.then_some(options);
    let (items, source_rows) = match texts {
        Some(texts) => candidates(DataFrame::new(ctx.state(), texts), args, images.is_some(), &fail).await?,
        None => (Vec::new(), count_source(ctx).await.map_err(fail)?),
    };
    let (missing, extra, skipped_found) = differences;
    let skipped = images.is_some().then_some(skipped_found);
    Ok((SourceIds { rows: source_rows, missing, extra, skipped }, Candidates { items, images }))
}

/// The ids every run record of the dataset lists as bad images skipped.
async fn skipped_images(ds: &lance::Dataset) -> Result<HashSet<String>> {
    let mut ids = HashSet::new();
    for v in existing_versions(ds, ds.version().version).await? {
        if let (Some(record), _) = version_records(ds, v).await? {
            ids.extend(record.skipped_image_ids.into_iter().map(|s| s.id));
        }
    }
    Ok(ids)
}

/// Ids counted, with the first few as examples.
type Counted = (u64, Vec<String>);

/// The ids of the write's query (`input`) against the dataset's, in one pass over each: the distinct ids the
/// query has and the dataset lacks (missing; those in `skipped` counted apart), and those the dataset has and the
/// query lacks (extra). Registers the query's ids as `__verify_source`, for [`count_source`].
async fn id_differences(
    ctx: &datafusion::prelude::SessionContext,
    input: &LogicalPlan,
    id_column: &str,
    ds: &lance::Dataset,
    skipped: &HashSet<String>,
    fail: &dyn Fn(datafusion::error::DataFusionError) -> Error,
) -> Result<(Counted, Counted, Counted)> {
    let id = quote_ident(id_column);
    let source = DataFrame::new(ctx.state(), input.clone()).select_columns(&[id_column]).map_err(fail)?;
    ctx.register_table("__verify_source", source.into_view())?;
    ctx.register_table("__verify_dataset", Arc::new(LanceTableProvider::new(Arc::new(ds.clone()), false, false)))?;
    // A full join keeps both sides' unmatched ids: the source's with no dataset id beside them, and the other way.
    // NULL ids match nothing and are no id (the write refuses them): both sides NULL, so left out.
    let sql = format!(
        "SELECT DISTINCT s.{id} AS missing, d.{id} AS extra FROM __verify_source s FULL OUTER JOIN __verify_dataset d \
         ON s.{id} = d.{id} WHERE (s.{id} IS NULL) <> (d.{id} IS NULL)"
    );
    let mut stream = ctx.sql(&sql).await.map_err(fail)?.execute_stream().await.map_err(fail)?;
    let (mut missing, mut extra, mut skipped_found): (Counted, Counted, Counted) = Default::default();
    let count = |side: &mut Counted, id: &str| {
        side.0 += 1;
        if side.1.len() < crate::ops::compare::EXAMPLES {
            side.1.push(id.to_string());
        }
    };
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(fail)?;
        let ids = cast(batch.column(0), &DataType::Utf8)?;
        for id in ids.as_string::<i32>().iter().flatten() {
            count(if skipped.contains(id) { &mut skipped_found } else { &mut missing }, id);
        }
        let ids = cast(batch.column(1), &DataType::Utf8)?;
        for id in ids.as_string::<i32>().iter().flatten() {
            count(&mut extra, id);
        }
    }
    Ok((missing, extra, skipped_found))
}

/// The rows of the write's query (`__verify_source`, registered by [`id_differences`]).
async fn count_source(ctx: &datafusion::prelude::SessionContext) -> datafusion::error::Result<u64> {
    let rows = ctx.sql("SELECT count(*) FROM __verify_source").await?.collect().await?;
    Ok(rows
        .first()
        .and_then(|b| b.column(0).as_primitive_opt::<datafusion::arrow::datatypes::Int64Type>())
        .map_or(0, |a| a.value(0).max(0) as u64))
}

/// The rows of `texts` (ids first, texts or images second) whose ids are lowest in the seeded order, and the rows
/// read: streamed, so that only those are held. Texts: 16 times the sample at most, to draw strata from; images:
/// the sample itself (an image's size is known once its header is read, and photos are large to hold).
async fn candidates(
    texts: DataFrame,
    args: &VerifyOptions,
    images: bool,
    fail: &dyn Fn(datafusion::error::DataFusionError) -> Error,
) -> Result<(Vec<Candidate>, u64)> {
    let mut lowest = Lowest::new(if images { 1 } else { 16 } * args.sample as usize);
    let mut rows = 0u64;
    let mut stream = texts.execute_stream().await.map_err(fail)?;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(fail)?;
        rows += batch.num_rows() as u64;
        let ids = cast(batch.column(0), &DataType::Utf8)?;
        let ids = ids.as_string::<i32>();
        let contents = contents(batch.column(1), images)?;
        for (i, content) in contents.into_iter().enumerate() {
            let (Some(content), true) = (content, ids.is_valid(i)) else { continue };
            lowest.offer(seeded_rank(args.seed, ids.value(i)), || (ids.value(i).to_string(), content.owned()));
        }
    }
    Ok((lowest.into_vec().into_iter().map(|(rank, (id, content))| Candidate { id, content, rank }).collect(), rows))
}

/// A row's content as the batch holds it; made a [`Content`] only when it is kept.
#[derive(Clone, Copy)]
enum Raw<'a> {
    Text(&'a str),
    Bytes(&'a [u8]),
    Path(&'a str),
}

impl Raw<'_> {
    fn owned(self) -> Content {
        match self {
            Raw::Text(t) => Content::Text(t.to_string()),
            Raw::Bytes(b) => Content::Image(Located::Fetched(bytes::Bytes::copy_from_slice(b))),
            Raw::Path(p) => Content::ImagePath(p.to_string()),
        }
    }
}

/// Each row's content (NULL: none): a text, an image's bytes, or an image's path.
fn contents(column: &ArrayRef, images: bool) -> Result<Vec<Option<Raw<'_>>>> {
    Ok(match column.data_type() {
        DataType::Binary => column.as_binary::<i32>().iter().map(|b| b.map(Raw::Bytes)).collect(),
        DataType::LargeBinary => column.as_binary::<i64>().iter().map(|b| b.map(Raw::Bytes)).collect(),
        DataType::BinaryView => column.as_binary_view().iter().map(|b| b.map(Raw::Bytes)).collect(),
        _ => {
            let raw = if images { Raw::Path } else { Raw::Text };
            crate::udf::embed::string_values(column)?.into_iter().map(|t| t.map(raw)).collect()
        }
    })
}

/// The sample drawn, by stratum, with the embedder that makes it again (and for images, its vision tower and the
/// job's options).
struct Drawn {
    rows: Vec<SampleRow>,
    strata: Vec<(String, u64)>,
    embedder: Arc<crate::model::Embedder>,
    settings: crate::model::CallSettings,
    images: Option<(Arc<crate::model::vision::VisionEmbedder>, EmbedOptions)>,
    model_dir: PathBuf,
    made_on: Option<DeviceInfo>,
}

struct SampleRow {
    id: String,
    content: Content,
    stratum: usize,
}

/// Load the recorded model (refused with a finding when it no longer gives the dataset's fingerprint), count
/// the candidates' tokens, and take the sample: bands of token length doubling up to the limit, and the texts
/// past it, each given an equal share, lowest seeded rank first.
async fn prepare_sample(
    args: &VerifyOptions,
    ds: &lance::Dataset,
    fp: &Fingerprint,
    candidates: Candidates,
) -> Result<std::result::Result<Drawn, String>> {
    let newest = newest_run_record(ds, ds.version().version, |r| r.model_dir.is_some()).await?;
    let made_on =
        newest_run_record(ds, ds.version().version, |r| r.device.is_some()).await?.and_then(|(_, r)| r.device);
    let model_dir = match (&args.model, newest.and_then(|(_, r)| r.model_dir)) {
        (Some(dir), _) => dir.clone(),
        (None, Some(dir)) => PathBuf::from(dir),
        (None, None) => {
            return Err(Error::Refused(
                "the run records do not say where the model is (written by an older version); give it with --model DIR"
                    .into(),
            ));
        }
    };
    if !model_dir.is_dir() {
        return Err(Error::Refused(format!(
            "the model directory {} is gone; give it with --model DIR",
            model_dir.display()
        )));
    }
    let mut options = crate::search::options_for(fp, &model_dir);
    if let Some(device) = &args.device {
        options.device = device.clone();
    }
    let (settings, now) = crate::campaign::Fingerprint::for_options(&options)
        .map_err(|e| e.context(format!("the model directory {}", model_dir.display())))?;
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
    let Candidates { items: candidates, images } = candidates;
    if let Some(job) = images {
        // The job's image settings, on the device and model verify uses.
        let job = EmbedOptions { model: options.model.clone(), device: options.device.clone(), ..job };
        let vision = job.vision_embedder()?;
        let (rows, strata) = draw_images(candidates, &job.image_base).await;
        return Ok(Ok(Drawn { rows, strata, embedder, settings, images: Some((vision, job)), model_dir, made_on }));
    }
    let texts: Vec<String> = candidates
        .iter()
        .map(|c| match &c.content {
            Content::Text(t) => t.clone(),
            _ => String::new(),
        })
        .collect();
    let counts = {
        let (e, s) = (Arc::clone(&embedder), settings.clone());
        tokio::task::spawn_blocking(move || {
            let refs: Vec<Option<&str>> = texts.iter().map(|t| Some(t.as_str())).collect();
            e.token_counts(&refs, &s)
        })
        .await??
    };
    let (rows, strata) = draw(candidates, &counts, fp.max_tokens.max(1), args.sample as usize);
    Ok(Ok(Drawn { rows, strata, embedder, settings, images: None, model_dir, made_on }))
}

/// An image sample by band of decoded size, read from each image's header (paths located first, against
/// `image_base`; objects fetched); an image whose header cannot be read now goes in a band of its own.
async fn draw_images(candidates: Vec<Candidate>, image_base: &str) -> (Vec<SampleRow>, Vec<(String, u64)>) {
    let paths = candidates
        .iter()
        .map(|c| match &c.content {
            Content::ImagePath(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    let located = crate::udf::image_source::locate(paths, image_base).await;
    let mut names: Vec<String> = MEGAPIXEL_BANDS.iter().map(|(_, n)| n.to_string()).collect();
    names.push("not readable now".into());
    let mut members = vec![0u64; names.len()];
    let mut rows: Vec<(u64, SampleRow)> = candidates
        .into_iter()
        .zip(located)
        .map(|(c, l)| {
            let content = match (c.content, l) {
                (Content::ImagePath(_), Some(l)) => Content::Image(l),
                (content, _) => content,
            };
            let header = match &content {
                Content::Image(l) => super::image_plan::header(l).ok(),
                _ => None,
            };
            let stratum = header.map_or(MEGAPIXEL_BANDS.len(), |(h, _)| band_of(h.pixels()));
            members[stratum] += 1;
            (c.rank, SampleRow { id: c.id, content, stratum })
        })
        .collect();
    rows.sort_by_key(|(rank, _)| *rank);
    (rows.into_iter().map(|(_, r)| r).collect(), names.into_iter().zip(members).collect())
}

/// The sample of `n` rows: bands of token length doubling up to `limit`, and the texts past it, each given
/// an equal share, lowest seeded rank first. `counts` are the candidates' (kept, dropped) token counts.
fn draw(
    candidates: Vec<Candidate>,
    counts: &[(usize, usize)],
    limit: usize,
    n: usize,
) -> (Vec<SampleRow>, Vec<(String, u64)>) {
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
    let quotas = shares(&by_stratum.iter().map(Vec::len).collect::<Vec<_>>(), n);
    let mut rows = Vec::new();
    let mut strata = Vec::new();
    let mut candidates: Vec<Option<Candidate>> = candidates.into_iter().map(Some).collect();
    for (k, mut members) in by_stratum.into_iter().enumerate() {
        strata.push((names[k].clone(), members.len() as u64));
        members.sort_unstable();
        for (_, i) in members.into_iter().take(quotas[k]) {
            if let Some(c) = candidates[i].take() {
                rows.push(SampleRow { id: c.id, content: c.content, stratum: k });
            }
        }
    }
    (rows, strata)
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
    args: &VerifyOptions,
) -> Result<SampleFindings> {
    let Drawn { rows, strata, embedder, settings, images, model_dir, made_on } = d;
    let (rows, vectors, bad) = match images {
        None => embed_texts_again(rows, Arc::clone(&embedder), settings, args.stop.clone()).await?,
        Some((vision, job)) => embed_images_again(rows, vision, job, args.stop.clone()).await?,
    };
    let dim = if rows.is_empty() { 1 } else { vectors.len() / rows.len() };
    let mut checks: Vec<StratumCheck> =
        strata.into_iter().map(|(name, candidates)| StratumCheck { name, candidates, ..Default::default() }).collect();
    let mut sums = vec![0f64; checks.len()];
    let (mut below, mut below_examples, mut not_stored) = (0u64, Vec::new(), 0u64);
    let (mut unreadable, mut unreadable_examples, mut bad_skipped) = (0u64, Vec::new(), 0u64);
    // float16 storage: the fresh vector is rounded as the stored one was.
    let round = fp.dtype == "float16";
    for (i, row) in rows.iter().enumerate() {
        let old = stored.get(&row.id).and_then(Option::as_ref);
        // An image that cannot be read now: skipped by the run as well (no vector), or changed since (a vector).
        if bad.contains(&i) {
            match old {
                None => bad_skipped += 1,
                Some(_) => tally(&mut unreadable, &mut unreadable_examples, &row.id),
            }
            continue;
        }
        let Some(old) = old else {
            not_stored += 1;
            continue;
        };
        let mut new = vectors[i * dim..(i + 1) * dim].to_vec();
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
            tally(&mut below, &mut below_examples, &row.id);
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
        unreadable,
        unreadable_examples,
        bad_skipped,
    })
}

/// One more id counted, kept as an example while there are few.
fn tally(count: &mut u64, examples: &mut Vec<String>, id: &str) {
    *count += 1;
    if examples.len() < EXAMPLES {
        examples.push(id.to_string());
    }
}

/// The sampled texts embedded again (none is bad: the set of bad rows is empty).
async fn embed_texts_again(
    rows: Vec<SampleRow>,
    embedder: Arc<crate::model::Embedder>,
    settings: crate::model::CallSettings,
    stop: StopToken,
) -> Result<(Vec<SampleRow>, Vec<f32>, HashSet<usize>)> {
    tokio::task::spawn_blocking(move || {
        let texts: Vec<Option<&str>> = rows
            .iter()
            .map(|r| match &r.content {
                Content::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        let made = embedder.embed_with_progress(&texts, &settings, &|_, _| {}, &|| stop.requested())?;
        Ok((rows, made.vectors, HashSet::new()))
    })
    .await?
}

/// The sampled images embedded again with the vision tower, under the job's pixel limit and batch; the rows
/// whose image cannot be read now (each gets zeros), by index.
async fn embed_images_again(
    rows: Vec<SampleRow>,
    vision: Arc<crate::model::vision::VisionEmbedder>,
    job: EmbedOptions,
    stop: StopToken,
) -> Result<(Vec<SampleRow>, Vec<f32>, HashSet<usize>)> {
    tokio::task::spawn_blocking(move || {
        let sources: Vec<_> = rows
            .iter()
            .map(|r| match &r.content {
                Content::Image(l) => Some(l.source()),
                _ => None,
            })
            .collect();
        let made = vision.embed(&sources, job.batch_images, job.max_image_pixels, true, &|| stop.requested()).map_err(
            |e| match e {
                crate::model::vision::EmbedImageError::Bad(b) => {
                    Error::Refused(format!("image {}: {}", b.row, b.error))
                }
                crate::model::vision::EmbedImageError::Other(e) => e,
            },
        )?;
        let bad = made.bad.iter().map(|b| b.row).collect();
        Ok((rows, made.vectors, bad))
    })
    .await?
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_small_stratum_leaves_its_share_to_the_others() {
        assert_eq!(super::shares(&[30, 5000, 0, 5000], 1000), vec![30, 485, 0, 485]);
        assert_eq!(super::shares(&[3, 4], 1000), vec![3, 4]);
        assert_eq!(super::shares(&[100, 100, 100], 10), vec![4, 3, 3]);
        assert_eq!(super::shares(&[], 10), Vec::<usize>::new());
    }
}
