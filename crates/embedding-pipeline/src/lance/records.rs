//! What a campaign's dataset records of its own history, read in one place: the run record each write
//! commits with its version (under [`RUN_RECORD_KEY`]), the maintenance record of `pipeline index` and
//! `pipeline optimize` (under [`MAINTENANCE_KEY`]), and the campaign fingerprint in the schema's metadata.
//! The sink, maintenance, inspection, search and lineage all read them through here.

use std::collections::HashMap;

use datafusion::common::exec_datafusion_err;
use lance::Dataset;
use serde::{Deserialize, Serialize};

use super::lance_err;
use crate::campaign::{FINGERPRINT_KEY, Fingerprint, RUN_RECORD_KEY, RunRecord};
use crate::error::Result;

/// The transaction property holding a [`MaintenanceRecord`].
pub const MAINTENANCE_KEY: &str = "embedding_pipeline.maintenance";

/// What `pipeline index` or `pipeline optimize` did in one commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MaintenanceRecord {
    /// `index`; `compaction` (the commit that compacts); `optimize` (the commit after the cleanup, with the
    /// figures of both).
    pub command: String,
    /// This program's version.
    pub pipeline_version: String,
    /// How long it took, where it was known when committing (an index's build is timed after its commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup: Option<CleanupRecord>,
    /// The newest run record when the cleanup began, and its version: a cleanup may remove that version,
    /// and search and lineage find the model through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<LastRun>,
}

/// A run record kept across a cleanup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LastRun {
    pub version: u64,
    pub record: crate::campaign::RunRecord,
}

/// A vector index built.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct IndexRecord {
    pub name: String,
    pub column: String,
    /// `ivf_pq` or `ivf_hnsw_sq`.
    pub kind: String,
    /// `cosine`, `l2` or `dot`.
    pub metric: String,
    /// IVF partitions asked for (null: Lance's choice from the row count); Lance may train fewer when there
    /// are too few vectors.
    pub partitions: Option<usize>,
    /// PQ sub-vectors (IVF_PQ only).
    pub sub_vectors: Option<usize>,
    /// Rows the index covers.
    pub rows_indexed: u64,
    /// Whether it replaced an index of the same name.
    pub replaced: bool,
}

/// Fragments rewritten by compaction.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CompactionRecord {
    pub fragments_removed: usize,
    pub fragments_added: usize,
    pub files_removed: usize,
    pub files_added: usize,
}

/// Old versions removed (tagged versions and the latest are always kept).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CleanupRecord {
    /// Versions older than this were removed, e.g. `7d`.
    pub older_than: String,
    pub versions_removed: u64,
    pub bytes_removed: u64,
    pub data_files_removed: u64,
    /// Tagged versions, which are kept whatever their age.
    pub tagged_kept: Vec<u64>,
}

impl MaintenanceRecord {
    /// One line for `pipeline inspect`.
    pub fn summary(&self) -> String {
        let mut out = format!("{} (pipeline {})", self.command, self.pipeline_version);
        if let Some(i) = &self.index {
            out += &format!(
                ": {} index {} on {} ({}), {} rows{}{}",
                i.kind,
                i.name,
                i.column,
                i.metric,
                i.rows_indexed,
                i.partitions.map(|p| format!(", {p} partitions asked for")).unwrap_or_default(),
                if i.replaced { ", replacing the previous one" } else { "" }
            );
        }
        if let Some(c) = &self.compaction {
            out += &format!(": compaction {} fragments into {}", c.fragments_removed, c.fragments_added);
        }
        if let Some(c) = &self.cleanup {
            out += &format!(
                "; cleanup of versions older than {}: {} removed ({} bytes){}",
                c.older_than,
                c.versions_removed,
                c.bytes_removed,
                if c.tagged_kept.is_empty() { String::new() } else { format!(", tagged kept: {:?}", c.tagged_kept) }
            );
        }
        if let Some(s) = self.seconds {
            out += &format!(", {s:.1} s");
        }
        out
    }

    /// The transaction properties that carry this record.
    pub(crate) fn properties(&self) -> HashMap<String, String> {
        HashMap::from([(MAINTENANCE_KEY.to_string(), serde_json::to_string(self).unwrap_or_default())])
    }
}

/// The fingerprint stored in a dataset, if any.
pub fn fingerprint_of_dataset(ds: &Dataset) -> datafusion::common::Result<Option<Fingerprint>> {
    ds.schema()
        .metadata
        .get(FINGERPRINT_KEY)
        .map(|json| Fingerprint::from_json(json).map_err(|e| exec_datafusion_err!("unreadable fingerprint: {e}")))
        .transpose()
}

/// The schema-metadata key holding the id column a campaign's dataset was written with (`embed.id_column`).
pub const ID_COLUMN_KEY: &str = "embedding_pipeline.id_column";

/// The id column of `ds`: `given` (a command's `--id-column`), else the one recorded when it was written, else
/// `id` (datasets written before the column was recorded).
pub fn id_column_of(ds: &Dataset, given: Option<&str>) -> String {
    given.or_else(|| ds.schema().metadata.get(ID_COLUMN_KEY).map(String::as_str)).unwrap_or("id").to_string()
}

/// The run record committed with `version` of `ds`, or None for a version this tool did not write.
pub async fn run_record(ds: &Dataset, version: u64) -> Result<Option<RunRecord>> {
    Ok(version_records(ds, version).await?.0)
}

/// What this tool committed with `version` of `ds`, read from its transaction once: the run record of a
/// write, or the maintenance record of `pipeline index` / `pipeline optimize` (at most one is there).
pub async fn version_records(ds: &Dataset, version: u64) -> Result<(Option<RunRecord>, Option<MaintenanceRecord>)> {
    let transaction = ds.read_version_transaction(version).await.map_err(lance_err(ds.uri()))?.transaction;
    let Some(properties) = transaction.and_then(|t| t.transaction_properties) else { return Ok((None, None)) };
    fn read<T: serde::de::DeserializeOwned>(properties: &HashMap<String, String>, key: &str) -> Option<T> {
        properties.get(key).and_then(|json| serde_json::from_str(json).ok())
    }
    Ok((read(&properties, RUN_RECORD_KEY), read(&properties, MAINTENANCE_KEY)))
}

/// The versions of `ds` still there, up to `version`, newest first (a cleanup removes older ones).
pub async fn existing_versions(ds: &Dataset, version: u64) -> Result<Vec<u64>> {
    let mut versions: Vec<u64> = ds
        .versions()
        .await
        .map_err(lance_err(ds.uri()))?
        .into_iter()
        .map(|v| v.version)
        .filter(|v| *v <= version)
        .collect();
    versions.sort_unstable_by(|a, b| b.cmp(a));
    Ok(versions)
}

/// The newest run record at or before `version` that `want` accepts, with its version. A version made by
/// something else (an index, a compaction) keeps the vectors of the runs before it.
pub async fn newest_run_record(
    ds: &Dataset,
    version: u64,
    want: impl Fn(&RunRecord) -> bool,
) -> Result<Option<(u64, RunRecord)>> {
    for v in existing_versions(ds, version).await? {
        match version_records(ds, v).await? {
            (Some(r), _) if want(&r) => return Ok(Some((v, r))),
            (Some(_), _) => {}
            // An optimize's record carries the newest run record from before its cleanup, which may be gone.
            (None, Some(m)) => {
                if let Some(kept) = m.last_run.filter(|l| want(&l.record)) {
                    return Ok(Some((kept.version, kept.record)));
                }
            }
            (None, None) => {}
        }
    }
    Ok(None)
}
