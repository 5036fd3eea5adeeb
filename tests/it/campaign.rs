//! Comparable campaigns: the fingerprint kept with the vectors, refusal of mismatched appends, run
//! records, tags, `inspect`, `compare` and `check-invariance`.

use std::path::Path;
use std::process::Output;

use lance::Dataset;
use serde_json::Value;

use crate::common::{model_dir, pipeline, scalar_i64, session, sql, write_jsonl};

const FINGERPRINT_KEY: &str = "embedding_pipeline.fingerprint";
const ONNX_SHA256: &str = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6";
const TOKENIZER_SHA256: &str = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037";

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

fn docs(dir: &Path) -> String {
    let p = dir.join("docs.jsonl");
    write_jsonl(&p, &[("a", Some("cat cat cat")), ("b", Some(&"cat ".repeat(40))), ("c", None)]);
    format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'", p.display())
}

fn copy_to(out: &str) -> String {
    format!("COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{out}' STORED AS LANCE")
}

#[tokio::test]
async fn fingerprint_is_stored_and_read_back_through_lance_and_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance").display().to_string();
    let s = session();
    sql(&s, &format!("{}; {}", docs(tmp.path()), copy_to(&out))).await.unwrap();

    let ds = Dataset::open(&out).await.unwrap();
    let fp: Value = serde_json::from_str(&ds.schema().metadata[FINGERPRINT_KEY]).unwrap();
    assert_eq!(fp["model_sha256"], ONNX_SHA256);
    assert_eq!(fp["tokenizer_sha256"], TOKENIZER_SHA256);

    let o = pipeline(&["inspect", &out, "--json"], tmp.path());
    assert!(o.status.success());
    let j = json_of(&o);
    let f = &j["fingerprint"];
    for (k, v) in [
        ("model", Value::from("all-MiniLM-L6-v2")),
        ("model_sha256", ONNX_SHA256.into()),
        ("model_dtype", "int8".into()),
        ("tokenizer_sha256", TOKENIZER_SHA256.into()),
        ("max_tokens", 256.into()),
        ("truncation", "right".into()),
        ("pooling", "mean".into()),
        ("normalize", true.into()),
        ("prefix", "".into()),
        ("dtype", "float32".into()),
        ("dim", 384.into()),
    ] {
        assert_eq!(f[k], v, "fingerprint.{k}");
    }
    assert_eq!((j["rows"].as_u64(), j["version"].as_u64()), (Some(3), Some(1)));
    assert_eq!(j["ids"]["unique"], true);
    assert_eq!(j["versions"].as_array().unwrap().len(), 1);
    let device = &j["versions"][0]["run"]["device"];
    assert_eq!(device["provider"], "CPUExecutionProvider");
    assert_eq!(device["onnxruntime_version"], "1.31.1");
}

#[tokio::test]
async fn each_mismatching_field_is_refused_and_the_version_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance").display().to_string();
    let s = session();
    sql(&s, &format!("{}; {}", docs(tmp.path()), copy_to(&out))).await.unwrap();
    for (set, field) in [
        ("SET embed.normalize = false".to_string(), "normalize"),
        ("SET embed.pooling = 'cls'".to_string(), "pooling"),
        ("SET embed.max_tokens = 128".to_string(), "max_tokens"),
        ("SET embed.truncation = 'left'".to_string(), "truncation"),
        ("SET embed.prefix = 'passage: '".to_string(), "prefix"),
    ] {
        let s = session();
        sql(&s, &docs(tmp.path())).await.unwrap();
        let err = sql(&s, &format!("{set}; {}", copy_to(&out))).await.unwrap_err().to_string();
        assert!(err.contains("refusing to append") && err.contains(&format!("  {field}: dataset")), "{set}: {err}");
        let ds = Dataset::open(&out).await.unwrap();
        assert_eq!((ds.version().version, ds.count_rows(None).await.unwrap()), (1, 3), "{set}");
    }
    // Plain vectors without a fingerprint are refused too.
    let err = sql(&s, &format!("COPY (SELECT id, embedding FROM (SELECT 'z' AS id, arrow_cast(make_array(1.0), 'FixedSizeList(1, Float32)') AS embedding)) TO '{out}' STORED AS LANCE"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("refusing to append"), "{err}");
}

