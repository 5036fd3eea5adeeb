//! scripts/adapt: a real fine-tune of the default MiniLM checkpoint on CPU, on pairs cut from the quickstart
//! corpus (the first half of each fortune → its second half) read from a Lance version the pipeline wrote; the
//! memory report checked against the exact tensor sizes in the checkpoint's weights file; the adapted export
//! evaluated against the base on held-out pairs by `pipeline evaluate`; and the lineage from the training data
//! version to the vectors verified, then broken link by link.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use super::lineage::{export, export_python, repo, status};
use crate::common::{pipeline, text};

fn adapt(args: &[&str], dir: &Path) -> Output {
    Command::new(repo().join("scripts/adapt")).args(args).current_dir(dir).output().unwrap()
}

/// The default model's sentence-transformers checkpoint, where the float32 export's lineage says it is.
fn base_checkpoint() -> PathBuf {
    let record: Value = serde_json::from_slice(
        &std::fs::read(repo().join("models/all-MiniLM-L6-v2-fp32/lineage.json"))
            .expect("models/all-MiniLM-L6-v2-fp32 is missing: run scripts/setup --models"),
    )
    .unwrap();
    let ckpt = embedding_pipeline::campaign::lineage::models(&record)
        .into_iter()
        .find(|m| m.role == "checkpoint")
        .and_then(|m| m.directory)
        .unwrap();
    PathBuf::from(ckpt)
}

/// Each tensor of a safetensors file, by name: (dtype, bytes), from the file's own header.
fn safetensors(path: &Path) -> BTreeMap<String, (String, u64)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let off = v["data_offsets"].as_array().unwrap();
            (k.clone(), (v["dtype"].as_str().unwrap().to_string(), off[1].as_u64().unwrap() - off[0].as_u64().unwrap()))
        })
        .collect()
}

fn json_file(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn embed_job(dir: &Path, name: &str, model: &Path, out: &str) {
    let sql = format!(
        "SET embed.model = '{}';\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'pairs/corpus.jsonl';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{out}' STORED AS LANCE;\n",
        model.display()
    );
    std::fs::write(dir.join(name), sql).unwrap();
    let o = pipeline(&["run", "-q", name], dir);
    assert!(o.status.success(), "{name}: {}", text(&o).1);
}

fn lineage(dir: &Path, dataset: &str) -> (Output, Value) {
    let o = pipeline(&["lineage", "--json", dataset, "--verify"], dir);
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o, v)
}

fn metric(report: &Value, dataset: usize, k: u64) -> (f64, f64) {
    let d = &report["datasets"][dataset];
    let recall =
        d["recall"].as_array().unwrap().iter().find(|r| r[0].as_u64() == Some(k)).unwrap()[1].as_f64().unwrap();
    (recall, d["ndcg_at_10"].as_f64().unwrap())
}

