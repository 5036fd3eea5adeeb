//! `pipeline index`, `pipeline optimize` and SQL's `embed_search()` on 1,000 real fortunes: the index is
//! built, seen by pylance and used by search; optimize compacts a campaign's many commits, keeps tagged
//! versions, leaves the vectors as they were; each leaves its record in the dataset's history.

use std::path::Path;

use serde_json::Value;

use crate::common::model_dir;
use crate::common::{pipeline, text};

fn fortunes() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/fortunes.jsonl").display().to_string()
}

/// The first `n` fortunes into `dir/docs.jsonl`, embedded into `out/docs.lance` with a commit every 100 rows,
/// the run's version tagged `tag` when given.
fn embed_fortunes(dir: &Path, n: usize, tag: Option<&str>) {
    let lines: Vec<String> = std::fs::read_to_string(fortunes()).unwrap().lines().take(n).map(String::from).collect();
    std::fs::write(dir.join("docs.jsonl"), lines.join("\n") + "\n").unwrap();
    let tag = tag.map(|t| format!("SET embed.tag = '{t}';")).unwrap_or_default();
    let sql = format!(
        "SET embed.model = '{}';\nSET embed.commit_rows = 100;\n{tag}\n\
         CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out/docs.lance' STORED AS LANCE;\n",
        model_dir().display()
    );
    std::fs::write(dir.join("job.sql"), sql).unwrap();
    let o = pipeline(&["run", "-q", "job.sql"], dir);
    assert!(o.status.success(), "{:?}", text(&o));
}

