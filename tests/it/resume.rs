//! Stable ids and resume, through the real binary: streaming commits, kill-and-resume, ctrl-C, bad ids,
//! two runs at once, and --restart.

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{model_dir, pipeline, spawn};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `n` short documents with ids `doc-00000`…; `extra` lines are appended verbatim.
fn corpus(dir: &Path, n: usize, extra: &[&str]) {
    let mut lines: Vec<String> = (0..n)
        .map(|i| serde_json::json!({"id": format!("doc-{i:05}"), "text": format!("Document {i} is about topic {} and colour {}.", i % 17, i % 5)}).to_string())
        .collect();
    lines.extend(extra.iter().map(|s| s.to_string()));
    std::fs::write(dir.join("docs.jsonl"), lines.join("\n") + "\n").unwrap();
}

/// A job that embeds docs.jsonl into `out`, committing every `commit_rows` rows; every other setting is
/// the default (DataFusion's 8,192-row batches included).
fn job(dir: &Path, name: &str, out: &str, commit_rows: usize) {
    let sql = format!(
        "SET embed.model = '{}';\n\
         SET embed.commit_rows = {commit_rows};\n\
         CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{out}' STORED AS LANCE;\n",
        model_dir().display()
    );
    std::fs::write(dir.join(name), sql).unwrap();
}

fn inspect(dir: &Path, out: &str) -> Value {
    let o = pipeline(&["inspect", out, "--json"], dir);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `pipeline inspect --json` says the dataset holds `rows` rows, each id once.
pub(crate) fn assert_every_id_once(j: &Value, rows: u64) {
    assert_eq!((j["rows"].as_u64(), j["ids"]["unique"].as_bool()), (Some(rows), Some(true)), "{j}");
}

/// Committed versions, counted from the manifests on disk.
pub(crate) fn versions(dir: &Path, out: &str) -> usize {
    std::fs::read_dir(dir.join(out).join("_versions"))
        .map(|d| d.filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "manifest"))).count())
        .unwrap_or(0)
}

