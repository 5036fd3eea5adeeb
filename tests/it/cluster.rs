//! A real Ballista cluster on loopback: `pipeline scheduler` and two `pipeline executor` processes (one ONNX
//! Runtime thread and one task each, so the 2-core machine is not oversubscribed), started and stopped by the
//! tests, and `pipeline run --cluster` against them.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ballista_core::serde::protobuf::GetJobStatusParams;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use embedding_pipeline::campaign::Fingerprint;
use embedding_pipeline::campaign::metrics::RunMetrics;
use embedding_pipeline::cluster::access::SERVER_NAME;
use embedding_pipeline::cluster::{ClusterKeys, check_keys_match};
use embedding_pipeline::udf::EmbedUdf;
use embedding_pipeline::udf::embed::HostOptions;

use crate::common::{command, model_dir, pipeline, session, spawn, tiny_model_dir};

/// A port nothing listens on now (and, with its neighbour, free for an executor's two services).
fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

fn wait_for_port(port: u16, what: &str, child: &mut Child) {
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening on {port}: {status}");
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{what} did not listen on {port} within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A scheduler and executors, each a `pipeline` process (the executors in `dir/hosts`); dropping it stops them all. One cluster at a time: the
/// 2-core machine runs each process's model on one thread, and a lost executor is noticed by its heartbeats.
struct Cluster {
    scheduler_port: u16,
    scheduler: Child,
    executors: Vec<(Child, PathBuf)>,
    /// The executors' results ports.
    executor_ports: Vec<u16>,
    /// The scheduler's warnings and errors.
    log: PathBuf,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Cluster {
    fn start(dir: &Path, executors: usize) -> Cluster {
        Self::start_with(dir, executors, 180)
    }

    /// With a scheduler that takes an executor for lost after `timeout` seconds without a heartbeat.
    fn start_with(dir: &Path, executors: usize, timeout: u64) -> Cluster {
        Self::launch(dir, executors, timeout, &[])
    }

    /// Two executors, the scheduler and they given the cluster's keys in `keys`.
    fn keyed(dir: &Path, keys: &Path) -> Cluster {
        Self::launch(dir, 2, 180, &["--cluster-keys".as_ref(), keys.as_os_str()])
    }

    /// `extra` given to each process.
    fn launch(dir: &Path, executors: usize, timeout: u64, extra: &[&std::ffi::OsStr]) -> Cluster {
        let one_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
        let scheduler_port = free_port();
        let scheduler = command(&["scheduler", "--bind", &format!("127.0.0.1:{scheduler_port}")], dir)
            .args(["--executor-timeout", &timeout.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("scheduler.log")).unwrap())
            .spawn()
            .unwrap();
        // In the cluster before it is waited for, so that a failed start still stops every process.
        let mut cluster = Cluster {
            scheduler_port,
            scheduler,
            executors: Vec::new(),
            executor_ports: Vec::new(),
            log: dir.join("scheduler.log"),
            _one_at_a_time: one_at_a_time,
        };
        wait_for_port(scheduler_port, "the scheduler", &mut cluster.scheduler);
        // The executors' working directory, against which a relative embed.model resolves on them.
        let hosts = dir.join("hosts");
        std::fs::create_dir_all(&hosts).unwrap();
        for i in 0..executors {
            let port = free_port();
            let work = dir.join(format!("executor-{i}"));
            let child = command(&["executor", "--scheduler", &format!("127.0.0.1:{scheduler_port}")], &hosts)
                .args(["--bind", &format!("127.0.0.1:{port}"), "--intra-threads", "1", "--concurrent-tasks", "1"])
                .args(extra)
                .arg("--work-dir")
                .arg(&work)
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            cluster.executors.push((child, work));
            let (child, _) = cluster.executors.last_mut().unwrap();
            wait_for_port(port, "an executor", child);
            cluster.executor_ports.push(port);
        }
        cluster
    }

    fn url(&self) -> String {
        format!("df://127.0.0.1:{}", self.scheduler_port)
    }

    /// Files each executor wrote into its work directory (its share of a job's results).
    fn files_per_executor(&self) -> Vec<usize> {
        fn count(dir: &Path) -> usize {
            std::fs::read_dir(dir).map_or(0, |entries| {
                entries.flatten().map(|e| if e.path().is_dir() { count(&e.path()) } else { 1 }).sum()
            })
        }
        self.executors.iter().map(|(_, work)| count(work)).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.executors.iter_mut().map(|(c, _)| c).chain(std::iter::once(&mut self.scheduler)) {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("the scheduler's log:\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
    }
}

/// `n` documents from the 1,000 fortunes (past 1,000 they come round again, under new ids), in `parts` JSON
/// lines files under `dir/docs/` (one scan partition each).
fn fortunes_in_parts(dir: &Path, n: usize, parts: usize) {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/fortunes.jsonl");
    let text = std::fs::read_to_string(corpus).unwrap();
    let fortunes: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let mut doc = fortunes[i % fortunes.len()].clone();
            if i >= fortunes.len() {
                doc["id"] = format!("{}-{}", doc["id"].as_str().unwrap(), i / fortunes.len()).into();
            }
            doc.to_string()
        })
        .collect();
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    for (i, chunk) in lines.chunks(n.div_ceil(parts)).enumerate() {
        std::fs::write(dir.join(format!("docs/part-{i}.jsonl")), chunk.join("\n") + "\n").unwrap();
    }
}

/// id → vector from `--format ndjson` output.
fn vectors_by_id(out: &Output) -> BTreeMap<String, Vec<f32>> {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let row: serde_json::Value = serde_json::from_str(l).unwrap();
            let v = row["v"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
            (row["id"].as_str().unwrap().to_string(), v)
        })
        .collect()
}

/// The same ids, once each, and the same vectors to 1e-6 (a task's batches are not the local run's).
fn assert_same_vectors(here: &BTreeMap<String, Vec<f32>>, there: &BTreeMap<String, Vec<f32>>) {
    assert_eq!(there.keys().collect::<Vec<_>>(), here.keys().collect::<Vec<_>>(), "the same ids, once each");
    let worst =
        here.iter().flat_map(|(id, a)| a.iter().zip(&there[id]).map(|(x, y)| (x - y).abs())).fold(0f32, f32::max);
    assert!(worst <= 1e-6, "largest difference {worst}");
}

/// A query of every document's id and vector, from `docs/`, on the tiny model (what is checked is where rows are
/// embedded and how they come back, not what the vectors mean).
fn vectors_of_docs() -> String {
    format!(
        "SET embed.model = '{}'; CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs/'; \
         SELECT id, embed(text) AS v FROM docs",
        tiny_model_dir().display()
    )
}

#[test]
fn a_query_embeds_on_two_executors_as_it_does_here() {
    let dir = tempfile::tempdir().unwrap();
    fortunes_in_parts(dir.path(), 1000, 4);
    let cluster = Cluster::start(dir.path(), 2);
    let query = vectors_of_docs();
    let args = ["run", "-q", "--format", "ndjson", "--maxrows", "inf", "-c", &query];
    let here = vectors_by_id(&pipeline(&args, dir.path()));
    let url = cluster.url();
    let there = vectors_by_id(&pipeline(&[&args[..], &["--cluster", &url]].concat(), dir.path()));
    assert_eq!(here.len(), 1000);
    assert_same_vectors(&here, &there);
    // Both executors did a share of the work: each wrote results for the client to fetch.
    let files = cluster.files_per_executor();
    assert!(files.iter().all(|&n| n > 0), "result files per executor: {files:?}");

    // embed_dim() and a join run there too and print as here.
    let join = format!(
        "SET embed.model = '{}'; CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs/'; \
         SELECT embed_dim() AS dim, count(*) AS n FROM docs a JOIN docs b ON a.id = b.id",
        tiny_model_dir().display()
    );
    let args = ["run", "-q", "--format", "csv", "-c", &join];
    let here = pipeline(&args, dir.path());
    let there = pipeline(&[&args[..], &["--cluster", &url]].concat(), dir.path());
    assert!(there.status.success(), "{}", String::from_utf8_lossy(&there.stderr));
    assert_eq!(String::from_utf8_lossy(&there.stdout), String::from_utf8_lossy(&here.stdout));
    assert_eq!(String::from_utf8_lossy(&there.stdout), "dim,n\n384,1000\n");
}

#[test]
fn a_scheduler_refuses_a_timeout_shorter_than_two_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let o = pipeline(&["scheduler", "--bind", &format!("127.0.0.1:{port}"), "--executor-timeout", "9"], dir.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--executor-timeout 9") && err.contains("10 seconds or more"), "{err}");
}

#[test]
fn a_cluster_nobody_listens_at_is_named_before_any_statement_runs() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let o = pipeline(&["run", "--cluster", &format!("df://127.0.0.1:{port}"), "-c", "SELECT 1"], dir.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("no scheduler answers") && err.contains("pipeline scheduler --bind"), "{err}");
    let o = pipeline(&["run", "--cluster", "http://127.0.0.1:1", "-c", "SELECT 1"], dir.path());
    assert!(String::from_utf8_lossy(&o.stderr).contains("df://HOST:PORT"));
}

