//! Lineage: what made a model directory, as `scripts/export-onnx` records it in `lineage.json` (an
//! OpenLineage-shaped run event: the base model, the checkpoint and its adaptation, the training data, the
//! exporter and its verification, the ONNX file), and how a dataset's vectors hang from it.
//!
//! A model directory with `lineage.json` puts the digest of its identity in the fingerprint (`lineage_sha256`:
//! see [`digest`]), and
//! each write's run record carries the model directory and the whole record, so that `pipeline lineage` can
//! print the chain (training data → checkpoint → ONNX export → vectors) and check each link later.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// The lineage file in a model directory.
pub const LINEAGE_FILE: &str = "lineage.json";

/// A model directory's lineage record, and its [`digest`] (which the fingerprint keeps).
#[derive(Debug, Clone, PartialEq)]
pub struct Lineage {
    pub sha256: String,
    pub record: Value,
}

/// What makes two lineage records the same lineage: the hashes and versions that decide the model, and not
/// when or where the export ran. Kept: each input's hashes and versions (the base model's name and revision,
/// the checkpoint's adaptation, weights and training config, the training data's kind, version, tag, manifest
/// or file hashes, and a remote URI), the exporter's versions, opset and dtype, and the ONNX file's sha256.
/// Left out: the event time, the run id, timings, verification figures (which move in the last digits from
/// one CPU to another) and local paths. So the same checkpoint exported again, on this machine or another,
/// is the same campaign, and any change to what made the model is another.
pub fn identity(record: &Value) -> Value {
    const VOLATILE: [&str; 4] = ["_producer", "_schemaURL", "directory", "seconds"];
    let strip = |facet: &Value, also: &[&str]| -> Value {
        match facet.as_object() {
            Some(map) => Value::Object(
                map.iter()
                    .filter(|(k, _)| !VOLATILE.contains(&k.as_str()) && !also.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
            None => Value::Null,
        }
    };
    let mut inputs: Vec<Value> = record
        .get("inputs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|d| {
            let namespace = text(d.get("namespace"));
            // Local paths (a checkpoint's folder, local training data) differ between machines; names of
            // models and remote URIs do not.
            let name = if namespace == "file" || namespace == "lance" { String::new() } else { text(d.get("name")) };
            let mut facets = serde_json::Map::new();
            if let Some(f) = facet(d, "embeddingPipeline_model") {
                facets.insert("model".into(), strip(f, &[]));
            }
            if let Some(f) = facet(d, "embeddingPipeline_trainingData") {
                let local = text(f.get("kind")) != "remote";
                facets.insert("training_data".into(), strip(f, if local { &["uri"] } else { &[] }));
            }
            serde_json::json!({"namespace": namespace, "name": name, "facets": facets})
        })
        .collect();
    inputs.sort_by_key(|v| v.to_string());
    let exporter = record.get("run").and_then(|r| r.get("facets")).and_then(|f| f.get("embeddingPipeline_exporter"));
    serde_json::json!({
        "inputs": inputs,
        "exporter": exporter.map(|e| strip(e, &[])).unwrap_or(Value::Null),
        "onnx_sha256": onnx_sha256(record),
    })
}

/// sha256 of [`identity`], in a canonical form (object keys sorted at every level).
pub fn digest(record: &Value) -> String {
    fn canonical(v: &Value) -> Value {
        match v {
            Value::Object(map) => {
                let sorted: BTreeMap<&String, Value> = map.iter().map(|(k, v)| (k, canonical(v))).collect();
                Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
            other => other.clone(),
        }
    }
    super::digest::hex_sha256(canonical(&identity(record)).to_string().as_bytes())
}

/// The lineage of the model directory `dir`, or None when it has no `lineage.json`. A file that is not
/// JSON is an error that names it.
pub fn read(dir: &Path) -> Result<Option<Lineage>> {
    let path = dir.join(LINEAGE_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let bad = |message: String| Error::model(dir, LINEAGE_FILE, message);
    let bytes = std::fs::read(&path).map_err(|e| bad(format!("cannot read: {e}")))?;
    let record: Value = serde_json::from_slice(&bytes)
        .map_err(|e| bad(format!("not JSON ({e}); write it again with scripts/export-onnx, or remove it")))?;
    Ok(Some(Lineage { sha256: digest(&record), record }))
}

/// Where a fingerprinted model directory is, and its lineage: what a run record keeps about its model.
#[derive(Debug, Clone)]
pub struct ModelOrigin {
    pub dir: PathBuf,
    pub lineage: Option<Lineage>,
}

type Origins = Mutex<HashMap<(String, String), ModelOrigin>>;

fn origins() -> &'static Origins {
    static ORIGINS: OnceLock<Origins> = OnceLock::new();
    ORIGINS.get_or_init(Default::default)
}

/// Remember the model directory that a fingerprint with these hashes was made from, for the run records
/// of writes under it (which know the fingerprint, not the directory).
pub fn remember(model_sha256: &str, lineage_sha256: &str, origin: ModelOrigin) {
    let key = (model_sha256.to_string(), lineage_sha256.to_string());
    origins().lock().unwrap_or_else(|e| e.into_inner()).insert(key, origin);
}

/// The model directory this process fingerprinted with these hashes, if any.
pub fn recall(model_sha256: &str, lineage_sha256: &str) -> Option<ModelOrigin> {
    let key = (model_sha256.to_string(), lineage_sha256.to_string());
    origins().lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned()
}

/// One link of the chain from training data to vectors.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Link {
    /// 'training data', 'base model', 'checkpoint', 'ONNX export', 'model directory', 'vectors' or 'plan'.
    pub link: String,
    /// What it is: a URI, a path, a name.
    pub name: String,
    /// What else the record says of it.
    pub detail: String,
    /// File (or manifest) to sha256.
    pub sha256: BTreeMap<String, String>,
}

impl Link {
    pub fn new(link: &str, name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { link: link.into(), name: name.into(), detail: detail.into(), sha256: BTreeMap::new() }
    }

    /// One line: link, name, detail, and each hash shortened to 12 digits.
    pub fn to_text(&self) -> String {
        let mut line = format!("{:<16} {}", self.link, self.name);
        if !self.detail.is_empty() {
            line += &format!(": {}", self.detail);
        }
        if !self.sha256.is_empty() {
            let hashes: Vec<String> =
                self.sha256.iter().map(|(f, h)| format!("{f} {}…", h.get(..12).unwrap_or(h))).collect();
            line += &format!(" (sha256 {})", hashes.join(", "));
        }
        line
    }
}

/// A facet of a lineage record's dataset: `{"facets": {name: {…}}}`.
fn facet<'a>(dataset: &'a Value, name: &str) -> Option<&'a Value> {
    dataset.get("facets")?.get(name)
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn hashes(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

/// The inputs of a record with the facet `name`, with that facet.
fn inputs_with<'a>(record: &'a Value, name: &'a str) -> impl Iterator<Item = (&'a Value, &'a Value)> + 'a {
    record
        .get("inputs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(move |d| facet(d, name).map(|f| (d, f)))
}

/// The training data a record names: (kind, URI, version, manifest sha256 or file hashes).
pub fn training_data(record: &Value) -> Option<TrainingData> {
    let (_, f) = inputs_with(record, "embeddingPipeline_trainingData").next()?;
    Some(TrainingData {
        kind: text(f.get("kind")),
        uri: text(f.get("uri")),
        version: f.get("version").and_then(Value::as_u64),
        tag: f.get("tag").and_then(Value::as_str).map(str::to_string),
        manifest_sha256: f.get("manifest_sha256").and_then(Value::as_str).map(str::to_string),
        files: hashes(f.get("files")),
    })
}

/// Training data as a lineage record names it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingData {
    /// 'lance', 'files' or 'remote'.
    pub kind: String,
    pub uri: String,
    pub version: Option<u64>,
    pub tag: Option<String>,
    pub manifest_sha256: Option<String>,
    pub files: BTreeMap<String, String>,
}

/// A model a record names (base or checkpoint): its directory when it has one, and its weight hashes.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInput {
    pub role: String,
    pub name: String,
    pub directory: Option<String>,
    pub weights: BTreeMap<String, String>,
    /// The training files beside a checkpoint (`training.json`, `trainer_state.json`, …) and their hashes.
    pub training_config: BTreeMap<String, String>,
}

