//! The command-line habits datafusion-cli users bring: `-c`, `-` for standard input and several job files in
//! the order given; `--var` and `--set`; `--format` and `--maxrows`; `SHOW` and `information_schema`;
//! `pipeline sql`; `--version`; completions; `-v` / `-q`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::common::{assert_text, command, model_dir, pipeline, refusal, text, write_jsonl};

/// `pipeline ARGS` in `dir` with `input` on standard input.
fn pipeline_with_stdin(args: &[&str], dir: &Path, input: &str) -> Output {
    let mut child =
        command(args, dir).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn set_model() -> String {
    format!("SET embed.model = '{}';", model_dir().display())
}

#[test]
fn commands_files_and_stdin_run_in_the_order_given() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("middle.sql"), "SELECT 'from the file' AS b;").unwrap();
    let o = pipeline_with_stdin(
        &["run", "-c", "SELECT 'first' AS a", "middle.sql", "-", "-c", "SELECT 'last' AS d; SELECT 'very last' AS e"],
        dir,
        "SELECT 'from stdin' AS c;",
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let at = |s: &str| out.find(s).unwrap_or_else(|| panic!("{s} missing from:\n{out}"));
    assert!(at("first") < at("from the file") && at("from the file") < at("from stdin"), "{out}");
    assert!(at("from stdin") < at("| last") && at("| last") < at("very last"), "{out}");

    // A parse error anywhere stops everything before anything runs, and names where it came from ("-c #2").
    let args = ["run", "-c", "COPY (SELECT 1 AS id) TO 'x.parquet' STORED AS PARQUET", "-c", "SELEC 2"];
    let mut said = refusal(&args, &pipeline(&args, dir));
    assert!(!dir.join("x.parquet").exists(), "the first statement must not have run");
    // Nothing to run, and standard input twice, are refused.
    said += &refusal(&["run", "--format", "csv"], &pipeline(&["run", "--format", "csv"], dir));
    said += &refusal(&["run", "-", "-"], &pipeline_with_stdin(&["run", "-", "-"], dir, "SELECT 1;"));
    assert_text("job_sources_refused", dir, &said);
}

#[test]
fn one_job_file_serves_two_corpora_through_variables() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_jsonl(&dir.join("a.jsonl"), &[("a1", Some("alpha")), ("a2", Some("beta"))]);
    write_jsonl(&dir.join("b.jsonl"), &[("b1", Some("gamma")), ("b2", Some("delta")), ("b3", Some("epsilon"))]);
    let job = format!(
        "{}\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '${{CORPUS}}';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO '${{OUT}}' STORED AS LANCE;\n",
        set_model()
    );
    std::fs::write(dir.join("job.sql"), job).unwrap();
    for (corpus, rows) in [("a", 3 - 1), ("b", 3)] {
        let (c, out) = (format!("CORPUS={corpus}.jsonl"), format!("OUT=out/{corpus}.lance"));
        let o = pipeline(&["run", "job.sql", "--var", &c, "--var", &out], dir);
        let (stdout, err) = text(&o);
        assert!(o.status.success(), "{err}");
        assert!(stdout.contains(&format!("wrote {rows} rows to")), "{stdout}");
        let o = pipeline(&["inspect", "--json", &format!("out/{corpus}.lance")], dir);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["rows"], rows, "{v}");
    }
    // A variable the job uses and the command line lacks is named, with its line, before anything runs.
    let args = ["run", "job.sql", "--var", "CORPUS=a.jsonl"];
    assert_text("a_variable_without_a_value", dir, &refusal(&args, &pipeline(&args, dir)));
    // One given and never used is warned about.
    let o = pipeline(&["run", "-c", "SELECT 1 AS x", "--var", "UNUSED=1"], dir);
    assert!(o.status.success() && text(&o).1.contains("--var UNUSED is not used"), "{:?}", text(&o));
}

#[test]
fn set_options_show_all_and_information_schema() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let o = pipeline(
        &[
            "run",
            "--set",
            "embed.batch_tokens=4096",
            "--format",
            "csv",
            "-c",
            "SHOW embed.batch_tokens",
            "-c",
            "SELECT name FROM information_schema.df_settings WHERE name LIKE 'embed.%' ORDER BY name",
        ],
        dir,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("embed.batch_tokens,4096"), "{out}");
    for key in ["embed.model", "embed.max_tokens", "embed.device", "embed.precision"] {
        assert!(out.lines().any(|l| l == key), "{key} missing from:\n{out}");
    }
    let o = pipeline(&["run", "-c", "SHOW ALL"], dir);
    assert!(o.status.success() && text(&o).0.contains("embed.pooling"), "{:?}", text(&o));
    // A bad value is refused by its key, as a SET in the job is; a key both --set and the job set; no `=`.
    let mut said = String::new();
    for args in [
        &["run", "--set", "embed.batch_tokens=many", "-c", "SELECT 1"][..],
        &["run", "--set", "embed.batch_tokens=4096", "-c", "SET embed.batch_tokens = 8192"],
        &["run", "--set", "batch_tokens", "-c", "SELECT 1"],
    ] {
        said += &refusal(args, &pipeline(args, dir));
    }
    assert_text("set_flags_refused", dir, &said);
}

