//! A campaign's plan, made before renting by `pipeline plan`: the fingerprint the run will have, what the
//! source was, the exact token totals, and the work units (contiguous ranges of the rows in length order).
//! Kept as `plan.json` in the plan directory `<output>.plan/`, beside the work list of prepared rows.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::campaign::Fingerprint;
use crate::campaign::digest::hex_sha256;

/// The plan directory's file of the plan itself.
pub const PLAN_FILE: &str = "plan.json";
/// The plan directory's picture of the histogram.
pub const HISTOGRAM_FILE: &str = "histogram.svg";
/// The plan directory's work list: the rows in length order, with their token count and unit.
pub const WORK_LIST_FILE: &str = "worklist.parquet";
/// The work list's column of each row's unit.
pub const UNIT_COLUMN: &str = "__unit";

/// What `pipeline plan` found and decided for one write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkPlan {
    /// The tool's version that made the plan.
    pub tool_version: String,
    /// When the plan was made (UTC, RFC 3339).
    pub created: String,
    /// The Lance dataset the write goes to.
    pub output: String,
    /// The fingerprint the run's vectors will carry.
    pub fingerprint: Fingerprint,
    /// SHA-256 of the write's query as planned (its tables, columns, filters and id column): a run whose
    /// write reads otherwise is not this plan's.
    #[serde(default)]
    pub write_digest: String,
    /// The sources as they were when planned.
    pub sources: Vec<SourceSnapshot>,
    /// Counts over the whole input.
    pub totals: Totals,
    /// Useful tokens a unit reaches before the next begins: every unit but the last holds at least this
    /// many, and less than this many plus its last row's.
    pub unit_tokens: u64,
    /// The work units, longest rows first.
    pub units: Vec<Unit>,
    /// How long the texts are, before truncation.
    pub histogram: Histogram,
}

impl WorkPlan {
    /// The plan kept in the plan directory `dir`, and the SHA-256 of its `plan.json`, which names it.
    pub fn read(dir: &Path) -> Result<(Self, String), String> {
        let path = dir.join(PLAN_FILE);
        let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let plan = serde_json::from_slice(&bytes).map_err(|e| {
            format!("{} is not a plan this version can read ({e}); run pipeline plan again", path.display())
        })?;
        Ok((plan, hex_sha256(&bytes)))
    }
}

/// Where a plan replaced by `pipeline plan` is kept when a version of its output was made from it: beside the
/// plan directory, named by the first 12 hex digits of its `plan.json`'s SHA-256 (`out.lance.plan.3f2a9c1b0d4e`),
/// so that version's lineage still finds the plan it executed.
pub fn kept_plan_dir(dir: &Path, digest: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}", &digest[..digest.len().min(12)]));
    dir.with_file_name(name)
}

/// A plan a run is executing, and how far its units are done. The work list's reader notes where each
/// unit ends among the rows it passes on; the sink, which receives those rows in the same order, asks at
/// each commit how many units its committed rows complete.
#[derive(Debug)]
pub struct WorkPlanInUse {
    /// The plan directory.
    pub dir: PathBuf,
    pub plan: WorkPlan,
    /// SHA-256 of its `plan.json`.
    pub digest: String,
    progress: Mutex<UnitProgress>,
}

#[derive(Debug, Default)]
struct UnitProgress {
    /// Per unit read so far: the rows passed on for embedding when its last row had been read. Units
    /// whose rows were all in the output already end where the rows before them did.
    ends: Vec<u64>,
    /// Rows committed so far by the write.
    committed: u64,
    /// Units done after the last commit.
    done: u64,
}