/// `pipeline run <job> --restart` in `dir`, started over an output of `before` versions and returned once it has
/// committed one more (before it ends, which the test asserts).
pub(crate) fn restarting_until_a_commit(dir: &Path, job: &str, out: &str, before: usize) -> Child {
    let mut child = spawn(&["run", job, "--restart"], dir);
    let start = Instant::now();
    while versions(dir, out) <= before {
        assert!(child.try_wait().unwrap().is_none(), "the restart ended before its first commit");
        assert!(start.elapsed() < Duration::from_secs(120), "no commit within 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn wait_for_commit(dir: &Path, out: &str, child: &mut Child) {
    let start = Instant::now();
    while versions(dir, out) == 0 {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its first commit");
        assert!(start.elapsed() < Duration::from_secs(120), "no commit within 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn commits_stream_every_commit_rows_with_a_run_record_each() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 300, &[]);
    job(d, "job.sql", "out.lance", 100);
    let o = pipeline(&["run", "job.sql"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("wrote 300 rows"), "{stdout}");
    let j = inspect(d, "out.lance");
    assert_every_id_once(&j, 300);
    let runs: Vec<&Value> = j["versions"].as_array().unwrap().iter().map(|v| &v["run"]).collect();
    // A commit once 100 rows are held, never cutting a model call's rows (at most 256 more).
    let rows: Vec<u64> = runs.iter().map(|r| r["rows_written"].as_u64().unwrap()).collect();
    assert!(rows.len() >= 2 && rows[..rows.len() - 1].iter().all(|&n| (100..356).contains(&n)), "{rows:?}");
    let last: Vec<bool> = runs.iter().map(|r| r["last_commit"].as_bool().unwrap()).collect();
    assert!(last[..last.len() - 1].iter().all(|l| !l) && last[last.len() - 1], "{last:?}");
    // Every document embedded is accounted to exactly the commit that wrote it.
    for r in &runs {
        assert_eq!(r["documents"].as_u64(), r["rows_written"].as_u64(), "{r}");
    }

    // A rerun finds everything done and writes nothing.
    let o = pipeline(&["run", "job.sql"], d);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && stdout.contains("this job is done: all 300 ids are already in"), "{stdout}");
    assert_eq!(versions(d, "out.lance"), rows.len());
}

#[test]
fn killed_runs_resume_to_every_id_exactly_once_with_the_clean_vectors() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 3000, &[]);
    job(d, "clean.sql", "clean.lance", 500);
    job(d, "job.sql", "out.lance", 25);
    let clean = pipeline(&["run", "clean.sql"], d);
    assert!(clean.status.success(), "{}", stderr(&clean));

    // SIGKILL at pseudo-random moments (fixed seed), rerunning after each kill: each run is killed
    // between 0 and 400 ms after its next commit lands, so it dies mid-batch, mid-model-call or mid-commit.
    let mut seed: u64 = 0x5eed;
    let mut kills = 0;
    while kills < 5 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let delay = Duration::from_millis((seed >> 33) % 400);
        let before = versions(d, "out.lance");
        let mut child = spawn(&["run", "job.sql"], d);
        let start = Instant::now();
        while versions(d, "out.lance") == before && child.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < Duration::from_secs(120), "no commit within 120 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(delay);
        let running = child.try_wait().unwrap().is_none();
        assert!(running, "the run finished before kill {}; the corpus is too small", kills + 1);
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
    }
    let last = pipeline(&["run", "job.sql"], d);
    assert!(last.status.success(), "{}", stderr(&last));

    let j = inspect(d, "out.lance");
    assert_every_id_once(&j, 3000);
    let o = pipeline(&["compare", "clean.lance", "out.lance", "--json"], d);
    crate::common::assert_same_vectors(&o, 3000);
}

#[test]
fn ctrl_c_commits_what_is_done_exits_non_zero_and_the_rerun_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 2000, &[]);
    job(d, "job.sql", "out.lance", 100);
    let mut child = spawn(&["run", "job.sql"], d);
    wait_for_commit(d, "out.lance", &mut child);
    let committed = inspect(d, "out.lance")["rows"].as_u64().unwrap();
    signal(&child, "INT");
    let asked = Instant::now();
    let o = child.wait_with_output().unwrap();
    let exit = asked.elapsed();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    // Within a model call per session plus the commit (generous for a busy machine).
    assert!(exit < Duration::from_secs(10), "{exit:?} to exit after ctrl-C");
    assert!(err.contains("interrupted") && err.contains("run the same job again to resume"), "{err}");
    let partial = inspect(d, "out.lance")["rows"].as_u64().unwrap();
    assert!(partial > committed && partial < 2000, "{partial} rows after ctrl-C, {committed} before");

    let o = pipeline(&["run", "job.sql"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("resuming: {partial} of 2000 already done")));
    let j = inspect(d, "out.lance");
    assert_every_id_once(&j, 2000);
}

