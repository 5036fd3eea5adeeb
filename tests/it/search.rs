//! `pipeline search`: the query embedded with the dataset's own model (found through its run records), the
//! nearest rows exactly those a brute-force cosine over the stored vectors gives, and a model that does not make
//! the dataset's vectors refused.

use std::path::Path;

use serde_json::Value;

use crate::common::{assert_text, docs_job, pipeline, refusal, text, write_jsonl};

fn search(dir: &Path, args: &[&str]) -> (std::process::Output, Value) {
    let mut all = vec!["search", "--json"];
    all.extend_from_slice(args);
    let o = pipeline(&all, dir);
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o, v)
}

#[test]
fn search_finds_what_a_brute_force_cosine_finds_and_refuses_another_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let texts = [
        ("dog1", "My dog started talking to me this morning and asked for breakfast."),
        ("dog2", "A talking dog walks into a bar and orders a drink."),
        ("cat1", "The cat sleeps on the sofa all afternoon."),
        ("tax1", "Quarterly tax filings are due at the end of the month."),
        ("sql1", "SELECT id FROM docs WHERE length(text) > 10;"),
        ("sea1", "Waves broke on the rocks under a grey sky."),
        ("car1", "He drove to the stadium in an old red car."),
        ("bird", "A parrot repeated every word the sailor said."),
    ];
    let docs: Vec<(&str, Option<&str>)> = texts.iter().map(|(i, t)| (*i, Some(*t))).collect();
    write_jsonl(&dir.join("docs.jsonl"), &docs);
    docs_job(dir, "job.sql", "");
    let o = pipeline(&["run", "-q", "job.sql"], dir);
    assert!(o.status.success(), "{:?}", text(&o));

    let (o, rows) = search(dir, &["out/docs.lance", "a dog that can talk", "-k", "3"]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(!text(&o).1.contains("WARN"), "{}", text(&o).1);
    let rows = rows.as_array().unwrap().clone();
    assert_eq!(rows.len(), 3);
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert!(ids[..2].contains(&"dog1") && ids[..2].contains(&"dog2"), "{ids:?}");
    assert!(rows[0].get("embedding").is_none(), "vectors are not printed: {rows:?}");

    // The same query through `pipeline embed`, and a cosine distance against every stored vector.
    let model = super::common::model_dir().display().to_string();
    let o = pipeline(&["embed", "--model", &model, "a dog that can talk"], dir);
    let q: Vec<f32> =
        serde_json::from_value(serde_json::from_slice::<Value>(&o.stdout).unwrap()["vector"].clone()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let batches = rt
        .block_on(super::common::sql(
            &super::common::session(),
            &format!(
                "CREATE EXTERNAL TABLE v STORED AS LANCE LOCATION '{}'; SELECT id, embedding FROM v",
                dir.join("out/docs.lance").display()
            ),
        ))
        .unwrap();
    let all_ids = super::common::strings(&batches, "id");
    let vectors = super::common::vectors(&batches, "embedding");
    let mut brute: Vec<(f64, &str)> = all_ids
        .iter()
        .zip(&vectors)
        .map(|(id, v)| {
            let v = v.as_ref().unwrap();
            let dot: f64 = v.iter().zip(&q).map(|(a, b)| *a as f64 * *b as f64).sum();
            let norms = (v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>()
                * q.iter().map(|a| (*a as f64).powi(2)).sum::<f64>())
            .sqrt();
            (1.0 - dot / norms, id.as_str())
        })
        .collect();
    brute.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (row, (distance, id)) in rows.iter().zip(&brute) {
        assert_eq!(row["id"].as_str().unwrap(), *id, "{rows:?} against {brute:?}");
        assert!((row["_distance"].as_f64().unwrap() - distance).abs() < 1e-5, "{rows:?} against {brute:?}");
    }

    // A filter applies before the search.
    let (o, rows) = search(dir, &["out/docs.lance", "a dog that can talk", "-k", "2", "--where", "id <> 'dog1'"]);
    assert!(o.status.success(), "{:?}", text(&o));
    let ids: Vec<&str> = rows.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2);
    assert!(!ids.contains(&"dog1") && ids[0] == "dog2", "{ids:?}");

    // Another model cannot embed the query: refused, naming what differs.
    let other = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2-fp32").display().to_string();
    let mut said = String::new();
    let mut refused = |args: &[&str]| said += &refusal(args, &pipeline(args, dir));
    refused(&["search", "--json", "out/docs.lance", "a dog", "--model", &other]);
    // Bad arguments and datasets without vectors say so.
    refused(&["search", "--json", "out/docs.lance", "a dog", "--metric", "hamming"]);
    refused(&["search", "--json", "out/docs.lance", "a dog", "--column", "text"]);
    refused(&["search", "--json", "out/docs.lance", "a dog", "--exact", "--refine", "5"]);
    // What is wrong with the dataset named is said plainly: a version it lacks, a file, a store not supported
    // (not object_store's list of valid schemes).
    refused(&["search", "--json", "out/docs.lance@99", "a dog"]);
    refused(&["search", "--json", "out/docs.lance@nosuchtag", "a dog"]);
    refused(&["search", "--json", "docs.jsonl", "a dog"]);
    refused(&["search", "--json", "gs://bucket/docs.lance", "a dog"]);
    assert_text("search_refusals", dir, &said);
}