/// An executor whose model makes other vectors than the client planned with refuses to embed: here the
/// executors' `embed` itself, given a fingerprint whose model hash is not this model's.
#[tokio::test]
async fn an_executor_with_another_model_refuses_to_embed() {
    let s = session();
    let ctx = s.context();
    let planned = ctx.state().scalar_functions()["embed"].clone();
    let mut fingerprint: Fingerprint = EmbedUdf::planned_fingerprint(&planned).unwrap();
    fingerprint.model_sha256 = "0".repeat(64);
    let model = model_dir().display().to_string();
    ctx.sql(&format!("SET embed.model = '{model}'")).await.unwrap();
    ctx.register_udf(EmbedUdf::on_cluster(fingerprint, HostOptions::default(), Arc::new(RunMetrics::default())));
    let err = ctx.sql("SELECT embed('a text') AS v").await.unwrap().collect().await.unwrap_err().to_string();
    assert!(err.contains("makes other vectors") && err.contains("model_sha256"), "{err}");

    // With the client's own fingerprint, the same function embeds as the client's does.
    let s = session();
    let ctx = s.context();
    let planned = ctx.state().scalar_functions()["embed"].clone();
    let here =
        crate::common::vectors(&ctx.sql("SELECT embed('a text') AS v").await.unwrap().collect().await.unwrap(), "v");
    let fingerprint = EmbedUdf::planned_fingerprint(&planned).unwrap();
    ctx.sql(&format!("SET embed.model = '{model}'")).await.unwrap();
    ctx.register_udf(EmbedUdf::on_cluster(fingerprint, HostOptions::default(), Arc::new(RunMetrics::default())));
    let there =
        crate::common::vectors(&ctx.sql("SELECT embed('a text') AS v").await.unwrap().collect().await.unwrap(), "v");
    assert_eq!(here, there);
}

