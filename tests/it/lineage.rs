//! scripts/export-onnx and `pipeline lineage`: a tiny sentence-transformers model built here from a config (no
//! hub) is exported in float32 and float16 by the real exporter (torch, in its own environment under the install
//! home, installed on first use), verified, embedded with through `pipeline run`, and its chain read back and
//! checked; then each link is broken in turn and `--verify` must name it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::{model_dir, pipeline, text, write_jsonl};

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The exporter's python, its environment installed if needed (once per machine: tests share it).
pub fn export_python() -> PathBuf {
    let out = Command::new(repo().join("scripts/export-onnx")).arg("--env").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// scripts/export-onnx with this build's pipeline.
pub(crate) fn export(args: &[&str], dir: &Path) -> Output {
    Command::new(repo().join("scripts/export-onnx"))
        .args(args)
        .env("PIPELINE", env!("CARGO_BIN_EXE_pipeline"))
        .current_dir(dir)
        .output()
        .unwrap()
}

/// The test's checkpoint `ckpt` exported into `out`, with its training data, base and check texts, and `extra`.
fn export_ckpt(dir: &Path, out: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "ckpt",
        out,
        "--train-data",
        "train.lance@1",
        "--base",
        "test/tiny-bert@seed0",
        "--check-texts",
        "check.jsonl",
    ];
    args.extend_from_slice(extra);
    export(&args, dir)
}

/// A tiny, randomly initialised sentence-transformers checkpoint in `dir/name`, as sentence-transformers 6
/// saves it, with the default model's tokenizer.
fn tiny_checkpoint(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    let o = Command::new(export_python())
        .arg(repo().join("tests/fixtures/make_tiny_st_model.py"))
        .arg(model_dir())
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

fn lineage_json(dir: &Path, args: &[&str]) -> (Output, Value) {
    let mut all = vec!["lineage", "--json"];
    all.extend_from_slice(args);
    let o = pipeline(&all, dir);
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o, v)
}

/// The status of the check of `link`.
pub(crate) fn status(report: &Value, link: &str) -> String {
    report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["link"] == link))
        .map(|c| c["status"].as_str().unwrap_or_default().to_string())
        .unwrap_or_else(|| format!("no check of {link} in {report}"))
}

fn run_job(dir: &Path, name: &str, model: &Path, out: &str, extra: &[&str]) -> Output {
    let sql = format!(
        "SET embed.model = '{}';\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{out}' STORED AS LANCE;\n",
        model.display()
    );
    std::fs::write(dir.join(name), sql).unwrap();
    let mut args = vec!["run", "-q", name];
    args.extend_from_slice(extra);
    pipeline(&args, dir)
}