/// The training record `scripts/adapt` writes beside the checkpoint it trains.
pub const TRAINING_RECORD: &str = "training.json";

/// The base model and checkpoint a record names.
pub fn models(record: &Value) -> Vec<ModelInput> {
    inputs_with(record, "embeddingPipeline_model")
        .map(|(d, f)| {
            let role = text(f.get("role"));
            let directory = match f.get("directory").and_then(Value::as_str) {
                Some(dir) => Some(dir.to_string()),
                None if role == "checkpoint" => Some(text(d.get("name"))),
                None => None,
            };
            ModelInput {
                role,
                name: text(d.get("name")),
                directory,
                weights: hashes(f.get("weights_sha256")),
                training_config: hashes(f.get("training_config_sha256")),
            }
        })
        .collect()
}

/// The ONNX file's sha256 as the export recorded it.
pub fn onnx_sha256(record: &Value) -> Option<String> {
    onnx_facet(record)?.get("sha256")?.as_str().map(str::to_string)
}

/// The external data files' sha256 as the export recorded them, by location (empty for a graph that holds its
/// weights).
pub fn external_data_sha256(record: &Value) -> BTreeMap<String, String> {
    onnx_facet(record).map(|f| hashes(f.get("external_data_sha256"))).unwrap_or_default()
}

