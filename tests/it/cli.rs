//! The `pipeline` binary: running a job file, its summary, and its errors and exit codes.

use std::path::Path;

use crate::common::{assert_text, command, model_dir, pipeline, refusal, text, write_jsonl};

pub(crate) fn job(dir: &Path, body: &str) -> String {
    write_jsonl(&dir.join("docs.jsonl"), &[("x1", Some("first text")), ("x2", Some("second text")), ("x3", None)]);
    let sql = format!("SET embed.model = '{}';\n{body}", model_dir().display());
    std::fs::write(dir.join("job.sql"), sql).unwrap();
    "job.sql".to_string()
}

#[test]
fn run_writes_prints_and_summarises() {
    let tmp = tempfile::tempdir().unwrap();
    let file = job(
        tmp.path(),
        "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';
         SELECT id, embed(text) AS embedding FROM docs ORDER BY id LIMIT 2;
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out/docs.lance' STORED AS LANCE;",
    );
    let o = pipeline(&["run", &file], tmp.path());
    let (out, err) = text(&o);
    assert!(o.status.success(), "stdout:\n{out}\nstderr:\n{err}");
    // The whole text, as a user reads it; what differs between runs and machines is filtered.
    assert_text("run_writes_prints_and_summarises", tmp.path(), &out);
    assert!(tmp.path().join("out/docs.lance").is_dir());
}

#[test]
fn a_failing_statement_is_named_with_its_line_and_exits_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let file = job(tmp.path(), "\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'missing.jsonl';");
    let o = pipeline(&["run", &file], tmp.path());
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert_text("a_failing_statement_is_named", tmp.path(), &err);
}

#[test]
fn a_missing_job_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["run", "nope.sql"];
    assert_text("a_missing_job_file", tmp.path(), &refusal(&args, &pipeline(&args, tmp.path())));
}

#[test]
fn a_missing_onnx_runtime_says_what_to_run() {
    let tmp = tempfile::tempdir().unwrap();
    let file = job(tmp.path(), "SELECT embed('x');");
    let args = ["run", "--ort-lib", "/nonexistent/libonnxruntime.so", &file];
    // Where it looked and what to run (no panic).
    assert_text("a_missing_onnx_runtime", tmp.path(), &refusal(&args, &pipeline(&args, tmp.path())));
}

#[test]
fn a_library_that_is_not_onnx_runtime_is_refused_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let not_ort = tmp.path().join("libnot_ort.so");
    std::fs::write(&not_ort, b"not a shared library").unwrap();
    let file = job(tmp.path(), "SELECT embed('x');");
    let o = command(&["run", &file], tmp.path()).env("ORT_DYLIB_PATH", &not_ort).output().unwrap();
    assert_text("a_library_that_is_not_onnx_runtime", tmp.path(), &refusal(&["run", &file], &o));
}

#[test]
fn the_device_flag_reaches_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    let file = job(tmp.path(), "SELECT embed('x');");
    let o = pipeline(&["run", "--device", "cuda:1", &file], tmp.path());
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("embed.device = 'cuda:1'"), "{err}");
}

#[test]
fn devices_reports_the_runtime_and_why_there_is_no_gpu() {
    let tmp = tempfile::tempdir().unwrap();
    let o = pipeline(&["devices", "--json"], tmp.path());
    assert!(o.status.success(), "{:?}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["onnxruntime_version"], "1.31.1");
    assert!(j["onnxruntime_library"].as_str().unwrap().contains("libonnxruntime"), "{j}");
    assert!(j["cuda_provider"].is_boolean(), "{j}");
    match j["nvidia"].as_object() {
        // A GPU machine: every GPU is described.
        Some(n) => assert!(n["gpus"].as_array().unwrap().iter().all(|g| g["name"].is_string()), "{j}"),
        None => assert!(j["nvidia_error"].as_str().unwrap().contains("libcuda.so.1"), "{j}"),
    }

    // Without a runtime, it says where it looked and exits 0: the report is the point.
    let o = pipeline(&["devices", "--ort-lib", "/nonexistent/libonnxruntime.so"], tmp.path());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("ONNX Runtime") && out.contains("/nonexistent/libonnxruntime.so"), "{out}");
    assert!(out.contains("GPUs:") || out.contains("NVIDIA driver"), "{out}");
}

#[test]
fn embed_prints_the_vectors_a_query_makes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("more.jsonl"), "{\"text\": \"second text\"}\n").unwrap();
    let model = model_dir().display().to_string();
    let o = pipeline(&["embed", "--model", &model, "first text", "--file", "more.jsonl"], dir);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("fingerprint: {"), "{err}");
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let batches = rt
        .block_on(crate::common::sql(
            &crate::common::session(),
            "SELECT embed('first text') AS a, embed('second text') AS b",
        ))
        .unwrap();
    for (i, col) in ["a", "b"].into_iter().enumerate() {
        let want = crate::common::vectors(&batches, col)[0].clone().unwrap();
        let got: Vec<f32> = serde_json::from_value(lines[i]["vector"].clone()).unwrap();
        assert_eq!(lines[i]["index"], i);
        assert_eq!(got, want, "text {i}");
    }
    // Nothing to embed, and a file that is not JSON lines, are errors that say so.
    let mut said = refusal(&["embed", "--model", &model], &pipeline(&["embed", "--model", &model], dir));
    std::fs::write(dir.join("bad.jsonl"), "plain\n").unwrap();
    let args = ["embed", "--model", &model, "--file", "bad.jsonl"];
    said += &refusal(&args, &pipeline(&args, dir));
    assert_text("embed_without_texts_or_with_a_bad_file", dir, &said);
}

