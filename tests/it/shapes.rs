//! Exactly once for every shape of write a user writes, and every way in: each COPY shape below is run on half
//! its corpus (an interrupted campaign), then on the whole corpus (the resume), then again (a finished job run
//! again). Each either ends with every id of its output once, having embedded only the rows not yet written, or
//! is refused before anything is embedded. Through the library (`EmbedSession` + `ctx.sql`), so what
//! `pipeline run` adds on top is not what keeps the promise.

use std::path::Path;

use crate::common::{assert_text, scalar_i64, session, session_on, sql, strings, tiny_model_dir};

/// `a` and `b` of `n` rows each, and `meta`, which marks a's even rows English.
fn corpus(dir: &Path, n: usize) {
    for table in ["a", "b"] {
        let lines: Vec<String> = (0..n)
            .map(|i| serde_json::json!({"id": format!("{table}{i:02}"), "text": format!("{table} document number {i} about topic {}", i % 3)}).to_string())
            .collect();
        std::fs::write(dir.join(format!("{table}.jsonl")), lines.join("\n") + "\n").unwrap();
    }
    let meta: Vec<String> = (0..10)
        .map(|i| {
            serde_json::json!({"id": format!("a{i:02}"), "lang": if i % 2 == 0 { "en" } else { "de" }}).to_string()
        })
        .collect();
    std::fs::write(dir.join("meta.jsonl"), meta.join("\n") + "\n").unwrap();
}

/// A session on the tiny model (which rows are embedded is the point here, not their vectors) with the three
/// tables of `dir`.
async fn tables(dir: &Path) -> embedding_pipeline::EmbedSession {
    let s = session_on(&tiny_model_dir());
    for t in ["a", "b", "meta"] {
        sql(
            &s,
            &format!(
                "CREATE EXTERNAL TABLE {t} STORED AS JSON LOCATION '{}'",
                dir.join(format!("{t}.jsonl")).display()
            ),
        )
        .await
        .unwrap();
    }
    s
}

/// Rows and distinct ids of the dataset at `out`, and its ids.
async fn written(out: &str) -> (i64, i64, Vec<String>) {
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE o STORED AS LANCE LOCATION '{out}'")).await.unwrap();
    let rows = scalar_i64(&sql(&s, "SELECT count(*) FROM o").await.unwrap());
    let ids = scalar_i64(&sql(&s, "SELECT count(DISTINCT id) FROM o").await.unwrap());
    (rows, ids, strings(&sql(&s, "SELECT id FROM o ORDER BY id").await.unwrap(), "id"))
}

/// Run `query`'s COPY into `out` on a corpus of `n` rows per table; what was embedded, or the error.
async fn copy(dir: &Path, n: usize, query: &str, out: &str) -> Result<u64, String> {
    corpus(dir, n);
    let s = tables(dir).await;
    let result = sql(&s, &format!("COPY ({query}) TO '{out}' STORED AS LANCE")).await;
    let embedded = s.metrics().embed_stats().docs;
    result.map(|_| embedded).map_err(|e| format!("{e} (embedded {embedded})"))
}