#[test]
fn export_verify_embed_and_prove_the_chain_then_break_each_link() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let docs: Vec<(String, Option<String>)> =
        (0..40).map(|i| (format!("d{i}"), Some(format!("document {i} about {}", "lineage ".repeat(i % 7))))).collect();
    let docs: Vec<(&str, Option<&str>)> = docs.iter().map(|(i, t)| (i.as_str(), t.as_deref())).collect();
    write_jsonl(&dir.join("docs.jsonl"), &docs);

    // The training data: a Lance dataset written by the pipeline (its version 1).
    std::fs::write(
        dir.join("train.sql"),
        "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
         COPY (SELECT id, text FROM docs) TO 'train.lance' STORED AS LANCE;\n",
    )
    .unwrap();
    let o = pipeline(&["run", "-q", "train.sql"], dir);
    assert!(o.status.success(), "{:?}", text(&o));

    let ckpt = tiny_checkpoint(dir, "ckpt");
    std::fs::write(dir.join("check.jsonl"), "\"a user's own text\"\n{\"text\": \"another one\"}\n").unwrap();
    for (dtype, out, floor) in [("float32", "m32", 0.99999), ("float16", "m16", 0.999)] {
        let o = export_ckpt(dir, out, &["--dtype", dtype]);
        let (_, err) = text(&o);
        assert!(o.status.success(), "{dtype}: {err}");
        assert!(err.contains("verified on 18 texts"), "{err}");
        let record: Value =
            serde_json::from_slice(&std::fs::read(dir.join(out).join("lineage.json")).unwrap()).unwrap();
        let v = &record["run"]["facets"]["embeddingPipeline_verification"];
        assert!(v["passed"].as_bool().unwrap() && v["min_cosine"].as_f64().unwrap() >= floor, "{v}");
        assert_eq!(record["run"]["facets"]["embeddingPipeline_exporter"]["dtype"], dtype);
        let onnx_sha =
            embedding_pipeline::campaign::fingerprint::sha256_file(&dir.join(out).join("onnx/model.onnx")).unwrap();
        assert_eq!(record["outputs"][0]["facets"]["embeddingPipeline_onnx"]["sha256"], onnx_sha.as_str());
        let data = &record["inputs"][2]["facets"]["embeddingPipeline_trainingData"];
        assert_eq!((data["kind"].as_str(), data["version"].as_u64()), (Some("lance"), Some(1)), "{record}");
        let ck = &record["inputs"][1]["facets"]["embeddingPipeline_model"];
        assert_eq!(ck["adaptation"], "full");
        assert!(ck["training_config_sha256"]["training_args.json"].is_string(), "{ck}");
    }

    // Embed with each; the fingerprint carries the lineage's digest and the dtype, so they never mix.
    let o = run_job(dir, "j32.sql", &dir.join("m32"), "out/v32.lance", &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = run_job(dir, "j16.sql", &dir.join("m16"), "out/v16.lance", &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = run_job(dir, "mix.sql", &dir.join("m16"), "out/v32.lance", &[]);
    assert!(!o.status.success() && text(&o).1.contains("fingerprint"), "{:?}", text(&o));
    // The same checkpoint exported again (another time, another folder: what scripts/setup does on each
    // machine) is the same lineage, so the campaign goes on with it.
    let o = export_ckpt(dir, "m32-again", &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_ne!(
        std::fs::read(dir.join("m32/lineage.json")).unwrap(),
        std::fs::read(dir.join("m32-again/lineage.json")).unwrap()
    );
    let o = run_job(dir, "again.sql", &dir.join("m32-again"), "out/v32.lance", &[]);
    assert!(o.status.success(), "the same lineage exported twice must be one campaign: {:?}", text(&o));

    for (data, dtype) in [("out/v32.lance", "float32"), ("out/v16.lance", "float16")] {
        let (o, report) = lineage_json(dir, &[data, "--verify"]);
        assert!(o.status.success(), "{:?}", text(&o));
        let links: Vec<&str> =
            report["chain"].as_array().unwrap().iter().map(|l| l["link"].as_str().unwrap()).collect();
        assert_eq!(
            links,
            ["training data", "base model", "checkpoint", "ONNX export", "model directory", "vectors"],
            "{report}"
        );
        assert_eq!(report["fingerprint"]["model_dtype"], dtype);
        assert!(report["fingerprint"]["lineage_sha256"].is_string());
        for link in ["ONNX export", "model directory", "checkpoint", "training data"] {
            assert_eq!(status(&report, link), "ok", "{link}: {report}");
        }
        // The base model's weights were not given (--base-dir): named, not checked.
        assert_eq!(status(&report, "base model"), "unchecked");
    }
    // The text form and inspect show the chain too.
    let (out, _) = text(&pipeline(&["lineage", "out/v32.lance"], dir));
    assert!(out.contains("training data") && out.contains("lance version 1") && out.contains("checkpoint"), "{out}");
    let (out, _) = text(&pipeline(&["inspect", "out/v32.lance"], dir));
    assert!(out.contains("lineage (pipeline lineage --verify checks it)") && out.contains("full fine-tune"), "{out}");

    // One byte of the model file changed: the model directory's link breaks, and only it.
    let onnx = dir.join("m32/onnx/model.onnx");
    let good = std::fs::read(&onnx).unwrap();
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    std::fs::write(&onnx, &bad).unwrap();
    let (o, report) = lineage_json(dir, &["out/v32.lance", "--verify"]);
    assert!(!o.status.success(), "{report}");
    assert_eq!(status(&report, "model directory"), "BROKEN", "{report}");
    assert_eq!(status(&report, "training data"), "ok");
    let (_, err) = text(&pipeline(&["lineage", "out/v32.lance", "--verify"], dir));
    assert!(err.contains("lineage broken at: model directory"), "{err}");
    std::fs::write(&onnx, &good).unwrap();

    // The checkpoint's weights changed after the export.
    let weights = ckpt.join("model.safetensors");
    let good_weights = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, [good_weights.as_slice(), b" "].concat()).unwrap();
    let (o, report) = lineage_json(dir, &["out/v32.lance", "--verify"]);
    assert!(!o.status.success());
    assert_eq!(status(&report, "checkpoint"), "BROKEN", "{report}");
    std::fs::write(&weights, &good_weights).unwrap();

    // A version added to the training data, then the referenced one cleaned up by Lance: the link breaks.
    let o = pipeline(&["run", "-q", "--restart", "train.sql"], dir);
    assert!(o.status.success(), "{:?}", text(&o));
    let (o, report) = lineage_json(dir, &["out/v32.lance", "--verify"]);
    assert!(o.status.success(), "a newer version alone breaks nothing: {report}");
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let ds = lance::Dataset::open(dir.join("train.lance").to_str().unwrap()).await.unwrap();
        assert_eq!(ds.version().version, 2);
        let removed = ds.cleanup_old_versions(Default::default(), Some(true), None).await.unwrap();
        assert!(removed.old_versions >= 1, "{removed:?}");
    });
    let (o, report) = lineage_json(dir, &["out/v32.lance", "--verify"]);
    assert!(!o.status.success());
    assert_eq!(status(&report, "training data"), "BROKEN", "{report}");
    assert_eq!(status(&report, "model directory"), "ok", "{report}");
}

