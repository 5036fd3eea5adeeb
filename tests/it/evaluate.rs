//! `pipeline evaluate`: two representations of one corpus scored side by side on held-out queries (a whole
//! text, and the same texts cut to 8 tokens, asked with words from the second half of each text), the scores
//! checked against `pipeline search --exact`'s own rankings, the neighbour overlap of two datasets, and the
//! refusals of bad input.

use std::path::Path;

use serde_json::Value;

use super::common::docs_job;
use crate::common::{pipeline, text};

/// 300 fortunes embedded twice: whole into `out/docs.lance`, cut to 8 tokens into `out/short.lance`. Returns
/// the (query, id) pairs: for each of the first 40 texts of 24 words or more, its second half.
fn two_representations(dir: &Path) -> Vec<(String, String)> {
    let lines = crate::common::fortunes(300);
    std::fs::write(dir.join("docs.jsonl"), lines.join("\n") + "\n").unwrap();
    docs_job(dir, "job.sql", "");
    let job = std::fs::read_to_string(dir.join("job.sql")).unwrap();
    let short = job.replace("out/docs.lance", "out/short.lance").replacen('\n', "\nSET embed.max_tokens = 8;\n", 1);
    std::fs::write(dir.join("short.sql"), short).unwrap();
    for j in ["job.sql", "short.sql"] {
        let o = pipeline(&["run", j], dir);
        assert!(o.status.success(), "{j}: {}", text(&o).1);
    }
    let mut pairs = Vec::new();
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap();
        let words: Vec<&str> = v["text"].as_str().unwrap().split_whitespace().collect();
        if words.len() >= 24 && pairs.len() < 40 {
            pairs.push((words[words.len() / 2..].join(" "), v["id"].as_str().unwrap().to_string()));
        }
    }
    assert_eq!(pairs.len(), 40);
    pairs
}

fn json(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "{}", text(o).1);
    serde_json::from_slice(&o.stdout).unwrap()
}

fn recall(d: &Value, k: u64) -> f64 {
    d["recall"].as_array().unwrap().iter().find(|r| r[0].as_u64() == Some(k)).unwrap()[1].as_f64().unwrap()
}

#[test]
fn evaluate_scores_two_representations_side_by_side_as_search_ranks_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pairs = two_representations(dir);
    let queries: Vec<String> =
        pairs.iter().map(|(q, id)| serde_json::json!({"_id": format!("q-{id}"), "text": q}).to_string()).collect();
    std::fs::write(dir.join("queries.jsonl"), queries.join("\n") + "\n").unwrap();
    let qrels: Vec<String> = pairs.iter().map(|(_, id)| format!("q-{id}\t{id}\t1")).collect();
    std::fs::write(dir.join("qrels.tsv"), format!("query-id\tcorpus-id\tscore\n{}\n", qrels.join("\n"))).unwrap();

    let r = json(&pipeline(
        &[
            "evaluate",
            "out/docs.lance",
            "out/short.lance",
            "--queries",
            "queries.jsonl",
            "--qrels",
            "qrels.tsv",
            "--json",
        ],
        dir,
    ));
    assert_eq!((r["queries"].as_u64(), r["judged"].as_u64()), (Some(40), Some(40)), "{r}");
    let (whole, short) = (&r["datasets"][0], &r["datasets"][1]);
    assert_eq!((whole["rows"].as_u64(), short["rows"].as_u64()), (Some(300), Some(300)));
    // The whole texts find the texts their second halves came from; cut to 8 tokens, they cannot.
    assert!(recall(whole, 10) >= 0.9, "{r}");
    assert!(recall(short, 10) + 0.3 < recall(whole, 10), "{r}");
    assert!(short["ndcg_at_10"].as_f64().unwrap() + 0.3 < whole["ndcg_at_10"].as_f64().unwrap(), "{r}");
    for d in [whole, short] {
        // One relevant document per query: recall grows with k, and MRR@10 <= recall@10.
        let (r1, r5, r10, r100) = (recall(d, 1), recall(d, 5), recall(d, 10), recall(d, 100));
        assert!(r1 <= r5 && r5 <= r10 && r10 <= r100 && r100 <= 1.0, "{d}");
        assert!(d["mrr_at_10"].as_f64().unwrap() <= r10 + 1e-12, "{d}");
        assert_eq!(d["relevant_missing"].as_u64(), Some(0));
    }

    // The same scores from pipeline search --exact's rankings, for 6 pairs given as --pairs: MRR@10 and
    // recall@1 computed here from its hits equal evaluate's.
    let few = &pairs[..6];
    let lines: Vec<String> = few.iter().map(|(q, id)| serde_json::json!({"query": q, "id": id}).to_string()).collect();
    std::fs::write(dir.join("pairs.jsonl"), lines.join("\n") + "\n").unwrap();
    for dataset in ["out/docs.lance", "out/short.lance"] {
        let (mut mrr, mut top1) = (0.0, 0.0);
        for (q, id) in few {
            let hits = json(&pipeline(&["search", dataset, q, "-k", "10", "--exact", "--json"], dir));
            let ids: Vec<&str> = hits.as_array().unwrap().iter().map(|h| h["id"].as_str().unwrap()).collect();
            if let Some(i) = ids.iter().position(|h| h == id) {
                mrr += 1.0 / (i + 1) as f64;
                top1 += f64::from(u8::from(i == 0));
            }
        }
        let e = json(&pipeline(&["evaluate", dataset, "--pairs", "pairs.jsonl", "-k", "1,10", "--json"], dir));
        let d = &e["datasets"][0];
        assert!((d["mrr_at_10"].as_f64().unwrap() - mrr / 6.0).abs() < 1e-9, "{dataset}: {mrr} against {e}");
        assert!((recall(d, 1) - top1 / 6.0).abs() < 1e-9, "{dataset}: {top1} against {e}");
    }
    // The text form: one column per dataset.
    let o = pipeline(&["evaluate", "out/docs.lance", "out/short.lance", "--pairs", "pairs.jsonl"], dir);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("recall@10")
            && out.contains("nDCG@10")
            && out.contains("[2] out/short.lance (version 1, 300 rows)"),
        "{out}"
    );

    // Neighbour overlap: a copy keeps every neighbour; the cut texts move them.
    assert!(
        std::process::Command::new("cp")
            .args(["-r", "out/docs.lance", "copy.lance"])
            .current_dir(dir)
            .status()
            .unwrap()
            .success()
    );
    let same = json(&pipeline(&["evaluate", "out/docs.lance", "copy.lance", "--overlap", "10", "--json"], dir));
    assert_eq!(
        (same["overlap"]["mean"].as_f64(), same["overlap"]["sampled"].as_u64()),
        (Some(1.0), Some(200)),
        "{same}"
    );
    let moved = json(&pipeline(&["evaluate", "out/docs.lance", "out/short.lance", "--overlap", "10", "--json"], dir));
    let mean = moved["overlap"]["mean"].as_f64().unwrap();
    assert!(mean > 0.0 && mean < 0.8, "{moved}");
}

