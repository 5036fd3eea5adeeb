//! `pipeline verify` and `pipeline report`: a clean campaign passes; each fault planted around the pipeline
//! with pylance (an id removed, an id twice, a NaN vector, another model's vectors) is found and named; what
//! cannot be checked exits 2; and the report opens in a real headless Chromium, which renders its histogram
//! and timeline.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::{assert_text, docs_job, pipeline, python, refusal, text};

/// The first `n` fortunes as `docs.jsonl`, and the job that embeds them into `out/docs.lance`, run.
fn campaign(dir: &Path, n: usize) {
    let lines = crate::common::fortunes(n);
    std::fs::write(dir.join("docs.jsonl"), lines.join("\n") + "\n").unwrap();
    docs_job(dir, "job.sql", "");
    for args in [&["plan", "job.sql"][..], &["run", "job.sql"]] {
        let o = pipeline(args, dir);
        assert!(o.status.success(), "{args:?}: {}", text(&o).1);
    }
}

fn verify(dir: &Path, dataset: &str, extra: &[&str]) -> (Output, Value) {
    let mut args = vec!["verify", dataset, "--json"];
    args.extend_from_slice(extra);
    let o = pipeline(&args, dir);
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o, v)
}

fn findings(v: &Value) -> String {
    v["findings"]
        .as_array()
        .map(|f| f.iter().map(|x| x.as_str().unwrap_or_default()).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

/// A copy of the clean dataset, changed by a pylance script (argv[1] is its path), and verified.
fn planted(dir: &Path, name: &str, script: &str) -> (Output, Value) {
    let copy = dir.join(format!("{name}.lance"));
    let o = Command::new("cp").arg("-r").arg(dir.join("out/docs.lance")).arg(&copy).output().unwrap();
    assert!(o.status.success());
    python(script, &[copy.to_str().unwrap()], &[]);
    verify(dir, copy.to_str().unwrap(), &["--job", "job.sql"])
}

const HEADER: &str = "import sys, lance, pyarrow as pa, pyarrow.compute as pc\nds = lance.dataset(sys.argv[1])\n";

#[test]
fn verify_passes_a_clean_campaign_and_names_each_planted_fault() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    campaign(dir, 300);

    let (o, v) = verify(dir, "out/docs.lance", &["--job", "job.sql"]);
    assert!(o.status.success(), "{}\n{v}", text(&o).1);
    assert_eq!(v["verdict"], "sound", "{v}");
    assert_eq!((v["rows"].as_u64(), v["ids"]["distinct"].as_u64()), (Some(300), Some(300)));
    assert_eq!((v["ids"]["missing"].as_u64(), v["ids"]["extra"].as_u64()), (Some(0), Some(0)), "{v}");
    // 300 rows, a sample of 1,000 asked: every row is embedded again, in strata of token length.
    let s = &v["sample"];
    assert_eq!(s["rows"].as_u64(), Some(300), "{s}");
    assert!(s["min_cosine"].as_f64().unwrap() >= 0.9999, "{s}");
    assert!(s["same_device"].as_bool().unwrap(), "{s}");
    let strata: Vec<&Value> = s["strata"].as_array().unwrap().iter().filter(|k| k["rows"].as_u64() > Some(0)).collect();
    assert!(strata.len() >= 3, "{s}");
    assert!(v["lineage"].as_array().unwrap().iter().any(|c| c["link"] == "model directory" && c["status"] == "ok"));
    let saved: Value = serde_json::from_slice(&std::fs::read(dir.join("out/docs.lance.verify.json")).unwrap()).unwrap();
    assert_eq!((saved[0]["verdict"].as_str(), saved[0]["version"].as_u64()), (Some("sound"), v["version"].as_u64()));

    // Without the job: the dataset's own checks, and a note on what was not checked.
    let (o, v) = verify(dir, "out/docs.lance", &[]);
    assert!(o.status.success(), "{v}");
    assert!(v["sample"].is_null() && v["notes"].to_string().contains("--job"), "{v}");
    let o = pipeline(&["verify", "out/docs.lance", "--job", "job.sql", "--sample", "40"], dir);
    let (out, _) = text(&o);
    assert!(o.status.success() && out.contains("SOUND") && out.contains("min cosine"), "{out}");

    // An id removed.
    let (o, v) = planted(
        dir,
        "removed",
        &format!(
            "{HEADER}first = ds.to_table(columns=['id']).column('id')[0].as_py()\nds.delete(f\"id = '{{first}}'\")\n"
        ),
    );
    assert_eq!(o.status.code(), Some(1), "{v}");
    assert_eq!(v["ids"]["missing"].as_u64(), Some(1), "{v}");
    let f = findings(&v);
    assert!(f.contains("1 ids of the corpus are missing (e.g. ") && f.contains("(Delete, "), "{f}");

    // An id renamed: one of the corpus missing, one the corpus lacks. Counted the same whether the corpus is read for
    // a sample (which counts its rows) or not (a count of its own).
    let script = format!(
        "{HEADER}row = ds.to_table(limit=1)\nfirst = row.column('id')[0].as_py()\nds.delete(f\"id = '{{first}}'\")\n\
         i = row.schema.get_field_index('id')\nrow = row.set_column(i, 'id', pa.array(['not-in-corpus']))\n\
         lance.write_dataset(row, sys.argv[1], mode='append')\n"
    );
    let (o, v) = planted(dir, "renamed", &script);
    assert_eq!(o.status.code(), Some(1), "{v}");
    let ids = &v["ids"];
    assert_eq!(
        (ids["missing"].as_u64(), ids["extra"].as_u64(), ids["source_rows"].as_u64()),
        (Some(1), Some(1), Some(300)),
        "{v}"
    );
    assert_eq!(ids["extra_examples"], serde_json::json!(["not-in-corpus"]), "{v}");
    let (_, unsampled) =
        verify(dir, dir.join("renamed.lance").to_str().unwrap(), &["--job", "job.sql", "--sample", "0"]);
    assert_eq!(unsampled["ids"], v["ids"], "{unsampled}");

    // An id twice: one row appended again.
    let (o, v) = planted(
        dir,
        "twice",
        &format!(
            "{HEADER}row = ds.to_table(limit=1)\nlance.write_dataset(row, sys.argv[1], mode='append')\nprint(row.column('id')[0])\n"
        ),
    );
    assert_eq!(o.status.code(), Some(1), "{v}");
    assert_eq!(v["ids"]["duplicated"].as_u64(), Some(1), "{v}");
    assert!(findings(&v).contains("1 ids are held more than once"), "{v}");
    assert!(findings(&v).contains("(Append,"), "{v}");

    // A NaN vector: a row replaced by one whose first value is NaN.
    let nan = format!(
        "{HEADER}row = ds.to_table(limit=1)\nid = row.column('id')[0].as_py()\n\
         vec = row.column('embedding')[0].values.to_pylist()\nvec[0] = float('nan')\n\
         arr = pa.FixedSizeListArray.from_arrays(pa.array(vec, pa.float32()), len(vec))\n\
         row = row.set_column(row.schema.get_field_index('embedding'), row.schema.field('embedding'), arr)\n\
         ds.delete(f\"id = '{{id}}'\")\nlance.write_dataset(row, sys.argv[1], mode='append')\nprint(id)\n"
    );
    let (o, v) = planted(dir, "nan", &nan);
    assert_eq!(o.status.code(), Some(1), "{v}");
    assert_eq!(v["vectors"]["non_finite"].as_u64(), Some(1), "{v}");
    assert!(findings(&v).contains("1 vectors hold NaN or infinite values (e.g. id "), "{v}");

    // Another model's vectors (the float32 export, where the campaign ran the int8 default) for 20 rows,
    // written around the sink under the dataset's own schema and fingerprint.
    let fp32 = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2-fp32");
    let lines: Vec<String> =
        std::fs::read_to_string(dir.join("docs.jsonl")).unwrap().lines().take(20).map(String::from).collect();
    std::fs::write(dir.join("twenty.jsonl"), lines.join("\n") + "\n").unwrap();
    let o = pipeline(&["embed", "--model", fp32.to_str().unwrap(), "--file", "twenty.jsonl"], dir);
    assert!(o.status.success(), "{}", text(&o).1);
    std::fs::write(dir.join("twenty.vectors"), &o.stdout).unwrap();
    let other = format!(
        "{HEADER}import json\nrows = [json.loads(l) for l in open('twenty.jsonl')]\n\
         vecs = [json.loads(l)['vector'] for l in open('twenty.vectors')]\n\
         ids = [r['id'] for r in rows]\n\
         arr = pa.FixedSizeListArray.from_arrays(pa.array([x for v in vecs for x in v], pa.float32()), len(vecs[0]))\n\
         t = pa.table({{'id': pa.array(ids, pa.string()), 'embedding': arr}}).cast(ds.schema)\n\
         ds.delete('id IN (' + ','.join(repr(i) for i in ids) + ')')\n\
         lance.write_dataset(t, sys.argv[1], mode='append')\n"
    );
    let copy = dir.join("other.lance");
    assert!(Command::new("cp").arg("-r").arg(dir.join("out/docs.lance")).arg(&copy).status().unwrap().success());
    let o =
        Command::new(super::common::test_python()).arg("-c").arg(&other).arg(&copy).current_dir(dir).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (o, v) = verify(dir, copy.to_str().unwrap(), &["--job", "job.sql"]);
    assert_eq!(o.status.code(), Some(1), "{v}");
    assert_eq!(v["sample"]["below"].as_u64(), Some(20), "{v}");
    assert!(findings(&v).contains("20 of 300 sampled vectors differ from their re-embedding"), "{v}");
    let (_, err) = text(&o);
    assert!(err.contains("is not sound"), "{err}");
}

#[test]
fn verify_exits_2_when_it_cannot_check() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    campaign(dir, 20);
    // The model directory named is not there: the sample cannot be embedded again.
    let (o, v) = verify(dir, "out/docs.lance", &["--job", "job.sql", "--model", "no/such/model"]);
    assert_eq!(o.status.code(), Some(2), "{v}");
    assert_eq!(v["verdict"], "cannot check", "{v}");
    assert!(v["cannot_check"].to_string().contains("no/such/model is gone"), "{v}");
    // The model directory the run recorded is gone: its lineage link cannot be checked, nor the sample made.
    let model = dir.join("model-copy");
    assert!(Command::new("cp").arg("-r").arg(super::common::model_dir()).arg(&model).status().unwrap().success());
    let sql = std::fs::read_to_string(dir.join("job.sql")).unwrap();
    let sql = sql.replace(&super::common::model_dir().display().to_string(), &model.display().to_string());
    std::fs::write(dir.join("copy.sql"), sql.replace("out/docs.lance", "out/copy.lance")).unwrap();
    let o = pipeline(&["run", "copy.sql"], dir);
    assert!(o.status.success(), "{}", text(&o).1);
    std::fs::remove_dir_all(&model).unwrap();
    let (o, v) = verify(dir, "out/copy.lance", &[]);
    assert_eq!(o.status.code(), Some(2), "{v}");
    assert!(v["findings"].as_array().unwrap().is_empty(), "{v}");
    assert!(v["cannot_check"].to_string().contains("model-copy is gone"), "{v}");
    // With the job, which cannot be planned without its model: the job's own error, naming the directory.
    let args = ["verify", "out/copy.lance", "--job", "copy.sql"];
    let o = pipeline(&args, dir);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
    let mut said = refusal(&args, &o);
    // A dataset not written by embed(): nothing to check its vectors against.
    python(
        "import sys, lance, pyarrow as pa\nlance.write_dataset(pa.table({'id': ['a'], 'embedding': pa.FixedSizeListArray.from_arrays(pa.array([1.0, 0.0], pa.float32()), 2)}), sys.argv[1])",
        &[dir.join("plain.lance").to_str().unwrap()],
        &[],
    );
    for args in [["verify", "plain.lance"], ["verify", "no-such.lance"]] {
        let o = pipeline(&args, dir);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
        said += &refusal(&args, &o);
    }
    // Each exits 2 (cannot check), not 1 (a fault found), naming what is missing.
    assert_text("what_verify_cannot_check", dir, &said);
}

