//! The lineage of a dataset's version (`pipeline lineage DATASET[@VERSION]`): how its vectors were made, from
//! the training data through the checkpoint and the ONNX export to the vectors, with each hash; and, when
//! verified, whether every link that can still be reached is as recorded.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::campaign::digest::hex_sha256;
use crate::campaign::fingerprint::sha256_file;
use crate::campaign::lineage::{self, LINEAGE_FILE, Link};
use crate::campaign::work_plan::WorkPlan;
use crate::campaign::{Fingerprint, RunRecord};
use crate::error::Result;
use crate::lance::open_dataset;
use crate::lance::records::fingerprint_of_dataset;
use crate::lance::records::newest_run_record;

/// What `pipeline lineage` shows.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct LineageReport {
    pub dataset: String,
    pub version: u64,
    pub fingerprint: Option<Fingerprint>,
    /// The model directory of the newest run record at or before this version.
    pub model_dir: Option<String>,
    /// The version whose run record the model was read from.
    pub run_version: Option<u64>,
    /// Training data first, vectors last.
    pub chain: Vec<Link>,
    /// With --verify: each link's check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Check>,
}

/// One link re-checked.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Check {
    pub link: String,
    /// 'ok', 'BROKEN', or 'unchecked' (the link cannot be reached from here).
    pub status: String,
    pub detail: String,
}

impl Check {
    fn ok(link: &str, detail: impl Into<String>) -> Self {
        Self { link: link.into(), status: "ok".into(), detail: detail.into() }
    }
    fn broken(link: &str, detail: impl Into<String>) -> Self {
        Self { link: link.into(), status: "BROKEN".into(), detail: detail.into() }
    }
    fn unchecked(link: &str, detail: impl Into<String>) -> Self {
        Self { link: link.into(), status: "unchecked".into(), detail: detail.into() }
    }
}

impl LineageReport {
    /// The links whose check failed, by name; empty when none did (or nothing was checked).
    pub fn broken(&self) -> Vec<&str> {
        self.checks.iter().filter(|c| c.status == "BROKEN").map(|c| c.link.as_str()).collect()
    }
}

/// The chain of one version of a dataset, checked when `verify`.
pub async fn report(location: &str, verify: bool) -> Result<LineageReport> {
    let ds = open_dataset(location).await?;
    let version = ds.version().version;
    let fingerprint = fingerprint_of_dataset(&ds)?;
    let run = newest_run_record(&ds, version, |_| true).await?;
    let record = run.as_ref().and_then(|(_, r)| r.lineage.clone());
    let model_dir = run.as_ref().and_then(|(_, r)| r.model_dir.clone());

    let mut chain = record.as_ref().map(lineage::chain).unwrap_or_default();
    if let Some(fp) = &fingerprint {
        let mut link = Link::new(
            "model directory",
            model_dir.clone().unwrap_or_else(|| format!("{} (where it was is not recorded)", fp.model)),
            format!("{}, {} tokens, {} pooling", fp.model_dtype, fp.max_tokens, fp.pooling),
        );
        link.sha256.insert("onnx".into(), fp.model_sha256.clone());
        link.sha256.insert("tokenizer.json".into(), fp.tokenizer_sha256.clone());
        if !fp.lineage_sha256.is_empty() {
            link.sha256.insert(format!("{LINEAGE_FILE} (identity)"), fp.lineage_sha256.clone());
        }
        chain.push(link);
    }
    let rows = ds.count_rows(None).await.map_err(crate::lance::lance_err(ds.uri()))? as u64;
    let mut vectors = Link::new("vectors", format!("{}@{version}", ds.uri()), format!("{rows} rows"));
    if let Some((v, r)) = &run {
        vectors.detail += &format!(", last written by version {v} ({} rows, tool {})", r.rows_written, r.tool_version);
    }
    chain.push(vectors);
    if let Some(p) = run.as_ref().and_then(|(_, r)| r.plan.as_ref()) {
        let mut link = Link::new("plan", &p.path, format!("{} units", p.units));
        link.sha256.insert("plan.json".into(), p.digest.clone());
        chain.push(link);
    }

    let mut checks = Vec::new();
    if verify {
        checks = check(fingerprint.as_ref(), model_dir.as_deref(), record.as_ref(), run.as_ref().map(|(_, r)| r)).await;
    }
    Ok(LineageReport {
        dataset: ds.uri().to_string(),
        version,
        fingerprint,
        model_dir,
        run_version: run.map(|(v, _)| v),
        chain,
        checks,
    })
}