fn json(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "{:?}", text(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {:?}", text(o)))
}

fn ids(rows: &Value) -> Vec<String> {
    rows.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect()
}

const PYLANCE_INDICES: &str = r#"
import json, sys, lance
ds = lance.dataset(sys.argv[1])
print(json.dumps([{"name": i["name"], "type": i["type"]} for i in ds.list_indices()]))
"#;

#[test]
fn an_index_is_built_recorded_seen_by_pylance_and_used_by_search_and_embed_search() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    embed_fortunes(dir, 1000, None);
    let query = "a dog that can talk";
    let exact = json(&pipeline(&["search", "--json", "out/docs.lance", query, "--exact"], dir));

    let o = pipeline(&["index", "out/docs.lance"], dir);
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("pipeline search and embed_search() use it"), "{out}{err}");
    // Lance's warning about its own future default is not the user's to act on.
    assert!(!err.contains("LANCE_INCLUDE_VECTOR_CENTROIDS") && !err.contains("WARN"), "{err}");
    assert!(
        out.contains("index (pipeline ") && out.contains("ivf_pq index embedding_idx on embedding (cosine), 1000 rows"),
        "{out}"
    );
    let py: Value = serde_json::from_str(&crate::common::python(
        PYLANCE_INDICES,
        &[&dir.join("out/docs.lance").display().to_string()],
        &[],
    ))
    .unwrap();
    assert_eq!(py[0]["name"], "embedding_idx", "{py}");
    assert!(py[0]["type"].as_str().unwrap().contains("PQ"), "{py}");

    // Through the index, its candidates re-ranked by their stored vectors (--refine 10): nearly all the exact
    // hits, at their exact distances. (Lance's k-means is not seeded: a recall bound, not an order.)
    let indexed = json(&pipeline(&["search", "--json", "out/docs.lance", query], dir));
    let (exact_ids, indexed_ids) = (ids(&exact), ids(&indexed));
    let shared = indexed_ids.iter().filter(|i| exact_ids.contains(i)).count();
    assert!(shared >= 8, "exact {exact_ids:?}, indexed {indexed_ids:?}");
    let distance = |rows: &Value, id: &str| {
        rows.as_array().unwrap().iter().find(|r| r["id"] == id).map(|r| r["_distance"].as_f64().unwrap())
    };
    for id in indexed_ids.iter().filter(|i| exact_ids.contains(i)) {
        let (a, b) = (distance(&indexed, id).unwrap(), distance(&exact, id).unwrap());
        assert!((a - b).abs() <= 1e-5, "{id}: re-ranked {a}, exact {b}");
    }
    // Without re-ranking, the index's own approximate order; 0 is refused.
    let approximate = json(&pipeline(&["search", "--json", "out/docs.lance", query, "--refine", "1"], dir));
    assert_eq!(approximate.as_array().unwrap().len(), 10);
    let o = pipeline(&["search", "out/docs.lance", query, "--refine", "0"], dir);
    assert!(!o.status.success() && text(&o).1.contains("--refine"), "{:?}", text(&o));

    // The same search in SQL, joined back to the source's text.
    let sql = format!(
        "SELECT h.id, h._distance, d.text FROM embed_search('out/docs.lance', '{query}', 10) h JOIN docs d USING (id) \
         ORDER BY h._distance"
    );
    let create = "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl'";
    let rows = json(&pipeline(&["run", "-q", "--format", "json", "-c", create, "-c", &sql], dir));
    assert_eq!(ids(&rows), indexed_ids);
    for (a, b) in rows.as_array().unwrap().iter().zip(indexed.as_array().unwrap()) {
        assert!((a["_distance"].as_f64().unwrap() - b["_distance"].as_f64().unwrap()).abs() <= 1e-6);
    }
    assert!(rows[0]["text"].as_str().unwrap().to_lowercase().contains("dog"), "{rows}");
    let rows = json(&pipeline(
        &["run", "-q", "--format", "json", "-c", "SELECT count(*) AS n FROM embed_search('out/docs.lance', 'x')"],
        dir,
    ));
    assert_eq!(rows[0]["n"], 10, "k defaults to 10");

    // inspect shows the index's version as what it is, not as a version without a run record, and the index
    // as Lance built it.
    let report = json(&pipeline(&["inspect", "--json", "out/docs.lance"], dir));
    let index = &report["indices"][0];
    assert_eq!(
        (index["name"].as_str(), index["column"].as_str()),
        (Some("embedding_idx"), Some("embedding")),
        "{report}"
    );
    assert!(index["index_type"].as_str().unwrap().contains("PQ"), "{index}");
    assert_eq!((index["partitions"].as_u64(), index["indexed_rows"].as_u64()), (Some(1), Some(1000)), "{index}");
    let last = report["versions"].as_array().unwrap().last().unwrap().clone();
    assert!(last["run"].is_null(), "{last}");
    assert_eq!(last["maintenance"]["command"], "index");
    assert_eq!(last["maintenance"]["index"]["kind"], "ivf_pq");
    assert_eq!(last["maintenance"]["index"]["sub_vectors"], 24, "384 dimensions, 16 a sub-vector");
    let (out, _) = text(&pipeline(&["inspect", "out/docs.lance"], dir));
    assert!(out.contains(": index (pipeline ") && !out.contains("no run record"), "{out}");
    assert!(out.contains("indices\n  embedding_idx on embedding: IVF_PQ, 1 partition, 1000 rows indexed"), "{out}");

    // The partitions asked for are recorded as such; the index shows those Lance trained (fewer: PQ on 1,000
    // vectors trains 3 of 8 here).
    let v = json(&pipeline(&["index", "out/docs.lance", "--partitions", "8", "--json"], dir));
    assert_eq!(v["record"]["index"]["partitions"], 8, "{v}");
    assert!(v["index"]["partitions"].as_u64().is_some_and(|p| (1..8).contains(&p)), "{v}");

    // Rebuilt as another kind: it replaces the index, in a new version.
    let o = pipeline(&["index", "out/docs.lance", "--kind", "ivf_hnsw_sq", "--json"], dir);
    let v = json(&o);
    assert_eq!(v["record"]["index"]["replaced"], true, "{v}");
    assert_eq!(v["record"]["index"]["kind"], "ivf_hnsw_sq");
    let hnsw = json(&pipeline(&["search", "--json", "out/docs.lance", query], dir));
    let shared = ids(&hnsw).iter().filter(|i| exact_ids.contains(i)).count();
    assert!(shared >= 5, "{hnsw}");

    // Failures are named: a bad query to embed_search, a missing column, a dataset too small for PQ.
    let o = pipeline(&["run", "-c", "SELECT * FROM embed_search('out/docs.lance')"], dir);
    assert!(
        !o.status.success() && text(&o).1.contains("embed_search('dataset', 'query text' [, k])"),
        "{:?}",
        text(&o)
    );
    for (sql, says) in [
        ("SELECT * FROM embed_search('out/docs.lance', 'x', 2.5)", "k, how many rows, must be a whole number"),
        ("SELECT * FROM embed_search('out/docs.lance', 'x', 0)", "k, how many rows, must be a whole number"),
        ("SELECT * FROM embed_search('out/docs.lance', NULL)", "the query must be a text constant"),
    ] {
        let o = pipeline(&["run", "-c", sql], dir);
        assert!(!o.status.success() && text(&o).1.contains(says), "{sql}: {:?}", text(&o));
    }
    let o = pipeline(&["run", "-c", "SELECT * FROM embed_search('nowhere.lance', 'x', 3)"], dir);
    assert!(!o.status.success() && text(&o).1.contains("nowhere.lance"), "{:?}", text(&o));
    let o = pipeline(&["index", "out/docs.lance", "--column", "vec"], dir);
    assert!(!o.status.success() && text(&o).1.contains("no column `vec`"), "{:?}", text(&o));
    let small = tempfile::tempdir().unwrap();
    embed_fortunes(small.path(), 100, None);
    let o = pipeline(&["index", "out/docs.lance"], small.path());
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("at least 256 vectors and there are 100"), "{err}");
    let o = pipeline(&["index", "out/docs.lance", "--kind", "ivf_hnsw_sq", "--metric", "l2"], small.path());
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("pipeline search --metric l2 uses it"), "{out}{err}");
    assert!(out.contains("built: embedding_idx on embedding: IVF_HNSW_SQ"), "{out}");
}