/// The shapes that resume: the query, and the ids of its output on the whole corpus (10 rows a table).
fn resuming_shapes() -> Vec<(&'static str, &'static str, Vec<String>)> {
    let ids = |prefix: &str, keep: &dyn Fn(usize) -> bool| -> Vec<String> {
        (0..10).filter(|i| keep(*i)).map(|i| format!("{prefix}{i:02}")).collect()
    };
    let all = |_: usize| true;
    let mut both = ids("a", &all);
    both.extend(ids("b", &all));
    vec![
        ("plain", "SELECT id, embed(text) AS embedding FROM a", ids("a", &all)),
        (
            "union all",
            "SELECT id, embed(text) AS embedding FROM a UNION ALL SELECT id, embed(text) AS embedding FROM b",
            both.clone(),
        ),
        ("computed id", "SELECT 'en:' || id AS id, embed(text) AS embedding FROM a", ids("en:a", &all)),
        (
            "renamed id",
            "SELECT doc AS id, embed(body) AS embedding FROM (SELECT id AS doc, text AS body FROM a)",
            ids("a", &all),
        ),
        ("cte", "WITH x AS (SELECT id, text FROM a) SELECT id, embed(text) AS embedding FROM x", ids("a", &all)),
        ("order by limit", "SELECT id, embed(text) AS embedding FROM a ORDER BY id LIMIT 5", ids("a", &|i| i < 5)),
        (
            "order by a column not shown, limit",
            "SELECT id, embed(text) AS embedding FROM a ORDER BY text LIMIT 5",
            ids("a", &|i| i < 5),
        ),
        ("a volatile column riding along", "SELECT id, embed(text) AS embedding, random() AS r FROM a", ids("a", &all)),
        (
            "a volatile column under a filter that does not read it",
            "SELECT id, embed(text) AS embedding, r FROM (SELECT id, text, random() AS r FROM a) WHERE id <> 'zz'",
            ids("a", &all),
        ),
        (
            "a volatile column beside an ordered limit",
            "SELECT id, embed(text) AS embedding, random() AS r FROM a ORDER BY id LIMIT 5",
            ids("a", &|i| i < 5),
        ),
        (
            "join",
            "SELECT a.id, embed(a.text) AS embedding FROM a JOIN meta ON a.id = meta.id WHERE meta.lang = 'en'",
            ids("a", &|i| i % 2 == 0),
        ),
        ("distinct", "SELECT id, embed(text) AS embedding FROM (SELECT DISTINCT id, text FROM a)", ids("a", &all)),
        (
            "id computed over a union of embeddings",
            "SELECT 'x:' || id AS id, embedding FROM (SELECT id, embed(text) AS embedding FROM a \
             UNION ALL SELECT id, embed(text) AS embedding FROM b)",
            both.iter().map(|i| format!("x:{i}")).collect(),
        ),
        (
            "window under embed",
            "SELECT id, embedding FROM (SELECT id, embed(text) AS embedding, row_number() OVER (ORDER BY id) AS r \
             FROM a) WHERE r <= 5",
            ids("a", &|i| i < 5),
        ),
    ]
}

/// Every shape, interrupted after half its corpus, resumes to each id of its output once, embedding only
/// what was missing; run again, it embeds and writes nothing.
#[tokio::test]
async fn every_shape_resumes_to_each_id_once_embedding_only_what_is_missing() {
    for (name, query, want) in resuming_shapes() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out.lance").display().to_string();
        let first = copy(tmp.path(), 5, query, &out).await.unwrap_or_else(|e| panic!("{name}, first run: {e}"));
        let (rows_before, _, _) = written(&out).await;
        assert_eq!(first, rows_before as u64, "{name}: the first run embedded what it wrote");

        let resumed = copy(tmp.path(), 10, query, &out).await.unwrap_or_else(|e| panic!("{name}, resume: {e}"));
        let (rows, distinct, ids) = written(&out).await;
        assert_eq!((rows, distinct), (want.len() as i64, want.len() as i64), "{name}: {ids:?}");
        assert_eq!(ids, want, "{name}");
        assert_eq!(resumed, (rows - rows_before) as u64, "{name}: the resume embedded only the rows it added");

        let again = copy(tmp.path(), 10, query, &out).await.unwrap_or_else(|e| panic!("{name}, rerun: {e}"));
        assert_eq!(again, 0, "{name}: a finished job run again embeds nothing");
        assert_eq!(written(&out).await.0, want.len() as i64, "{name}: and writes nothing");
    }
}