/// ctrl-C during `run --restart`: the message says the same job resumes it, with or without `--restart` (the same
/// restart goes on with the one that stopped rather than replacing its rows), and a second SIGINT a moment after the first (as `timeout -s INT` delivers one to the
/// process and one to its group) is the same stop, not a second ctrl-C that would drop the rows being committed.
#[test]
fn ctrl_c_on_a_restart_is_resumed_by_the_same_restart_and_a_doubled_signal_counts_once() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 30, &[]);
    job(d, "job.sql", "out.lance", 100);
    let o = pipeline(&["run", "job.sql"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    corpus(d, 2000, &[]);
    let child = restarting_until_a_commit(d, "job.sql", "out.lance", 1);
    signal(&child, "INT");
    std::thread::sleep(Duration::from_millis(100));
    let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(!err.contains("exiting at once"), "the second signal was taken for a second ctrl-C: {err}");
    assert!(err.contains("interrupted") && err.contains("with or without --restart"), "{err}");
    let partial = inspect(d, "out.lance")["rows"].as_u64().unwrap();
    assert!(partial > 0 && partial < 2000, "{partial} rows after ctrl-C");

    // Issue 53: the same restart run again resumes the one that stopped instead of replacing its rows.
    let o = pipeline(&["run", "job.sql", "--restart"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("resuming the restart of") && out.contains("stopped at version"), "{out}");
    assert!(out.contains(&format!("resuming: {partial} of 2000 already done")), "{out}");
    assert_every_id_once(&inspect(d, "out.lance"), 2000);
    // Finished, a restart replaces the rows again, as asked.
    let o = pipeline(&["run", "job.sql", "--restart"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains("resuming") && !out.contains("this job is done"), "{out}");
    assert_every_id_once(&inspect(d, "out.lance"), 2000);
}

/// Issue 53: a restart that stopped, then a restart of a corpus that changed since: the rows are replaced, as asked
/// (the stopped restart's rows are not this write's).
#[test]
fn a_restart_after_a_stopped_restart_of_another_corpus_replaces_the_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 30, &[]);
    job(d, "job.sql", "out.lance", 100);
    assert!(pipeline(&["run", "job.sql"], d).status.success());
    corpus(d, 2000, &[]);
    let mut child = restarting_until_a_commit(d, "job.sql", "out.lance", 1);
    signal(&child, "KILL");
    let _ = child.wait();
    corpus(d, 1500, &[]);
    let o = pipeline(&["run", "job.sql", "--restart"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains("resuming"), "{out}");
    assert_every_id_once(&inspect(d, "out.lance"), 1500);
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// SIGTERM long before the first commit is due (default commit_rows and commit_seconds): the rows
/// already embedded are committed, and the process exits within seconds, not after the batch it was in.
#[test]
fn sigterm_before_any_commit_keeps_the_rows_embedded_and_exits_soon() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 6_000, &[]);
    job(d, "job.sql", "out.lance", 50_000);
    let mut child = spawn(&["run", "job.sql"], d);
    // Wait until the model has been running a while: the progress of a run shows in nothing on disk,
    // so give it time to embed some rows.
    std::thread::sleep(Duration::from_secs(5));
    assert!(child.try_wait().unwrap().is_none(), "the run ended before the signal; the corpus is too small");
    assert_eq!(versions(d, "out.lance"), 0, "no commit is due yet");
    signal(&child, "TERM");
    let asked = Instant::now();
    let o = child.wait_with_output().unwrap();
    let exit = asked.elapsed();
    let err = stderr(&o);
    assert!(!o.status.success() && err.contains("interrupted"), "{err}");
    assert!(exit < Duration::from_secs(10), "{exit:?} to exit after SIGTERM");
    let kept = inspect(d, "out.lance")["rows"].as_u64().unwrap();
    assert!(kept > 0 && kept < 6_000, "{kept} rows kept");
    let o = pipeline(&["run", "job.sql"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_every_id_once(&inspect(d, "out.lance"), 6_000);
}

/// Two runs on one machine take one thread per core each by default and slow each other down: the
/// second says so, with the setting to use.
#[test]
fn a_run_beside_another_says_how_to_share_the_cores() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 12_000, &[]);
    job(d, "big.sql", "big.lance", 50_000);
    let mut first = spawn(&["run", "big.sql"], d);
    std::thread::sleep(Duration::from_secs(1));
    std::fs::write(d.join("small.jsonl"), "{\"id\": \"x\", \"text\": \"hello\"}\n").unwrap();
    let small = std::fs::read_to_string(d.join("big.sql")).unwrap().replace("docs.jsonl", "small.jsonl");
    std::fs::write(d.join("small.sql"), small.replace("big.lance", "small.lance")).unwrap();
    let o = pipeline(&["run", "small.sql"], d);
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    // Other tests' runs may be about too; this one's neighbour must be named.
    let line = stdout.lines().find(|l| l.starts_with("shared machine: ")).unwrap_or_default();
    assert!(
        line.contains("other pipeline run(s) on this machine (pid ") && line.contains(&first.id().to_string()),
        "{stdout}"
    );
    assert!(line.contains("SET embed.intra_threads = "), "{stdout}");
}

/// A second ctrl-C, a second or more after the first (one sooner is the first delivered twice), exits at once,
/// whatever the run is doing.
#[test]
fn a_second_ctrl_c_exits_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 12_000, &[]);
    job(d, "job.sql", "out.lance", 50_000);
    let mut child = spawn(&["run", "job.sql"], d);
    std::thread::sleep(Duration::from_secs(3));
    assert!(child.try_wait().unwrap().is_none());
    signal(&child, "INT");
    std::thread::sleep(Duration::from_millis(1100));
    // The first may have been honoured already: the run committed and ended.
    let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let asked = Instant::now();
    let o = child.wait_with_output().unwrap();
    assert!(asked.elapsed() < Duration::from_secs(2), "{:?} to exit after a second ctrl-C", asked.elapsed());
    let err = stderr(&o);
    assert!(o.status.code() == Some(130) || err.contains("interrupted"), "{:?}: {err}", o.status);
}

