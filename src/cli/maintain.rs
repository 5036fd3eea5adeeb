//! `pipeline index DATASET` and `pipeline optimize DATASET`: a vector index for `pipeline search`, and
//! compaction with the cleanup of old versions; each leaves a record in the dataset's history.

use anyhow::{Context, bail};

use crate::lance::inspect::indices;
use crate::lance::lock::{Holder, WriteLock};
use crate::lance::maintain::{self, IndexKind, IndexRequest};
use crate::lance::{Metric, dataset_uri, open_dataset};

/// Build the index and say what was built.
pub async fn index(
    dataset: &str,
    column: &str,
    kind: IndexKind,
    metric: Metric,
    partitions: Option<usize>,
    json: bool,
) -> anyhow::Result<()> {
    latest_only(dataset, "index")?;
    let mut ds = open_dataset(dataset).await?;
    let _lock = locked(&mut ds, dataset, Holder::Index).await?;
    let request = IndexRequest { column: column.into(), kind, metric, partitions };
    let (version, record) = maintain::build_index(&mut ds, &request).await?;
    // As Lance built it: the partitions it trained may be fewer than asked for.
    let name = record.index.as_ref().map(|i| i.name.clone()).unwrap_or_default();
    let built = indices(&ds).await?.into_iter().find(|i| i.name == name);
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
    let age = humantime::parse_duration(older_than.trim())
        .with_context(|| format!("--older-than {older_than}: give a duration such as 7d, 36h or 0s"))?;
    latest_only(dataset, "optimize")?;
    let mut ds = open_dataset(dataset).await?;
    let _lock = locked(&mut ds, dataset, Holder::Optimize).await?;
    let report = maintain::optimize(&mut ds, age, older_than).await?;
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

/// The dataset's write lock, taken once the dataset is known to be there, and the dataset as it is under it
/// (a write may have committed between the open and the lock).
async fn locked(ds: &mut lance::Dataset, dataset: &str, holder: Holder) -> anyhow::Result<WriteLock> {
    // The URI a write locks (see crate::lance::LanceSink).
    let lock = WriteLock::acquire(&dataset_uri(dataset), holder)?;
    let uri = ds.uri().to_string();
    ds.checkout_latest().await.map_err(crate::lance::lance_err(&uri))?;
    Ok(lock)
}

/// Refuse `path@version` and `path@tag`: maintenance commits onto the latest version, not an older checkout.
fn latest_only(dataset: &str, command: &str) -> anyhow::Result<()> {
    if let Some((path, at)) = dataset.rsplit_once('@')
        && !at.is_empty()
        && !at.contains('/')
    {
        bail!("{dataset}: {command} works on a dataset's latest version; give {path}");
    }
    Ok(())
}