#[test]
fn formats_carry_full_vectors_and_maxrows_cuts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let model = model_dir().display().to_string();
    let o = pipeline(&["embed", "--model", &model, "a talking dog"], dir);
    assert!(o.status.success(), "{:?}", text(&o));
    let line: Value = serde_json::from_slice(&o.stdout).unwrap();
    let want: Vec<f32> = serde_json::from_value(line["vector"].clone()).unwrap();
    let query = "SELECT 'q1' AS id, embed('a talking dog') AS embedding";
    let close = |got: &[f32]| {
        assert_eq!(got.len(), 384);
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(diff <= 1e-6, "largest difference {diff}");
    };
    let sets = format!("embed.model={model}");
    let run = |format: &str, sql: &str, extra: &[&str]| {
        let mut args = vec!["run", "-q", "--set", sets.as_str(), "--format", format, "-c", sql];
        args.extend_from_slice(extra);
        let o = pipeline(&args, dir);
        assert!(o.status.success(), "{format}: {:?}", text(&o));
        text(&o)
    };
    let (out, _) = run("json", query, &[]);
    let rows: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows[0]["id"], "q1");
    close(&serde_json::from_value::<Vec<f32>>(rows[0]["embedding"].clone()).unwrap());
    let (out, _) = run("ndjson", query, &[]);
    let row: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    close(&serde_json::from_value::<Vec<f32>>(row["embedding"].clone()).unwrap());
    let (out, _) = run("csv", query, &[]);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("id,embedding"));
    let field = lines.next().unwrap().strip_prefix("q1,").unwrap().trim_matches('"').to_string();
    close(&serde_json::from_str::<Vec<f32>>(&field).unwrap());
    let (out, _) = run("table", query, &[]);
    assert!(out.contains("384 values]"), "{out}");

    // --maxrows: the machine-read formats keep the note off standard output.
    let many = "SELECT * FROM (VALUES (1), (2), (3), (4), (5)) AS t(n)";
    let (out, err) = run("csv", many, &["--maxrows", "2"]);
    assert_eq!(out, "n\n1\n2\n");
    assert!(err.contains("showing the first 2 rows"), "{err}");
    let (out, _) = run("ndjson", many, &["--maxrows", "inf"]);
    assert_eq!(out.lines().count(), 5);
    let (out, _) = run("table", many, &["--maxrows", "3"]);
    assert!(out.contains("| 3 |") && !out.contains("| 4 |") && out.contains("showing the first 3 rows"), "{out}");
    // Without -q too: the notes and the summary go to stderr, so stdout parses.
    let o = pipeline(&["run", "--format", "ndjson", "-c", "SELECT 1 AS n"], dir);
    let (out, err) = text(&o);
    assert_eq!(out, "{\"n\":1}\n");
    assert!(err.contains("pipeline run: nothing written"), "{err}");
    let args = ["run", "--maxrows", "0", "-c", "SELECT 1"];
    assert_text("maxrows_zero", dir, &refusal(&args, &pipeline(&args, dir)));
    let (out, _) = run("json", "SELECT 1 AS n WHERE false", &[]);
    assert_eq!(out.trim(), "[]");
}

#[test]
fn a_reader_that_stops_early_ends_the_output_without_a_panic() {
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().unwrap();
    let mut child = command(
        &["run", "--format", "ndjson", "--maxrows", "inf", "-c", "SELECT value FROM generate_series(1, 2000000)"],
        tmp.path(),
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "{\"value\":1}");
    // `head -1` has what it wanted and closes the pipe (the reader is dropped above).
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    assert_eq!(o.status.code(), Some(141), "the code a shell gives a SIGPIPE, as cat or grep: {:?}", o.status);
}

#[test]
fn every_command_ends_quietly_on_a_closed_stdout() {
    // A pipe whose reader is gone before the program starts: its first print meets a closed stdout.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = command(&["--version"], Path::new(".")).stdout(writer).stderr(Stdio::piped()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(141), "{:?}", o.status);
}

#[test]
fn the_sql_shell_reads_statements_after_a_setup_job() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_jsonl(&dir.join("docs.jsonl"), &[("x1", Some("first text")), ("x2", Some("second text"))]);
    std::fs::write(
        dir.join("setup.sql"),
        format!("{}\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';", set_model()),
    )
    .unwrap();
    let run_shell = |input: &str| pipeline_with_stdin(&["sql", "setup.sql", "--format", "csv"], dir, input);
    let o = run_shell(
        "SELECT count(*) AS n FROM docs;\nSET embed.truncate_dim = 128;\nSELECT embed_dim() AS d,\n  \
         array_length(embed(text)) AS len FROM docs WHERE id = 'x1';\n",
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("n\n2\n") && out.contains("d,len\n128,128\n"), "{out}");
    let o = run_shell("SELECT 1 AS one;\nSELECT nothing FROM docs;\nSELECT 3;\n");
    let (out, err) = text(&o);
    assert!(!o.status.success() && err.contains("<stdin>: statement 2 (line 2) failed"), "{err}");
    assert!(out.contains("one\n1\n") && !out.contains("\n3\n"), "{out}");
}