/// A shape whose rows are chosen after `embed()` (a window numbering the embedded rows) writes a new output, and
/// its resume is refused before anything is embedded, saying why and what to do; the dataset keeps its rows.
/// (With the window under `embed()`, the same choice resumes: `window under embed` below.)
#[tokio::test]
async fn a_shape_that_chooses_rows_after_embed_is_refused_when_it_would_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance").display().to_string();
    let query = "SELECT id, embedding FROM (SELECT id, embedding, row_number() OVER (ORDER BY id) AS r \
                 FROM (SELECT id, embed(text) AS embedding FROM a)) WHERE r <= 5";
    assert_eq!(copy(tmp.path(), 10, query, &out).await.unwrap(), 10, "a new output: every row embedded");
    assert_eq!(written(&out).await.0, 5);
    let err = copy(tmp.path(), 10, query, &out).await.unwrap_err();
    // Why, what to do (embed.restart), and that nothing was embedded.
    assert_text("a_resume_of_rows_chosen_after_embed", tmp.path(), &err);
    assert_eq!(written(&out).await.0, 5, "the dataset is as it was");
}

/// A LIMIT ordered by a column the SELECT does not show embeds only the rows it keeps, as one ordered by a shown
/// column does (DataFusion puts a projection between the LIMIT and the `embed()` projection).
#[tokio::test]
async fn a_limit_ordered_by_a_column_not_shown_embeds_only_the_rows_it_keeps() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance").display().to_string();
    let query = "SELECT id, embed(text) AS embedding FROM a ORDER BY text DESC LIMIT 3";
    assert_eq!(copy(tmp.path(), 10, query, &out).await.unwrap(), 3, "only the 3 rows kept are embedded");
    assert_eq!(written(&out).await.2, ["a07", "a08", "a09"]);
    assert_eq!(copy(tmp.path(), 10, query, &out).await.unwrap(), 0, "a rerun embeds nothing");
    assert_eq!(written(&out).await.0, 3);
}

/// A query whose rows are chosen by a volatile expression (random()) chooses other rows on every run: its first run
/// writes, and a rerun into the dataset is refused before anything is embedded, naming the expression and what to
/// do; the dataset keeps its rows. (A volatile column that only rides along resumes: see the shapes above.)
#[tokio::test]
async fn a_shape_that_chooses_rows_at_random_is_refused_when_it_would_resume() {
    let mut said = String::new();
    for (query, rows) in [
        ("SELECT id, embed(text) AS embedding FROM a ORDER BY random() LIMIT 4", 4),
        ("SELECT id, embed(text) AS embedding FROM a WHERE random() < 2.0", 10),
        ("SELECT id, embedding FROM (SELECT id, embed(text) AS embedding, random() AS r FROM a) WHERE r < 2.0", 10),
        ("SELECT id, embed(text) AS embedding FROM a WHERE id IN (SELECT id FROM a ORDER BY random() LIMIT 4)", 4),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out.lance").display().to_string();
        assert_eq!(copy(tmp.path(), 10, query, &out).await.unwrap(), rows, "{query}: a new output is written");
        let err = copy(tmp.path(), 10, query, &out).await.unwrap_err();
        // The expression, what to do instead (ORDER BY md5(id) LIMIT n), and that nothing was embedded.
        said += &format!("{query}\n  {}\n", err.replace(&tmp.path().display().to_string(), "[DIR]"));
        assert_eq!(written(&out).await.0, rows as i64, "{query}: the dataset is as it was");
        // A plan would fix the rows once, for runs that choose them anew: refused, saying why.
        let job = tmp.path().join("job.sql");
        let table = tmp.path().join("a.jsonl");
        let text = format!(
            "CREATE EXTERNAL TABLE a STORED AS JSON LOCATION '{}';\nCOPY ({query}) TO '{out}' STORED AS LANCE;\n",
            table.display()
        );
        std::fs::write(&job, text).unwrap();
        let size = embedding_pipeline::ops::plan::UnitSize::Tokens(1000);
        let err = embedding_pipeline::ops::plan::plan_job(&job, &Default::default(), size).await.unwrap_err();
        assert!(err.chain_text().contains("cannot be planned: its rows are chosen by random()"), "{err:?}");
    }
    assert_text("resumes_of_rows_chosen_at_random", Path::new("/nowhere"), &said);
}