/// The job that embeds `docs/` into `out`, at the default settings.
fn write_job(dir: &Path, name: &str, out: &str, extra: &str) {
    write_job_on(&tiny_model_dir(), dir, name, out, extra);
}

/// [`write_job`] on `model`: the real one where a test needs a write that takes a while.
fn write_job_on(model: &Path, dir: &Path, name: &str, out: &str, extra: &str) {
    let sql = format!(
        "SET embed.model = '{}';\n{extra}\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs/';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{out}' STORED AS LANCE;\n",
        model.display()
    );
    std::fs::write(dir.join(name), sql).unwrap();
}

fn inspect(dir: &Path, dataset: &str) -> serde_json::Value {
    let o = pipeline(&["inspect", "--json", dataset], dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// 2,000 documents in 4 files, embedded here into `here/docs.lance` by `here.sql`; `there.sql` writes them into
/// `there/docs.lance`. On the tiny model.
fn embedded_here(dir: &Path) {
    embedded_here_on(&tiny_model_dir(), dir);
}

/// [`embedded_here`] on `model`.
fn embedded_here_on(model: &Path, dir: &Path) {
    fortunes_in_parts(dir, 2000, 4);
    write_job_on(model, dir, "here.sql", "here/docs.lance", "");
    write_job_on(model, dir, "there.sql", "there/docs.lance", "");
    let o = pipeline(&["run", "-q", "here.sql"], dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_write_on_two_executors_is_one_commit_equal_to_a_local_run() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    embedded_here(dir);

    let cluster = Cluster::start(dir, 2);
    let url = cluster.url();
    let o = pipeline(&["run", "--cluster", &url, "there.sql"], dir);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}{out}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("wrote 2000 rows to ") && out.contains("there/docs.lance in 1 commit(s), now at version 1"),
        "{out}"
    );
    crate::common::assert_same_vectors(
        &pipeline(&["compare", "here/docs.lance", "there/docs.lance", "--json"], dir),
        2000,
    );

    // One Lance version, whose record sums every task and names each executor's share.
    let report = inspect(dir, "there/docs.lance");
    let versions = report["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 1, "{report}");
    let run = &versions[0]["run"];
    assert_eq!(run["rows_written"], 2000);
    assert_eq!(run["documents"], 2000);
    let shares = run["executors"].as_array().unwrap();
    assert_eq!(shares.len(), 2, "both executors took a share: {run}");
    let sum = |key: &str| shares.iter().map(|s| s[key].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("rows_written"), 2000);
    assert_eq!(sum("documents"), 2000);
    assert_eq!(sum("useful_tokens"), run["useful_tokens"].as_u64().unwrap());
    assert!(sum("tasks") >= 4, "at least one task per file: {run}");
    assert!(shares.iter().all(|s| s["rows_written"].as_u64().unwrap() > 0 && s["device"].is_object()), "{run}");
    // The executors ordered their shares by length, as a local write does.
    assert!(run["padding_efficiency"].as_f64().unwrap() > 0.8, "{run}");

    // Run again: every id is there, so nothing is embedded and no version is made.
    let o = pipeline(&["run", "--cluster", &url, "there.sql"], dir);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("this job is done: all ") && !out.contains("resuming"), "{out}");
    assert_eq!(inspect(dir, "there/docs.lance")["versions"].as_array().unwrap().len(), 1);

    // Other settings are refused before any task runs, and the dataset stays as it is.
    write_job(dir, "other.sql", "there/docs.lance", "SET embed.normalize = 'false';");
    let o = pipeline(&["run", "--cluster", &url, "other.sql"], dir);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("refusing to append") && err.contains("normalize"), "{err}");
    assert_eq!(inspect(dir, "there/docs.lance")["versions"].as_array().unwrap().len(), 1);

    // A tag given to a run with nothing new marks the current version, as locally.
    write_job(dir, "tagged.sql", "there/docs.lance", "SET embed.tag = 'v1';");
    let o = pipeline(&["run", "--cluster", &url, "tagged.sql"], dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(inspect(dir, "there/docs.lance")["versions"][0]["tags"][0], "v1");
    // --restart replaces the rows in one new version, under the same fingerprint (compare checks it).
    let o = pipeline(&["run", "--restart", "--cluster", &url, "there.sql"], dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = inspect(dir, "there/docs.lance");
    assert_eq!((report["versions"].as_array().unwrap().len(), &report["rows"]), (2, &serde_json::json!(2000)));
    crate::common::assert_same_vectors(
        &pipeline(&["compare", "here/docs.lance", "there/docs.lance", "--json"], dir),
        2000,
    );

    // A Lance table is read here only: a query of one on the cluster is refused, naming it.
    let o = pipeline(
        &[
            "run",
            "--cluster",
            &url,
            "-c",
            "CREATE EXTERNAL TABLE v STORED AS LANCE LOCATION 'there/docs.lance'; SELECT count(*) FROM v",
        ],
        dir,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("v is a Lance table") && err.contains("without --cluster"), "{err}");
    // So is a write into anything but Lance.
    let o = pipeline(
        &[
            "run",
            "--cluster",
            &url,
            "-c",
            "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs/'; COPY (SELECT id FROM docs) TO 'ids.parquet' STORED AS PARQUET",
        ],
        dir,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("only writes into Lance run"), "{err}");
    assert!(!dir.join("ids.parquet").exists());

    // Half the corpus gone from the output (a restart that kept 1,000 rows): the cluster embeds only the rest.
    let o = pipeline(
        &[
            "run",
            "-q",
            "-c",
            &format!(
                "SET embed.model = '{}'; CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs/part-0.jsonl'; \
         CREATE EXTERNAL TABLE more STORED AS JSON LOCATION 'docs/part-1.jsonl'; \
         COPY (SELECT id, embed(text) AS embedding FROM docs UNION ALL SELECT id, embed(text) AS embedding FROM more) \
         TO 'half/docs.lance' STORED AS LANCE",
                tiny_model_dir().display()
            ),
        ],
        dir,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    write_job(dir, "half.sql", "half/docs.lance", "");
    let o = pipeline(&["run", "--cluster", &url, "half.sql"], dir);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("resuming: 1000 of 2000 already done") && out.contains("wrote 1000 rows"), "{out}");
    crate::common::assert_same_vectors(
        &pipeline(&["compare", "here/docs.lance", "half/docs.lance", "--json"], dir),
        2000,
    );
    // The planner knows how many ids are done, so it sends them whole to every task rather than shuffling the
    // input by id into target_partitions tasks: a task per file, as in a fresh write.
    let report = inspect(dir, "half/docs.lance");
    let run = &report["versions"].as_array().unwrap().last().unwrap()["run"];
    let tasks: u64 = run["executors"].as_array().unwrap().iter().map(|s| s["tasks"].as_u64().unwrap()).sum();
    assert_eq!(tasks, 4, "{run}");

    // Issue 53: a restart here killed after its first commit, then the same restart on the cluster resumes it
    // (its rows are kept and the rest embedded there), and once finished, a restart replaces the rows again.
    write_job(dir, "small.sql", "here/docs.lance", "SET embed.commit_rows = 100;");
    let mut child = crate::resume::restarting_until_a_commit(dir, "small.sql", "here/docs.lance", 1);
    child.kill().unwrap();
    let _ = child.wait();
    let kept = inspect(dir, "here/docs.lance")["rows"].as_u64().unwrap();
    assert!(kept > 0 && kept < 2000, "{kept} rows after the kill");
    let o = pipeline(&["run", "--restart", "--cluster", &url, "here.sql"], dir);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("resuming the restart of") && out.contains(&format!("resuming: {kept} of 2000")), "{out}");
    let report = inspect(dir, "here/docs.lance");
    crate::resume::assert_every_id_once(&report, 2000);
    let run = &report["versions"].as_array().unwrap().last().unwrap()["run"];
    assert!(run["restarted"] == true && run["write_digest"].is_string() && run["executors"].is_array(), "{run}");
    crate::common::assert_same_vectors(
        &pipeline(&["compare", "here/docs.lance", "there/docs.lance", "--json"], dir),
        2000,
    );
    let o = pipeline(&["run", "--restart", "--cluster", &url, "here.sql"], dir);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && !out.contains("resuming") && out.contains("wrote 2000 rows"), "{out}");
    drop(cluster);
}

