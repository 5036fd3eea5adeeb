//! `pipeline run` executing a plan: the vectors of a run without one, the plan named in the run records,
//! refusals (corpus, settings or query changed) before anything is written, a plan carried to another
//! folder, and kill-and-resume from a plan.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common::{model_dir, pipeline, text, write_jsonl};

/// `n` rows of many lengths (some past a 16-token limit), one NULL text, split over two files of `docs/`.
fn corpus(dir: &Path, n: usize) {
    let words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "again", "tomorrow"];
    let rows: Vec<(String, Option<String>)> = (0..n)
        .map(|i| {
            let text = (0..1 + (i * 7) % 23).map(|w| words[(i + w) % words.len()]).collect::<Vec<_>>().join(" ");
            (format!("r{i:04}"), (i != 5).then_some(text))
        })
        .collect();
    let rows: Vec<(&str, Option<&str>)> = rows.iter().map(|(i, t)| (i.as_str(), t.as_deref())).collect();
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    write_jsonl(&dir.join("docs/a.jsonl"), &rows[..n / 2]);
    write_jsonl(&dir.join("docs/b.jsonl"), &rows[n / 2..]);
}

/// A job embedding `docs/` into `out` with a 16-token limit; `extra` goes before the COPY.
fn job(dir: &Path, name: &str, out: &str, extra: &str) {
    let sql = format!(
        "SET embed.model = '{}';\nSET embed.max_tokens = 16;\n{extra}\n\
         CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs/';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{out}' STORED AS LANCE;\n",
        model_dir().display()
    );
    std::fs::write(dir.join(name), sql).unwrap();
}