/// Each version's run record counts exactly the rows that version added: its documents are its rows,
/// its useful tokens are the tokenizer's count over its ids' texts, its truncated documents are those
/// of its ids longer than max_tokens. And commits come as rows are finished, not in a burst at the end.
#[test]
fn each_run_record_counts_exactly_the_rows_of_its_commit() {
    use embedding_pipeline::EmbedOptions;
    use embedding_pipeline::campaign::Fingerprint;
    use embedding_pipeline::model::{Placement, registry};
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let texts: Vec<(String, String)> = (0..600)
        .map(|i| (format!("doc-{i:05}"), format!("{i} {}", "several words of text ".repeat(1 + (i * 7) % 13))))
        .collect();
    let lines: Vec<String> = texts.iter().map(|(id, t)| serde_json::json!({"id": id, "text": t}).to_string()).collect();
    std::fs::write(d.join("docs.jsonl"), lines.join("\n") + "\n").unwrap();
    job(d, "job.sql", "out.lance", 100);
    let sql = std::fs::read_to_string(d.join("job.sql")).unwrap();
    std::fs::write(d.join("job.sql"), format!("SET embed.max_tokens = 40;\n{sql}")).unwrap();
    let o = pipeline(&["run", "job.sql"], d);
    assert!(o.status.success(), "{}", stderr(&o));

    let model = model_dir().display().to_string();
    let mut options = EmbedOptions::default().with_model(model.clone());
    options.max_tokens = 40;
    let (cut, _) = Fingerprint::for_options(&options).unwrap();
    let (whole, _) = Fingerprint::for_options(&EmbedOptions::default().with_model(model)).unwrap();
    let embedder = registry::get_or_load(&model_dir(), Placement::cpu(1)).unwrap();
    let text_of: std::collections::HashMap<&str, &str> = texts.iter().map(|(i, t)| (i.as_str(), t.as_str())).collect();

    let j = inspect(d, "out.lance");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut timestamps = Vec::new();
    let (mut documents, mut wall) = (0, 0.0);
    for v in j["versions"].as_array().unwrap() {
        let ids: Vec<String> = runtime.block_on(ids_at(&d.join("out.lance"), v["version"].as_u64().unwrap()));
        let new: Vec<Option<&str>> =
            ids.iter().filter(|id| seen.insert((*id).clone())).map(|id| Some(text_of[id.as_str()])).collect();
        let run = &v["run"];
        let tokens: usize = embedder.token_lengths(&new, &cut).unwrap().iter().sum();
        let truncated = embedder.token_lengths(&new, &whole).unwrap().iter().filter(|&&n| n > 40).count();
        assert_eq!(run["rows_written"].as_u64(), Some(new.len() as u64), "{run}");
        assert_eq!(run["documents"].as_u64(), Some(new.len() as u64), "{run}");
        assert_eq!(run["useful_tokens"].as_u64(), Some(tokens as u64), "{run}");
        assert_eq!(run["truncated_documents"].as_u64(), Some(truncated as u64), "{run}");
        documents += new.len();
        wall += run["wall_seconds"].as_f64().unwrap();
        timestamps.push(chrono::DateTime::parse_from_rfc3339(v["timestamp"].as_str().unwrap()).unwrap());
    }
    assert_eq!(documents, 600);
    assert!(timestamps.len() >= 5, "{} commits", timestamps.len());
    // The records cover the write from its start to its last commit. The commits came as rows were
    // finished, spread over most of that time, not in a burst at the end.
    let span = (timestamps[timestamps.len() - 1] - timestamps[0]).num_milliseconds() as f64 / 1000.0;
    assert!(span > 0.3 * wall, "commits spread over {span:.2} s of a {wall:.2} s write");
}