/// pylance's nearest query on a vector from `pipeline embed`: ids and cosine distances, nearest first.
const PYLANCE_NEAREST: &str = r#"
import json, sys, lance, numpy as np
q = np.array(json.loads(sys.argv[2])["vector"], dtype=np.float32)
t = lance.dataset(sys.argv[1]).to_table(columns=["id"], nearest={"column": "embedding", "q": q, "k": 10, "metric": "cosine"})
print(json.dumps({"ids": t.column("id").to_pylist(), "distances": t.column("_distance").to_pylist()}))
"#;

#[test]
fn search_on_the_quickstart_output_finds_talking_dogs_and_agrees_with_pylance() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The quickstart job as it is, run from the repository's layout (its relative paths made absolute).
    let job = std::fs::read_to_string(root.join("sql/quickstart.sql"))
        .unwrap()
        .replace("'models/", &format!("'{}/models/", root.display()))
        .replace("'examples/", &format!("'{}/examples/", root.display()));
    std::fs::write(dir.join("quickstart.sql"), job).unwrap();
    let o = pipeline(&["run", "-q", "quickstart.sql"], dir);
    assert!(o.status.success(), "{:?}", text(&o));

    let fortunes = root.join("examples/data/fortunes.jsonl").display().to_string();
    let (o, rows) = search(dir, &["out/quickstart.lance", "a dog that can talk", "--join", &fortunes]);
    assert!(o.status.success(), "{:?}", text(&o));
    let rows = rows.as_array().unwrap().clone();
    assert_eq!(rows.len(), 10);
    let texts: Vec<&str> = rows.iter().map(|r| r["text"].as_str().unwrap()).collect();
    let dogs = texts.iter().filter(|t| t.to_lowercase().contains("dog")).count();
    assert!(texts[..2].iter().all(|t| t.to_lowercase().contains("dog")) && dogs >= 4, "{texts:#?}");

    let model = root.join("models/all-MiniLM-L6-v2").display().to_string();
    let o = pipeline(&["embed", "--model", &model, "a dog that can talk"], dir);
    assert!(o.status.success(), "{:?}", text(&o));
    let dataset = dir.join("out/quickstart.lance").display().to_string();
    let py = crate::common::python(PYLANCE_NEAREST, &[&dataset, String::from_utf8_lossy(&o.stdout).trim()], &[]);
    let py: Value = serde_json::from_str(&py).unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    let py_ids: Vec<&str> = py["ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(ids, py_ids);
    for (r, d) in rows.iter().zip(py["distances"].as_array().unwrap()) {
        let (a, b) = (r["_distance"].as_f64().unwrap(), d.as_f64().unwrap());
        assert!((a - b).abs() <= 1e-6, "{a} vs pylance {b}");
    }

    // A hit the source lacks keeps its columns, null.
    let some = dir.join("some.jsonl");
    let lines: Vec<String> = std::fs::read_to_string(&fortunes).unwrap().lines().map(String::from).collect();
    let kept: Vec<&String> = lines.iter().filter(|l| !l.contains(&format!("\"{}\"", ids[0]))).collect();
    assert_eq!(kept.len(), lines.len() - 1);
    std::fs::write(&some, kept.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let (o, rows) =
        search(dir, &["out/quickstart.lance", "a dog that can talk", "--join", &some.display().to_string()]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(rows[0]["id"].as_str(), Some(ids[0]), "{rows}");
    assert_eq!(rows[0].as_object().unwrap().get("text"), Some(&Value::Null), "present, null: {rows}");

    // A CSV source with a line break inside a quoted text, as pandas writes one.
    let csv = dir.join("some.csv");
    std::fs::write(&csv, format!("id,text\n{},\"a dog\nthat talks\"\nother,plain\n", ids[0])).unwrap();
    let (o, rows) = search(dir, &["out/quickstart.lance", "a dog that can talk", "--join", &csv.display().to_string()]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(rows[0]["text"], "a dog\nthat talks", "{rows}");

    // The join's failures are named.
    let twice = dir.join("twice.jsonl");
    let lines = std::fs::read_to_string(&fortunes).unwrap();
    std::fs::write(&twice, format!("{lines}{lines}")).unwrap();
    let mut said = String::new();
    for args in [
        &["search", "--json", "out/quickstart.lance", "a dog", "--join", "notes.txt"][..],
        &["search", "--json", "out/quickstart.lance", "a dog", "--join", &fortunes, "--id", "key"],
        &["search", "--json", "out/quickstart.lance", "a dog", "--join", &twice.display().to_string()],
    ] {
        said += &refusal(args, &pipeline(args, dir));
    }
    assert_text("search_join_refusals", dir, &said);
}