fn inspect(dir: &Path, out: &str) -> Value {
    let o = pipeline(&["inspect", out, "--json"], dir);
    assert!(o.status.success(), "{}", text(&o).1);
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `pipeline compare --json` of two outputs: every id in both, vectors within 1e-6.
fn assert_same_vectors(dir: &Path, a: &str, b: &str, rows: u64) {
    let o = pipeline(&["compare", a, b, "--json"], dir);
    let c: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(o.status.success(), "{c}");
    assert_eq!(
        (c["matched"].as_u64(), c["only_in_a"].as_u64(), c["only_in_b"].as_u64()),
        (Some(rows), Some(0), Some(0))
    );
    assert!(c["max_abs_diff"].as_f64().unwrap() <= 1e-6, "{c}");
}

#[test]
fn a_run_from_its_plan_skips_the_ordering_and_gives_the_vectors_of_a_run_without_one() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 120);
    job(d, "job.sql", "out/docs.lance", "");
    job(d, "ref.sql", "out/ref.lance", "");
    let o = pipeline(&["plan", "job.sql", "--json", "--unit-tokens", "300"], d);
    assert!(o.status.success(), "{}", text(&o).1);
    let plan = &serde_json::from_slice::<Value>(&o.stdout).unwrap()[0];
    let units = plan["units"].as_array().unwrap().len() as u64;
    assert!(units >= 3, "{plan}");

    // EXPLAIN: the work list in place of the source, the counting and the sort; without a plan, those.
    let explain = |args: &[&str]| {
        let body = std::fs::read_to_string(d.join("job.sql")).unwrap().replace("COPY (", "EXPLAIN COPY (");
        std::fs::write(d.join("explain.sql"), body).unwrap();
        let o = pipeline(&[&["run", "explain.sql"], args].concat(), d);
        assert!(o.status.success(), "{}", text(&o).1);
        text(&o).0
    };
    let planned = explain(&[]);
    assert!(planned.contains("WorkListExec: plan=") && planned.contains("units="), "{planned}");
    assert!(!planned.contains("TokenCountExec") && !planned.contains("DataSourceExec"), "{planned}");
    let unplanned = explain(&["--no-plan"]);
    assert!(unplanned.contains("TokenCountExec") && !unplanned.contains("WorkListExec"), "{unplanned}");

    let o = pipeline(&["run", "job.sql"], d);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains("executing the plan") && stdout.contains("the sources are as planned"), "{stdout}");
    assert!(stdout.contains(&format!("{units} of {units} units done")), "{stdout}");
    let o = pipeline(&["run", "ref.sql"], d);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(!text(&o).0.contains("executing the plan"), "no plan beside out/ref.lance");
    assert_same_vectors(d, "out/docs.lance", "out/ref.lance", 120);

    // The run records name the plan by the digest of its plan.json, and count exactly the plan's tokens.
    let digest: String = Sha256::digest(std::fs::read(d.join("out/docs.lance.plan/plan.json")).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let j = inspect(d, "out/docs.lance");
    let runs: Vec<&Value> = j["versions"].as_array().unwrap().iter().map(|v| &v["run"]).collect();
    assert!(runs.iter().all(|r| r["plan"]["digest"].as_str() == Some(digest.as_str())), "{j}");
    let last = &runs.last().unwrap()["plan"];
    assert_eq!((last["units_done"].as_u64(), last["units"].as_u64()), (Some(units), Some(units)), "{last}");
    let useful: u64 = runs.iter().map(|r| r["useful_tokens"].as_u64().unwrap()).sum();
    assert_eq!(useful, plan["totals"]["useful_tokens"].as_u64().unwrap());
    let shown = text(&pipeline(&["inspect", "out/docs.lance"], d)).0;
    assert!(shown.contains("from plan ") && shown.contains(&digest[..12]), "{shown}");
    assert!(shown.contains(&format!("{units} of {units} done")), "{shown}");

    // A rerun from the plan finds every id done and writes nothing.
    let o = pipeline(&["run", "job.sql"], d);
    let stdout = text(&o).0;
    assert!(o.status.success() && stdout.contains("this job is done: all 120 ids are already in"), "{stdout}");
    assert!(!stdout.contains("resuming") && !stdout.contains("units done"), "{stdout}");
    assert_eq!(inspect(d, "out/docs.lance")["versions"].as_array().unwrap().len(), runs.len());

    // The job, corpus and plan carried to another folder (another machine) run there from the plan.
    let there = tempfile::tempdir().unwrap();
    let t = there.path();
    std::fs::create_dir_all(t.join("out")).unwrap();
    for f in ["job.sql", "docs/a.jsonl", "docs/b.jsonl"] {
        std::fs::create_dir_all(t.join(f).parent().unwrap()).unwrap();
        std::fs::copy(d.join(f), t.join(f)).unwrap();
    }
    std::fs::create_dir_all(t.join("out/docs.lance.plan")).unwrap();
    for f in std::fs::read_dir(d.join("out/docs.lance.plan")).unwrap().flatten() {
        std::fs::copy(f.path(), t.join("out/docs.lance.plan").join(f.file_name())).unwrap();
    }
    let o = pipeline(&["run", "job.sql"], t);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success() && stdout.contains("executing the plan"), "{stdout}{stderr}");
}

