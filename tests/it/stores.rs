//! Object stores: a corpus read from and a Lance dataset written to an S3-compatible server (moto's, from
//! the tests' Python tools, started on 127.0.0.1 by the test and stopped by it), with a ctrl-C and a resume
//! there, compared with a local run, and read back with pylance as a user would.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{command, model_dir, python, test_python};

/// moto's S3 server on a free port of 127.0.0.1, killed when dropped.
pub struct S3Server {
    child: Child,
    endpoint: String,
}

impl S3Server {
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(test_python())
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Self { child, endpoint: format!("http://127.0.0.1:{port}") };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(60), "moto's server did not listen within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// The environment a user sets for an S3-compatible server: the same variables serve the pipeline,
    /// boto3 and pylance.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ENDPOINT", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pipeline(args: &[&str], dir: &Path, env: &[(&str, String)]) -> Output {
    command(args, dir).envs(env.iter().cloned()).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn inspect(dir: &Path, out: &str, env: &[(&str, String)]) -> Option<Value> {
    let o = pipeline(&["inspect", out, "--json"], dir, env);
    o.status.success().then(|| serde_json::from_slice(&o.stdout).unwrap())
}

const MAKE_BUCKETS: &str = r#"
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT"])
for bucket in ("corpus", "vectors"):
    s3.create_bucket(Bucket=bucket)
s3.upload_file(sys.argv[1], "corpus", "docs.jsonl")
"#;

/// What pylance reads back: rows, distinct ids, the dimension and the fingerprint's model dtype.
const READ_BACK: &str = r#"
import json, os, sys, lance
ds = lance.dataset(sys.argv[1], storage_options={
    "aws_endpoint": os.environ["AWS_ENDPOINT"], "aws_allow_http": "true", "aws_region": "us-east-1",
    "aws_access_key_id": "testing", "aws_secret_access_key": "testing"})
t = ds.to_table(columns=["id", "embedding"])
fp = json.loads(ds.schema.metadata[b"embedding_pipeline.fingerprint"])
print(json.dumps({"rows": t.num_rows, "ids": len(set(t.column("id").to_pylist())),
                  "dim": len(t.column("embedding")[0]), "versions": len(ds.versions()), "fingerprint": fp}))
"#;

#[test]
fn a_corpus_in_a_bucket_embeds_into_a_bucket_survives_ctrl_c_resumes_and_reads_back_in_pylance() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let server = S3Server::start();
    let env = server.env();
    let lines: Vec<String> = (0..3000)
        .map(|i| serde_json::json!({"id": format!("doc-{i:05}"), "text": format!("Document {i} is about topic {} and colour {}.", i % 17, i % 5)}).to_string())
        .collect();
    std::fs::write(d.join("docs.jsonl"), lines.join("\n") + "\n").unwrap();
    python(MAKE_BUCKETS, &[&d.join("docs.jsonl").display().to_string()], &env);

    let job = |source: &str, out: &str| {
        format!(
            "SET embed.model = '{}';\nSET embed.commit_rows = 100;\n\
             CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{source}';\n\
             COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{out}' STORED AS LANCE;\n",
            model_dir().display()
        )
    };
    let out = "s3://vectors/docs.lance";
    std::fs::write(d.join("s3.sql"), job("s3://corpus/docs.jsonl", out)).unwrap();
    std::fs::write(d.join("local.sql"), job("docs.jsonl", "clean.lance")).unwrap();

    // Ctrl-C once the first commit is in the bucket.
    let mut child = command(&["run", "s3.sql"], d)
        .envs(env.iter().cloned())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let committed = loop {
        if let Some(rows) = inspect(d, out, &env).and_then(|j| j["rows"].as_u64()).filter(|&r| r > 0) {
            break rows;
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its first commit");
        assert!(start.elapsed() < Duration::from_secs(180), "no commit in the bucket within 180 s");
        std::thread::sleep(Duration::from_millis(200));
    };
    // A second run on this machine is refused while the first writes: the lock lives in the install home.
    let second = pipeline(&["run", "s3.sql"], d, &env);
    assert!(!second.status.success(), "a second run wrote beside the first");
    assert!(
        stderr(&second).contains("another pipeline run is writing to s3://vectors/docs.lance"),
        "{}",
        stderr(&second)
    );
    let sent = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "the run finished before ctrl-C; the corpus is too small: {err}");
    assert!(err.contains("interrupted") && err.contains("run the same job again to resume"), "{err}");
    let partial = inspect(d, out, &env).unwrap()["rows"].as_u64().unwrap();
    assert!(partial >= committed && partial < 3000, "{partial} rows after ctrl-C, {committed} before");

    let o = pipeline(&["run", "s3.sql"], d, &env);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains(&format!("resuming: {partial} of 3000 already done")), "{stdout}");
    let j = inspect(d, out, &env).unwrap();
    assert_eq!((j["rows"].as_u64(), j["ids"]["unique"].as_bool()), (Some(3000), Some(true)), "{j}");

    // The same vectors as a run on local files.
    let o = pipeline(&["run", "local.sql"], d, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = pipeline(&["compare", "clean.lance", out, "--json"], d, &env);
    crate::common::assert_same_vectors(&o, 3000);

    // Plans live beside local outputs only: said, not written as a local `s3:` folder.
    let o = pipeline(&["plan", "s3.sql"], d, &env);
    assert!(!o.status.success() && stderr(&o).contains("plans are kept beside a local output"), "{}", stderr(&o));
    assert!(!d.join("s3:").exists());

    // pylance reads the bucket's dataset, fingerprint included.
    let read: Value = serde_json::from_str(&python(READ_BACK, &[out], &env)).unwrap();
    assert_eq!(
        (read["rows"].as_u64(), read["ids"].as_u64(), read["dim"].as_u64()),
        (Some(3000), Some(3000), Some(384))
    );
    assert!(read["versions"].as_u64().unwrap() >= 2, "{read}");
    assert!(read["fingerprint"]["model_sha256"].as_str().is_some_and(|s| s.len() == 64), "{read}");
}

#[test]
fn a_bucket_that_does_not_exist_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let server = S3Server::start();
    let sql = format!(
        "SET embed.model = '{}';\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 's3://nosuchbucket/docs.jsonl';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out.lance' STORED AS LANCE;\n",
        model_dir().display()
    );
    std::fs::write(d.join("job.sql"), sql).unwrap();
    let o = pipeline(&["run", "job.sql"], d, &server.env());
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("s3://nosuchbucket/docs.jsonl")
            && err.contains("S3: NoSuchBucket: The specified bucket does not exist"),
        "{err}"
    );
    assert!(!err.contains("<Error>"), "{err}");
    assert!(!err.contains(".cargo/registry") && !err.contains("panicked"), "{err}");
    assert!(!d.join("out.lance").exists(), "nothing may be written");
}
