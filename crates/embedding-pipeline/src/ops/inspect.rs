//! What a dataset holds and how it was made: its fingerprint, every version with its run record and
//! timestamp, its tags, its row count, and whether its ids are unique. The JSON form of
//! [`DatasetReport`] is a stable interface for scripts (documented in the README).

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::prelude::SessionContext;
use lance::Dataset;
use lance::datafusion::LanceTableProvider;
use lance::index::DatasetIndexExt;
use serde::Serialize;

use crate::campaign::{Fingerprint, RunRecord};
use crate::error::{Error, Result};
use crate::lance::lance_err;
use crate::lance::records::{MaintenanceRecord, fingerprint_of_dataset, version_records};

/// Everything `pipeline inspect` shows.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct DatasetReport {
    /// The dataset's location.
    pub uri: String,
    /// The latest version.
    pub version: u64,
    /// Rows at the latest version.
    pub rows: u64,
    /// The campaign fingerprint, or null for a dataset not written by `embed()`.
    pub fingerprint: Option<Fingerprint>,
    /// The id column's state at the latest version, or null when there is no such column.
    pub ids: Option<IdReport>,
    /// Tag name to version.
    pub tags: BTreeMap<String, u64>,
    /// The indices at the latest version, as Lance reports them.
    pub indices: Vec<IndexReport>,
    /// Every version, oldest first.
    pub versions: Vec<VersionReport>,
}

/// An index as it is now (Lance's statistics): what `pipeline index` built, with the partitions Lance trained.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct IndexReport {
    pub name: String,
    pub column: String,
    /// Lance's name for its kind, e.g. `IVF_PQ`.
    pub index_type: String,
    /// IVF partitions trained (null for an index without).
    pub partitions: Option<u64>,
    pub indexed_rows: u64,
    /// Rows written since it was built, which a search reads exactly.
    pub unindexed_rows: u64,
}

/// The indices of `ds` on its columns, by name (Lance's own system indices left out).
pub async fn indices(ds: &Dataset) -> Result<Vec<IndexReport>> {
    let uri = ds.uri();
    let mut columns = BTreeMap::new();
    for m in ds.load_indices().await.map_err(lance_err(uri))?.iter() {
        if let Some(field) = m.fields.first().and_then(|&id| ds.schema().field_by_id(id)) {
            columns.entry(m.name.clone()).or_insert_with(|| field.name.clone());
        }
    }
    let mut out = Vec::new();
    for (name, column) in columns {
        let stats: serde_json::Value =
            serde_json::from_str(&ds.index_statistics(&name).await.map_err(lance_err(uri))?).unwrap_or_default();
        out.push(IndexReport {
            name,
            column,
            index_type: stats["index_type"].as_str().unwrap_or("unknown").to_string(),
            partitions: stats["indices"][0]["num_partitions"].as_u64(),
            indexed_rows: stats["num_indexed_rows"].as_u64().unwrap_or(0),
            unindexed_rows: stats["num_unindexed_rows"].as_u64().unwrap_or(0),
        });
    }
    Ok(out)
}

impl IndexReport {
    /// One line for `pipeline inspect` and `pipeline index`.
    pub fn summary(&self) -> String {
        format!(
            "{} on {}: {}{}, {} rows indexed, {} not yet (searched exactly)",
            self.name,
            self.column,
            self.index_type,
            self.partitions.map(|p| format!(", {p} partition{}", if p == 1 { "" } else { "s" })).unwrap_or_default(),
            self.indexed_rows,
            self.unindexed_rows
        )
    }
}

/// Whether the ids are unique.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct IdReport {
    pub column: String,
    pub unique: bool,
    pub distinct: u64,
    pub nulls: u64,
}

/// One version of the dataset.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct VersionReport {
    pub version: u64,
    /// Commit time, RFC 3339, UTC.
    pub timestamp: String,
    /// Tags on this version.
    pub tags: Vec<String>,
    /// The run record committed with this version, or null for versions not written by this tool.
    pub run: Option<RunRecord>,
    /// What `pipeline index` or `pipeline optimize` did in this version, or null.
    pub maintenance: Option<MaintenanceRecord>,
}

