//! Integrity under concurrency and at the edges of the output: two writes racing for one new output, and
//! outputs that are not Lance datasets, each refused before anything is embedded.

use datafusion::physical_plan::collect;

use crate::common::{scalar_i64, session, sql, write_jsonl};

const ROWS: [(&str, Option<&str>); 4] = [
    ("a", Some("Rust is a systems programming language.")),
    ("b", Some("Lance is a columnar format for machine learning.")),
    ("c", Some("The weather is lovely today.")),
    ("d", Some("DataFusion plans and runs SQL queries over Arrow data.")),
];

/// A session with `docs` over a small corpus in `dir`, and the COPY that embeds it into `out`.
async fn job(dir: &std::path::Path, out: &str) -> (embedding_pipeline::EmbedSession, String) {
    let corpus = dir.join("docs.jsonl");
    if !corpus.exists() {
        write_jsonl(&corpus, &ROWS);
    }
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'", corpus.display())).await.unwrap();
    (s, format!("COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{out}' STORED AS LANCE"))
}

async fn rows_and_ids(out: &str) -> (i64, i64) {
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE o STORED AS LANCE LOCATION '{out}'")).await.unwrap();
    let rows = scalar_i64(&sql(&s, "SELECT count(*) FROM o").await.unwrap());
    (rows, scalar_i64(&sql(&s, "SELECT count(DISTINCT id) FROM o").await.unwrap()))
}

/// The race found by starting two runs a second apart: the second decided "new output" before the first
/// created it, then wrote every id again. Here the second write is analysed (where resume is decided)
/// before the first runs, and planned and executed after it: it must skip every id the first wrote.
#[tokio::test]
async fn a_write_analysed_before_another_created_the_output_skips_its_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance").display().to_string();
    let (first, copy) = job(tmp.path(), &out).await;
    let (second, _) = job(tmp.path(), &out).await;
    let state = second.context().state();
    let analysed = state.optimize(&state.create_logical_plan(&copy).await.unwrap()).unwrap();

    sql(&first, &copy).await.unwrap();
    let physical = state.query_planner().create_physical_plan(&analysed, &state).await.unwrap();
    let written = collect(physical, second.context().task_ctx()).await.unwrap();
    assert_eq!(scalar_i64(&written), 0, "every id was already written by the first run");
    assert_eq!(rows_and_ids(&out).await, (4, 4));
    assert_eq!(second.metrics().embed_stats().docs, 0, "nothing embedded twice");
}

/// The write lock is taken when a write is planned, so a run planned first keeps the output and a run
/// planned while it holds it is refused rather than writing the same ids.
#[tokio::test]
async fn a_write_planned_first_holds_the_output_until_it_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance").display().to_string();
    let (first, copy) = job(tmp.path(), &out).await;
    let (second, _) = job(tmp.path(), &out).await;
    let planned = first.context().sql(&copy).await.unwrap().create_physical_plan().await.unwrap();

    let err = sql(&second, &copy).await.unwrap_err().to_string();
    assert!(err.contains("another pipeline run is writing to"), "{err}");
    assert_eq!(second.metrics().embed_stats().docs, 0);
    collect(planned, first.context().task_ctx()).await.unwrap();
    assert_eq!(rows_and_ids(&out).await, (4, 4));
    // Once the first write's plan is gone, the output is free again, and a rerun writes nothing new.
    assert_eq!(scalar_i64(&sql(&second, &copy).await.unwrap()), 0);
}

#[tokio::test]
async fn an_output_that_is_a_file_is_refused_before_embedding() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance");
    std::fs::write(&out, "not a dataset").unwrap();
    let (s, copy) = job(tmp.path(), &out.display().to_string()).await;
    let err = sql(&s, &copy).await.unwrap_err().to_string();
    assert!(err.contains(&out.display().to_string()) && err.contains("is a file, not a Lance dataset"), "{err}");
    assert_eq!(s.metrics().embed_stats().docs, 0, "refused before any embedding");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "not a dataset");
}

#[tokio::test]
async fn a_directory_of_other_files_is_refused_and_left_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("results");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let (s, copy) = job(tmp.path(), &out.display().to_string()).await;
    let err = sql(&s, &copy).await.unwrap_err().to_string();
    assert!(err.contains("is a directory that is not a Lance dataset (it holds notes.txt)"), "{err}");
    assert_eq!(s.metrics().embed_stats().docs, 0);
    let names: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["notes.txt"]);
}

/// An empty directory, and a dataset whose first commit was killed (data files, no manifest), are
/// outputs to write into.
#[tokio::test]
async fn an_empty_directory_and_an_unfinished_first_commit_are_written_into() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty.lance");
    std::fs::create_dir(&empty).unwrap();
    let unfinished = tmp.path().join("unfinished.lance");
    std::fs::create_dir_all(unfinished.join("data")).unwrap();
    std::fs::write(unfinished.join("data/orphan.lance"), "left by a killed commit").unwrap();
    for out in [empty, unfinished] {
        let out = out.display().to_string();
        let (s, copy) = job(tmp.path(), &out).await;
        assert_eq!(scalar_i64(&sql(&s, &copy).await.unwrap()), 4, "{out}");
        assert_eq!(rows_and_ids(&out).await, (4, 4));
    }
}

/// A write that fails partway keeps the rows already embedded (committed as the write's last version)
/// and says what failed; a rerun after the fix resumes from them.
#[tokio::test]
async fn a_write_that_fails_partway_keeps_the_rows_embedded_before() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance").display().to_string();
    let corpus = tmp.path().join("docs.jsonl");
    let long = "word ".repeat(400);
    let mut rows: Vec<(String, Option<&str>)> =
        (0..300).map(|i| (format!("doc-{i:03}"), Some("a short text"))).collect();
    rows.push(("doc-long".into(), Some(long.as_str())));
    let rows: Vec<(&str, Option<&str>)> = rows.iter().map(|(id, t)| (id.as_str(), *t)).collect();
    write_jsonl(&corpus, &rows);
    let s = session();
    sql(
        &s,
        &format!(
            "SET embed.order = 'original'; SET embed.truncation = 'error'; SET datafusion.execution.target_partitions = 1;
             CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'",
            corpus.display()
        ),
    )
    .await
    .unwrap();
    let copy = format!("COPY (SELECT id, embed(text, id) AS embedding FROM docs) TO '{out}' STORED AS LANCE");
    let err = sql(&s, &copy).await.unwrap_err().to_string();
    assert!(err.contains("id doc-long has") && err.contains("embed.truncation = 'error'"), "{err}");
    let (kept, distinct) = rows_and_ids(&out).await;
    // In the original order, rows go to the model 32 at a time: the nine calls before the one holding the
    // long text embedded 288 rows, all kept; the failed call's other 12 rows were never embedded.
    assert_eq!((kept, distinct), (288, 288));
}
