//! `pipeline index DATASET` and `pipeline optimize DATASET`: a vector index for `pipeline search`, and
//! compaction with the cleanup of old versions; each leaves a record in the dataset's history.

use super::ExitStatus;
use super::args::{IndexKindArg, MetricArg, at_least};
use super::printer::{Printer, out};
use embedding_pipeline::lance::Metric;
use embedding_pipeline::ops::maintain::{self, IndexOptions};

/// `pipeline index`'s arguments.
#[derive(Debug, clap::Args)]
pub struct IndexArgs {
    /// The Lance dataset.
    dataset: String,
    /// ivf_pq (small, fast; needs 256 rows) or ivf_hnsw_sq (more recall, more memory).
    #[arg(long, value_enum, default_value_t = IndexKindArg::IvfPq)]
    kind: IndexKindArg,
    /// The metric searches must use for the index to serve them.
    #[arg(long, value_enum, default_value_t = MetricArg::Cosine)]
    metric: MetricArg,
    /// The vector column.
    #[arg(long, default_value = "embedding")]
    column: String,
    /// IVF partitions (default: Lance's choice from the row count).
    #[arg(long, value_parser = at_least::<1>)]
    partitions: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `pipeline optimize`'s arguments.
#[derive(Debug, clap::Args)]
pub struct OptimizeArgs {
    /// The Lance dataset.
    dataset: String,
    /// Remove versions older than this (0s: all but tagged ones and the latest). Their run records go
    /// with them: tag a version (embed.tag) to keep it.
    #[arg(long, default_value = "7d", value_name = "DURATION")]
    older_than: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Build the index and say what was built.
pub async fn index(args: IndexArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let IndexArgs { dataset, kind, metric, column, partitions, json } = args;
    let (kind, metric, partitions) = (kind.into(), Metric::from(metric), partitions.map(|p| p as usize));
    let request = IndexOptions { column, kind, metric, partitions };
    let report = maintain::index(&dataset, &request).await?;
    if json {
        out!(printer, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!(printer, "{dataset}: version {}: {}", report.version, report.record.summary());
        if let Some(built) = &report.index {
            out!(printer, "built: {}", built.summary());
        }
        match metric {
            Metric::Cosine => {
                out!(printer, "pipeline search and embed_search() use it; search --exact searches without it")
            }
            other => out!(
                printer,
                "pipeline search --metric {} uses it (a search by another metric, embed_search()'s cosine included, \
                 is exact)",
                other.name()
            ),
        }
    }
    Ok(ExitStatus::Success)
}

/// Compact and clean up, and say what was done.
pub async fn optimize(args: OptimizeArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let OptimizeArgs { dataset, older_than, json } = args;
    let report = maintain::optimize(&dataset, &older_than).await?;
    if json {
        out!(printer, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        let c = &report.compaction;
        match report.compacted_version {
            Some(v) => out!(
                printer,
                "compaction: {} fragments rewritten into {} ({} files removed, {} added), version {v}",
                c.fragments_removed,
                c.fragments_added,
                c.files_removed,
                c.files_added
            ),
            None => out!(printer, "compaction: nothing to compact"),
        }
        let k = &report.cleanup;
        out!(
            printer,
            "cleanup: {} version{} older than {older_than} removed, {} bytes freed{}",
            k.versions_removed,
            if k.versions_removed == 1 { "" } else { "s" },
            k.bytes_removed,
            if k.tagged_kept.is_empty() {
                String::new()
            } else {
                format!("; tagged versions kept: {:?}", k.tagged_kept)
            }
        );
        out!(printer, "recorded in version {} ({:.1} s)", report.version, report.seconds);
    }
    Ok(ExitStatus::Success)
}