#[test]
fn an_executor_killed_in_a_write_leaves_every_id_once_after_a_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // The real model, so that the kill lands while the tasks are still embedding.
    embedded_here_on(&model_dir(), dir);

    // The scheduler takes an executor for lost after 15 s without a heartbeat (executors send one every 5 s).
    let mut cluster = Cluster::start_with(dir, 2, 15);
    let url = cluster.url();
    // Kill an executor once the tasks have begun writing their fragments.
    let client = writing_there(dir, &url);
    let (killed, _) = &mut cluster.executors[0];
    killed.kill().unwrap();
    killed.wait().unwrap();
    let first = ended(client, "the job neither completed nor failed within 300 s of an executor's loss");
    let outcome = if first.status.success() { "completed on the other executor" } else { "failed" };
    eprintln!(
        "with an executor killed, the job {outcome}:\n{}{}",
        String::from_utf8_lossy(&first.stdout),
        String::from_utf8_lossy(&first.stderr)
    );
    if !first.status.success() {
        // A failed job committed nothing.
        assert!(!dir.join("there/docs.lance/_versions").exists(), "a failed job left a version");
    }
    // Run again (on the executor left): every id exactly once, the vectors a local run makes.
    let o = pipeline(&["run", "--cluster", &url, "there.sql"], dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    crate::common::assert_same_vectors(
        &pipeline(&["compare", "here/docs.lance", "there/docs.lance", "--json"], dir),
        2000,
    );
    let report = inspect(dir, "there/docs.lance");
    assert_eq!(report["ids"]["unique"], true, "{report}");
    assert_eq!(report["rows"], 2000, "{report}");
}