#[test]
fn evaluate_refuses_what_it_cannot_score_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("docs.jsonl"),
        "{\"id\": \"a\", \"text\": \"a dog\"}\n{\"id\": \"b\", \"text\": \"a cat\"}\n",
    )
    .unwrap();
    docs_job(dir, "job.sql", "");
    let o = pipeline(&["run", "job.sql"], dir);
    assert!(o.status.success(), "{}", text(&o).1);
    std::fs::write(dir.join("q.jsonl"), "{\"id\": \"1\", \"text\": \"dog\"}\n{\"id\": \"2\"}\n").unwrap();
    std::fs::write(dir.join("good.jsonl"), "{\"id\": \"1\", \"text\": \"dog\"}\n").unwrap();
    std::fs::write(dir.join("qrels.tsv"), "1\ta\t1\n").unwrap();
    std::fs::write(dir.join("bad.tsv"), "1\ta\t1\n1 a\n").unwrap();
    std::fs::write(dir.join("none.tsv"), "1\ta\t0\n").unwrap();
    std::fs::write(dir.join("pairs.jsonl"), "{\"query\": \"dog\"}\n").unwrap();
    let cases: [(&[&str], &str); 7] = [
        (&["out/docs.lance", "--queries", "q.jsonl", "--qrels", "qrels.tsv"], "q.jsonl:2: a query needs a `text`"),
        (&["out/docs.lance", "--queries", "good.jsonl", "--qrels", "bad.tsv"], "bad.tsv:2: a judgement is"),
        (
            &["out/docs.lance", "--queries", "good.jsonl", "--qrels", "none.tsv"],
            "no query has a document judged relevant",
        ),
        (&["out/docs.lance", "--pairs", "pairs.jsonl"], "pairs.jsonl:1: a pair needs the relevant document's `id`"),
        (&["out/docs.lance", "--pairs", "missing.jsonl"], "cannot read missing.jsonl"),
        (&["out/docs.lance", "--overlap", "5"], "--overlap compares two datasets; 1 given"),
        (&["out/docs.lance"], "nothing to evaluate"),
    ];
    for (args, says) in cases {
        let mut all = vec!["evaluate"];
        all.extend_from_slice(args);
        let o = pipeline(&all, dir);
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains(".rs:"), "{err}");
    }
    // A dataset without a fingerprint (written by pylance): named.
    crate::common::python(
        "import sys, lance, pyarrow as pa\nlance.write_dataset(pa.table({'id': ['a'], 'embedding': pa.array([[1.0, 0.0]], pa.list_(pa.float32(), 2))}), sys.argv[1])\n",
        &[dir.join("plain.lance").to_str().unwrap()],
        &[],
    );
    let o = pipeline(&["evaluate", "plain.lance", "--queries", "good.jsonl", "--qrels", "qrels.tsv"], dir);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("plain.lance: the dataset holds no fingerprint"), "{err}");
}