/// The digest of the exported model as a fingerprint's `model_sha256` has it: the graph's sha256, combined with
/// its external data files' when it has them.
pub fn model_sha256(record: &Value) -> Option<String> {
    Some(super::digest::model_digest(&onnx_sha256(record)?, external_data_sha256(record)))
}

fn onnx_facet(record: &Value) -> Option<&Value> {
    record.get("outputs")?.as_array()?.iter().find_map(|d| facet(d, "embeddingPipeline_onnx"))
}

/// The training run `scripts/adapt` recorded: loss, steps, batch, learning rate, seed, LoRA, device, and the
/// rows it read.
fn training_link(t: &Value, config: &BTreeMap<String, String>) -> Link {
    let number = |k: &str| t.get(k).and_then(Value::as_f64).map(|x| format!("{x}")).unwrap_or_else(|| "?".into());
    let mut detail = format!(
        "{}, {} steps of batch {}, learning rate {}, seed {}",
        text(t.get("loss")),
        text(t.get("steps")),
        text(t.get("batch_size")),
        number("learning_rate"),
        text(t.get("seed")),
    );
    if let Some(r) = t.get("lora").and_then(|l| l.get("r")) {
        detail += &format!(", LoRA r={r}");
    }
    if let (Some(first), Some(last)) =
        (t.get("first_loss").and_then(Value::as_f64), t.get("last_loss").and_then(Value::as_f64))
    {
        detail += &format!(", loss {first:.4} → {last:.4}");
    }
    detail += &format!(", {} rows, torch {} on {}", text(t.get("rows")), text(t.get("torch")), text(t.get("device")));
    let mut link = Link::new("training", TRAINING_RECORD, detail);
    if let Some(sha) = config.get(TRAINING_RECORD) {
        link.sha256.insert(TRAINING_RECORD.into(), sha.clone());
    }
    if let Some(rows) = t.get("rows_sha256").and_then(Value::as_str) {
        link.sha256.insert("rows".into(), rows.into());
    }
    link
}