#[test]
fn version_completions_and_log_levels() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let o = pipeline(&["--version"], dir);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.starts_with("pipeline ") && out.contains("DataFusion 54.1.0") && out.contains("Lance 14.0.2"), "{out}");
    // The library's own version, whichever scripts/setup installed (a version, then its path).
    let ort = out.lines().find(|l| l.starts_with("ONNX Runtime ")).unwrap_or_default();
    assert!(ort.chars().nth("ONNX Runtime ".len()).is_some_and(|c| c.is_ascii_digit()) && ort.contains(" ("), "{out}");
    assert!(ort.contains("ort 2.0.0-rc.15"), "{out}");
    // The commit it was built from: this checkout's.
    let head = std::process::Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert!(out.contains(&format!("built from commit {head}")), "{out} (HEAD {head})");
    assert!(out.starts_with(&format!("pipeline {}\n", env!("CARGO_PKG_VERSION"))), "{out}");
    for (shell, mark) in [("bash", "_pipeline()"), ("zsh", "#compdef pipeline"), ("fish", "complete -c pipeline")] {
        let o = pipeline(&["completions", shell], dir);
        let out = text(&o).0;
        assert!(o.status.success() && out.contains(mark) && out.contains("maxrows"), "{shell}: {out}");
    }
    // -q leaves the summary out; -v and -q together are refused.
    let o = pipeline(&["-q", "run", "-c", "SELECT 1 AS x"], dir);
    assert!(o.status.success() && !text(&o).0.contains("pipeline run:"), "{:?}", text(&o));
    let o = pipeline(&["run", "-c", "SELECT 1 AS x"], dir);
    assert!(o.status.success() && text(&o).0.contains("pipeline run:"), "{:?}", text(&o));
    let o = pipeline(&["-v", "-q", "run", "-c", "SELECT 1"], dir);
    assert!(!o.status.success(), "{:?}", text(&o));
    // -vv turns on debug logs.
    let o = pipeline(&["-vv", "run", "-c", "SELECT 1 AS x"], dir);
    assert!(o.status.success() && text(&o).1.contains("DEBUG"), "{:?}", text(&o));
}

#[test]
fn a_sigterm_at_the_sql_prompt_ends_the_shell_and_its_history_is_saved() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let home = dir.join("home");
    // A terminal for the shell: script(1) runs it on a pseudo-terminal, typed into from this pipe.
    let mut script = Command::new("script")
        .args(["-q", "-e", "-c", &format!("'{}' sql", env!("CARGO_BIN_EXE_pipeline")), "/dev/null"])
        .env("EMBED_PIPELINE_HOME", &home)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let screen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut out = script.stdout.take().unwrap();
    let seen = std::sync::Arc::clone(&screen);
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut out, &mut buf) {
            if n == 0 {
                break;
            }
            seen.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let mut stdin = script.stdin.take().unwrap();
    stdin.write_all(b"SELECT 41 + 1 AS answer;\n").unwrap();
    // Wait for the answer and the prompt after it.
    let started = std::time::Instant::now();
    let at_prompt = || {
        let s = screen.lock().unwrap();
        s.find("42").is_some_and(|at| s[at..].contains("pipeline> "))
    };
    while !at_prompt() {
        if started.elapsed() > std::time::Duration::from_secs(120) {
            let _ = script.kill();
            panic!("no answer and prompt: {}", screen.lock().unwrap());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let shell = descendant_running(script.id(), env!("CARGO_BIN_EXE_pipeline")).expect("the shell's process");
    let killed = Command::new("kill").args(["-TERM", &shell.to_string()]).status().unwrap();
    assert!(killed.success());
    let status = wait_at_most(&mut script, 30);
    reader.join().unwrap();
    let screen = screen.lock().unwrap().clone();
    assert_eq!(status.and_then(|s| s.code()), Some(143), "ended at once, as by SIGTERM: {screen}");
    assert!(screen.contains("terminated at the prompt"), "{screen}");
    let history = std::fs::read_to_string(home.join("sql_history")).unwrap_or_default();
    assert!(history.contains("SELECT 41 + 1 AS answer;"), "saved as it was entered: {history:?}");
}

/// The process under `pid` (itself included) running `exe`.
fn descendant_running(pid: u32, exe: &str) -> Option<u32> {
    let exe = std::fs::canonicalize(exe).ok()?;
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        if std::fs::read_link(format!("/proc/{p}/exe")).ok().as_deref() == Some(exe.as_path()) {
            return Some(p);
        }
        let children = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        queue.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
    }
    None
}

/// The child's exit status, or None (and the child killed) after `seconds`.
fn wait_at_most(child: &mut std::process::Child, seconds: u64) -> Option<std::process::ExitStatus> {
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(seconds) {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}