/// Inspect the dataset at `uri`; `id_column` names the ids to check (default: the column it was written with).
pub async fn inspect(uri: &str, id_column: Option<&str>) -> Result<DatasetReport> {
    let ds = Dataset::open(uri).await.map_err(lance_err(uri))?;
    let id_column = &crate::lance::records::id_column_of(&ds, id_column);
    let fingerprint = fingerprint_of_dataset(&ds).map_err(|e| Error::lance_from(uri, e))?;
    let tags: BTreeMap<String, u64> =
        ds.tags().list().await.map_err(lance_err(uri))?.into_iter().map(|(name, t)| (name, t.version)).collect();
    let mut versions = Vec::new();
    for v in ds.versions().await.map_err(lance_err(uri))? {
        let (run, maintenance) = version_records(&ds, v.version).await?;
        versions.push(VersionReport {
            version: v.version,
            timestamp: v.timestamp.to_rfc3339(),
            tags: tags.iter().filter(|(_, tv)| **tv == v.version).map(|(n, _)| n.clone()).collect(),
            run,
            maintenance,
        });
    }
    let rows = ds.count_rows(None).await.map_err(lance_err(uri))? as u64;
    let ids = if ds.schema().field(id_column).is_some() {
        Some(check_ids(Arc::new(ds.clone()), id_column).await?)
    } else {
        None
    };
    let indices = indices(&ds).await?;
    Ok(DatasetReport {
        uri: uri.to_string(),
        version: ds.version().version,
        rows,
        fingerprint,
        ids,
        tags,
        indices,
        versions,
    })
}

/// Whether the ids are unique: distinct and NULL ids counted.
async fn check_ids(ds: Arc<Dataset>, column: &str) -> Result<IdReport> {
    let c = id_counts(ds, column, 0).await?;
    Ok(IdReport {
        column: column.to_string(),
        unique: c.nulls == 0 && c.duplicated == 0,
        distinct: c.distinct,
        nulls: c.nulls,
    })
}

/// A dataset's ids counted: `inspect`'s uniqueness and `verify`'s ids.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdCounts {
    pub rows: u64,
    pub distinct: u64,
    /// Rows whose id is NULL.
    pub nulls: u64,
    /// Ids held more than once, and up to the `examples` asked for of them.
    pub duplicated: u64,
    pub duplicated_examples: Vec<String>,
}

/// Count the ids of `ds` in one aggregation by id, read as it streams (DataFusion's hash aggregation: its
/// memory grows with the distinct ids, not with the rows).
pub async fn id_counts(ds: Arc<Dataset>, column: &str, examples: usize) -> Result<IdCounts> {
    use datafusion::arrow::array::{Array, AsArray};
    use futures::StreamExt;
    let uri = ds.uri().to_string();
    let df_err = |e: datafusion::error::DataFusionError| Error::lance_from(uri.clone(), e);
    let ctx = SessionContext::new();
    ctx.register_table("t", Arc::new(LanceTableProvider::new(ds, false, false))).map_err(df_err)?;
    let id = crate::lance::quote_ident(column);
    let sql = format!("SELECT {id}, count(*) FROM t GROUP BY {id}");
    let mut stream = ctx.sql(&sql).await.map_err(df_err)?.execute_stream().await.map_err(df_err)?;
    let mut out = IdCounts::default();
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(df_err)?;
        let keys = datafusion::arrow::compute::cast(batch.column(0), &datafusion::arrow::datatypes::DataType::Utf8)
            .map_err(|e| df_err(e.into()))?;
        let keys = keys.as_string::<i32>();
        let counts = batch.column(1).as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        for i in 0..batch.num_rows() {
            let n = counts.value(i).max(0) as u64;
            out.rows += n;
            if keys.is_null(i) {
                out.nulls += n;
                continue;
            }
            out.distinct += 1;
            if n > 1 {
                out.duplicated += 1;
                if out.duplicated_examples.len() < examples {
                    out.duplicated_examples.push(keys.value(i).to_string());
                }
            }
        }
    }
    Ok(out)
}