#[test]
fn a_task_longer_than_the_executor_timeout_completes_on_its_executor() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // One file, so one task, on one executor, that embeds for longer than the scheduler waits for word from an
    // executor (10 s, looked at every 15 s). A busy executor used to send none, and its task was taken from it and
    // restarted for ever. The test shows something only while the task outlasts the timeout and the next look
    // (25 s): 2,000 documents on one thread took 55 s on one of these machines and 24 s on another, and a pace timed
    // beforehand misleads when other tests share the machine, so a job that ends sooner is run again, on as many
    // documents as its own pace says take about 32 s.
    let cluster = Cluster::start_with(dir, 1, 10);
    let mut n = 1500;
    loop {
        let _ = std::fs::remove_dir_all(dir.join("docs"));
        let _ = std::fs::remove_dir_all(dir.join("there"));
        fortunes_in_parts(dir, n, 1);
        write_job_on(&model_dir(), dir, "there.sql", "there/docs.lance", "");
        let started = Instant::now();
        let o = ended(running_there(dir, &cluster.url()), "the job did not end within 300 s");
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && out.contains(&format!("wrote {n} rows")), "{out}{err}");
        let took = started.elapsed();
        if took > Duration::from_secs(25) {
            break;
        }
        assert!(n < 20_000, "{n} documents took {took:.0?}, too short to outlast the timeout");
        // Enough for about 32 s at the pace this run had: the machine's, and its neighbours' at the time.
        n = (n as f64 * (32.0 / took.as_secs_f64()).max(1.3)) as usize;
    }
    let log = std::fs::read_to_string(&cluster.log).unwrap();
    assert!(!log.contains("heartbeat timed out") && !log.contains("Reset"), "the executor was taken for lost:\n{log}");
    let run = &inspect(dir, "there/docs.lance")["versions"][0]["run"];
    assert_eq!(run["executors"][0]["tasks"], 1, "{run}");
    drop(cluster);
}

