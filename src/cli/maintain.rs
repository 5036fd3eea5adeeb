//! `pipeline index DATASET` and `pipeline optimize DATASET`: a vector index for `pipeline search`, and
//! compaction with the cleanup of old versions; each leaves a record in the dataset's history.

use embedding_pipeline::lance::Metric;
use embedding_pipeline::lance::maintain::{self, IndexKind, IndexRequest};

/// Build the index and say what was built.
pub async fn index(
    dataset: &str,
    column: &str,
    kind: IndexKind,
    metric: Metric,
    partitions: Option<usize>,
    json: bool,
) -> anyhow::Result<()> {
    let request = IndexRequest { column: column.into(), kind, metric, partitions };
    let maintain::BuiltIndex { version, record, index: built } = maintain::index(dataset, &request).await?;
    if json {
        let out = serde_json::json!({ "version": version, "record": record, "index": built });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{dataset}: version {version}: {}", record.summary());
        if let Some(built) = &built {
            println!("built: {}", built.summary());
        }
        match metric {
            Metric::Cosine => println!("pipeline search and embed_search() use it; search --exact searches without it"),
            other => println!(
                "pipeline search --metric {} uses it (a search by another metric, embed_search()'s cosine included, \
                 is exact)",
                other.name()
            ),
        }
    }
    Ok(())
}

/// Compact and clean up, and say what was done.
pub async fn optimize(dataset: &str, older_than: &str, json: bool) -> anyhow::Result<()> {
    let report = maintain::optimize(dataset, older_than).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let c = &report.compaction;
        match report.compacted_version {
            Some(v) => println!(
                "compaction: {} fragments rewritten into {} ({} files removed, {} added), version {v}",
                c.fragments_removed, c.fragments_added, c.files_removed, c.files_added
            ),
            None => println!("compaction: nothing to compact"),
        }
        let k = &report.cleanup;
        println!(
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
        println!("recorded in version {} ({:.1} s)", report.version, report.seconds);
    }
    Ok(())
}
