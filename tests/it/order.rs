//! The length-ordering stage: in the plan, longest first, windows, whole-input ordering that spills
//! through DataFusion's sort under the session's memory limit,
//! rows keyed correctly after reordering, and the same vectors as the original order.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use datafusion::arrow::array::RecordBatch;
use serde_json::Value;

use crate::common::{model_dir, pipeline, session, session_on, sql, strings, tiny_model_dir, vectors};

/// Rows whose token count is known: "cat" repeated k times is k + 2 tokens. Shuffled lengths.
fn cats(dir: &Path, n: usize) -> String {
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let k = 1 + (i * 37) % 50;
            serde_json::json!({"id": format!("r{i:04}"), "k": k, "text": "cat ".repeat(k).trim_end()}).to_string()
        })
        .collect();
    let p = dir.join("cats.jsonl");
    std::fs::write(&p, lines.join("\n")).unwrap();
    format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'", p.display())
}

fn by_id(batches: &[RecordBatch]) -> HashMap<String, Vec<f32>> {
    strings(batches, "id").into_iter().zip(vectors(batches, "v")).map(|(id, v)| (id, v.unwrap())).collect()
}

/// Write `select` into a new Lance dataset in `dir` and read it back in written order.
async fn through_lance(s: &embedding_pipeline::EmbedSession, dir: &Path, name: &str, select: &str) -> Vec<RecordBatch> {
    let out = dir.join(format!("{name}.lance"));
    sql(s, &format!("COPY ({select}) TO '{}' STORED AS LANCE", out.display())).await.unwrap();
    sql(s, &format!("CREATE EXTERNAL TABLE {name} STORED AS LANCE LOCATION '{}'", out.display())).await.unwrap();
    sql(s, &format!("SELECT * FROM {name}")).await.unwrap()
}

/// A session on the tiny model (the ordering is the point here; each length still gets its own vector) and one
/// partition, reading `n` rows of cats in batches of 16, after `settings`.
async fn cats_in_small_batches(dir: &Path, n: usize, settings: &str) -> embedding_pipeline::EmbedSession {
    let s = session_on(&tiny_model_dir());
    let setup = format!(
        "SET datafusion.execution.target_partitions = 1; SET datafusion.execution.batch_size = 16; {settings} {}",
        cats(dir, n)
    );
    sql(&s, &setup).await.unwrap();
    s
}

/// Each vector of `ordered` is its own text's: the same as in the original order.
async fn assert_same_vectors_as_the_original_order(
    s: &embedding_pipeline::EmbedSession,
    ordered: &[RecordBatch],
    n: usize,
) {
    let original = sql(s, "SET embed.order = 'original'; SELECT id, embed(text) AS v FROM docs").await.unwrap();
    let (a, b) = (by_id(ordered), by_id(&original));
    assert_eq!(a.len(), n, "every row exactly once");
    for (id, v) in &a {
        assert_eq!(v, &b[id], "id {id}");
    }
}

#[tokio::test]
async fn explain_shows_the_ordering_stage_on_writes_only() {
    let tmp = tempfile::tempdir().unwrap();
    let s = session();
    sql(&s, &cats(tmp.path(), 10)).await.unwrap();
    let copy =
        format!("COPY (SELECT id, embed(text) AS v FROM docs) TO '{}/x.lance' STORED AS LANCE", tmp.path().display());
    let plan = strings(&sql(&s, &format!("EXPLAIN {copy}")).await.unwrap(), "plan").join("\n");
    assert!(plan.contains("LengthOrderExec: text=text@") && plan.contains("window=65536 rows"), "{plan}");
    // A SELECT keeps its input order.
    let plan = strings(&sql(&s, "EXPLAIN SELECT id, embed(text) AS v FROM docs").await.unwrap(), "plan").join("\n");
    assert!(!plan.contains("LengthOrderExec"), "{plan}");
    let plan =
        strings(&sql(&s, &format!("SET embed.order = 'original'; EXPLAIN {copy}")).await.unwrap(), "plan").join("\n");
    assert!(!plan.contains("LengthOrderExec"), "{plan}");
}

#[tokio::test]
async fn rows_come_out_longest_first_within_a_window_and_keyed_to_their_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let s = cats_in_small_batches(tmp.path(), 120, "SET embed.order_window = 40;").await;
    let ordered = through_lance(&s, tmp.path(), "ordered", "SELECT id, k, embed(text) AS v FROM docs").await;
    let ks: Vec<i64> = strings(&ordered, "k").iter().map(|k| k.parse().unwrap()).collect();
    assert_eq!(ks.len(), 120);
    for window in ks.chunks(40) {
        assert!(window.windows(2).all(|w| w[0] >= w[1]), "not longest first within a window: {window:?}");
    }
    assert!(ks.windows(2).any(|w| w[0] < w[1]), "windows are ordered separately, not as one");
    assert_same_vectors_as_the_original_order(&s, &ordered, 120).await;
}