#[tokio::test]
async fn run_record_counts_are_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance").display().to_string();
    let s = session();
    // One partition, so both texts share one model call.
    sql(
        &s,
        &format!(
            "SET datafusion.execution.target_partitions = 1; SET embed.max_tokens = 16; {}; {}",
            docs(tmp.path()),
            copy_to(&out)
        ),
    )
    .await
    .unwrap();
    let j = json_of(&pipeline(&["inspect", &out, "--json"], tmp.path()));
    let r = &j["versions"][0]["run"];
    // a: [CLS] cat cat cat [SEP] = 5 tokens. b: 42 tokens cut to 16, 26 dropped. c: NULL.
    for (k, v) in [
        ("rows_written", 3),
        ("documents", 2),
        ("null_texts", 1),
        ("useful_tokens", 21),
        ("processed_tokens", 32),
        ("truncated_documents", 1),
        ("dropped_tokens", 26),
        ("model_calls", 1),
    ] {
        assert_eq!(r[k].as_u64(), Some(v), "run.{k} in {r}");
    }
    assert!((r["padding_efficiency"].as_f64().unwrap() - 21.0 / 32.0).abs() < 1e-9);
    for k in ["wall_seconds", "model_seconds", "tokenize_seconds", "write_seconds"] {
        assert!(r[k].as_f64().unwrap() >= 0.0, "{k}");
    }
    assert!(r["wall_seconds"].as_f64().unwrap() >= r["model_seconds"].as_f64().unwrap());
    // How busy the model was: ONNX Runtime's run alone, within the model time, over one CPU session's wall time.
    let (run, model) = (r["model_run_seconds"].as_f64().unwrap(), r["model_seconds"].as_f64().unwrap());
    assert!(run > 0.0 && run <= model, "model_run_seconds {run} within model_seconds {model}");
    assert_eq!(r["model_sessions"].as_u64(), Some(1), "{r}");
    let busy = r["model_busy"].as_f64().unwrap();
    let expected = run / r["wall_seconds"].as_f64().unwrap();
    assert!(busy > 0.0 && busy <= 1.0 && (busy - expected).abs() < 1e-9, "model_busy {busy}, expected {expected}");
}

#[tokio::test]
async fn tags_mark_versions_that_read_back_from_sql() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.lance").display().to_string();
    let s = session();
    let first =
        format!("COPY (SELECT id, embed(text) AS embedding FROM docs WHERE id <> 'c') TO '{out}' STORED AS LANCE");
    sql(&s, &format!("{}; SET embed.tag = 'minilm-v1'; {first}", docs(tmp.path()))).await.unwrap();
    // The tag is taken: a second run with it is refused before anything is written.
    let err = sql(&s, &copy_to(&out)).await.unwrap_err().to_string();
    assert!(err.contains("minilm-v1") && err.contains("already marks version 1"), "{err}");
    sql(&s, &format!("SET embed.tag = ''; {}", copy_to(&out))).await.unwrap();
    let ds = Dataset::open(&out).await.unwrap();
    assert_eq!(ds.version().version, 2);
    sql(&s, &format!("CREATE EXTERNAL TABLE tagged STORED AS LANCE LOCATION '{out}' OPTIONS ('tag' 'minilm-v1')"))
        .await
        .unwrap();
    assert_eq!(scalar_i64(&sql(&s, "SELECT count(*) FROM tagged").await.unwrap()), 2);
    let j = json_of(&pipeline(&["inspect", &out, "--json"], tmp.path()));
    assert_eq!(j["tags"]["minilm-v1"], 1);
    assert_eq!(j["versions"][0]["tags"][0], "minilm-v1");
    assert_eq!(j["ids"]["unique"], true, "the second write added only the missing id");
    assert_eq!(j["rows"], 3);
}