/// The ids of one version of a dataset.
async fn ids_at(uri: &Path, version: u64) -> Vec<String> {
    use datafusion::arrow::array::AsArray;
    use futures::TryStreamExt;
    let ds = lance::Dataset::open(&uri.display().to_string()).await.unwrap().checkout_version(version).await.unwrap();
    let mut scan = ds.scan();
    scan.project(&["id"]).unwrap();
    let batches: Vec<_> = scan.try_into_stream().await.unwrap().try_collect().await.unwrap();
    batches
        .iter()
        .flat_map(|b| b.column(0).as_string::<i32>().iter().map(|s| s.unwrap().to_string()).collect::<Vec<_>>())
        .collect()
}

#[test]
fn duplicate_and_null_ids_are_refused_before_any_write() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 20, &[]);
    job(d, "job.sql", "out.lance", 100);
    assert!(pipeline(&["run", "job.sql"], d).status.success());

    for (extra, expect) in [
        (r#"{"id": "doc-00003", "text": "a second doc-00003"}"#, "1 ids occur more than once (first: doc-00003)"),
        (r#"{"id": null, "text": "no id"}"#, "1 rows have a NULL id"),
    ] {
        corpus(d, 20, &[extra]);
        let o = pipeline(&["run", "job.sql"], d);
        let err = stderr(&o);
        assert!(!o.status.success() && err.contains(expect) && err.contains("Nothing was embedded"), "{err}");
        assert!(!String::from_utf8_lossy(&o.stdout).contains("embedded"), "nothing may be embedded");
        assert_eq!(versions(d, "out.lance"), 1, "the output stays untouched");
    }
    // A missing id column is named too.
    std::fs::write(
        d.join("noid.sql"),
        std::fs::read_to_string(d.join("job.sql")).unwrap().replace("SELECT id, ", "SELECT "),
    )
    .unwrap();
    let o = pipeline(&["run", "noid.sql"], d);
    assert!(!o.status.success() && stderr(&o).contains("no id column `id`"), "{}", stderr(&o));
}

#[test]
fn integer_ids_resume_too() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let lines: Vec<String> =
        (0..30).map(|i| serde_json::json!({"id": i, "text": format!("number {i}")}).to_string()).collect();
    std::fs::write(d.join("docs.jsonl"), lines[..20].join("\n")).unwrap();
    job(d, "job.sql", "out.lance", 100);
    assert!(pipeline(&["run", "job.sql"], d).status.success());
    std::fs::write(d.join("docs.jsonl"), lines.join("\n")).unwrap();
    let o = pipeline(&["run", "job.sql"], d);
    assert!(String::from_utf8_lossy(&o.stdout).contains("resuming: 20 of 30 already done"), "{}", stderr(&o));
    let j = inspect(d, "out.lance");
    assert_every_id_once(&j, 30);
}