#[test]
fn verify_reads_the_write_into_the_dataset_whatever_its_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    campaign(dir, 20);
    // The same fortunes under another key and text column.
    let rows: Vec<String> = std::fs::read_to_string(dir.join("docs.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            serde_json::json!({"key": v["id"], "body": v["text"]}).to_string()
        })
        .collect();
    std::fs::write(dir.join("docs2.jsonl"), rows.join("\n") + "\n").unwrap();
    // Three writes: the plain one, a computed id in the original order, and a UNION ALL of both.
    let sql = format!(
        "SET embed.model = '{}';\nSET embed.order = 'original';\n\
         CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
         CREATE EXTERNAL TABLE docs2 STORED AS JSON LOCATION 'docs2.jsonl';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out/a.lance' STORED AS LANCE;\n\
         COPY (SELECT 'k-' || key AS id, embed(body) AS embedding FROM docs2) TO 'out/b.lance' STORED AS LANCE;\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs UNION ALL SELECT 'k-' || key AS id, embed(body) AS embedding \
         FROM docs2) TO 'out/c.lance' STORED AS LANCE;\n",
        super::common::model_dir().display()
    );
    std::fs::write(dir.join("three.sql"), sql).unwrap();
    let o = pipeline(&["run", "three.sql"], dir);
    assert!(o.status.success(), "{}", text(&o).1);
    // The second write's corpus and texts, not the first's: every id there, every row embedded again.
    let (o, v) = verify(dir, "out/b.lance", &["--job", "three.sql"]);
    assert!(o.status.success(), "{v}");
    assert_eq!((v["ids"]["missing"].as_u64(), v["ids"]["extra"].as_u64()), (Some(0), Some(0)), "{v}");
    assert_eq!(v["sample"]["rows"].as_u64(), Some(20), "{v}");
    assert!(v["notes"].as_array().unwrap().iter().all(|n| !n.to_string().contains("does not write")), "{v}");
    // A union: its ids are checked, its texts cannot be read beside them, which is said (exit 2).
    let (o, v) = verify(dir, "out/c.lance", &["--job", "three.sql"]);
    assert_eq!(o.status.code(), Some(2), "{v}");
    assert_eq!((v["ids"]["missing"].as_u64(), v["ids"]["extra"].as_u64()), (Some(0), Some(0)), "{v}");
    assert!(v["cannot_check"].to_string().contains("not one SELECT with embed()"), "{v}");
    let (o, v) = verify(dir, "out/c.lance", &["--job", "three.sql", "--sample", "0"]);
    assert!(o.status.success(), "{v}");
    // The job's write into another dataset is used, and said to be.
    let (o, v) = verify(dir, "out/a.lance", &["--job", "job.sql"]);
    assert!(o.status.success(), "{v}");
    let (_, v) = verify(dir, "out/docs.lance", &["--job", "three.sql", "--sample", "0"]);
    assert!(v["notes"].to_string().contains("the job does not write this dataset"), "{v}");
}

