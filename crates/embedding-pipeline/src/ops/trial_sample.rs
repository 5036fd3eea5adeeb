//! What the trials of both kinds (a text write's, [`super::trial`]; an image write's, [`super::image_trial`])
//! share: what a trial is asked, its sample written through the run's own write path with each embedded chunk
//! timed, and the sample's vectors compared with a reference.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use datafusion::datasource::file_format::format_as_file_type;
use datafusion::logical_expr::LogicalPlan;
use datafusion::logical_expr::dml::CopyTo;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::campaign::metrics::{HostShare, usable_cores};
use crate::campaign::work_plan::WorkPlanInUse;
use crate::campaign::{EmbedStats, FINGERPRINT_KEY};
use crate::error::{Error, Result};
use crate::lance::dataset_uri;
use crate::lance::target::WriteTarget;
use crate::ops::compare::Thresholds;
use crate::session::EmbedSession;

/// Minimum cosine of a trial's vectors against the reference's for the same model file.
pub const MATCH_COSINE: f64 = 0.9999;
/// Largest absolute difference of any element allowed against the reference (as `pipeline compare`).
const MATCH_DIFF: f64 = 0.01;

/// What a trial is asked.
#[derive(Debug, Clone)]
pub struct TrialOptions {
    pub file: PathBuf,
    /// Values of the job's `${NAME}` variables (`--var`).
    pub vars: BTreeMap<String, String>,
    /// Embedding time the sample should take, minutes (from the warm-up's rate).
    pub minutes: f64,
    /// Rows of the sample, instead of `minutes`.
    pub sample: Option<u64>,
    /// Where trial.json goes; the sample's vectors go beside it, as `<stem>.lance`.
    pub save: PathBuf,
    pub reference: Option<String>,
    pub memory_budget: Option<u64>,
    /// Keep the job's batch settings as they are.
    pub no_probe: bool,
    /// The trial's name in `pipeline cost` (default: the device).
    pub name: Option<String>,
}

impl TrialOptions {
    /// Minutes of embedding the sample takes, by default.
    pub const DEFAULT_MINUTES: f64 = 2.0;
    /// Where the trial is saved, by default.
    pub const DEFAULT_SAVE: &str = "trial.json";

    /// A trial of the job `file` with the defaults `pipeline trial` has: a sample of about two minutes, saved
    /// to trial.json (its vectors to trial.lance), the batch settings probed, named by the device.
    pub fn new(file: impl Into<PathBuf>) -> Self {
        Self {
            file: file.into(),
            vars: BTreeMap::new(),
            minutes: Self::DEFAULT_MINUTES,
            sample: None,
            save: Self::DEFAULT_SAVE.into(),
            reference: None,
            memory_budget: None,
            no_probe: false,
            name: None,
        }
    }
}

/// The sample's vectors against a reference dataset's, by id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Comparison {
    pub reference: String,
    pub matched: u64,
    pub min_cosine: Option<f64>,
    pub mean_cosine: Option<f64>,
    pub max_abs_diff: Option<f64>,
    /// Whether the vectors match: minimum cosine >= [`MATCH_COSINE`], same fingerprint, ids found.
    pub passed: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
}

impl Comparison {
    /// Why the trial's vectors do not match the reference, when they do not.
    pub fn mismatch(&self) -> Option<String> {
        (!self.passed)
            .then(|| format!("the trial's vectors do not match {}: {}", self.reference, self.failures.join("; ")))
    }
}

/// The times of the sample's write: its start, its first model call, each embedded chunk's end (seconds since
/// the first call) with the useful tokens and images embedded so far, and its end.
pub(crate) struct Timed {
    pub(crate) started: Instant,
    pub(crate) first_call: Instant,
    pub(crate) points: Vec<(f64, u64, u64)>,
    pub(crate) last: Instant,
    pub(crate) ended: Instant,
    pub(crate) host: Option<HostShare>,
}

impl Timed {
    /// The points as (seconds, useful tokens so far).
    pub(crate) fn tokens(&self) -> Vec<(f64, u64)> {
        self.points.iter().map(|p| (p.0, p.1)).collect()
    }
}

/// What a trial's write writes: the work list in a plan directory (a text write's sample), or the write's input
/// with only some rows kept (an image write's).
pub(crate) enum SampleRows<'a> {
    WorkList(&'a Path),
    Input(Arc<LogicalPlan>),
}