#[tokio::test]
async fn whole_input_ordering_spills_beyond_the_session_memory_limit_and_stays_exact() {
    let tmp = tempfile::tempdir().unwrap();
    // 64 KB: the write's id check (a grouped count of 1,200 ids, which spills too) needs more than 16 KB.
    let limits =
        "SET datafusion.runtime.memory_limit = '64K'; SET datafusion.execution.sort_spill_reservation_bytes = 0;";
    let s = cats_in_small_batches(tmp.path(), 1200, &format!("{limits} SET embed.order_window = 0;")).await;
    let copy = format!(
        "COPY (SELECT id, embed(text) AS v FROM docs) TO '{}/analyzed.lance' STORED AS LANCE",
        tmp.path().display()
    );
    let analyzed = strings(&sql(&s, &format!("EXPLAIN ANALYZE {copy}")).await.unwrap(), "plan").join("\n");
    let line = |name: &str| analyzed.lines().find(|l| l.contains(name)).unwrap_or_default().to_string();
    assert!(line("LengthOrderExec").contains("window=whole input, sorted below"), "{analyzed}");
    let sort = line("SortExec");
    assert!(sort.contains("expr=[__token_count@"), "DataFusion's sort orders by the token count: {sort}");
    let spills: u64 = sort.split("spill_count=").nth(1).and_then(|r| r.split(',').next()).unwrap().parse().unwrap();
    assert!(spills >= 2, "1,200 rows against a 64 KB memory limit spill more than once: {sort}");
    let ordered = through_lance(&s, tmp.path(), "ordered", "SELECT id, k, embed(text) AS v FROM docs").await;
    let ks: Vec<i64> = strings(&ordered, "k").iter().map(|k| k.parse().unwrap()).collect();
    assert_eq!(ks.len(), 1200);
    assert!(ks.windows(2).all(|w| w[0] >= w[1]), "the merged runs are longest first: {ks:?}");
    assert_same_vectors_as_the_original_order(&s, &ordered, 1200).await;
}

#[tokio::test]
async fn a_window_the_memory_limit_will_not_hold_is_passed_on_early_and_every_row_arrives() {
    let tmp = tempfile::tempdir().unwrap();
    let s = cats_in_small_batches(tmp.path(), 1200, "SET datafusion.runtime.memory_limit = '64K';").await;
    let ordered = through_lance(&s, tmp.path(), "windows", "SELECT id, k, embed(text) AS v FROM docs").await;
    let ks: Vec<i64> = strings(&ordered, "k").iter().map(|k| k.parse().unwrap()).collect();
    let ids: std::collections::HashSet<String> = strings(&ordered, "id").into_iter().collect();
    assert_eq!((ks.len(), ids.len()), (1200, 1200), "every row exactly once");
    // The default window is 65,536 rows; the 64 KB limit cuts it into several, each longest first.
    let rises = ks.windows(2).filter(|w| w[0] < w[1]).count();
    assert!(rises >= 2, "windows passed on early: {ks:?}");
}

#[tokio::test]
async fn the_first_window_is_small_and_each_next_one_four_times_the_last_up_to_the_option() {
    let tmp = tempfile::tempdir().unwrap();
    // At the default window (65,536 rows): 1,024 rows first, then 4,096, so the first model call waits for 1,024.
    let s = cats_in_small_batches(tmp.path(), 6000, "").await;
    let ordered = through_lance(&s, tmp.path(), "ramp", "SELECT id, k, embed(text) AS v FROM docs").await;
    let ks: Vec<i64> = strings(&ordered, "k").iter().map(|k| k.parse().unwrap()).collect();
    assert_eq!(ks.len(), 6000);
    let rises: Vec<usize> = (1..ks.len()).filter(|&i| ks[i - 1] < ks[i]).collect();
    assert_eq!(rises, vec![1024, 5120], "windows of 1,024, 4,096 and the 880 rows left");
    for window in [&ks[..1024], &ks[1024..5120], &ks[5120..]] {
        assert!(window.windows(2).all(|w| w[0] >= w[1]), "not longest first within a window: {window:?}");
    }
    // A window option below the first window's size is the size of every window.
    let s = cats_in_small_batches(tmp.path(), 300, "SET embed.order_window = 100;").await;
    let ordered = through_lance(&s, tmp.path(), "small", "SELECT id, k, embed(text) AS v FROM docs").await;
    let ks: Vec<i64> = strings(&ordered, "k").iter().map(|k| k.parse().unwrap()).collect();
    let rises: Vec<usize> = (1..ks.len()).filter(|&i| ks[i - 1] < ks[i]).collect();
    assert_eq!(rises, vec![100, 200]);
}