/// Ctrl-C and SIGTERM stop a verify (exit 130) with nothing saved; the results of several versions are kept
/// side by side, an old version's check not hiding the newest's; a dataset read through a link, with a
/// trailing slash, keeps its results beside the dataset itself, where the report on its real path finds them.
#[test]
fn verify_stops_when_asked_and_keeps_each_versions_result_beside_the_real_dataset() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let lines = crate::common::fortunes(120);
    docs_job(dir, "job.sql", "");
    // Two versions: 60 rows, then the corpus grown to 120 and the job run again.
    for n in [60, 120] {
        std::fs::write(dir.join("docs.jsonl"), lines[..n].join("\n") + "\n").unwrap();
        let o = pipeline(&["run", "job.sql"], dir);
        assert!(o.status.success(), "{}", text(&o).1);
    }
    let saved = dir.join("out/docs.lance.verify.json");

    // Stopped once it has begun (it says its first stage after it watches for signals): exit 130, nothing saved.
    for signal in ["-INT", "-TERM"] {
        let mut child = crate::common::command(&["verify", "out/docs.lance", "--job", "job.sql"], dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut said = String::new();
        while !said.contains("verify: reading the corpus") {
            assert!(stderr.read_line(&mut said).unwrap() > 0, "{signal}: it never began: {said}");
        }
        assert!(Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap().success());
        let status = child.wait().unwrap();
        std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
        assert_eq!(status.code(), Some(130), "{signal}: {said}");
        assert!(said.contains("verify stopped before its end, as asked; no result was saved"), "{signal}: {said}");
        assert!(!saved.exists(), "{signal}: a stopped verify saved a result");
    }

    // The newest version, then an older one: both kept, the newest's still there.
    let (o, newest) = verify(dir, "out/docs.lance", &["--job", "job.sql", "--sample", "10"]);
    assert!(o.status.success(), "{newest}");
    let latest = newest["version"].as_u64().unwrap();
    let older = format!("out/docs.lance@{}", latest - 1);
    let (o, v) = verify(dir, &older, &[]);
    assert!(o.status.success(), "{v}");
    assert_eq!((v["version"].as_u64(), v["rows"].as_u64()), (Some(latest - 1), Some(60)), "{v}");
    let kept: Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    let versions: Vec<u64> = kept.as_array().unwrap().iter().map(|r| r["version"].as_u64().unwrap()).collect();
    assert_eq!(versions, [latest - 1, latest], "{kept}");
    assert_eq!(kept[1]["sample"]["rows"].as_u64(), Some(10), "the newest check kept whole: {kept}");
    // Each version's page shows its own result.
    for (at, shows) in [("out/docs.lance".to_string(), latest), (older.clone(), latest - 1)] {
        let o = pipeline(&["report", &at, "-o", "page.html"], dir);
        assert!(o.status.success(), "{}", text(&o).1);
        let page = std::fs::read_to_string(dir.join("page.html")).unwrap();
        assert!(page.contains(&format!("SOUND</span> at version {shows},")), "{at}: {page}");
    }

    // Through a link, with a trailing slash: the result goes beside the dataset itself, named without the slash,
    // and a check again of the same version replaces its result.
    std::os::unix::fs::symlink(dir.join("out/docs.lance"), dir.join("link.lance")).unwrap();
    let (o, v) = verify(dir, "link.lance/", &["--sample", "0"]);
    assert!(o.status.success(), "{v}");
    assert!(!v["dataset"].as_str().unwrap().ends_with('/'), "{v}");
    assert!(!dir.join("link.lance.verify.json").exists());
    let kept: Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    assert_eq!(kept.as_array().unwrap().len(), 2, "{kept}");
    assert_eq!((kept[1]["version"].as_u64(), kept[1]["checked_at"].clone()), (Some(latest), v["checked_at"].clone()));
}