/// Re-check every link that can be reached.
async fn check(
    fingerprint: Option<&Fingerprint>,
    model_dir: Option<&str>,
    record: Option<&serde_json::Value>,
    run: Option<&RunRecord>,
) -> Vec<Check> {
    let mut checks = Vec::new();
    let Some(fp) = fingerprint else {
        checks.push(Check::broken("vectors", "the dataset has no fingerprint: its vectors were not made by embed()"));
        return checks;
    };
    if let (Some(record), false) = (record, fp.lineage_sha256.is_empty()) {
        match lineage::model_sha256(record) {
            Some(sha) if sha == fp.model_sha256 => {
                checks.push(Check::ok("ONNX export", "the export's files are the ones the vectors were made with"))
            }
            Some(sha) => checks.push(Check::broken(
                "ONNX export",
                format!(
                    "lineage.json names onnx/model.onnx{} {sha}, but the vectors were made with {}",
                    if lineage::external_data_sha256(record).is_empty() { "" } else { " and its external data" },
                    fp.model_sha256
                ),
            )),
            None => checks.push(Check::unchecked("ONNX export", "lineage.json names no ONNX file")),
        }
    }
    checks.push(check_model_dir(fp, model_dir));
    if let Some(record) = record {
        for m in lineage::models(record) {
            let link = if m.role == "base" { "base model" } else { "checkpoint" };
            let dir = m.directory.as_deref().map(Path::new);
            // The training record is its own link: changed, it is the training that no longer matches.
            if let Some(sha) = m.training_config.get(lineage::TRAINING_RECORD) {
                let record = [(lineage::TRAINING_RECORD.to_string(), sha.clone())].into_iter().collect();
                checks.push(check_files("training", dir, &record));
            }
            checks.push(check_files(link, dir, &m.weights));
        }
        if let Some(data) = lineage::training_data(record) {
            checks.push(check_training_data(&data).await);
        }
    }
    if let Some(p) = run.and_then(|r| r.plan.as_ref()) {
        checks.push(check_plan(&p.path, &p.digest).await);
    }
    checks
}

/// The model directory's files hash as the fingerprint says.
fn check_model_dir(fp: &Fingerprint, model_dir: Option<&str>) -> Check {
    const LINK: &str = "model directory";
    let Some(dir) = model_dir else {
        return Check::unchecked(LINK, "the run records do not say where the model was (written by an older version)");
    };
    let dir = PathBuf::from(dir);
    let spec = match crate::model::ModelSpec::load(&dir) {
        Ok(spec) => spec,
        Err(e) => return Check::broken(LINK, format!("{}: {e}", dir.display())),
    };
    let mut wrong = Vec::new();
    let onnx = spec.onnx_path.strip_prefix(&dir).unwrap_or(&spec.onnx_path).display().to_string();
    // The model's digest covers its external data files too, as the fingerprint's does.
    for (file, got, want) in [
        (onnx.as_str(), crate::campaign::fingerprint::model_sha256(&spec.onnx_path), &fp.model_sha256),
        ("tokenizer.json", sha256_file(&spec.tokenizer_path), &fp.tokenizer_sha256),
    ] {
        match got {
            Ok(h) if &h == want => {}
            Ok(h) => wrong.push(format!("{file} hashes {h}, the vectors were made with {want}")),
            Err(e) => wrong.push(e.to_string()),
        }
    }
    let lineage_path = dir.join(LINEAGE_FILE);
    match (fp.lineage_sha256.is_empty(), lineage_path.is_file()) {
        (true, true) => wrong.push(format!("{LINEAGE_FILE} was added after the vectors were made")),
        (false, false) => wrong.push(format!("{LINEAGE_FILE} is gone")),
        (false, true) => match lineage::read(&dir) {
            Ok(Some(l)) if l.sha256 == fp.lineage_sha256 => {}
            Ok(Some(l)) => wrong.push(format!(
                "{LINEAGE_FILE} now describes another lineage (digest {}, the vectors were made with {})",
                l.sha256, fp.lineage_sha256
            )),
            Ok(None) => wrong.push(format!("{LINEAGE_FILE} is gone")),
            Err(e) => wrong.push(e.to_string()),
        },
        (true, false) => {}
    }
    if wrong.is_empty() {
        Check::ok(LINK, format!("{}: files hash as recorded", dir.display()))
    } else {
        Check::broken(LINK, format!("{}: {}", dir.display(), wrong.join("; ")))
    }
}