#[test]
fn optimize_compacts_a_campaigns_commits_keeps_tagged_versions_and_the_vectors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Two runs, about 100 rows a commit: some versions (the last tagged), then some more.
    embed_fortunes(dir, 500, Some("half"));
    embed_fortunes(dir, 1000, None);
    let before = json(&pipeline(&["inspect", "--json", "out/docs.lance"], dir));
    let tagged = before["tags"]["half"].as_u64().unwrap();
    let commits = before["versions"].as_array().unwrap().len();
    assert!(commits >= 6, "{before}");
    copy_dir(&dir.join("out/docs.lance"), &dir.join("before.lance"));

    let report = json(&pipeline(&["optimize", "out/docs.lance", "--older-than", "0s", "--json"], dir));
    let removed = report["compaction"]["fragments_removed"].as_u64().unwrap();
    assert!(removed as usize >= commits - 1, "one fragment a commit, {commits} commits: {report}");
    assert_eq!(report["compaction"]["fragments_added"], 1, "{report}");
    assert!(report["cleanup"]["versions_removed"].as_u64().unwrap() as usize >= commits - 1, "{report}");
    assert_eq!(report["cleanup"]["tagged_kept"], serde_json::json!([tagged]));

    let after = json(&pipeline(&["inspect", "--json", "out/docs.lance"], dir));
    assert_eq!((after["rows"].as_u64(), after["ids"]["unique"].as_bool()), (Some(1000), Some(true)), "{after}");
    let versions: Vec<u64> =
        after["versions"].as_array().unwrap().iter().map(|v| v["version"].as_u64().unwrap()).collect();
    let compacted = report["compacted_version"].as_u64().unwrap();
    assert_eq!(versions, [tagged, compacted, compacted + 1], "the tagged one, compaction's, and optimize's record");
    let last = after["versions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["maintenance"]["command"], "optimize", "{last}");
    assert_eq!(last["maintenance"]["compaction"]["fragments_removed"], removed);
    // The vectors are the same, and the tagged version still reads as it was.
    let o = pipeline(&["compare", "--json", "before.lance", "out/docs.lance"], dir);
    crate::common::assert_same_vectors(&o, 1000);
    let o = pipeline(&["compare", "--json", &format!("before.lance@{tagged}"), "out/docs.lance@half"], dir);
    crate::common::assert_same_vectors(&o, 500);
    // Search still finds the model through the run records left.
    let hits = json(&pipeline(&["search", "--json", "out/docs.lance", "a dog that can talk", "-k", "3"], dir));
    assert_eq!(hits.as_array().unwrap().len(), 3);
    // The run records' versions all removed (the tag deleted first): search and lineage still find the model,
    // through the run record optimize's own record carries.
    let o = crate::common::python(
        "import sys, lance; lance.dataset(sys.argv[1]).tags.delete('half')",
        &[&dir.join("out/docs.lance").display().to_string()],
        &[],
    );
    assert!(o.trim().is_empty(), "{o}");
    let report = json(&pipeline(&["optimize", "out/docs.lance", "--older-than", "0s", "--json"], dir));
    assert!(report["cleanup"]["versions_removed"].as_u64().unwrap() >= 1, "{report}");
    let after = json(&pipeline(&["inspect", "--json", "out/docs.lance"], dir));
    assert!(after["versions"].as_array().unwrap().iter().all(|v| v["run"].is_null()), "{after}");
    let hits = json(&pipeline(&["search", "--json", "out/docs.lance", "a dog that can talk", "-k", "3"], dir));
    assert_eq!(hits.as_array().unwrap().len(), 3);
    let o = pipeline(&["lineage", "out/docs.lance"], dir);
    let (out, _) = text(&o);
    assert!(o.status.success() && out.contains("all-MiniLM-L6-v2") && !out.contains("is not recorded"), "{out}");
    let o = pipeline(&["optimize", "out/docs.lance@1"], dir);
    assert!(!o.status.success() && text(&o).1.contains("give out/docs.lance"), "{:?}", text(&o));
    // A second optimize has nothing to compact, and says so; a bad age is refused.
    let (out, err) = text(&pipeline(&["optimize", "out/docs.lance"], dir));
    assert!(out.contains("compaction: nothing to compact") && out.contains("older than 7d"), "{out}{err}");
    let o = pipeline(&["optimize", "out/docs.lance", "--older-than", "soon"], dir);
    assert!(!o.status.success() && text(&o).1.contains("--older-than soon"), "{:?}", text(&o));
}