fn chromium() -> PathBuf {
    let path = PathBuf::from("/usr/bin/chromium");
    assert!(path.is_file(), "the report's test needs Debian's chromium: run scripts/setup --test-tools");
    path
}

/// Chromium headless, with a fresh profile and nothing reaching out to the network.
fn headless(dir: &Path, args: &[&str]) -> Output {
    let profile = tempfile::tempdir().unwrap();
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

#[test]
fn the_report_renders_in_a_headless_browser() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    campaign(dir, 200);
    let o = pipeline(&["verify", "out/docs.lance", "--job", "job.sql", "--sample", "60"], dir);
    assert!(o.status.success(), "{}", text(&o).0);
    let o = pipeline(
        &["trial", "job.sql", "--no-probe", "--sample", "30", "--name", "cpu-2t", "--save", "trial.json"],
        dir,
    );
    assert!(o.status.success(), "{}", text(&o).1);
    let prices = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/prices.toml");
    let o = pipeline(
        &[
            "report",
            "out/docs.lance",
            "-o",
            "report.html",
            "--trial",
            "trial.json",
            "--prices",
            prices.to_str().unwrap(),
        ],
        dir,
    );
    assert!(o.status.success(), "{}", text(&o).1);
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    // Issue 53: the trial's small cost and hours keep their digits (they printed as 0.00).
    assert!(!html.contains(">0.00<") && !html.contains(">0.00 ("), "a trial's figures print as 0.00: {html}");
    // Self-contained: no script, and nothing loaded from elsewhere (SVG's namespace URI is a name, not a fetch).
    for fetch in ["<script", "<link", "src=", "href=", "url(", "@import"] {
        assert!(!html.contains(fetch), "the page holds {fetch:?}: it is not self-contained");
    }

    // The DOM Chromium builds from the page: every section, the charts as SVG.
    let url = format!("file://{}", dir.join("report.html").display());
    let o = headless(dir, &["--dump-dom", &url]);
    let dom = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for expected in [
        "Embedding campaign",
        "Fingerprint",
        "past the 256-token limit",
        "Rows written per commit",
        "Useful tokens per second, per commit",
        "Padding efficiency per commit",
        "cpu-2t",
        "Lineage",
        "SOUND",
        "min cosine",
    ] {
        assert!(dom.contains(expected), "the rendered page lacks {expected:?}");
    }
    assert!(dom.matches("<svg").count() >= 4, "histogram and three timeline charts");

    // A screenshot: not blank (many pixels neither white nor one flat colour).
    let o = headless(dir, &["--screenshot=shot.png", "--window-size=1200,2400", "--hide-scrollbars", &url]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(dir.join("shot.png")).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    let inked = pixels.chunks(channels).filter(|p| p[..3].iter().any(|&c| c < 200)).count();
    let total = pixels.len() / channels;
    assert!((info.width, info.height) == (1200, 2400), "{}x{}", info.width, info.height);
    assert!(inked * 100 > total, "only {inked} of {total} pixels are drawn on");
    if let Ok(keep) = std::env::var("EMBED_PIPELINE_KEEP_SCREENSHOT") {
        std::fs::copy(dir.join("shot.png"), keep).unwrap();
    }
}