#[test]
fn the_exporter_refuses_what_it_cannot_export_and_leaves_out_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ckpt = tiny_checkpoint(dir, "ckpt");

    // A module the pipeline does not run (a LayerNorm after pooling): named, nothing written.
    let modules = std::fs::read_to_string(ckpt.join("modules.json")).unwrap();
    let mut parsed: Vec<Value> = serde_json::from_str(&modules).unwrap();
    parsed.push(serde_json::json!({"idx": 3, "name": "3", "path": "3_LayerNorm", "type": "sentence_transformers.models.LayerNorm"}));
    std::fs::write(ckpt.join("modules.json"), serde_json::to_string(&parsed).unwrap()).unwrap();
    let o = export(&["ckpt", "out"], dir);
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("sentence_transformers.models.LayerNorm") && err.contains("modules.json"),
        "{err}"
    );
    assert!(!dir.join("out").exists());
    std::fs::write(ckpt.join("modules.json"), modules).unwrap();

    // A default prompt goes before every input on both sides, as in sentence-transformers; the export says so.
    let config = ckpt.join("config_sentence_transformers.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    c["prompts"] = serde_json::json!({"query": "query: ", "document": ""});
    c["default_prompt_name"] = "query".into();
    std::fs::write(&config, c.to_string()).unwrap();
    let o = export(&["ckpt", "prompted"], dir);
    let (_, err) = text(&o);
    assert!(o.status.success() && err.contains("default prompt 'query' ('query: ') goes before every input"), "{err}");

    // An OUT that holds something is not overwritten.
    std::fs::create_dir(dir.join("taken")).unwrap();
    std::fs::write(dir.join("taken/keep.txt"), "mine").unwrap();
    let o = export(&["ckpt", "taken"], dir);
    assert!(!o.status.success() && text(&o).1.contains("not empty"), "{:?}", text(&o));
    assert_eq!(std::fs::read_to_string(dir.join("taken/keep.txt")).unwrap(), "mine");

    // Training data that is not there, and a version that is not there.
    let o = export(&["ckpt", "out", "--train-data", "nowhere.lance@3"], dir);
    assert!(!o.status.success() && text(&o).1.contains("nowhere.lance"), "{:?}", text(&o));
    assert!(!dir.join("out").exists());
}

/// The float32 and float16 exports of the default model that `scripts/setup --models` (and `--gpu`) makes from
/// the PyPI checkpoint: verified, with their lineage, and the float32 one gives the sentence-transformers README's
/// similarity matrix through `pipeline run`.
#[test]
fn the_default_models_exports_give_the_sentence_transformers_matrix() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_jsonl(
        &dir.join("docs.jsonl"),
        &[
            ("s0", Some("The weather is lovely today.")),
            ("s1", Some("It's so sunny outside!")),
            ("s2", Some("He drove to the stadium.")),
        ],
    );
    // sentence-transformers' README: similarity of sentences 0-1, 0-2, 1-2.
    let readme = [0.6660f32, 0.1046, 0.1411];
    for (name, dtype, tolerance) in
        [("all-MiniLM-L6-v2-fp32", "float32", 0.0005f32), ("all-MiniLM-L6-v2-fp16", "float16", 0.001)]
    {
        let model = repo().join("models").join(name);
        assert!(model.join("lineage.json").is_file(), "{} is missing: run scripts/setup --models", model.display());
        let out = format!("out/{name}.lance");
        let o = run_job(dir, "job.sql", &model, &out, &[]);
        assert!(o.status.success(), "{name}: {:?}", text(&o));
        let (o, report) = lineage_json(dir, &[&out, "--verify"]);
        assert!(o.status.success(), "{name}: {report}");
        assert_eq!(report["fingerprint"]["model_dtype"], dtype);
        for link in ["base model", "checkpoint", "ONNX export", "model directory"] {
            assert_eq!(status(&report, link), "ok", "{name} {link}: {report}");
        }
        let rt = tokio::runtime::Runtime::new().unwrap();
        let batches = rt
            .block_on(super::common::sql(
                &super::common::session(),
                &format!(
                    "CREATE EXTERNAL TABLE v STORED AS LANCE LOCATION '{}'; SELECT id, embedding FROM v ORDER BY id",
                    dir.join(&out).display()
                ),
            ))
            .unwrap();
        let v: Vec<Vec<f32>> = super::common::vectors(&batches, "embedding").into_iter().map(Option::unwrap).collect();
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let got = [dot(&v[0], &v[1]), dot(&v[0], &v[2]), dot(&v[1], &v[2])];
        for (g, want) in got.iter().zip(readme) {
            assert!((g - want).abs() <= tolerance, "{name}: {got:?} against the README's {readme:?}");
        }
    }
}

