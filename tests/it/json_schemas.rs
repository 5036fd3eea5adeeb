//! What the commands print with `--json`, and the run record and fingerprint a campaign keeps, checked against
//! the JSON Schemas in `docs/reference/schemas/` (generated from the types: `src/cli/schemas.rs`) by a real
//! validator, Python's `jsonschema` from the tests' tools, made strict: a key the schema does not name fails too.
//! The schemas are what the types say; this shows the types are what the commands print.

use std::path::Path;

use super::common::{docs_job, pipeline, python, text};

/// Validates each `name=path` against `docs/reference/schemas/<name>.json`, with every object closed to keys
/// its schema does not name; prints one line per failure.
const VALIDATE: &str = r#"
import json, sys, jsonschema
def closed(s):
    if isinstance(s, dict):
        if s.get("type") == "object" and "properties" in s and "additionalProperties" not in s:
            s["additionalProperties"] = False
        for v in s.values():
            closed(v)
    elif isinstance(s, list):
        for v in s:
            closed(v)
folder = sys.argv[1]
for arg in sys.argv[2:]:
    name, path = arg.split("=", 1)
    schema = json.load(open(f"{folder}/{name}.json"))
    closed(schema)
    for e in jsonschema.Draft202012Validator(schema).iter_errors(json.load(open(path))):
        print(f"{name}: at {list(e.absolute_path)}: {e.message[:300]}")
"#;

/// Checks each `(schema, JSON text)` against `docs/reference/schemas/<schema>.json`, every object closed to keys
/// its schema does not name; panics listing every failure. The texts are written under `dir/schema-check/`.
pub fn assert_matches_schemas(dir: &Path, documents: &[(&str, &str)]) {
    let folder = dir.join("schema-check");
    std::fs::create_dir_all(&folder).unwrap();
    let schemas = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference/schemas");
    let mut args = vec![schemas.display().to_string()];
    for (i, (name, json)) in documents.iter().enumerate() {
        let path = folder.join(format!("{i}-{name}.json"));
        std::fs::write(&path, json).unwrap();
        args.push(format!("{name}={}", path.display()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let failures = python(VALIDATE, &args, &[]);
    assert!(failures.is_empty(), "the commands' JSON is not what the schemas say:\n{failures}");
}

#[test]
fn the_commands_json_is_what_the_schemas_say() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let lines = crate::common::fortunes(300);
    std::fs::write(dir.join("docs.jsonl"), lines.join("\n") + "\n").unwrap();
    docs_job(dir, "job.sql", "");
    let pairs: Vec<String> = lines[..5]
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            serde_json::json!({"query": v["text"], "id": v["id"]}).to_string()
        })
        .collect();
    std::fs::write(dir.join("pairs.jsonl"), pairs.join("\n") + "\n").unwrap();

    // Each command in a campaign's order, its JSON saved under the name of its schema.
    let steps: &[(&str, &[&str])] = &[
        ("devices", &["devices", "--json"]),
        ("plan", &["plan", "job.sql", "--json"]),
        ("work-plan", &["inspect", "out/docs.lance.plan", "--json"]),
        ("probe", &["probe", "job.sql", "--max-batch-tokens", "1024", "--json"]),
        ("trial", &["trial", "job.sql", "--sample", "40", "--no-probe", "--json"]),
        ("compare-order", &["compare-order", "job.sql", "--sample", "40", "--json"]),
        ("invariance", &["check-invariance", "job.sql", "--sample", "40", "--json"]),
        ("run", &["run", "--quiet", "job.sql"]),
        ("inspect", &["inspect", "out/docs.lance", "--json"]),
        ("verify", &["verify", "out/docs.lance", "--job", "job.sql", "--sample", "20", "--json"]),
        ("lineage-report", &["lineage", "out/docs.lance", "--json"]),
        ("compare", &["compare", "out/docs.lance", "out/docs.lance", "--json"]),
        ("evaluate", &["evaluate", "out/docs.lance", "--pairs", "pairs.jsonl", "--json"]),
        ("index", &["index", "out/docs.lance", "--kind", "ivf_hnsw_sq", "--json"]),
        ("optimize", &["optimize", "out/docs.lance", "--json"]),
    ];
    let mut documents: Vec<(&str, String)> = Vec::new();
    for (name, args) in steps {
        let o = pipeline(args, dir);
        assert!(o.status.success(), "pipeline {}: {}", args.join(" "), text(&o).1);
        if *name != "run" {
            documents.push((name, text(&o).0));
        }
    }
    // The trial's JSON is what `pipeline cost` reads; the dataset keeps a run record and a fingerprint.
    let trial = &documents.iter().find(|(name, _)| *name == "trial").unwrap().1;
    std::fs::write(dir.join("trial.json"), trial).unwrap();
    let o = pipeline(&["cost", "trial.json", "--json"], dir);
    assert!(o.status.success(), "{}", text(&o).1);
    documents.push(("cost", text(&o).0));
    let inspect: serde_json::Value =
        serde_json::from_str(&documents.iter().find(|(name, _)| *name == "inspect").unwrap().1).unwrap();
    assert!(inspect["fingerprint"]["dim"].as_u64() == Some(384), "{inspect}");
    let record =
        inspect["versions"].as_array().unwrap().iter().find_map(|v| v.get("run").filter(|r| !r.is_null())).unwrap();
    documents.push(("run-record", record.to_string()));
    documents.push(("fingerprint", inspect["fingerprint"].to_string()));
    let borrowed: Vec<(&str, &str)> = documents.iter().map(|(n, j)| (*n, j.as_str())).collect();
    assert_matches_schemas(dir, &borrowed);

    // The validator is strict: a key no schema names fails it.
    let mut extra = record.clone();
    extra["not_in_the_schema"] = serde_json::json!(1);
    let extra = extra.to_string();
    let failed = std::panic::catch_unwind(|| assert_matches_schemas(dir, &[("run-record", &extra)]));
    let message = failed.expect_err("a key the schema does not name passed");
    let message = message.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("not_in_the_schema"), "{message}");
}