#[tokio::test]
async fn compare_finds_identical_differing_and_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (a, b, c) = ["a.lance", "b.lance", "c.lance"].map(|f| d.join(f).display().to_string()).into();
    let s = session();
    sql(&s, &format!("{}; {}", docs(d), copy_to(&a))).await.unwrap();
    sql(&s, &format!("SET embed.pooling = 'cls'; {}", copy_to(&b))).await.unwrap();
    sql(&s, &format!("SET embed.pooling = 'mean'; COPY (SELECT id, embed(text) AS embedding FROM docs WHERE id <> 'a') TO '{c}' STORED AS LANCE"))
        .await
        .unwrap();

    let same = pipeline(&["compare", &a, &a, "--json"], d);
    assert!(same.status.success());
    let j = json_of(&same);
    assert_eq!(
        (j["matched"].as_u64(), j["min_cosine"].as_f64(), j["max_abs_diff"].as_f64()),
        (Some(3), Some(1.0), Some(0.0))
    );

    let differ = pipeline(&["compare", &a, &b, "--json"], d);
    assert!(!differ.status.success());
    let j = json_of(&differ);
    assert!(j["min_cosine"].as_f64().unwrap() < 0.9999 && j["max_abs_diff"].as_f64().unwrap() > 0.0, "{j}");

    let missing = pipeline(&["compare", &a, &c, "--json"], d);
    assert!(!missing.status.success());
    let j = json_of(&missing);
    assert_eq!((j["only_in_a"].as_u64(), j["only_in_b"].as_u64()), (Some(1), Some(0)));
    assert_eq!(j["only_in_a_examples"][0], "a");
    assert_eq!(j["min_cosine"].as_f64(), Some(1.0));
    // Versions compare with `@`.
    let o = pipeline(&["compare", &format!("{a}@1"), &a], d);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn the_default_model_is_batch_invariant() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/fortunes.jsonl");
    std::fs::write(
        tmp.path().join("job.sql"),
        format!(
            "SET embed.model = '{}';\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}';\nSELECT 1;",
            model_dir().display(),
            corpus.display()
        ),
    )
    .unwrap();
    let o = pipeline(&["check-invariance", "job.sql", "--sample", "24", "--json"], tmp.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j = json_of(&o);
    assert_eq!(j["sample"], 24);
    assert!(j["max_abs_diff"].as_f64().unwrap() <= 1e-5, "{j}");
}

#[tokio::test]
async fn truncation_error_names_the_id() {
    let tmp = tempfile::tempdir().unwrap();
    let s = session();
    sql(&s, &docs(tmp.path())).await.unwrap();
    let err = sql(&s, "SET embed.max_tokens = 16; SET embed.truncation = 'error'; SELECT embed(text, id) FROM docs")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("id b") && err.contains("42 tokens"), "{err}");
    let err = sql(&s, "SELECT embed(text) FROM docs").await.unwrap_err().to_string();
    assert!(err.contains("cat cat") && err.contains("embed(text, id)"), "{err}");
}

#[tokio::test]
async fn a_prefix_changes_the_vector() {
    let s = session();
    let plain = crate::common::vectors(&sql(&s, "SELECT embed('a sunny day') AS v").await.unwrap(), "v");
    let prefixed = crate::common::vectors(
        &sql(&s, "SET embed.prefix = 'query: '; SELECT embed('a sunny day') AS v").await.unwrap(),
        "v",
    );
    let c = crate::common::cosine(plain[0].as_ref().unwrap(), prefixed[0].as_ref().unwrap());
    assert!(c < 0.999 && c > 0.5, "cosine {c}");
}