#[test]
fn adapt_fine_tunes_with_its_memory_measured_and_the_lineage_reaches_the_training_data_version() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let base = base_checkpoint();
    let o = Command::new(export_python())
        .arg(repo().join("tests/fixtures/make_pairs.py"))
        .arg(repo().join("examples/data/fortunes.jsonl"))
        .arg(dir.join("pairs"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let train_rows = std::fs::read_to_string(dir.join("pairs/train.jsonl")).unwrap().lines().count() as u64;
    // The training pairs as a Lance dataset the pipeline writes (its version 1).
    std::fs::write(
        dir.join("train.sql"),
        "CREATE EXTERNAL TABLE pairs STORED AS JSON LOCATION 'pairs/train.jsonl';\n\
         COPY (SELECT id, anchor, positive FROM pairs) TO 'pairs.lance' STORED AS LANCE;\n",
    )
    .unwrap();
    let o = pipeline(&["run", "-q", "train.sql"], dir);
    assert!(o.status.success(), "{}", text(&o).1);
    let base_arg = base.to_str().unwrap();

    // Refused before anything is trained: a column that is not there (named, before torch loads), and a run
    // that does not fit the memory it is given (after the report, which says what would fit).
    let o = adapt(&[base_arg, "nothing", "--pairs", "pairs.lance@1", "--anchor", "question"], dir);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("no column 'question'") && err.contains("anchor, positive"), "{err}");
    // (At the fine-tune's length below: a step on 256-token texts measured 3 times as long, and refuses the same.)
    let o = adapt(
        &[
            base_arg,
            "too-big",
            "--pairs",
            "pairs.lance@1",
            "--batch-size",
            "16",
            "--card-gb",
            "1.5",
            "--max-seq-length",
            "64",
        ],
        dir,
    );
    let err = text(&o).1;
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("memory of one step on the longest batch (16 pairs)"), "{err}");
    assert!(err.contains("needs") && err.contains("the largest batch that fits") && err.contains("--lora"), "{err}");
    assert!(!dir.join("too-big").exists() && !dir.join("nothing").exists());

    // Stopped while training, by SIGINT and by SIGTERM: exit 130, nothing written. Started with SIGINT ignored, as
    // a script's background job is, where Python's own ctrl-C handling would not be installed.
    for signal in ["-INT", "-TERM"] {
        let mut child = Command::new("sh")
            .args(["-c", "trap '' INT; exec \"$0\" \"$@\""])
            .arg(repo().join("scripts/adapt"))
            .args([base_arg, "stopped", "--pairs", "pairs.lance@1", "--batch-size", "4", "--max-seq-length", "32"])
            .args(["--steps", "1000"])
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut said = String::new();
        while !said.contains("adapt: training 1000 steps") {
            assert!(std::io::BufRead::read_line(&mut stderr, &mut said).unwrap() > 0, "{signal}: {said}");
        }
        assert!(Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap().success());
        let status = child.wait().unwrap();
        std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
        assert_eq!(status.code(), Some(130), "{signal}: {said}");
        assert!(said.contains("adapt: stopped before its end, as asked; nothing was written"), "{signal}: {said}");
        assert!(!dir.join("stopped").exists(), "{signal}");
    }

    // The fine-tune: 40 steps of 16 pairs (about one epoch), seeded.
    let o = adapt(
        &[
            base_arg,
            "adapted",
            "--pairs",
            "pairs.lance@1",
            "--batch-size",
            "16",
            "--steps",
            "40",
            "--lr",
            "1e-4",
            "--max-seq-length",
            "64",
            "--base",
            "sentence-transformers/all-MiniLM-L6-v2@pypi",
        ],
        dir,
    );
    let err = text(&o).1;
    assert!(o.status.success(), "{err}");
    let (report_at, first_step) = (err.find("memory of one step").unwrap(), err.find("step 4/40").unwrap());
    assert!(report_at < first_step, "the memory report comes before the first step: {err}");
    let record = json_file(&dir.join("adapted/training.json"));
    assert_eq!(record["loss_per_step"].as_array().unwrap().len(), 40);
    let data = &record["training_data"];
    assert_eq!((data["kind"].as_str(), data["version"].as_u64()), (Some("lance"), Some(1)), "{data}");
    assert_eq!(u(&data["rows"]), train_rows);
    assert_eq!(data["rows_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(record["hyperparameters"]["batch_size"], 16);
    assert_eq!(record["base"]["directory"], base_arg);

    // The memory report's fixed parts are the exact sizes of the tensors in the checkpoint's weights file.
    let tensors = safetensors(&base.join("model.safetensors"));
    let params: BTreeMap<&String, u64> =
        tensors.iter().filter(|(_, (dtype, _))| dtype == "F32").map(|(k, (_, b))| (k, *b)).collect();
    let weights: u64 = params.values().sum();
    let memory = &record["memory"];
    let variants = memory["variants"].as_array().unwrap();
    let names: Vec<&str> = variants.iter().map(|v| v["variant"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "full fine-tune",
            "full fine-tune + gradient checkpointing",
            "LoRA r=16",
            "LoRA r=16 + gradient checkpointing"
        ]
    );
    let full = &variants[0]["measured"];
    assert_eq!(u(&full["weights"]), weights, "{full}");
    // The pooler's layer is not on the path from the tokens to the loss: it gets no gradient and no state.
    let unused: Vec<&str> = full["without_gradient"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(unused.iter().all(|n| n.contains("pooler")), "{unused:?}");
    let unused_bytes: u64 =
        params.iter().filter(|(k, _)| unused.iter().any(|n| n.ends_with(k.as_str()))).map(|(_, b)| b).sum();
    let trained = (params.len() - unused.len()) as u64;
    assert_eq!(u(&full["gradients"]), weights - unused_bytes, "{full}");
    // AdamW: two moments the size of each gradient, and a 4-byte step count per tensor.
    assert_eq!(u(&full["optimizer_states"]), 2 * u(&full["gradients"]) + 4 * trained, "{full}");
    assert_eq!(u(&full["optimizer_tensors_with_state"]), trained);
    let peak =
        ["weights", "buffers", "gradients", "optimizer_states", "activations"].iter().map(|k| u(&full[k])).sum::<u64>();
    assert_eq!(u(&full["peak"]), peak);
    let checkpointed = &variants[1]["measured"];
    assert!(u(&checkpointed["activations"]) < u(&full["activations"]), "{memory}");
    assert_eq!(u(&checkpointed["gradients"]), u(&full["gradients"]));
    let lora = &variants[2]["measured"];
    assert_eq!(u(&lora["gradients"]), u(&lora["trainable"]), "{lora}");
    assert!(u(&lora["gradients"]) * 20 < u(&full["gradients"]), "{lora}");
    assert_eq!(u(&lora["optimizer_states"]), 2 * u(&lora["gradients"]) + 4 * u(&lora["optimizer_tensors_with_state"]));
    for v in variants {
        let (at48, at80) = (u(&v["largest"]["48"]), u(&v["largest"]["80"]));
        assert!(at48 > 16 && at80 > at48, "{v}");
    }

    // The export carries the training record into lineage.json: the data version, the base, the training.
    let o = export(&["adapted", "m-adapted"], dir);
    assert!(o.status.success(), "{}", text(&o).1);
    let lineage_record = json_file(&dir.join("m-adapted/lineage.json"));
    let td = embedding_pipeline::campaign::lineage::training_data(&lineage_record).unwrap();
    assert_eq!((td.kind.as_str(), td.version), ("lance", Some(1)));
    assert_eq!(td.manifest_sha256, data["manifest_sha256"].as_str().map(String::from));

    // Base and adapted vectors of the same corpus, scored on the held-out pairs: the adapted model ranks the
    // held-out continuations higher, though it never saw them.
    embed_job(dir, "base.sql", &repo().join("models/all-MiniLM-L6-v2-fp32"), "out/base.lance");
    embed_job(dir, "adapted.sql", &dir.join("m-adapted"), "out/adapted.lance");
    let o =
        pipeline(&["evaluate", "out/base.lance", "out/adapted.lance", "--pairs", "pairs/heldout.jsonl", "--json"], dir);
    assert!(o.status.success(), "{}", text(&o).1);
    let scores: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ((base_r10, base_ndcg), (adapted_r10, adapted_ndcg)) = (metric(&scores, 0, 10), metric(&scores, 1, 10));
    assert!(adapted_r10 > base_r10 && adapted_ndcg > base_ndcg, "{scores}");

    // The lineage walks from the vectors down to the training data's version, and every link holds.
    let (o, report) = lineage(dir, "out/adapted.lance");
    assert!(o.status.success(), "{report}");
    let links: Vec<&str> = report["chain"].as_array().unwrap().iter().map(|l| l["link"].as_str().unwrap()).collect();
    assert_eq!(
        links,
        ["training data", "base model", "training", "checkpoint", "ONNX export", "model directory", "vectors"],
        "{report}"
    );
    for link in ["training data", "base model", "training", "checkpoint", "ONNX export", "model directory"] {
        assert_eq!(status(&report, link), "ok", "{link}: {report}");
    }
    let (out, _) = text(&pipeline(&["lineage", "out/adapted.lance"], dir));
    assert!(out.contains("MultipleNegativesRankingLoss, 40 steps of batch 16"), "{out}");

    // The training record changed: the training link breaks, and only it.
    let path = dir.join("adapted/training.json");
    let good = std::fs::read(&path).unwrap();
    std::fs::write(&path, [good.as_slice(), b" "].concat()).unwrap();
    let (o, report) = lineage(dir, "out/adapted.lance");
    assert!(!o.status.success());
    assert_eq!(status(&report, "training"), "BROKEN", "{report}");
    assert_eq!(status(&report, "checkpoint"), "ok", "{report}");
    std::fs::write(&path, &good).unwrap();

    // The training data rewritten (made again from the same rows: another version 1): its link breaks, and the
    // checkpoint can no longer be exported as if trained on it.
    std::fs::remove_dir_all(dir.join("pairs.lance")).unwrap();
    let o = pipeline(&["run", "-q", "train.sql"], dir);
    assert!(o.status.success(), "{}", text(&o).1);
    let (o, report) = lineage(dir, "out/adapted.lance");
    assert!(!o.status.success());
    assert_eq!(status(&report, "training data"), "BROKEN", "{report}");
    assert_eq!(status(&report, "training"), "ok", "{report}");
    let o = export(&["adapted", "m-again"], dir);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("is not what adapted was trained on"), "{err}");
    assert!(!dir.join("m-again").exists());
}