impl DatasetReport {
    /// The human-readable form.
    pub fn to_text(&self) -> String {
        let mut out = format!("dataset {}\n  version {}, {} rows\n", self.uri, self.version, self.rows);
        match &self.ids {
            Some(ids) if ids.unique => out += &format!("  ids ({}): unique\n", ids.column),
            Some(ids) => {
                out += &format!(
                    "  ids ({}): NOT unique: {} distinct, {} NULL, of {} rows\n",
                    ids.column, ids.distinct, ids.nulls, self.rows
                )
            }
            None => out += "  ids: no id column (name it with --id-column)\n",
        }
        match &self.fingerprint {
            Some(fp) => {
                out += "fingerprint\n";
                for (k, v) in fp.fields() {
                    out += &format!("  {k}: {v}\n");
                }
            }
            None => out += "fingerprint: none (not written by embed())\n",
        }
        // The newest write's model, from its training data on (scripts/export-onnx's lineage.json).
        if let Some(record) = self.versions.iter().rev().find_map(|v| v.run.as_ref()).and_then(|r| r.lineage.as_ref()) {
            out += "lineage (pipeline lineage --verify checks it)\n";
            for link in crate::campaign::lineage::chain(record) {
                out += &format!("  {}\n", link.to_text());
            }
        }
        if !self.tags.is_empty() {
            out += "tags\n";
            for (name, v) in &self.tags {
                out += &format!("  {name}: version {v}\n");
            }
        }
        if !self.indices.is_empty() {
            out += "indices\n";
            for i in &self.indices {
                out += &format!("  {}\n", i.summary());
            }
        }
        out += "versions\n";
        for v in &self.versions {
            out += &version_text(v);
        }
        out
    }
}

/// One version's line of the text: its time and tags, and what made it.
fn version_text(v: &VersionReport) -> String {
    let mut out = String::new();
    let tags = if v.tags.is_empty() { String::new() } else { format!(" [{}]", v.tags.join(", ")) };
    out += &format!("  {} {}{tags}", v.version, v.timestamp);
    match &v.run {
        Some(r) if r.images > 0 && r.processed_tokens == 0 => {
            out += &format!(
                ": {} rows, {} images ({} NULL, {} bad ones skipped), {:.1} megapixels decoded from {:.1} MB of files, \
                 {:.1} s, {:.1} images/s",
                r.rows_written,
                r.images,
                r.null_texts,
                r.skipped_images,
                r.image_pixels as f64 / 1e6,
                r.image_bytes as f64 / 1e6,
                r.wall_seconds,
                r.images as f64 / r.wall_seconds.max(1e-9)
            );
            out += &run_tail(r);
        }
        Some(r) => {
            out += &format!(
                ": {} rows, {} documents, {} NULL, {} useful / {} processed tokens (efficiency {:.3}), {} truncated ({} tokens dropped), {:.1} s, {:.0} useful tokens/s",
                r.rows_written,
                r.documents,
                r.null_texts,
                r.useful_tokens,
                r.processed_tokens,
                r.padding_efficiency,
                r.truncated_documents,
                r.dropped_tokens,
                r.wall_seconds,
                r.useful_tokens_per_second
            );
            out += &run_tail(r);
        }
        None => match &v.maintenance {
            Some(m) => out += &format!(": {}\n", m.summary()),
            None => out += ": no run record\n",
        },
    }
    out
}

/// The end of a run's line: its device and plan.
fn run_tail(r: &RunRecord) -> String {
    let mut out = String::new();
    if let Some(d) = &r.device {
        out += &format!(", {d}");
    }
    if let Some(p) = &r.plan {
        let completed = match p.units_done - p.units_done_before {
            0 => "no unit completed".to_string(),
            1 => format!("unit {} completed", p.units_done_before),
            _ => format!("units {}-{} completed", p.units_done_before, p.units_done - 1),
        };
        let digest = p.digest.get(..12).unwrap_or(&p.digest);
        out += &format!(
            ", from plan {} (plan.json sha256 {digest}…): {completed}, {} of {} done",
            p.path, p.units_done, p.units
        );
    }
    out + "\n"
}