/// The library refuses a repeated or NULL id in a COPY's output, before embedding: the write path owns the
/// check, not `pipeline run`. A UNION ALL of two tables that share an id is caught too.
#[tokio::test]
async fn the_library_refuses_repeated_and_null_ids_of_the_output() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance").display().to_string();
    corpus(tmp.path(), 4);
    let s = tables(tmp.path()).await;
    let mut said = String::new();
    for query in [
        "SELECT id, embed(text) AS embedding FROM a UNION ALL SELECT id, embed(text) AS embedding FROM a",
        "SELECT substr(id, 1, 1) AS id, embed(text) AS embedding FROM a",
        "SELECT CASE WHEN id = 'a01' THEN NULL ELSE id END AS id, embed(text) AS e FROM a",
    ] {
        let err = sql(&s, &format!("COPY ({query}) TO '{out}' STORED AS LANCE")).await.unwrap_err().to_string();
        said += &format!("{query}\n  {err}\n");
        assert_eq!(s.metrics().embed_stats().docs, 0, "{query}");
        assert!(!Path::new(&out).join("_versions").exists(), "{query}: nothing written");
    }
    // Floating-point ids do not compare exactly: refused, naming the column and its type, before embedding.
    let err =
        sql(&s, &format!("COPY (SELECT length(id) + 0.5 AS id, embed(text) AS e FROM a) TO '{out}' STORED AS LANCE"))
            .await
            .unwrap_err()
            .to_string();
    said += &format!("length(id) + 0.5 AS id\n  {err}\n");
    assert_eq!(s.metrics().embed_stats().docs, 0);
    assert!(!Path::new(&out).join("_versions").exists(), "nothing written");
    // A repeated id whose rows are already written is still the corpus's fault, and still refused.
    sql(&s, &format!("COPY (SELECT id, embed(text) AS embedding FROM a) TO '{out}' STORED AS LANCE")).await.unwrap();
    let twice = "SELECT id, embed(text) AS embedding FROM a UNION ALL SELECT id, embed(text) AS embedding FROM a";
    let err = sql(&s, &format!("COPY ({twice}) TO '{out}' STORED AS LANCE")).await.unwrap_err().to_string();
    said += &format!("the UNION ALL again, its rows written\n  {err}\n");
    // Each names how many ids, the first of them, and that nothing was embedded.
    assert_text("repeated_null_and_float_ids_of_the_output", tmp.path(), &said);
}

/// Two names of one dataset (the dataset and a symbolic link to it) are one lock: a write planned through the
/// link while another holds the dataset is refused, and the ids are written once.
#[tokio::test]
async fn a_write_through_a_symlink_waits_for_the_write_into_the_real_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance");
    let link = tmp.path().join("link.lance");
    std::os::unix::fs::symlink(&out, &link).unwrap(); // before the dataset exists, as a user may
    corpus(tmp.path(), 4);
    let (first, second) = (tables(tmp.path()).await, tables(tmp.path()).await);
    let copy =
        |to: &Path| format!("COPY (SELECT id, embed(text) AS embedding FROM a) TO '{}' STORED AS LANCE", to.display());
    let planned = first.context().sql(&copy(&out)).await.unwrap().create_physical_plan().await.unwrap();
    let err = sql(&second, &copy(&link)).await.unwrap_err().to_string();
    assert!(err.contains("another pipeline run is writing to"), "{err}");
    datafusion::physical_plan::collect(planned, first.context().task_ctx()).await.unwrap();
    assert_eq!(scalar_i64(&sql(&second, &copy(&link)).await.unwrap()), 0, "every id is there already");
    let (rows, distinct, _) = written(&out.display().to_string()).await;
    assert_eq!((rows, distinct), (4, 4));
}