/// A model directory without lineage.json: the chain starts at the ONNX file, and --verify still checks the
/// model's files and the plan's corpus.
#[test]
fn without_lineage_the_chain_starts_at_the_onnx_file_and_the_plan_is_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_jsonl(
        &dir.join("docs.jsonl"),
        &[("a", Some("one text")), ("b", Some("another text")), ("c", Some("a third"))],
    );
    super::common::docs_job(dir, "job.sql", "");
    for args in [&["plan", "job.sql"][..], &["run", "-q", "job.sql"]] {
        let o = pipeline(args, dir);
        assert!(o.status.success(), "{:?}", text(&o));
    }
    let (o, report) = lineage_json(dir, &["out/docs.lance", "--verify"]);
    assert!(o.status.success(), "{report}");
    let links: Vec<&str> = report["chain"].as_array().unwrap().iter().map(|l| l["link"].as_str().unwrap()).collect();
    assert_eq!(links, ["model directory", "vectors", "plan"], "{report}");
    assert!(report["fingerprint"].get("lineage_sha256").is_none(), "{report}");
    assert_eq!(status(&report, "model directory"), "ok", "{report}");
    assert_eq!(status(&report, "plan"), "ok", "{report}");
    let (out, _) = text(&pipeline(&["lineage", "out/docs.lance"], dir));
    assert!(out.contains("has no lineage.json: the chain starts at the ONNX file"), "{out}");

    // The corpus changed after it was planned and embedded: the plan's link breaks.
    let mut docs = std::fs::read_to_string(dir.join("docs.jsonl")).unwrap();
    docs.push_str("{\"id\": \"d\", \"text\": \"added later\"}\n");
    std::fs::write(dir.join("docs.jsonl"), docs).unwrap();
    let (o, report) = lineage_json(dir, &["out/docs.lance", "--verify"]);
    assert!(!o.status.success());
    assert_eq!(status(&report, "plan"), "BROKEN", "{report}");
    assert_eq!(status(&report, "model directory"), "ok", "{report}");
    // A dataset that is not there is an error that names it.
    let o = pipeline(&["lineage", "out/none.lance"], dir);
    assert!(!o.status.success() && text(&o).1.contains("out/none.lance"), "{:?}", text(&o));
}

/// A second representation version in the same output, planned anew (issue 53 item 7): the plan the first
/// version executed is kept beside the new one, not replaced, so both versions' lineage still verifies. A plan no
/// version was made from is replaced as before.
#[test]
fn a_new_plan_keeps_the_one_an_earlier_version_was_made_from() {
    use sha2::Digest;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_jsonl(&dir.join("docs.jsonl"), &[("a", Some("one text")), ("b", Some("another text"))]);
    super::common::docs_job(dir, "v1.sql", "SET embed.tag = 'v1';");
    super::common::docs_job(dir, "v2.sql", "SET embed.tag = 'v2';\nSET embed.max_tokens = 128;");
    let plan_dir = dir.join("out/docs.lance.plan");
    let digest = |d: &Path| format!("{:x}", sha2::Sha256::digest(std::fs::read(d.join("plan.json")).unwrap()));
    for args in [&["plan", "v1.sql"][..], &["plan", "v1.sql"], &["run", "-q", "v1.sql"]] {
        let o = pipeline(args, dir);
        assert!(o.status.success(), "{:?}", text(&o));
    }
    let first = digest(&plan_dir);
    let plans = std::fs::read_dir(dir.join("out")).unwrap();
    let plans = plans.filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("docs.lance.plan"));
    // Planned twice before the run: the first plan, which no version executed, was replaced.
    assert_eq!(plans.count(), 1);

    for args in [&["plan", "v2.sql"][..], &["run", "-q", "v2.sql", "--restart"]] {
        let o = pipeline(args, dir);
        assert!(o.status.success(), "{:?}", text(&o));
    }
    let kept = dir.join(format!("out/docs.lance.plan.{}", &first[..12]));
    assert_eq!(digest(&kept), first);
    assert_ne!(digest(&plan_dir), first);
    for version in ["out/docs.lance@v1", "out/docs.lance@v2"] {
        let (o, report) = lineage_json(dir, &[version, "--verify"]);
        assert!(o.status.success(), "{version}: {report}");
        assert_eq!(status(&report, "plan"), "ok", "{version}: {report}");
    }
}
