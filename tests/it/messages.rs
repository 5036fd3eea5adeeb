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