#[test]
fn a_changed_corpus_setting_or_query_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 40);
    job(d, "job.sql", "out/docs.lance", "");
    let o = pipeline(&["plan", "job.sql"], d);
    assert!(o.status.success(), "{}", text(&o).1);
    let refused = |job: &str, args: &[&str]| {
        let o = pipeline(&[&["run", job], args].concat(), d);
        assert!(!o.status.success(), "{}", text(&o).0);
        assert!(!d.join("out/docs.lance").exists(), "nothing written");
        text(&o).1
    };
    let (a, b) =
        (std::fs::read_to_string(d.join("docs/a.jsonl")).unwrap(), std::fs::read(d.join("docs/b.jsonl")).unwrap());

    // One line appended.
    std::fs::write(d.join("docs/a.jsonl"), format!("{a}{{\"id\": \"new\", \"text\": \"one more\"}}\n")).unwrap();
    let e = refused("job.sql", &[]);
    assert!(e.contains("the corpus changed since the plan") && e.contains("a.jsonl has "), "{e}");
    assert!(e.contains("run pipeline plan on the job again") && e.contains("job.sql: statement 4 (line 5)"), "{e}");
    // One text edited, the size kept.
    std::fs::write(d.join("docs/a.jsonl"), a.replacen("quick", "quack", 1)).unwrap();
    let e = refused("job.sql", &[]);
    assert!(e.contains("a.jsonl has other content (its SHA-256 differs)"), "{e}");
    std::fs::write(d.join("docs/a.jsonl"), &a).unwrap();
    // One file removed.
    std::fs::remove_file(d.join("docs/b.jsonl")).unwrap();
    let e = refused("job.sql", &[]);
    assert!(e.contains("b.jsonl was removed"), "{e}");
    std::fs::write(d.join("docs/b.jsonl"), &b).unwrap();

    // A setting of the fingerprint changed.
    job(d, "longer.sql", "out/docs.lance", "SET embed.max_tokens = 32;");
    let e = refused("longer.sql", &[]);
    assert!(e.contains("another campaign fingerprint") && e.contains("max_tokens: plan 16, this run 32"), "{e}");
    // The query changed.
    let body =
        std::fs::read_to_string(d.join("job.sql")).unwrap().replace("FROM docs)", "FROM docs WHERE id <> 'r0001')");
    std::fs::write(d.join("where.sql"), body).unwrap();
    let e = refused("where.sql", &[]);
    assert!(e.contains("is not the one the plan") && e.contains("query, tables or id column"), "{e}");
    // Length order off.
    job(d, "original.sql", "out/docs.lance", "SET embed.order = 'original';");
    let e = refused("original.sql", &[]);
    assert!(e.contains("orders the rows by length") && e.contains("embed.order = 'original'"), "{e}");
    // A plan directory that holds no plan.
    let e = refused("job.sql", &["--plan", "out"]);
    assert!(e.contains("cannot read") && e.contains("plan.json"), "{e}");

    // Unchanged, it runs; --no-plan runs the changed query as it is.
    let o = pipeline(&["run", "where.sql", "--no-plan"], d);
    assert!(o.status.success() && !text(&o).0.contains("executing the plan"), "{}", text(&o).1);
    assert_eq!(inspect(d, "out/docs.lance")["rows"].as_u64(), Some(39));
    let o = pipeline(&["run", "job.sql", "--plan", "out/docs.lance.plan"], d);
    let stdout = text(&o).0;
    assert!(o.status.success() && stdout.contains("resuming: 39 of 40 already done"), "{stdout}{}", text(&o).1);
    assert_eq!(inspect(d, "out/docs.lance")["rows"].as_u64(), Some(40));
}

#[test]
fn killed_runs_from_a_plan_resume_to_every_id_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 2000);
    job(d, "job.sql", "out/docs.lance", "SET embed.commit_rows = 25;");
    job(d, "clean.sql", "out/clean.lance", "SET embed.commit_rows = 25;");
    let o = pipeline(&["run", "clean.sql"], d);
    assert!(o.status.success(), "{}", text(&o).1);
    let o = pipeline(&["plan", "job.sql", "--units", "8"], d);
    assert!(o.status.success(), "{}", text(&o).1);
    let versions = || {
        std::fs::read_dir(d.join("out/docs.lance/_versions"))
            .map(|v| v.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "manifest")).count())
            .unwrap_or(0)
    };
    // SIGKILL 0-300 ms after a commit lands (fixed seed), three times, then a run to the end.
    let mut seed: u64 = 0x9147;
    for kill in 0..3 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let before = versions();
        let mut child =
            crate::common::command(&["run", "job.sql"], d).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let start = Instant::now();
        while versions() == before && child.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < Duration::from_secs(120), "no commit within 120 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis((seed >> 33) % 300));
        assert!(child.try_wait().unwrap().is_none(), "the run finished before kill {kill}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let o = pipeline(&["run", "job.sql"], d);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success() && stdout.contains("resuming: ") && stdout.contains("executing the plan"), "{stderr}");
    let j = inspect(d, "out/docs.lance");
    assert_eq!((j["rows"].as_u64(), j["ids"]["unique"].as_bool()), (Some(2000), Some(true)), "{j}");
    assert_same_vectors(d, "out/clean.lance", "out/docs.lance", 2000);
    let records: Vec<&Value> = j["versions"].as_array().unwrap().iter().map(|v| &v["run"]["plan"]).collect();
    let done: Vec<u64> = records.iter().map(|p| p["units_done"].as_u64().unwrap()).collect();
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "units complete in order across the runs: {done:?}");
    let units = records[0]["units"].as_u64().unwrap();
    assert_eq!(done.last(), Some(&units), "{done:?}");
}