impl WorkPlanInUse {
    /// The plan in the plan directory `dir`.
    pub fn load(dir: &Path) -> Result<Self, String> {
        let (plan, digest) = WorkPlan::read(dir)?;
        Ok(Self { dir: dir.to_path_buf(), plan, digest, progress: Mutex::default() })
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, UnitProgress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A write begins reading the work list: nothing passed on, nothing committed.
    pub fn start(&self) {
        *self.progress() = UnitProgress::default();
    }

    /// The next unit's last row was read, when `passed` rows had been passed on in all.
    pub fn unit_read(&self, passed: u64) {
        self.progress().ends.push(passed);
    }

    /// `rows` more rows were committed; the record of that commit.
    pub fn committed(&self, rows: u64) -> PlanRecord {
        let mut p = self.progress();
        p.committed += rows;
        let before = p.done;
        p.done = p.ends.iter().filter(|end| **end <= p.committed).count() as u64;
        PlanRecord {
            path: self.dir.display().to_string(),
            digest: self.digest.clone(),
            units: self.plan.units.len() as u64,
            units_done_before: before,
            units_done: p.done,
        }
    }

    /// Units whose rows are all committed (or were in the output already), and units in all.
    pub fn units_done(&self) -> (u64, u64) {
        (self.progress().done, self.plan.units.len() as u64)
    }
}

/// What a commit made from a plan records: which plan, and the units done after it. Units are done in
/// their order, so the units this commit completed are `units_done_before..units_done`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PlanRecord {
    /// The plan directory, as the run named it.
    pub path: String,
    /// SHA-256 of its `plan.json`.
    pub digest: String,
    /// Units in the plan.
    pub units: u64,
    /// Units done before this commit, and after it.
    pub units_done_before: u64,
    pub units_done: u64,
}

/// A source table as it was when planned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SourceSnapshot {
    /// The table's name in the job.
    pub table: String,
    /// Where a file table's files are (files or folders), and the ending its folders' files have.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locations: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file_extension: String,
    /// Its files, for a file table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<SourceFile>,
    /// Its URI and version, for a Lance table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lance: Option<LanceSnapshot>,
    /// Set when the table cannot be checked for changes (an object store, a table in memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unchecked: Option<String>,
}

/// One file of a source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SourceFile {
    pub path: String,
    pub bytes: u64,
    /// Modification time, seconds since the Unix epoch.
    pub modified: i64,
    /// SHA-256 of the content, hex.
    pub sha256: String,
}

/// A Lance source's version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LanceSnapshot {
    pub uri: String,
    pub version: u64,
}

/// Counts over the whole input, exactly as the run will count them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Totals {
    /// Rows (each one id).
    pub rows: u64,
    /// Rows with a text.
    pub documents: u64,
    /// Rows whose text is NULL: they get a NULL vector.
    pub null_texts: u64,
    /// Tokens the texts hold, special tokens and prefix included, before truncation.
    pub tokens_before_truncation: u64,
    /// Tokens the model will be fed (after truncation): the run's useful tokens.
    pub useful_tokens: u64,
    /// Texts longer than the limit.
    pub truncated_documents: u64,
    /// Tokens truncation removes.
    pub dropped_tokens: u64,
    /// The limit: most tokens per text.
    pub max_tokens: u64,
}

/// A contiguous range of the rows in length order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Unit {
    pub unit: u32,
    /// Position of its first row in the length order.
    pub first_row: u64,
    pub rows: u64,
    pub useful_tokens: u64,
    /// Token counts of its longest and shortest row.
    pub longest: u32,
    pub shortest: u32,
}

/// Texts by token count before truncation, in bins of `bin_width` tokens; the last bin holds every text
/// at or beyond `bins.len() - 1` bin widths.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Histogram {
    pub bin_width: u32,
    /// Texts per bin; bin i holds lengths in `[i * bin_width, (i + 1) * bin_width)`.
    pub bins: Vec<u64>,
    /// The truncation limit, as in [`Totals::max_tokens`].
    pub limit: u64,
    /// Share of the texts longer than the limit, and of their tokens beyond it.
    pub documents_over_limit: f64,
    pub tokens_over_limit: f64,
}

/// Bins of the histogram: 64 of them up to twice the limit, the last also holding everything longer.
pub const HISTOGRAM_BINS: u32 = 64;

impl Histogram {
    /// An empty histogram for texts cut at `limit` tokens.
    pub fn new(limit: u64) -> Self {
        let bin_width = (2 * limit as u32).div_ceil(HISTOGRAM_BINS).max(1);
        Self { bin_width, bins: vec![0; HISTOGRAM_BINS as usize + 1], limit, ..Default::default() }
    }