/// A folder named without its trailing slash is read as with it: all of its JSON lines files, or a refusal
/// naming both kinds when it mixes `.json` and `.jsonl` (it read the `.json` half, silently).
#[tokio::test]
async fn a_folder_is_read_the_same_with_or_without_its_slash() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("docs");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("one.jsonl"), "{\"id\": \"1\", \"text\": \"one\"}\n").unwrap();
    std::fs::write(folder.join("two.jsonl"), "{\"id\": \"2\", \"text\": \"two\"}\n").unwrap();
    let s = session();
    for (name, location) in [("plain", folder.display().to_string()), ("slash", format!("{}/", folder.display()))] {
        sql(&s, &format!("CREATE EXTERNAL TABLE {name} STORED AS JSON LOCATION '{location}'")).await.unwrap();
        assert_eq!(scalar_i64(&sql(&s, &format!("SELECT count(*) FROM {name}")).await.unwrap()), 2, "{name}");
    }
    std::fs::write(folder.join("three.json"), "{\"id\": \"3\", \"text\": \"three\"}\n").unwrap();
    for location in [folder.display().to_string(), format!("{}/", folder.display())] {
        let err = sql(&s, &format!("CREATE EXTERNAL TABLE mixed STORED AS JSON LOCATION '{location}'"))
            .await
            .unwrap_err()
            .to_string();
        assert_text("a_folder_of_json_and_jsonl_files", tmp.path(), &err);
    }
}

/// A COPY into a file format never replaces an existing file (the job's own corpus, say) unless the job says
/// so; the file is left as it was.
#[tokio::test]
async fn a_copy_over_an_existing_file_is_refused_unless_the_job_sets_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    corpus(tmp.path(), 4);
    let s = tables(tmp.path()).await;
    let corpus_file = tmp.path().join("a.jsonl");
    let before = std::fs::read(&corpus_file).unwrap();
    let copy = format!("COPY (SELECT id FROM a) TO '{}' STORED AS JSON", corpus_file.display());
    let err = sql(&s, &copy).await.unwrap_err().to_string();
    assert_text("a_copy_over_an_existing_file", tmp.path(), &err);
    assert_eq!(std::fs::read(&corpus_file).unwrap(), before, "the corpus is untouched");
    let parquet = tmp.path().join("ids.parquet");
    let to_parquet = format!("COPY (SELECT id FROM a) TO '{}' STORED AS PARQUET", parquet.display());
    sql(&s, &to_parquet).await.unwrap();
    assert!(sql(&s, &to_parquet).await.is_err(), "a second COPY to the same new file is refused too");
    sql(&s, &format!("SET embed.overwrite = true; {to_parquet}")).await.unwrap();
}

/// An output named by a symbolic link to a folder not made yet (a bigger disk, as a user may) is written
/// there; a link into a folder that does not exist is refused before anything is embedded. (Lance failed
/// after embedding with "File exists".)
#[tokio::test]
async fn a_write_through_a_link_to_a_new_folder_lands_there() {
    let tmp = tempfile::tempdir().unwrap();
    corpus(tmp.path(), 4);
    let s = tables(tmp.path()).await;
    let big = tmp.path().join("big");
    std::fs::create_dir(&big).unwrap();
    let link = tmp.path().join("out.lance");
    std::os::unix::fs::symlink(big.join("out.lance"), &link).unwrap();
    let copy =
        |to: &Path| format!("COPY (SELECT id, embed(text) AS embedding FROM a) TO '{}' STORED AS LANCE", to.display());
    sql(&s, &copy(&link)).await.unwrap();
    let (rows, distinct, _) = written(&big.join("out.lance").display().to_string()).await;
    assert_eq!((rows, distinct), (4, 4));

    let nowhere = tmp.path().join("nowhere.lance");
    std::os::unix::fs::symlink(tmp.path().join("missing/out.lance"), &nowhere).unwrap();
    let err = sql(&s, &copy(&nowhere)).await.unwrap_err().to_string();
    assert_text("a_link_into_a_missing_folder", tmp.path(), &err);
    assert_eq!(s.metrics().embed_stats().docs, 4, "nothing more was embedded");
}