#[tokio::test]
async fn a_write_tokenises_each_text_once_and_its_vectors_are_those_of_embed_alone() {
    let tmp = tempfile::tempdir().unwrap();
    // A model of its own (a copy), so that no other test's texts count.
    let model = tmp.path().join("model");
    let status = Command::new("cp").arg("-r").arg(model_dir()).arg(&model).status().unwrap();
    assert!(status.success());
    let s = crate::common::session_on(&model);
    sql(
        &s,
        &format!(
            "SET datafusion.execution.target_partitions = 1; SET embed.prefix = 'query: '; {}",
            cats(tmp.path(), 500)
        ),
    )
    .await
    .unwrap();
    let embedder =
        embedding_pipeline::EmbedOptions::default().with_model(model.display().to_string()).embedder().unwrap();
    let before = embedder.texts_tokenized();
    let ordered = through_lance(&s, tmp.path(), "once", "SELECT id, k, embed(text) AS v FROM docs").await;
    assert_eq!(embedder.texts_tokenized() - before, 500, "the ordering stage's tokens reach embed()");
    // The same vectors, bit for bit, as embed() tokenising by itself in the original order (with the prompt).
    assert_same_vectors_as_the_original_order(&s, &ordered, 500).await;
}

#[test]
fn order_memory_is_still_accepted_and_says_it_is_deprecated() {
    let tmp = tempfile::tempdir().unwrap();
    let create = cats(tmp.path(), 4);
    let job = format!(
        "SET embed.model = '{}';\nSET embed.order_memory = 1000000;\n{create};\n\
         COPY (SELECT id, embed(text) AS v FROM docs) TO 'out.lance' STORED AS LANCE;\n",
        model_dir().display()
    );
    std::fs::write(tmp.path().join("job.sql"), job).unwrap();
    let o = pipeline(&["run", "--quiet", "job.sql"], tmp.path());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("embed.order_memory is deprecated") && stderr.contains("datafusion.runtime.memory_limit"),
        "{stderr}"
    );
}

#[test]
fn compare_order_reports_both_orders_with_identical_vectors() {
    let tmp = tempfile::tempdir().unwrap();
    let create = cats(tmp.path(), 64);
    std::fs::write(tmp.path().join("job.sql"), format!("SET embed.model = '{}';\n{create};\n", model_dir().display()))
        .unwrap();
    let o = pipeline(&["compare-order", "job.sql", "--sample", "64", "--json"], tmp.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["max_abs_diff"].as_f64(), Some(0.0));
    let (l, r) = (&j["length"], &j["original"]);
    // k cats + [CLS] + [SEP], summed over 64 rows.
    let useful: u64 = (0..64).map(|i| (1 + (i * 37) % 50) as u64 + 2).sum();
    assert_eq!((l["documents"].as_u64(), r["documents"].as_u64()), (Some(64), Some(64)));
    assert_eq!((l["useful_tokens"].as_u64(), r["useful_tokens"].as_u64()), (Some(useful), Some(useful)));
    assert!(l["processed_tokens"].as_u64() < r["processed_tokens"].as_u64(), "{j}");
    assert!(l["padding_efficiency"].as_f64().unwrap() > r["padding_efficiency"].as_f64().unwrap());
}

/// `compare-order` writes through `ctx.sql`, as a library user does: a corpus with a repeated id is refused by the
/// write's own check, before anything is embedded (it was compared as if the ids were fine).
#[test]
fn compare_order_refuses_a_repeated_id() {
    let tmp = tempfile::tempdir().unwrap();
    let create = cats(tmp.path(), 8);
    let corpus = tmp.path().join("cats.jsonl");
    let text = std::fs::read_to_string(&corpus).unwrap().replace("\"r0003\"", "\"r0002\"");
    std::fs::write(&corpus, text).unwrap();
    std::fs::write(tmp.path().join("job.sql"), format!("SET embed.model = '{}';\n{create};\n", model_dir().display()))
        .unwrap();
    let o = pipeline(&["compare-order", "job.sql", "--sample", "8"], tmp.path());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains("1 ids occur more than once (first: r0002)"), "{stderr}");
}