    /// Count one text of `tokens` tokens (before truncation).
    pub fn add(&mut self, tokens: u64) {
        let bin = ((tokens / u64::from(self.bin_width)) as usize).min(self.bins.len() - 1);
        self.bins[bin] += 1;
    }

    /// Fill in the shares from the totals.
    pub fn finish(&mut self, totals: &Totals) {
        let share = |a: u64, b: u64| if b > 0 { a as f64 / b as f64 } else { 0.0 };
        self.documents_over_limit = share(totals.truncated_documents, totals.documents);
        self.tokens_over_limit = share(totals.dropped_tokens, totals.tokens_before_truncation);
    }
}

/// Cuts rows, in length order, into units: a unit ends with the row that brings it to `unit_tokens`
/// useful tokens. So `unit_tokens` = total / N gives at most N units.
#[derive(Debug)]
pub struct UnitCutter {
    unit_tokens: u64,
    rows_seen: u64,
    pub units: Vec<Unit>,
}

impl UnitCutter {
    pub fn new(unit_tokens: u64) -> Self {
        Self { unit_tokens: unit_tokens.max(1), rows_seen: 0, units: Vec::new() }
    }

    /// Useful tokens a unit reaches before the next begins.
    pub fn unit_tokens(&self) -> u64 {
        self.unit_tokens
    }

    /// The unit of the next row, of `tokens` useful tokens.
    pub fn push(&mut self, tokens: u32) -> u32 {
        let open = self.units.last().is_some_and(|u| u.useful_tokens < self.unit_tokens);
        if !open {
            let unit = self.units.len() as u32;
            self.units.push(Unit { unit, first_row: self.rows_seen, shortest: tokens, ..Default::default() });
        }
        let unit = self.units.last_mut().expect("a unit was just made");
        unit.rows += 1;
        unit.useful_tokens += u64::from(tokens);
        unit.longest = unit.longest.max(tokens);
        unit.shortest = unit.shortest.min(tokens);
        self.rows_seen += 1;
        unit.unit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_contiguous_and_end_with_the_row_that_reaches_their_tokens() {
        let mut cut = UnitCutter::new(100);
        let units: Vec<u32> = [300, 60, 50, 40, 30, 30, 10].iter().map(|t| cut.push(*t)).collect();
        assert_eq!(units, [0, 1, 1, 2, 2, 2, 3]);
        let u = &cut.units;
        assert_eq!((u[0].rows, u[0].useful_tokens, u[0].longest), (1, 300, 300), "a long row is a unit alone");
        assert_eq!((u[1].first_row, u[1].rows, u[1].useful_tokens, u[1].longest, u[1].shortest), (1, 2, 110, 60, 50));
        assert_eq!((u[2].first_row, u[2].rows, u[2].useful_tokens), (3, 3, 100));
        assert_eq!((u[3].first_row, u[3].rows, u[3].useful_tokens), (6, 1, 10));
    }

    #[test]
    fn a_unit_size_of_the_total_over_n_gives_at_most_n_units() {
        let rows: Vec<u32> = (0..1000).map(|i| 1 + (i * 37 % 200)).collect();
        let total: u64 = rows.iter().map(|t| u64::from(*t)).sum();
        for n in [1, 2, 3, 7, 50] {
            let mut cut = UnitCutter::new(total.div_ceil(n));
            rows.iter().for_each(|t| {
                cut.push(*t);
            });
            assert!(cut.units.len() as u64 <= n && cut.units.len() as u64 >= n - 1, "{n}: {}", cut.units.len());
        }
    }

    #[test]
    fn the_histogram_bins_to_twice_the_limit_and_keeps_the_rest_in_its_last_bin() {
        let mut h = Histogram::new(256);
        assert_eq!((h.bin_width, h.bins.len()), (8, 65));
        for t in [0, 7, 8, 511, 512, 10_000] {
            h.add(t);
        }
        assert_eq!((h.bins[0], h.bins[1], h.bins[63], h.bins[64]), (2, 1, 1, 2));
        let totals = Totals {
            documents: 4,
            truncated_documents: 1,
            tokens_before_truncation: 200,
            dropped_tokens: 50,
            ..Default::default()
        };
        h.finish(&totals);
        assert_eq!((h.documents_over_limit, h.tokens_over_limit), (0.25, 0.25));
    }
}
