//! Shared helpers: a session on the default model, running SQL, reading vectors out of results.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::Float32Type;
use embedding_pipeline::{EmbedOptions, EmbedSession};

/// The default model as `scripts/setup` installs it.
pub fn model_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2");
    assert!(dir.join("onnx/model.onnx").is_file(), "{} is missing: run scripts/setup first", dir.display());
    dir
}

/// The tiny model: `tests/fixtures/tiny`'s near-free graph (see its README) with the default model's tokenizer
/// and configs, for the tests of mechanics (resume, kills, commits, plans, query shapes, clusters, stores), where
/// what matters is which rows are written and when, not what the vectors mean. Assembled once under the
/// target directory's temporary folder; the same files every time, so its fingerprint is stable.
pub fn tiny_model_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let graph = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny/onnx/model.onnx");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tiny-model");
        let same = |d: &Path| std::fs::read(d.join("onnx/model.onnx")).ok() == std::fs::read(&graph).ok();
        if same(&dir) {
            return dir;
        }
        // Built beside it and renamed into place: tests in other processes may be assembling it too.
        let staging = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tiny-model.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        crate::model::copy_configs(&model_dir(), &staging);
        std::fs::create_dir_all(staging.join("onnx")).unwrap();
        std::fs::copy(&graph, staging.join("onnx/model.onnx")).unwrap();
        if dir.exists() && !same(&dir) {
            // Left by an older graph; a copy another process has just renamed into place is never removed.
            let _ = std::fs::remove_dir_all(&dir);
        }
        if std::fs::rename(&staging, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        assert!(same(&dir), "{} could not be assembled", dir.display());
        dir
    })
    .clone()
}

/// A session on the default model.
pub fn session() -> EmbedSession {
    session_on(&model_dir())
}

/// A session on the model in `dir`.
pub fn session_on(dir: &Path) -> EmbedSession {
    EmbedSession::with_options(EmbedOptions::default().with_model(dir.display().to_string())).unwrap()
}

/// Run statements one by one; return the last one's result.
pub async fn sql(session: &EmbedSession, statements: &str) -> datafusion::error::Result<Vec<RecordBatch>> {
    let mut last = Vec::new();
    for stmt in embedding_pipeline::ops::script::split_statements(statements).unwrap() {
        last = session.context().sql(&stmt.sql).await?.collect().await?;
    }
    Ok(last)
}

/// The vectors in column `col`, in row order; NULL rows are `None`.
pub fn vectors(batches: &[RecordBatch], col: &str) -> Vec<Option<Vec<f32>>> {
    let mut out = Vec::new();
    for b in batches {
        let list = b.column_by_name(col).unwrap().as_fixed_size_list();
        for i in 0..list.len() {
            // float16 vectors (embed.precision) as the float32 values they stand for.
            let v = datafusion::arrow::compute::cast(&list.value(i), &datafusion::arrow::datatypes::DataType::Float32);
            out.push(list.is_valid(i).then(|| v.unwrap().as_primitive::<Float32Type>().values().to_vec()));
        }
    }
    out
}

/// The strings in column `col`, in row order.
pub fn strings(batches: &[RecordBatch], col: &str) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let c = datafusion::arrow::compute::cast(
            b.column_by_name(col).unwrap(),
            &datafusion::arrow::datatypes::DataType::Utf8,
        )
        .unwrap();
        out.extend(c.as_string::<i32>().iter().map(|s| s.unwrap_or_default().to_string()));
    }
    out
}

/// One number from a one-row, one-column result.
pub fn scalar_i64(batches: &[RecordBatch]) -> i64 {
    let c =
        datafusion::arrow::compute::cast(batches[0].column(0), &datafusion::arrow::datatypes::DataType::Int64).unwrap();
    c.as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0)
}

pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb)
}

pub fn norm(a: &[f32]) -> f32 {
    a.iter().map(|x| x * x).sum::<f32>().sqrt()
}

/// A small JSONL corpus with the given (id, text) rows.
pub fn write_jsonl(path: &Path, rows: &[(&str, Option<&str>)]) {
    let lines: Vec<String> =
        rows.iter().map(|(id, text)| serde_json::json!({ "id": id, "text": text }).to_string()).collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// The first `n` lines of the repository's fortunes corpus (`examples/data/fortunes.jsonl`).
pub fn fortunes(n: usize) -> Vec<String> {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/fortunes.jsonl");
    std::fs::read_to_string(corpus).unwrap().lines().take(n).map(String::from).collect()
}

/// Write the job `name` into `dir`: the default model, `extra` SET lines, `docs.jsonl` as the table `docs`,
/// and its ids and vectors copied into `out/docs.lance`.
pub fn docs_job(dir: &Path, name: &str, extra: &str) {
    docs_job_on(&model_dir(), dir, name, extra);
}

/// [`docs_job`] on the model in `model`.
pub fn docs_job_on(model: &Path, dir: &Path, name: &str, extra: &str) {
    let sql = format!(
        "SET embed.model = '{}';\n{extra}\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out/docs.lance' STORED AS LANCE;\n",
        model.display()
    );
    std::fs::write(dir.join(name), sql).unwrap();
}

/// `pipeline compare A B --json` passed: `rows` ids on both sides, none on one side only, and no element
/// differs by more than 1e-6.
pub fn assert_same_vectors(compare: &std::process::Output, rows: u64) {
    let c: serde_json::Value = serde_json::from_slice(&compare.stdout).unwrap();
    assert!(compare.status.success(), "{c}");
    assert_eq!(
        (c["matched"].as_u64(), c["only_in_a"].as_u64(), c["only_in_b"].as_u64()),
        (Some(rows), Some(0), Some(0))
    );
    assert!(c["max_abs_diff"].as_f64().unwrap() <= 1e-6, "{c}");
}

/// The python of the tests' tools (pylance, moto): `EMBED_PIPELINE_TEST_PYTHON` as scripts/test sets it, or
/// what `scripts/setup --test-tools --print` installs and names.
pub fn test_python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        if let Some(p) = std::env::var_os("EMBED_PIPELINE_TEST_PYTHON") {
            return PathBuf::from(p);
        }
        let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/setup");
        let o = Command::new(setup).args(["--test-tools", "--print"]).output().unwrap();
        assert!(o.status.success(), "scripts/setup --test-tools: {}", String::from_utf8_lossy(&o.stderr));
        PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
    })
}