/// `pipeline ARGS` in `dir`, started, its output dropped.
fn spawn(args: &[&str], dir: &Path) -> std::process::Child {
    crate::common::command(args, dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn index_and_optimize_wait_for_a_write_and_a_kill_leaves_the_dataset_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    embed_fortunes(dir, 1000, None);
    copy_dir(&dir.join("out/docs.lance"), &dir.join("before.lance"));
    let before = json(&pipeline(&["inspect", "--json", "out/docs.lance"], dir));
    let versions =
        |v: &Value| v["versions"].as_array().unwrap().iter().map(|v| v["version"].clone()).collect::<Vec<_>>();

    // A write holds the dataset's lock (as pipeline run takes it): index and optimize are refused, and say so.
    let lock_path = dir.join("out/.docs.lance.lock");
    let lock = std::fs::OpenOptions::new().create(true).truncate(true).write(true).open(&lock_path).unwrap();
    std::io::Write::write_all(&mut &lock, b"pipeline run (process 1)").unwrap();
    lock.try_lock().unwrap();
    for args in [&["index", "out/docs.lance"][..], &["optimize", "out/docs.lance", "--older-than", "0s"]] {
        let o = pipeline(args, dir);
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains("another pipeline run is writing to"), "{args:?}: {err}");
    }
    drop(lock);
    assert_eq!(versions(&json(&pipeline(&["inspect", "--json", "out/docs.lance"], dir))), versions(&before));

    // Killed in the middle of building the index (SIGKILL, then ctrl-C's SIGINT): the dataset stays at its
    // version, with no index, and the vectors as they were; the lock goes with the process.
    for signal in ["-KILL", "-INT"] {
        let mut child = spawn(&["index", "out/docs.lance", "--kind", "ivf_hnsw_sq"], dir);
        // Once it holds the lock, the build has begun; it takes about 0.3 s after that on 1,000 vectors here.
        let started = std::time::Instant::now();
        while !std::fs::read_to_string(&lock_path).unwrap_or_default().contains("pipeline index") {
            assert!(started.elapsed().as_secs() < 60 && child.try_wait().unwrap().is_none(), "index never started");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(child.try_wait().unwrap().is_none(), "the build ended before the kill: kill sooner");
        let killed = std::process::Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap();
        assert!(killed.success());
        let status = child.wait().unwrap();
        assert!(!status.success(), "{signal}: {status:?}");
        let after = json(&pipeline(&["inspect", "--json", "out/docs.lance"], dir));
        assert_eq!(versions(&after), versions(&before), "{signal}: no new version: {after}");
        let o = crate::common::python(PYLANCE_INDICES, &[&dir.join("out/docs.lance").display().to_string()], &[]);
        assert_eq!(o.trim(), "[]", "{signal}: no index");
    }
    let o = pipeline(&["compare", "--json", "before.lance", "out/docs.lance"], dir);
    crate::common::assert_same_vectors(&o, 1000);
    // Run again, it builds the index.
    let o = pipeline(&["index", "out/docs.lance"], dir);
    assert!(o.status.success(), "{:?}", text(&o));

    // Killed while optimizing: whatever had committed stays (a compaction is one commit, a cleanup removes only
    // what no kept version needs); the dataset reads whole, the same vectors, and a rerun completes.
    let mut child = spawn(&["optimize", "out/docs.lance", "--older-than", "0s"], dir);
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&lock_path).unwrap_or_default().contains("pipeline optimize")
        && child.try_wait().unwrap().is_none()
    {
        assert!(started.elapsed().as_secs() < 60, "optimize never started");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let _ = std::process::Command::new("kill").args(["-KILL", &child.id().to_string()]).status();
    let _ = child.wait();
    let after = json(&pipeline(&["inspect", "--json", "out/docs.lance"], dir));
    assert_eq!((after["rows"].as_u64(), after["ids"]["unique"].as_bool()), (Some(1000), Some(true)), "{after}");
    let o = pipeline(&["compare", "--json", "before.lance", "out/docs.lance"], dir);
    crate::common::assert_same_vectors(&o, 1000);
    let report = json(&pipeline(&["optimize", "out/docs.lance", "--older-than", "0s", "--json"], dir));
    assert!(report["version"].as_u64().is_some(), "{report}");
    let o = pipeline(&["compare", "--json", "before.lance", "out/docs.lance"], dir);
    crate::common::assert_same_vectors(&o, 1000);
    let hits = json(&pipeline(&["search", "--json", "out/docs.lance", "a dog that can talk", "-k", "3"], dir));
    assert_eq!(hits.as_array().unwrap().len(), 3);
}