/// Files of a directory hash as recorded.
fn check_files(link: &str, dir: Option<&Path>, want: &std::collections::BTreeMap<String, String>) -> Check {
    let Some(dir) = dir else {
        return Check::unchecked(link, "no directory recorded");
    };
    if want.is_empty() {
        return Check::unchecked(link, format!("{}: no file hashes recorded", dir.display()));
    }
    if !dir.is_dir() {
        return Check::unchecked(link, format!("{} cannot be reached from here", dir.display()));
    }
    let wrong: Vec<String> = want
        .iter()
        .filter_map(|(file, sha)| match sha256_file(&dir.join(file)) {
            Ok(h) if &h == sha => None,
            Ok(h) => Some(format!("{file} hashes {h}, recorded {sha}")),
            Err(_) => Some(format!("{file} is gone")),
        })
        .collect();
    if wrong.is_empty() {
        Check::ok(link, format!("{}: {} file(s) hash as recorded", dir.display(), want.len()))
    } else {
        Check::broken(link, format!("{}: {}", dir.display(), wrong.join("; ")))
    }
}

async fn check_training_data(data: &lineage::TrainingData) -> Check {
    const LINK: &str = "training data";
    match data.kind.as_str() {
        "lance" => {
            let Some(version) = data.version else {
                return Check::unchecked(LINK, format!("{}: no version recorded", data.uri));
            };
            if !data.uri.contains("://") && !Path::new(&data.uri).exists() {
                return Check::unchecked(LINK, format!("{} cannot be reached from here", data.uri));
            }
            let ds = match open_dataset(&format!("{}@{version}", data.uri)).await {
                Ok(ds) => ds,
                Err(e) => {
                    return Check::broken(LINK, format!("version {version} of {} cannot be opened: {e}", data.uri));
                }
            };
            let bytes = match ds.object_store(None).await {
                Ok(store) => store.read_one_all(&ds.manifest_location().path).await,
                Err(e) => Err(e),
            };
            match (bytes, &data.manifest_sha256) {
                (Ok(b), Some(want)) if &hex_sha256(&b) == want => {
                    Check::ok(LINK, format!("{} version {version}: manifest hashes as recorded", data.uri))
                }
                (Ok(b), Some(want)) => Check::broken(
                    LINK,
                    format!(
                        "{} version {version}: manifest hashes {}, recorded {want} (the version was rewritten)",
                        data.uri,
                        hex_sha256(&b)
                    ),
                ),
                (Ok(_), None) => Check::unchecked(LINK, format!("{}: no manifest digest recorded", data.uri)),
                (Err(e), _) => Check::broken(LINK, format!("{} version {version}: manifest unreadable: {e}", data.uri)),
            }
        }
        "files" => {
            let root = Path::new(&data.uri);
            // A single file is recorded by its own name, relative to its folder (which must then be there:
            // a file gone from it is a broken link, a folder not on this machine an unchecked one).
            let single = root
                .file_name()
                .is_some_and(|n| data.files.len() == 1 && data.files.contains_key(&*n.to_string_lossy()));
            let dir = if single { root.parent().unwrap_or(root) } else { root };
            check_files(LINK, Some(dir), &data.files)
        }
        _ => Check::unchecked(LINK, format!("{}: remote, recorded as given", data.uri)),
    }
}

async fn check_plan(path: &str, digest: &str) -> Check {
    const LINK: &str = "plan";
    let (plan, now) = match WorkPlan::read(Path::new(path)) {
        Ok(p) => p,
        Err(e) => return Check::unchecked(LINK, e),
    };
    let (plan, path) = if now == digest {
        (plan, path.to_string())
    } else {
        // Replaced by a newer plan: `pipeline plan` kept the one this version executed beside it.
        let kept = crate::campaign::work_plan::kept_plan_dir(Path::new(path), digest);
        match WorkPlan::read(&kept) {
            Ok((old, d)) if d == digest => (old, kept.display().to_string()),
            _ => return Check::broken(LINK, format!("{path}/plan.json hashes {now}, the run executed {digest}")),
        }
    };
    let changes = crate::ops::plan::source_changes(&plan).await;
    if changes.is_empty() {
        Check::ok(LINK, format!("{path}: the corpus is as planned"))
    } else {
        Check::broken(LINK, format!("{path}: the corpus changed since it was planned: {}", changes.join("; ")))
    }
}

impl LineageReport {
    /// The human-readable form.
    pub fn to_text(&self) -> String {
        let mut out = format!("lineage of {} version {}\n", self.dataset, self.version);
        if self.fingerprint.as_ref().is_some_and(|f| f.lineage_sha256.is_empty()) {
            out += "  (the model directory has no lineage.json: the chain starts at the ONNX file)\n";
        }
        for link in &self.chain {
            out += &format!("  {}\n", link.to_text());
        }
        if !self.checks.is_empty() {
            out += "verify\n";
            for c in &self.checks {
                out += &format!("  {:<9} {:<16} {}\n", c.status, c.link, c.detail);
            }
        }
        out
    }
}