/// Run a Python script with the tests' tools; its stdout.
pub fn python(script: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let o = Command::new(test_python()).arg("-c").arg(script).args(args).envs(env.iter().cloned()).output().unwrap();
    assert!(o.status.success(), "python failed:\n{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The one way the tests start the command: `pipeline ARGS` in `dir`, to be run, spawned or given more (an
/// environment, standard input) by the caller.
pub fn command(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pipeline"));
    c.args(args).current_dir(dir);
    c
}

/// `pipeline ARGS` in `dir`, run to the end.
pub fn pipeline(args: &[&str], dir: &Path) -> std::process::Output {
    command(args, dir).output().unwrap()
}

/// `pipeline ARGS` in `dir`, started, its output piped.
pub fn spawn(args: &[&str], dir: &Path) -> std::process::Child {
    use std::process::Stdio;
    command(args, dir).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

/// A process's standard output and error, as text.
pub fn text(o: &std::process::Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// The command's text with what changes from run to run replaced: the temporary directory, digests, dates,
/// durations, rates, memory, thread counts, the CPU's name and the vectors' printed values (their last digit may
/// differ between CPUs); the lines about other runs sharing the machine are left out.
pub fn snapshot_filters(dir: &Path) -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("snapshots");
    settings.set_prepend_module_to_snapshot(false);
    let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    for d in [real.as_path(), dir] {
        settings.add_filter(&regex_escape(&d.display().to_string()), "[DIR]");
    }
    // The target directory's temporary folder (the tiny model's home), the repository and the install home, which
    // differ between clones and machines; the temporary folder first, as it may lie inside the repository.
    settings.add_filter(&regex_escape(env!("CARGO_TARGET_TMPDIR")), "[TARGET_TMP]");
    settings.add_filter(&regex_escape(env!("CARGO_MANIFEST_DIR")), "[REPO]");
    let home = std::env::var("EMBED_PIPELINE_HOME").map(PathBuf::from).unwrap_or_else(|_| {
        let data = std::env::var("XDG_DATA_HOME").map(PathBuf::from);
        data.unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".local/share"))
            .join("embedding-pipeline")
    });
    settings.add_filter(&regex_escape(&home.display().to_string()), "[HOME]");
    // Digests: a model exported here (its lineage.json holds the export's time) has its own on each machine.
    settings.add_filter(r"\b[0-9a-f]{64}\b", "[SHA256]");
    settings.add_filter(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d| UTC)?", "[DATE]");
    settings.add_filter(r"\b\d+(\.\d+)? ?(ms|s|min)\b", "[TIME]");
    settings.add_filter(r"[\d,]+(\.\d+)? (useful )?tokens/s", "[RATE] tokens/s");
    settings.add_filter(r"\b\d+(\.\d+)? ?(B|KiB|MiB|GiB)\b", "[MEMORY]");
    settings.add_filter(r"\b\d+ (intra-op )?threads?\b", "[N] threads");
    settings.add_filter(r"on cpu: .* \(\[N\] threads\)", "on cpu: [CPU] ([N] threads)");
    settings.add_filter(r"\[(-?\d+\.\d+, )+… (\d+) values\]", "[[VALUES] … $2 values]");
    // How busy the model was depends on the machine; whether the host set the pace too.
    settings
        .add_filter(r"model busy \d+% of the wall time \(([^)]*)\)(: .*)?", "model busy [SHARE] of the wall time ($1)");
    // Other tests' runs share this machine now and then: the lines that say so are not this run's output.
    settings.add_filter(r"(?m)^(note: other pipeline runs share|shared machine: ).*\n", "");
    settings
}

/// `text` as a regular expression that matches only itself.
fn regex_escape(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '/' || c == '_' { c.to_string() } else { format!("\\{c}") })
        .collect()
}

/// `text`, the command's output, checked whole against `tests/it/snapshots/NAME.snap`, with what changes between
/// runs and machines filtered ([`snapshot_filters`], `dir` being the test's directory). A new or changed text is
/// written beside it as `.snap.new`; `INSTA_UPDATE=always` writes it in place, to read in the diff.
pub fn assert_text(name: &str, dir: &Path, text: &str) {
    snapshot_filters(dir).bind(|| insta::assert_snapshot!(name, text));
}

/// A command that must fail, as a snapshot reads it: `$ pipeline ARGS`, its exit code and its standard error.
pub fn refusal(args: &[&str], o: &std::process::Output) -> String {
    assert!(!o.status.success(), "pipeline {args:?} succeeded: {:?}", text(o));
    let args: Vec<String> =
        args.iter().map(|a| if a.contains([' ', '\'', '"']) { format!("{a:?}") } else { a.to_string() }).collect();
    let code = o.status.code().map_or_else(|| "by a signal".to_string(), |c| c.to_string());
    format!("$ pipeline {}\nexit {code}\n{}\n", args.join(" "), text(o).1.trim_end())
}