/// `pipeline run --cluster url there.sql`, started.
fn running_there(dir: &Path, url: &str) -> Child {
    spawn(&["run", "--cluster", url, "there.sql"], dir)
}

/// What `client` printed, once it ended; bounded at 300 s, as a job that hangs is a failure of its own, not a
/// stalled test run (`hung` says which).
fn ended(mut client: Child, hung: &str) -> Output {
    let started = Instant::now();
    while client.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(300) {
            let _ = client.kill();
            panic!("{hung}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    client.wait_with_output().unwrap()
}

/// `pipeline run --cluster url there.sql`, once its tasks have begun writing their fragments.
fn writing_there(dir: &Path, url: &str) -> Child {
    let client = running_there(dir, url);
    let data = dir.join("there/docs.lance/data");
    let started = Instant::now();
    while std::fs::read_dir(&data).map_or(true, |d| d.count() == 0) {
        assert!(started.elapsed() < Duration::from_secs(120), "no task wrote a fragment within 120 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    client
}

#[test]
fn a_cluster_write_stopped_by_ctrl_c_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // The real model, so that the tasks are still embedding when the client is stopped.
    fortunes_in_parts(dir, 2000, 4);
    write_job_on(&model_dir(), dir, "there.sql", "there/docs.lance", "");
    let cluster = Cluster::start(dir, 2);
    let client = writing_there(dir, &cluster.url());
    let signalled = Command::new("kill").args(["-INT", &client.id().to_string()]).status().unwrap();
    assert!(signalled.success());
    let stopped = client.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&stopped.stderr);
    assert!(!stopped.status.success() && err.contains("stopped: nothing was committed"), "{err}");
    assert!(!dir.join("there/docs.lance/_versions").exists(), "a stopped job left a version");
    drop(cluster);
}

#[test]
fn a_cluster_write_inserts_tags_and_refuses_another_model_as_locally() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    embedded_here(dir);
    let cluster = Cluster::start(dir, 2);
    let url = cluster.url();

    // A quarter of the corpus, tagged; then INSERT INTO the Lance table, under another tag, adds only the rest in
    // one new version that the tag marks.
    write_job(dir, "quarter.sql", "there/docs.lance", "SET embed.tag = 'quarter';");
    let sql = std::fs::read_to_string(dir.join("quarter.sql"))
        .unwrap()
        .replace("LOCATION 'docs/'", "LOCATION 'docs/part-0.jsonl'");
    std::fs::write(dir.join("quarter.sql"), sql).unwrap();
    let o = pipeline(&["run", "--cluster", &url, "quarter.sql"], dir);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("wrote 500 rows"), "{out}{}", String::from_utf8_lossy(&o.stderr));
    let insert = format!(
        "SET embed.model = '{}';\nSET embed.tag = 'all';\n\
         CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs/';\n\
         CREATE EXTERNAL TABLE out STORED AS LANCE LOCATION 'there/docs.lance';\n\
         INSERT INTO out SELECT id, embed(text) AS embedding FROM docs;\n",
        tiny_model_dir().display()
    );
    std::fs::write(dir.join("insert.sql"), insert).unwrap();
    let o = pipeline(&["run", "--cluster", &url, "insert.sql"], dir);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("resuming: 500 of 2000 already done") && out.contains("wrote 1500 rows"), "{out}");
    let report = inspect(dir, "there/docs.lance");
    let versions = report["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{report}");
    assert_eq!((&versions[0]["tags"][0], &versions[1]["tags"][0]), (&"quarter".into(), &"all".into()), "{report}");
    assert_eq!(versions[1]["run"]["rows_written"], 1500, "{report}");
    crate::common::assert_same_vectors(
        &pipeline(&["compare", "here/docs.lance", "there/docs.lance", "--json"], dir),
        2000,
    );
    // A tag that marks an older version is refused, and nothing changes.
    let o = pipeline(&["run", "--cluster", &url, "quarter.sql"], dir);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("'quarter' already marks version 1"), "{err}");
    assert_eq!(inspect(dir, "there/docs.lance")["versions"].as_array().unwrap().len(), 2);

    // One file, which the scan cuts into byte ranges (a task each, as DataFusion splits a large file; here from
    // 1 KiB on): every id once, and the vectors of a local run.
    let all: String =
        (0..4).map(|i| std::fs::read_to_string(dir.join(format!("docs/part-{i}.jsonl"))).unwrap()).collect();
    std::fs::create_dir_all(dir.join("one")).unwrap();
    std::fs::write(dir.join("one/all.jsonl"), all).unwrap();
    let job = format!(
        "SET embed.model = '{}'; SET datafusion.optimizer.repartition_file_min_size = 1024;          CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'one/all.jsonl';          COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'ranges/docs.lance' STORED AS LANCE",
        tiny_model_dir().display()
    );
    let o = pipeline(&["run", "--cluster", &url, "-c", &job], dir);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("wrote 2000 rows"), "{out}{}", String::from_utf8_lossy(&o.stderr));
    crate::common::assert_same_vectors(
        &pipeline(&["compare", "here/docs.lance", "ranges/docs.lance", "--json"], dir),
        2000,
    );
    let run = &inspect(dir, "ranges/docs.lance")["versions"][0]["run"];
    let tasks: u64 = run["executors"].as_array().unwrap().iter().map(|s| s["tasks"].as_u64().unwrap()).sum();
    assert!(tasks >= 4, "the file was cut into ranges, a task each: {run}");

    // Executors whose model (at the job's relative embed.model, resolved in their own working directory) has
    // another tokenizer file refuse to embed, naming it, and the job commits nothing.
    for (home, edit) in [(dir.to_path_buf(), false), (dir.join("hosts"), true)] {
        let m = home.join("m");
        crate::model::copy_configs(&tiny_model_dir(), &m);
        std::fs::create_dir_all(m.join("onnx")).unwrap();
        std::os::unix::fs::symlink(tiny_model_dir().join("onnx/model.onnx"), m.join("onnx/model.onnx")).unwrap();
        if edit {
            // The same tokenizer, written out with one more line end: another file.
            let text = std::fs::read_to_string(m.join("tokenizer.json")).unwrap();
            std::fs::write(m.join("tokenizer.json"), text + "\n").unwrap();
        }
    }
    let job = "SET embed.model = 'm'; CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs/'; \
               COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'other/docs.lance' STORED AS LANCE";
    let o = pipeline(&["run", "--cluster", &url, "-c", job], dir);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("makes other vectors") && err.contains("tokenizer_sha256"), "{err}");
    assert!(err.contains("nothing was committed"), "{err}");
    assert!(!dir.join("other/docs.lance/_versions").exists(), "a refused job left a version");
    drop(cluster);
}