#[test]
fn a_second_run_on_the_same_output_is_refused_while_the_first_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 2000, &[]);
    job(d, "job.sql", "out.lance", 100);
    let mut first = spawn(&["run", "job.sql"], d);
    wait_for_commit(d, "out.lance", &mut first);
    let second = pipeline(&["run", "job.sql"], d);
    let err = stderr(&second);
    assert!(!second.status.success() && err.contains("another pipeline run is writing to"), "{err}");
    // Refused before it counts what is done: nothing reads as if it were resuming.
    let out = String::from_utf8_lossy(&second.stdout);
    assert!(!out.contains("resuming") && !err.contains("resuming"), "{out}{err}");
    let o = first.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let j = inspect(d, "out.lance");
    assert_every_id_once(&j, 2000);
}

#[test]
fn restart_writes_a_fresh_version_and_keeps_the_old_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 30, &[]);
    job(d, "job.sql", "out.lance", 100);
    assert!(pipeline(&["run", "job.sql"], d).status.success());
    let o = pipeline(&["run", "--restart", "job.sql"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let j = inspect(d, "out.lance");
    assert_eq!(
        (j["version"].as_u64(), j["rows"].as_u64(), j["ids"]["unique"].as_bool()),
        (Some(2), Some(30), Some(true))
    );
    let o = pipeline(&["compare", "out.lance@1", "out.lance@2"], d);
    assert!(o.status.success(), "the old version is still readable: {}", stderr(&o));
}

/// `INSERT INTO` a Lance table resumes as a COPY does, and says so: its input names the id without a table
/// (`docs.id AS id`), which the resume count once found ambiguous beside the done ids' `__done_ids.id`.
#[test]
fn an_insert_into_a_lance_table_says_what_is_done_and_adds_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 20, &[]);
    job(d, "job.sql", "out.lance", 100);
    let first =
        std::fs::read_to_string(d.join("job.sql")).unwrap().replace("FROM docs)", "FROM docs WHERE id < 'doc-00008')");
    std::fs::write(d.join("first.sql"), first).unwrap();
    assert!(pipeline(&["run", "first.sql"], d).status.success());
    let insert = format!(
        "SET embed.model = '{}';\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
         CREATE EXTERNAL TABLE out STORED AS LANCE LOCATION 'out.lance';\n\
         INSERT INTO out SELECT id, embed(text) AS embedding FROM docs;\n",
        model_dir().display()
    );
    std::fs::write(d.join("insert.sql"), insert).unwrap();
    let o = pipeline(&["run", "insert.sql"], d);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("resuming: 8 of 20 already done"), "{out}{}", stderr(&o));
    assert_every_id_once(&inspect(d, "out.lance"), 20);
}

/// `EXPLAIN ANALYZE` runs the write it explains: it resumes, and checks the ids, as the write does.
#[test]
fn an_explain_analyze_of_a_write_resumes_and_checks_ids_as_the_write() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d, 20, &[]);
    job(d, "job.sql", "out.lance", 100);
    let sql = std::fs::read_to_string(d.join("job.sql")).unwrap();
    std::fs::write(d.join("first.sql"), sql.replace("FROM docs)", "FROM docs WHERE id < 'doc-00008')")).unwrap();
    assert!(pipeline(&["run", "first.sql"], d).status.success());
    std::fs::write(d.join("explained.sql"), sql.replace("COPY (", "EXPLAIN ANALYZE COPY (")).unwrap();
    let o = pipeline(&["run", "explained.sql"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_every_id_once(&inspect(d, "out.lance"), 20);

    // A repeated id: refused before anything is written.
    corpus(d, 20, &[r#"{"id": "doc-00003", "text": "again"}"#]);
    std::fs::write(
        d.join("again.sql"),
        sql.replace("COPY (", "EXPLAIN ANALYZE COPY (").replace("out.lance", "new.lance"),
    )
    .unwrap();
    let o = pipeline(&["run", "again.sql"], d);
    assert!(!o.status.success() && stderr(&o).contains("doc-00003"), "{}", stderr(&o));
    assert!(!d.join("new.lance/_versions").exists());
}