/// The chain a lineage record describes, from the training data to the ONNX export.
pub fn chain(record: &Value) -> Vec<Link> {
    let mut links = Vec::new();
    if let Some(data) = training_data(record) {
        let mut detail = match (data.version, &data.tag) {
            (Some(v), Some(t)) => format!("{} version {v} (tag {t})", data.kind),
            (Some(v), None) => format!("{} version {v}", data.kind),
            _ => data.kind.clone(),
        };
        if data.kind == "remote" {
            detail += ", not hashed";
        }
        let mut link = Link::new("training data", data.uri, detail);
        link.sha256 = data.files;
        if let Some(m) = data.manifest_sha256 {
            link.sha256.insert("manifest".into(), m);
        }
        links.push(link);
    }
    for (d, f) in inputs_with(record, "embeddingPipeline_model") {
        let role = text(f.get("role"));
        let (link, detail) = if role == "base" {
            ("base model", text(f.get("revision")).trim().to_string())
        } else {
            let mut detail = match text(f.get("adaptation")).as_str() {
                "none" => "the base model itself, not adapted".to_string(),
                "full" => "full fine-tune".to_string(),
                "lora-merged" => "LoRA, merged".to_string(),
                other => other.to_string(),
            };
            let config = hashes(f.get("training_config_sha256"));
            if !config.is_empty() {
                detail += &format!(", training config {}", config.keys().cloned().collect::<Vec<_>>().join(", "));
            }
            if let Some(t) = f.get("training").filter(|t| t.is_object()) {
                links.push(training_link(t, &hashes(f.get("training_config_sha256"))));
            }
            ("checkpoint", detail)
        };
        let mut link = Link::new(link, text(d.get("name")), detail);
        link.sha256 = hashes(f.get("weights_sha256"));
        links.push(link);
    }
    let exporter = record.get("run").and_then(|r| r.get("facets")).and_then(|f| f.get("embeddingPipeline_exporter"));
    let verification =
        record.get("run").and_then(|r| r.get("facets")).and_then(|f| f.get("embeddingPipeline_verification"));
    if let Some(sha) = onnx_sha256(record) {
        let mut detail = String::new();
        if let Some(e) = exporter {
            detail += &format!(
                "{}, opset {}, torch {}, transformers {}, sentence-transformers {}",
                text(e.get("dtype")),
                text(e.get("opset")),
                text(e.get("torch")),
                text(e.get("transformers")),
                text(e.get("sentence_transformers"))
            );
        }
        if let Some(v) = verification {
            let min = v.get("min_cosine").and_then(Value::as_f64).unwrap_or(f64::NAN);
            detail += &format!("; verified on {} texts, minimum cosine {min:.7}", text(v.get("texts")));
        }
        let out = record.get("outputs").and_then(|o| o.get(0)).and_then(|o| o.get("name"));
        let detail = format!("exported {}, {detail}", text(record.get("eventTime")));
        let mut link = Link::new("ONNX export", text(out), detail);
        link.sha256.insert("onnx/model.onnx".into(), sha);
        link.sha256.extend(external_data_sha256(record).into_iter().map(|(f, h)| (format!("onnx/{f}"), h)));
        links.push(link);
    }
    links
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Value {
        serde_json::json!({
            "eventTime": "2026-12-01T23:00:00+00:00",
            "run": {"facets": {
                "embeddingPipeline_exporter": {"dtype": "float16", "opset": 17, "torch": "2.15.0",
                    "transformers": "5.24.0", "sentence_transformers": "6.2.0"},
                "embeddingPipeline_verification": {"texts": 16, "min_cosine": 0.99999881}
            }},
            "inputs": [
                {"namespace": "model", "name": "org/base", "facets": {"embeddingPipeline_model":
                    {"role": "base", "revision": "abc", "weights_sha256": {}, "directory": null}}},
                {"namespace": "file", "name": "/ckpt", "facets": {"embeddingPipeline_model":
                    {"role": "checkpoint", "adaptation": "full", "weights_sha256": {"model.safetensors": "11"},
                     "training_config_sha256": {"training_args.json": "22"}}}},
                {"namespace": "lance", "name": "/train.lance", "facets": {"embeddingPipeline_trainingData":
                    {"kind": "lance", "uri": "/train.lance", "version": 2, "tag": null, "manifest_sha256": "33"}}}
            ],
            "outputs": [{"namespace": "file", "name": "/out", "facets": {"embeddingPipeline_onnx":
                {"sha256": "44", "dtype": "float16"}}}]
        })
    }

    #[test]
    fn the_chain_runs_from_training_data_to_the_export() {
        let links = chain(&record());
        let kinds: Vec<&str> = links.iter().map(|l| l.link.as_str()).collect();
        assert_eq!(kinds, ["training data", "base model", "checkpoint", "ONNX export"]);
        assert_eq!(links[0].sha256["manifest"], "33");
        assert_eq!(links[0].detail, "lance version 2");
        assert!(links[2].detail.contains("full fine-tune") && links[2].detail.contains("training_args.json"));
        assert!(links[3].detail.contains("float16, opset 17") && links[3].detail.contains("0.9999988"));
        assert!(links[3].to_text().contains("(sha256 onnx/model.onnx 44…)"), "{}", links[3].to_text());
        let m = models(&record());
        assert_eq!(m[1].directory.as_deref(), Some("/ckpt"));
        assert_eq!(m[0].directory, None);
        assert_eq!(onnx_sha256(&record()).as_deref(), Some("44"));
        assert_eq!(training_data(&record()).unwrap().version, Some(2));
        // A record with nothing recognisable gives an empty chain, not an error.
        assert!(chain(&serde_json::json!({"inputs": 3})).is_empty());
    }

    #[test]
    fn a_trained_checkpoint_puts_its_training_between_the_base_and_the_checkpoint() {
        let mut r = record();
        let ckpt = &mut r["inputs"][1]["facets"]["embeddingPipeline_model"];
        ckpt["training_config_sha256"] = serde_json::json!({"training.json": "55"});
        ckpt["training"] = serde_json::json!({"loss": "MultipleNegativesRankingLoss", "steps": 40, "batch_size": 16,
            "learning_rate": 5e-5, "seed": 0, "lora": {"r": 8}, "first_loss": 1.5, "last_loss": 0.25,
            "rows": 700, "rows_sha256": "66", "torch": "2.15.0", "device": "cpu"});
        let links = chain(&r);
        let kinds: Vec<&str> = links.iter().map(|l| l.link.as_str()).collect();
        assert_eq!(kinds, ["training data", "base model", "training", "checkpoint", "ONNX export"]);
        let t = &links[2];
        assert_eq!(t.name, TRAINING_RECORD);
        assert_eq!(
            t.detail,
            "MultipleNegativesRankingLoss, 40 steps of batch 16, learning rate 0.00005, seed 0, LoRA r=8, \
             loss 1.5000 → 0.2500, 700 rows, torch 2.15.0 on cpu"
        );
        assert_eq!((t.sha256["training.json"].as_str(), t.sha256["rows"].as_str()), ("55", "66"));
        assert_eq!(models(&r)[1].training_config[TRAINING_RECORD], "55");
        // The training record is part of what made the model.
        assert_ne!(digest(&r), digest(&record()));
    }

    #[test]
    fn the_digest_ignores_when_and_where_and_follows_what() {
        let a = record();
        let mut b = record();
        b["eventTime"] = "2027-01-01T00:00:00+00:00".into();
        b["run"]["runId"] = "another".into();
        b["run"]["facets"]["embeddingPipeline_verification"]["min_cosine"] = 0.99999882.into();
        b["inputs"][1]["name"] = "/elsewhere/ckpt".into();
        b["inputs"][2]["name"] = "/elsewhere/train.lance".into();
        b["inputs"][2]["facets"]["embeddingPipeline_trainingData"]["uri"] = "/elsewhere/train.lance".into();
        assert_eq!(digest(&a), digest(&b), "{} against {}", identity(&a), identity(&b));
        for change in [
            |r: &mut Value| r["outputs"][0]["facets"]["embeddingPipeline_onnx"]["sha256"] = "45".into(),
            |r: &mut Value| {
                r["inputs"][1]["facets"]["embeddingPipeline_model"]["weights_sha256"]["model.safetensors"] = "12".into()
            },
            |r: &mut Value| r["inputs"][2]["facets"]["embeddingPipeline_trainingData"]["version"] = 3.into(),
            |r: &mut Value| r["inputs"][0]["facets"]["embeddingPipeline_model"]["revision"] = "def".into(),
            |r: &mut Value| r["run"]["facets"]["embeddingPipeline_exporter"]["torch"] = "2.16.0".into(),
        ] {
            let mut c = record();
            change(&mut c);
            assert_ne!(digest(&a), digest(&c), "{}", identity(&c));
        }
    }

    #[test]
    fn reads_a_directory_with_and_without_lineage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        std::fs::write(dir.path().join(LINEAGE_FILE), "{\"inputs\": []}").unwrap();
        let l = read(dir.path()).unwrap().unwrap();
        assert_eq!(l.sha256, digest(&serde_json::json!({"inputs": []})));
        std::fs::write(dir.path().join(LINEAGE_FILE), "{not json").unwrap();
        let e = read(dir.path()).unwrap_err().to_string();
        assert!(e.contains(LINEAGE_FILE) && e.contains("not JSON"), "{e}");
    }
}