#[test]
fn a_cluster_with_keys_takes_only_clients_and_executors_with_the_same_keys() {
    let dir = tempfile::tempdir().unwrap();
    fortunes_in_parts(dir.path(), 200, 2);
    let keys = dir.path().join("keys");
    let made = pipeline(&["cluster-keys", keys.to_str().unwrap()], dir.path());
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let other = dir.path().join("other-keys");
    assert!(pipeline(&["cluster-keys", other.to_str().unwrap()], dir.path()).status.success());

    let cluster = Cluster::keyed(dir.path(), &keys);
    let url = cluster.url();
    // With the keys: the same vectors as here, fetched from both executors, and a join whose shuffle one
    // executor reads from the other.
    let query = vectors_of_docs();
    let args = ["run", "-q", "--format", "ndjson", "--maxrows", "inf", "-c", &query];
    let here = vectors_by_id(&pipeline(&args, dir.path()));
    let keyed = ["--cluster", &url, "--cluster-keys", keys.to_str().unwrap()];
    let there = vectors_by_id(&pipeline(&[&args[..], &keyed].concat(), dir.path()));
    assert_eq!(there.len(), 200);
    assert_same_vectors(&here, &there);
    let join = "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs/'; \
                SELECT count(*) AS n FROM docs a JOIN docs b ON a.id = b.id";
    let joined = pipeline(&[&["run", "-q", "--format", "csv", "-c", join][..], &keyed].concat(), dir.path());
    assert_eq!(String::from_utf8_lossy(&joined.stdout), "n\n200\n", "{}", String::from_utf8_lossy(&joined.stderr));

    // Without keys, or with another cluster's: refused before any statement, saying what to give.
    let o = pipeline(&["run", "--cluster", &url, "-c", "SELECT 1"], dir.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("without the cluster's keys") && err.contains("--cluster-keys"),
        "{err}"
    );
    let o =
        pipeline(&["run", "--cluster", &url, "--cluster-keys", other.to_str().unwrap(), "-c", "SELECT 1"], dir.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("other keys") && err.contains("other-keys"), "{err}");
    // An executor without them does not join.
    let o = pipeline(
        &[
            "executor",
            "--scheduler",
            &format!("127.0.0.1:{}", cluster.scheduler_port),
            "--bind",
            &format!("127.0.0.1:{}", free_port()),
        ],
        dir.path(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("without the cluster's keys"), "{err}");

    // An executor's results port: no answer in plain gRPC, nor over TLS without the keys' certificate; an
    // answer (this is no scheduler) with them.
    let executor = format!("df://127.0.0.1:{}", cluster.executor_ports[0]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let loaded = ClusterKeys::load(&keys).unwrap();
    runtime.block_on(async {
        let e = check_keys_match(&executor, None).await.unwrap_err().to_string();
        assert!(e.contains("without the cluster's keys"), "{e}");
        let authority = tonic::transport::Certificate::from_pem(std::fs::read(keys.join("ca.pem")).unwrap());
        let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(authority).domain_name(SERVER_NAME);
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{}", cluster.executor_ports[0]))
                .unwrap()
                .tls_config(tls)
                .unwrap();
        // Refused in the handshake, or (TLS 1.3 checks a client's certificate after the client has finished) at
        // its first request: a status made here from the broken connection, which carries its cause, never an
        // answer from the server (this port's service would say Unimplemented).
        if let Ok(channel) = endpoint.connect().await {
            let asked =
                SchedulerGrpcClient::new(channel).get_job_status(GetJobStatusParams { job_id: String::new() }).await;
            let status = asked.expect_err("a client without the cluster's certificate was answered");
            assert!(
                std::error::Error::source(&status).is_some() && status.code() != tonic::Code::Unimplemented,
                "a client without the cluster's certificate was answered: {status:?}"
            );
        }
        check_keys_match(&executor, Some(&loaded)).await.unwrap();
    });
    drop(cluster);
}

#[test]
fn without_keys_nothing_listens_where_other_hosts_reach_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    for args in [
        vec!["scheduler".to_string(), "--bind".into(), format!("0.0.0.0:{port}")],
        vec![
            "executor".into(),
            "--scheduler".into(),
            format!("127.0.0.1:{port}"),
            "--bind".into(),
            format!("0.0.0.0:{port}"),
        ],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = pipeline(&args, dir.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("will not listen on 0.0.0.0") && err.contains("pipeline cluster-keys"),
            "{err}"
        );
    }
}