/// Write the sample into `vectors` through the run's own write path (the job's COPY options kept), each embedded
/// chunk timed.
pub(crate) async fn write_timed(
    session: &EmbedSession,
    write: &LogicalPlan,
    target: &WriteTarget,
    vectors: &str,
    rows: SampleRows<'_>,
) -> Result<Timed> {
    let ctx = session.context();
    let file_type = match write {
        LogicalPlan::Copy(c) => Arc::clone(&c.file_type),
        _ => format_as_file_type(
            ctx.state()
                .get_file_format_factory("lance")
                .ok_or_else(|| Error::Internal("the Lance format is not registered".into()))?,
        ),
    };
    let options_of_copy = match write {
        LogicalPlan::Copy(c) => c.options.clone(),
        _ => HashMap::new(),
    };
    let uri = dataset_uri(vectors);
    let input = match rows {
        SampleRows::WorkList(dir) => {
            session.metrics().use_plan(&uri, Arc::new(WorkPlanInUse::load(dir).map_err(Error::Refused)?));
            Arc::clone(&target.input)
        }
        SampleRows::Input(input) => input,
    };
    let copy = CopyTo::new(input, vectors.to_string(), Vec::new(), file_type, options_of_copy);
    session.metrics().keep_timeline();
    let before = session.metrics().embed_stats();
    let started = Instant::now();
    let written = async {
        let mut stream = ctx.execute_logical_plan(LogicalPlan::Copy(copy)).await?.execute_stream().await?;
        while let Some(batch) = stream.next().await {
            batch?;
        }
        Ok::<_, Error>(())
    }
    .await;
    let ended = Instant::now();
    session.metrics().forget_plan(&uri);
    let timeline = session.metrics().take_timeline();
    written?;
    let first_call = timeline.first_call.or(session.metrics().first_call()).unwrap_or(started);
    let last = timeline.points.last().map_or(ended, |p| p.at);
    let points =
        timeline.points.iter().map(|p| (p.at.duration_since(first_call).as_secs_f64(), p.tokens, p.images)).collect();
    let host = sample_host_share(session, &before, ended.duration_since(first_call));
    Ok(Timed { started, first_call, points, last, ended, host })
}

/// How busy the model was over `wall` (the sample's embedding), from the session's counters before the sample
/// and now.
pub(crate) fn sample_host_share(
    session: &EmbedSession,
    before: &EmbedStats,
    wall: std::time::Duration,
) -> Option<HostShare> {
    let now = session.metrics().embed_stats();
    let sample = EmbedStats {
        run_time: now.run_time.saturating_sub(before.run_time),
        sessions: now.sessions,
        ..EmbedStats::default()
    };
    let on_gpu = session.metrics().device().is_some_and(|d| d.cuda.is_some());
    HostShare::new(&sample, wall, usable_cores(), on_gpu)
}

/// The sample's vectors against `reference`'s, by id, as `pipeline compare --shared-ids` does.
pub(crate) async fn compare(vectors: &str, reference: &str, id_column: &str, target: &WriteTarget) -> Comparison {
    let column = target
        .input
        .schema()
        .fields()
        .iter()
        .find(|f| f.metadata().contains_key(FINGERPRINT_KEY))
        .map_or_else(|| "embedding".to_string(), |f| f.name().clone());
    let thresholds = Thresholds {
        min_cosine: MATCH_COSINE,
        max_diff: MATCH_DIFF,
        shared_ids: true,
        allow_different_fingerprints: false,
    };
    match crate::ops::compare::compare(vectors, reference, Some(id_column), &column, thresholds).await {
        Ok(r) => {
            let mut failures = r.failures.clone();
            if r.matched == 0 {
                failures.push(format!("no id of the sample is in {reference}"));
            }
            Comparison {
                reference: reference.to_string(),
                matched: r.matched,
                min_cosine: r.min_cosine,
                mean_cosine: r.mean_cosine,
                max_abs_diff: r.max_abs_diff,
                passed: r.passed && r.matched > 0,
                failures,
            }
        }
        Err(e) => Comparison {
            reference: reference.to_string(),
            matched: 0,
            min_cosine: None,
            mean_cosine: None,
            max_abs_diff: None,
            passed: false,
            failures: vec![crate::error::plain(&e.to_string())],
        },
    }
}