/// A corpus whose folder and file names hold spaces: planned, checked and run from the plan like any other (the
/// table's URL is percent-encoded, `my%20corpus`; the file system's path is not).
#[test]
fn a_corpus_path_with_spaces_is_planned_and_run_from_its_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let rows: Vec<(String, Option<String>)> =
        (0..20).map(|i| (format!("r{i:02}"), Some(format!("text number {i} of a spaced corpus")))).collect();
    let rows: Vec<(&str, Option<&str>)> = rows.iter().map(|(i, t)| (i.as_str(), t.as_deref())).collect();
    std::fs::create_dir_all(d.join("my corpus")).unwrap();
    write_jsonl(&d.join("my corpus/fort une.jsonl"), &rows);
    let sql = format!(
        "SET embed.model = '{}';\n\
         CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'my corpus/fort une.jsonl';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out/docs.lance' STORED AS LANCE;\n",
        model_dir().display()
    );
    std::fs::write(d.join("job.sql"), sql).unwrap();
    let o = pipeline(&["plan", "job.sql", "--json"], d);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    let plan = &serde_json::from_str::<Value>(&stdout).unwrap()[0];
    assert_eq!(plan["totals"]["documents"].as_u64(), Some(20), "{plan}");
    let o = pipeline(&["run", "job.sql"], d);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains("executing the plan") && stdout.contains("the sources are as planned"), "{stdout}");
    assert_eq!(inspect(d, "out/docs.lance")["rows"].as_u64(), Some(20));
}

/// Plan here, run on a GPU elsewhere (issue 53 item 4): `plan --device cuda`, or a job that SETs embed.device =
/// 'cuda', plans on this machine without a GPU, with the float16 model a GPU run takes by default; that plan's
/// fingerprint is the one a run with that model makes (run here from the plan). A CPU plan run on a GPU is refused
/// naming the command that plans for it.
#[test]
fn a_plan_for_a_gpu_is_made_without_one_with_the_model_the_gpu_will_use() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_jsonl(&d.join("docs.jsonl"), &[("a", Some("rivers and lakes")), ("b", Some("bread")), ("c", None)]);
    let body = "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
                COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out.lance' STORED AS LANCE;\n";
    std::fs::write(d.join("job.sql"), body).unwrap();
    std::fs::write(d.join("gpu.sql"), format!("SET embed.device = 'cuda';\n{body}")).unwrap();
    let fp16 = model_dir().with_file_name("all-MiniLM-L6-v2-fp16");

    let mut planned = Vec::new();
    for args in [&["plan", "job.sql", "--device", "cuda", "--json"][..], &["plan", "gpu.sql", "--json"]] {
        let o = pipeline(args, d);
        assert!(o.status.success(), "{args:?}: {:?}", text(&o));
        let plans: Value = serde_json::from_slice(&o.stdout).unwrap();
        let fp = plans[0]["fingerprint"].clone();
        assert_eq!(
            (fp["model"].as_str(), fp["model_dtype"].as_str()),
            (Some("all-MiniLM-L6-v2-fp16"), Some("float16"))
        );
        planned.push(fp);
    }
    assert_eq!(planned[0], planned[1]);

    // The float16 model run here from that plan: the fingerprints agree, so the plan is used.
    let model = format!("embed.model={}", fp16.display());
    let o = pipeline(&["run", "job.sql", "--set", &model], d);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("1 of 1 units done"), "{out}");

    // A plan for the CPU, run on a GPU: refused before the device is opened, naming the command.
    assert!(pipeline(&["plan", "job.sql"], d).status.success());
    let o = pipeline(&["run", "job.sql", "--device", "cuda"], d);
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("model: plan all-MiniLM-L6-v2, this run all-MiniLM-L6-v2-fp16"),
        "{err}"
    );
    assert!(err.contains("pipeline plan JOB --device cuda"), "{err}");
}
