//! SQL end to end: every source format, COPY into Lance and appending, INSERT INTO, reading versions,
//! joining vectors back to their source rows, and a COPY that fails halfway.

use std::path::Path;

use datafusion::arrow::datatypes::DataType;
use lance::Dataset;

use crate::common::{cosine, norm, scalar_i64, session, sql, strings, vectors, write_jsonl};

const ROWS: [(&str, Option<&str>); 5] = [
    ("a", Some("Rust is a systems programming language.")),
    ("b", Some("Lance is a columnar format for machine learning.")),
    ("c", Some("The weather is lovely today.")),
    ("d", Some("")),
    ("e", Some("DataFusion plans and runs SQL queries over Arrow data.")),
];

fn corpus(dir: &Path) -> String {
    let path = dir.join("docs.jsonl");
    write_jsonl(&path, &ROWS);
    path.display().to_string()
}

#[tokio::test]
async fn every_source_format_gives_the_same_vectors() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().display();
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'", corpus(tmp.path()))).await.unwrap();
    // Write the same rows in every other format, through DataFusion's own writers.
    sql(
        &s,
        &format!(
            "COPY (SELECT * FROM docs) TO '{d}/docs.parquet' STORED AS PARQUET;
             COPY (SELECT * FROM docs) TO '{d}/docs.csv' STORED AS CSV OPTIONS ('format.has_header' 'true');
             COPY (SELECT * FROM docs) TO '{d}/docs.arrow' STORED AS ARROW;
             COPY (SELECT * FROM docs) TO '{d}/docs.lance' STORED AS LANCE;"
        ),
    )
    .await
    .unwrap();
    let reference = vectors(&sql(&s, "SELECT id, embed(text) AS v FROM docs ORDER BY id").await.unwrap(), "v");
    for (name, ddl) in [
        ("parquet", format!("STORED AS PARQUET LOCATION '{d}/docs.parquet'")),
        ("csv", format!("STORED AS CSV LOCATION '{d}/docs.csv' OPTIONS ('format.has_header' 'true')")),
        ("arrow", format!("STORED AS ARROW LOCATION '{d}/docs.arrow'")),
        ("lance", format!("STORED AS LANCE LOCATION '{d}/docs.lance'")),
    ] {
        sql(&s, &format!("CREATE EXTERNAL TABLE t_{name} {ddl}")).await.unwrap();
        let b = sql(&s, &format!("SELECT id, embed(text) AS v FROM t_{name} ORDER BY id")).await.unwrap();
        assert_eq!(strings(&b, "id"), ["a", "b", "c", "d", "e"], "{name}");
        for (got, want) in vectors(&b, "v").iter().zip(&reference) {
            match (got, want) {
                (Some(g), Some(w)) => assert!(cosine(g, w) > 0.99999, "{name}: cosine {}", cosine(g, w)),
                // CSV reads an empty field as NULL.
                (None, Some(_)) if name == "csv" => {}
                other => panic!("{name}: {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn copy_creates_then_appends_only_new_ids_in_versions_that_stay_readable() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance");
    let o = out.display();
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'", corpus(tmp.path()))).await.unwrap();
    let first = format!("COPY (SELECT id, embed(text) AS embedding FROM docs WHERE id < 'c') TO '{o}' STORED AS LANCE");
    assert_eq!(scalar_i64(&sql(&s, &first).await.unwrap()), 2, "COPY reports rows written");
    let all = format!("COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{o}' STORED AS LANCE");
    assert_eq!(scalar_i64(&sql(&s, &all).await.unwrap()), 3, "only the ids not yet written");
    let embedded_before = s.metrics().embed_stats().docs;
    assert_eq!(scalar_i64(&sql(&s, &all).await.unwrap()), 0, "a rerun writes nothing");
    assert_eq!(s.metrics().embed_stats().docs, embedded_before, "and embeds nothing");

    let ds = Dataset::open(&o.to_string()).await.unwrap();
    assert_eq!(ds.version().version, 2);
    assert_eq!(ds.count_rows(None).await.unwrap(), 5);
    let field = ds.schema().field("embedding").unwrap();
    let arrow_field = datafusion::arrow::datatypes::Field::from(field);
    match arrow_field.data_type() {
        DataType::FixedSizeList(child, 384) => assert_eq!(child.data_type(), &DataType::Float32),
        other => panic!("embedding stored as {other}"),
    }
    let writes = s.metrics().writes();
    assert_eq!(writes.iter().map(|w| w.version).collect::<Vec<_>>(), [1, 2]);

    // The first version is still there, and reads from SQL.
    sql(&s, &format!("CREATE EXTERNAL TABLE v1 STORED AS LANCE LOCATION '{o}' OPTIONS ('version' '1')")).await.unwrap();
    assert_eq!(scalar_i64(&sql(&s, "SELECT count(*) FROM v1").await.unwrap()), 2);
    sql(&s, &format!("CREATE EXTERNAL TABLE latest STORED AS LANCE LOCATION '{o}'")).await.unwrap();
    assert_eq!(scalar_i64(&sql(&s, "SELECT count(DISTINCT id) FROM latest").await.unwrap()), 5);
    let err = sql(&s, "INSERT INTO v1 SELECT * FROM latest").await.unwrap_err().to_string();
    assert!(err.contains("pinned to version 1"), "{err}");
}

#[tokio::test]
async fn explain_shows_the_resume_anti_join() {
    let tmp = tempfile::tempdir().unwrap();
    let o = tmp.path().join("out.lance").display().to_string();
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'", corpus(tmp.path()))).await.unwrap();
    let copy = format!("COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{o}' STORED AS LANCE");
    // Planned even before the output exists: another run may create it before this one executes.
    let before = crate::common::strings(&sql(&s, &format!("EXPLAIN {copy}")).await.unwrap(), "plan").join("\n");
    assert!(before.contains("RightAnti") && before.contains("__done_ids"), "{before}");
    // The done ids are the side the hash join builds; the input streams through it.
    assert!(before.contains("join_type=RightAnti"), "{before}");
    sql(&s, &copy).await.unwrap();
    let after = crate::common::strings(&sql(&s, &format!("EXPLAIN {copy}")).await.unwrap(), "plan").join("\n");
    assert!(after.contains("RightAnti") && after.contains("__done_ids"), "{after}");
    // The planner knows how many ids are done (none before the first write): so few are sent whole to the join
    // rather than the input being shuffled by id.
    assert!(after.contains("mode=CollectLeft") && !after.contains("Hash([id"), "{after}");
    assert!(before.contains("mode=CollectLeft") && !before.contains("Hash([id"), "{before}");
}

#[tokio::test]
async fn insert_into_a_lance_table_appends_a_version() {
    let tmp = tempfile::tempdir().unwrap();
    let o = tmp.path().join("out.lance").display().to_string();
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'", corpus(tmp.path()))).await.unwrap();
    sql(&s, &format!("COPY (SELECT id, embed(text) AS embedding FROM docs WHERE id < 'c') TO '{o}' STORED AS LANCE"))
        .await
        .unwrap();
    sql(&s, &format!("CREATE EXTERNAL TABLE emb STORED AS LANCE LOCATION '{o}'")).await.unwrap();
    let inserted = sql(&s, "INSERT INTO emb SELECT id, embed(text) FROM docs WHERE id >= 'c'").await.unwrap();
    assert_eq!(scalar_i64(&inserted), 3);
    let ds = Dataset::open(&o).await.unwrap();
    assert_eq!((ds.version().version, ds.count_rows(None).await.unwrap()), (2, 5));
    // The same session reads what it wrote: an unpinned table scans the latest version.
    assert_eq!(scalar_i64(&sql(&s, "SELECT count(*) FROM emb").await.unwrap()), 5);
    assert_eq!(scalar_i64(&sql(&s, "SELECT count(*) FROM emb WHERE id >= 'c'").await.unwrap()), 3);
}

#[tokio::test]
async fn vectors_join_back_to_their_source_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let o = tmp.path().join("out.lance").display().to_string();
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'", corpus(tmp.path()))).await.unwrap();
    sql(&s, &format!("COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{o}' STORED AS LANCE")).await.unwrap();
    sql(&s, &format!("CREATE EXTERNAL TABLE emb STORED AS LANCE LOCATION '{o}'")).await.unwrap();
    let joined =
        sql(&s, "SELECT d.id, d.text, e.embedding FROM docs d JOIN emb e USING (id) ORDER BY d.id").await.unwrap();
    assert_eq!(strings(&joined, "id"), ["a", "b", "c", "d", "e"]);
    // Each stored vector is the one its own text gives now.
    let fresh = vectors(&sql(&s, "SELECT id, embed(text) AS v FROM docs ORDER BY id").await.unwrap(), "v");
    for (stored, fresh) in vectors(&joined, "embedding").iter().zip(&fresh) {
        let (a, b) = (stored.as_ref().unwrap(), fresh.as_ref().unwrap());
        assert!((norm(a) - 1.0).abs() < 1e-5);
        assert!(cosine(a, b) > 0.99999);
    }
}

#[tokio::test]
async fn a_copy_that_fails_halfway_leaves_no_new_version() {
    let tmp = tempfile::tempdir().unwrap();
    let o = tmp.path().join("out.lance").display().to_string();
    let path = tmp.path().join("docs.jsonl");
    // 40 rows; the 35th has a value that cannot be cast to INT.
    let lines: Vec<String> = (0..40)
        .map(|i| {
            let n = if i == 34 { "x".to_string() } else { i.to_string() };
            serde_json::json!({ "id": format!("{i:03}"), "text": format!("document number {i}"), "n": n }).to_string()
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'", path.display())).await.unwrap();
    let good = format!(
        "COPY (SELECT id, embed(text) AS embedding, 0 AS n FROM docs WHERE id < '010') TO '{o}' STORED AS LANCE"
    );
    sql(&s, &good).await.unwrap();
    // Small batches, so that several reach the sink before the bad row fails the query.
    sql(&s, "SET datafusion.execution.batch_size = 4").await.unwrap();
    let bad = format!(
        "COPY (SELECT id, embed(text) AS embedding, CAST(n AS BIGINT) AS n FROM docs) TO '{o}' STORED AS LANCE"
    );
    let err = sql(&s, &bad).await.unwrap_err().to_string();
    assert!(err.to_lowercase().contains("cast"), "{err}");
    let ds = Dataset::open(&o).await.unwrap();
    assert_eq!(ds.version().version, 1, "the failed COPY must not commit");
    assert_eq!(ds.count_rows(None).await.unwrap(), 10);
}

/// CSV as Python's `csv` module writes texts: CRLF line ends, line breaks and doubled quotes inside quoted values,
/// past 8 KiB (where DataFusion 54's own column inference cut a quoted value in two and failed). A file and a
/// folder of two, with no `newlines_in_values` option given, read every row with its text as written.
#[tokio::test]
async fn a_csv_with_line_breaks_in_quoted_texts_reads_every_row_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let text = |i: usize| format!("line one of {i}\nline two, with \"quotes\"\r\nthree");
    let csv = |rows: std::ops::Range<usize>| {
        let mut out = String::from("id,text\r\n");
        for i in rows {
            out += &format!("r{i},\"{}\"\r\n", text(i).replace('"', "\"\""));
        }
        out
    };
    std::fs::write(tmp.path().join("q.csv"), csv(0..300)).unwrap();
    std::fs::create_dir(tmp.path().join("parts")).unwrap();
    std::fs::write(tmp.path().join("parts/a.csv"), csv(0..150)).unwrap();
    std::fs::write(tmp.path().join("parts/b.csv"), csv(150..300)).unwrap();
    assert!(csv(0..150).len() > 8192 && csv(150..300).len() > 8192);
    for (name, location) in [("one", "q.csv"), ("two", "parts/")] {
        let s = session();
        let location = tmp.path().join(location);
        let create = format!(
            "CREATE EXTERNAL TABLE docs STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true')",
            location.display()
        );
        sql(&s, &create).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(scalar_i64(&sql(&s, "SELECT count(DISTINCT id) FROM docs").await.unwrap()), 300, "{name}");
        let found = sql(&s, "SELECT text FROM docs WHERE id = 'r165'").await.unwrap();
        assert_eq!(strings(&found, "text"), vec![text(165)], "{name}");
    }
}
