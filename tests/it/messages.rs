//! Issue 18: every bad input named where it can first be known, in the job file's own terms.

use crate::cli::{job, pipeline, text};

#[test]
fn a_syntax_error_late_in_the_job_stops_it_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let file = job(
        tmp.path(),
        "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';
COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out/docs.lance' STORED AS LANCE;
SELECT E'a\\'b;c' AS s;
/* a /* nested; */ comment; */
  SELEC count(*) FROM docs;",
    );
    let o = pipeline(&["run", &file], tmp.path());
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}");
    // The job's first line is the SET the helper adds, so SELEC is on line 6, column 3.
    assert!(err.contains("statement 5 (line 6) does not parse, so nothing was run"), "{err}");
    assert!(err.contains("Line: 6, Column: 3"), "{err}");
    assert!(!tmp.path().join("out/docs.lance").exists(), "the COPY before the typo ran");
}

mod options {
    use crate::common::{session, sql, vectors};

    async fn set_error(statement: &str) -> String {
        sql(&session(), statement).await.unwrap_err().to_string()
    }

    #[tokio::test]
    async fn bad_values_are_refused_at_the_set_naming_the_key() {
        for (statement, named) in [
            ("SET embed.batch_tokens = -5", "embed.batch_tokens = '-5': use a whole number"),
            ("SET embed.batch_tokens = 0", "embed.batch_tokens = '0': must be at least 1"),
            ("SET embed.commit_rows = 0", "embed.commit_rows = '0'"),
            ("SET embed.commit_seconds = 0", "embed.commit_seconds = '0'"),
            ("SET embed.max_tokens = 1", "embed.max_tokens = '1'"),
            ("SET embed.device = 'tpu'", "embed.device = 'tpu': use 'cpu', 'cuda'"),
            ("SET embed.normalize = 'sometimes'", "embed.normalize = 'sometimes'"),
            ("SET embed.restart = 'perhaps'", "embed.restart = 'perhaps': use 'true' or 'false'"),
            ("SET embed.order = 'random'", "embed.order = 'random'"),
            ("SET embed.sessions_per_device = 99", "embed.sessions_per_device = '99'"),
        ] {
            // Only the SET runs: nothing embeds, so the refusal can only come from the SET itself.
            let err = set_error(statement).await;
            assert!(err.contains(named), "{statement}: {err}");
        }
    }

    #[tokio::test]
    async fn a_misspelt_key_lists_the_valid_ones() {
        let err = set_error("SET embed.modle = 'x'").await;
        assert!(err.contains("unknown option embed.modle"), "{err}");
        assert!(err.contains("Did you mean embed.model?") && err.contains("batch_tokens, max_batch_rows"), "{err}");
    }

    #[tokio::test]
    async fn on_and_off_are_booleans_everywhere() {
        let s = session();
        let on = sql(&s, "SET embed.normalize = 'ON'; SELECT embed('a short text') AS v").await.unwrap();
        let off = sql(&s, "SET embed.normalize = 'off'; SELECT embed('a short text') AS v").await.unwrap();
        let norm = |b| vectors(b, "v")[0].clone().unwrap().iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm(&on) - 1.0).abs() < 1e-5);
        assert!((norm(&off) - 1.0).abs() > 1e-3, "'off' still normalised: {}", norm(&off));
        sql(&s, "SET embed.allow_cpu_fallback = 'yes'").await.unwrap();
    }
}

#[test]
fn a_bad_device_flag_is_refused_before_the_job_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let file = job(tmp.path(), "SELECT 1;");
    let o = pipeline(&["run", "--device", "tpu", &file], tmp.path());
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(err.contains("embed.device = 'tpu'"), "{err}");
}

#[test]
fn library_internals_stay_out_of_the_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let o = pipeline(&["inspect", "out/nonexistent.lance"], tmp.path());
    let (_, err) = text(&o);
    assert!(!o.status.success());
    // The dataset is named as the user typed it, and Lance's path without its leading '/' is gone.
    assert!(err.contains("out/nonexistent.lance: not found (the path does not exist"), "{err}");
    let stripped = tmp.path().join("out/nonexistent.lance").display().to_string()[1..].to_string();
    assert!(!err.contains(&format!(" {stripped}")), "{err}");
    assert!(!err.contains(".cargo") && !err.contains("commit.rs"), "{err}");

    let file = job(tmp.path(), "CREATE EXTERNAL TABLE d STORED AS JSON LOCATION 's3://bucket/x.jsonl';");
    let (_, err) = text(&pipeline(&["run", &file], tmp.path()));
    assert!(err.contains("s3://bucket/x.jsonl: this version reads local files only"), "{err}");
    assert!(!err.contains("bug in DataFusion") && !err.contains("External error"), "{err}");
}

#[test]
fn outputs_that_cannot_be_written_are_refused_before_touching_the_disk() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("afile"), "x").unwrap();
    for (output, says) in [
        ("gs://b/e.lance", "gs:// outputs are not supported by this version"),
        ("afile/e.lance", "afile is a file, so nothing can be written under it"),
        ("afile/deeper/e.lance", "afile is a file, so nothing can be written under it"),
    ] {
        let file = job(
            tmp.path(),
            &format!("COPY (SELECT 'a' AS id, embed('x') AS embedding) TO '{output}' STORED AS LANCE;"),
        );
        let o = pipeline(&["run", &file], tmp.path());
        let (_, err) = text(&o);
        assert!(!o.status.success());
        assert!(err.contains(says), "{output}: {err}");
        assert!(!err.contains(".cargo/registry"), "{err}");
    }
    assert!(!tmp.path().join("gs:").exists(), "a gs:// output made a local directory");
}