/// `embed.id_column` is recorded with the dataset: inspect, verify, search --join and compare find the ids without
/// being told, and a later write keyed by another column is refused before it embeds.
#[test]
fn the_id_column_of_a_job_is_recorded_and_used_by_every_later_command() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rows = [("d1", "k1", "a text about rivers"), ("d2", "k2", "a text about mountains"), ("d3", "k3", "bread")];
    let lines: Vec<String> =
        rows.iter().map(|(d, k, t)| serde_json::json!({ "doc_id": d, "key": k, "text": t }).to_string()).collect();
    std::fs::write(dir.join("docs.jsonl"), lines.join("\n") + "\n").unwrap();
    let write = |column: &str| {
        format!(
            "SET embed.model = '{}';\nSET embed.id_column = '{column}';\n\
             CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
             COPY (SELECT doc_id, key, embed(text) AS embedding FROM docs) TO 'out.lance' STORED AS LANCE;\n",
            model_dir().display()
        )
    };
    std::fs::write(dir.join("job.sql"), write("doc_id")).unwrap();
    let o = pipeline(&["run", "job.sql"], dir);
    assert!(o.status.success(), "{:?}", text(&o));

    let o = pipeline(&["inspect", "out.lance", "--json"], dir);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((report["ids"]["column"].as_str(), report["ids"]["unique"].as_bool()), (Some("doc_id"), Some(true)));
    // Told otherwise, inspect reads the column it is told.
    let o = pipeline(&["inspect", "out.lance", "--json", "--id-column", "key"], dir);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["ids"]["column"], "key");

    let o = pipeline(&["verify", "out.lance", "--job", "job.sql", "--sample", "2", "--json"], dir);
    assert!(o.status.success(), "{:?}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ids"]["column"], "doc_id", "{v}");

    let o = pipeline(&["search", "out.lance", "rivers", "-k", "1", "--join", "docs.jsonl", "--json"], dir);
    assert!(o.status.success(), "{:?}", text(&o));
    let hits: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((hits[0]["doc_id"].as_str(), hits[0]["text"].as_str()), (Some("d1"), Some("a text about rivers")));

    crate::common::assert_same_vectors(&pipeline(&["compare", "out.lance", "out.lance", "--json"], dir), 3);

    // The same output keyed by `key`: refused, and the dataset is left as it was.
    std::fs::write(dir.join("other.sql"), write("key")).unwrap();
    let o = pipeline(&["run", "other.sql"], dir);
    assert_text("another_id_column_for_the_same_output", dir, &refusal(&["run", "other.sql"], &o));
    let o = pipeline(&["inspect", "out.lance", "--json"], dir);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((report["rows"].as_u64(), report["version"].as_u64()), (Some(3), Some(1)), "{report}");
}

/// The binary asks the kernel for no transparent huge pages (mimalloc's arenas asked for them, and the kernel's
/// filling and re-assembling of 2 MiB pages after each purge kept resident memory at three or four times the live
/// heap), unless the user set MIMALLOC_ALLOW_THP; read from the running process, as /proc shows it, while it waits to
/// read its job from a named pipe (so past its set-up).
#[cfg(target_os = "linux")]
#[test]
fn the_binary_runs_without_transparent_huge_pages_unless_told_otherwise() {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let thp = |status: &str| status.lines().find_map(|l| l.strip_prefix("THP_enabled:")).map(|v| v.trim().to_string());
    let thp_of = |allow: Option<&str>| {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("job.sql");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let mut c = command(&["run", "job.sql"], tmp.path());
        c.env_remove("MIMALLOC_ALLOW_THP");
        if let Some(a) = allow {
            c.env("MIMALLOC_ALLOW_THP", a);
        }
        let mut child = c.stdout(std::process::Stdio::null()).spawn().unwrap();
        // Opening the pipe without blocking succeeds once the process has opened it to read its job.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut job = loop {
            match std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo) {
                Ok(f) => break f,
                Err(e) if std::time::Instant::now() < deadline => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "{e}");
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => panic!("the process never read its job: {e}"),
            }
        };
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        job.write_all(b"SELECT 1;\n").unwrap();
        drop(job);
        assert!(child.wait().unwrap().success());
        thp(&status)
    };
    assert_eq!(thp_of(None).as_deref(), Some("0"), "THP stays off by default");
    // The user's setting leaves the process as mimalloc leaves it: as the system and this test's process have it.
    let here = thp(&std::fs::read_to_string("/proc/self/status").unwrap());
    assert_eq!(thp_of(Some("1")), here, "MIMALLOC_ALLOW_THP=1 keeps the system's setting");
}
