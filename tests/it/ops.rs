//! The campaign operations driven as a library, with no `cli` module involved: a job run and resumed, planned
//! and the plan executed, probed, tried and costed, its output's lineage read; refusals as typed errors, and
//! what a [`Reporter`] is told on the way.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Mutex;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Int64Type, SchemaRef};
use embedding_pipeline::Error;
use embedding_pipeline::ops::plan::{UnitSize, plan_job};
use embedding_pipeline::ops::script::JobStatement;
use embedding_pipeline::ops::{Reporter, RunOptions, Silent, WorkPlanChoice, WriteProgress, run_job};

use crate::common::{model_dir, write_jsonl};

/// Everything a reporter is told, kept.
#[derive(Default)]
struct Recorder {
    notes: Mutex<Vec<String>>,
    warnings: Mutex<Vec<String>>,
    writes: Mutex<(u32, u32)>,
    last_progress: Mutex<Option<WriteProgress>>,
    results: Mutex<Vec<RecordBatch>>,
    finished: Mutex<Vec<SchemaRef>>,
}

impl Reporter for Recorder {
    fn note(&self, line: &str) {
        self.notes.lock().unwrap().push(line.to_string());
    }

    fn warning(&self, line: &str) {
        self.warnings.lock().unwrap().push(line.to_string());
    }

    fn write_started(&self, progress: WriteProgress) {
        self.writes.lock().unwrap().0 += 1;
        *self.last_progress.lock().unwrap() = Some(progress);
    }

    fn write_finished(&self) {
        self.writes.lock().unwrap().1 += 1;
    }

    fn query_rows(&self, batch: &RecordBatch) -> embedding_pipeline::Result<ControlFlow<()>> {
        self.results.lock().unwrap().push(batch.clone());
        Ok(ControlFlow::Continue(()))
    }

    fn query_finished(&self, schema: &SchemaRef) -> embedding_pipeline::Result<()> {
        self.finished.lock().unwrap().push(schema.clone());
        Ok(())
    }
}

impl Recorder {
    fn notes(&self) -> Vec<String> {
        self.notes.lock().unwrap().clone()
    }
}

/// The job's text: the default model, `docs.jsonl` in `dir` as `docs`, its vectors into `dir/out.lance`, and
/// the rows of the output counted.
fn job(dir: &Path) -> String {
    format!(
        "SET embed.model = '{model}';\n\
         CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{dir}/docs.jsonl';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{dir}/out.lance' STORED AS LANCE;\n\
         CREATE EXTERNAL TABLE out STORED AS LANCE LOCATION '{dir}/out.lance';\n\
         SELECT count(*) AS n, count(embedding) AS vectors FROM out;\n",
        model = model_dir().display(),
        dir = dir.display()
    )
}

fn corpus(dir: &Path, rows: usize) {
    let texts: Vec<(String, Option<String>)> = (0..rows)
        .map(|i| {
            let text = (i != 3).then(|| format!("document {i}: {}", "a few words of text ".repeat(1 + i % 7)));
            (format!("d{i:03}"), text)
        })
        .collect();
    let rows: Vec<(&str, Option<&str>)> = texts.iter().map(|(id, t)| (id.as_str(), t.as_deref())).collect();
    write_jsonl(&dir.join("docs.jsonl"), &rows);
}

/// A temporary folder holding a corpus of `rows` rows and the job over it, `job.sql`.
fn job_folder(rows: usize) -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    corpus(tmp.path(), rows);
    let file = tmp.path().join("job.sql");
    std::fs::write(&file, job(tmp.path())).unwrap();
    (tmp, file)
}

/// `job(dir)` with the folder given as `${DIR}` (its value in [`dir_var`]).
fn templated_job(dir: &Path) -> std::path::PathBuf {
    let file = dir.join("templated.sql");
    std::fs::write(&file, job(dir).replace(&dir.display().to_string(), "${DIR}")).unwrap();
    file
}

fn dir_var(dir: &Path) -> BTreeMap<String, String> {
    BTreeMap::from([("DIR".to_string(), dir.display().to_string())])
}

fn counts(batches: &[RecordBatch]) -> (i64, i64) {
    let b = &batches[0];
    (b.column(0).as_primitive::<Int64Type>().value(0), b.column(1).as_primitive::<Int64Type>().value(0))
}

/// A stop travels with the job it was given to (its session's token), not with the process: a job asked to stop ends
/// before its first statement and writes nothing, while another job running beside it, with a token of its own,
/// writes every row.
#[tokio::test(flavor = "multi_thread")]
async fn a_stop_reaches_its_own_job_and_no_other() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    corpus(a.path(), 40);
    corpus(b.path(), 40);
    let stopped = RunOptions { plans: WorkPlanChoice::Off, ..RunOptions::default() };
    let other = RunOptions { plans: WorkPlanChoice::Off, ..RunOptions::default() };
    stopped.stop.request();
    let job_a = JobStatement::all_of("a.sql", &job(a.path())).unwrap();
    let job_b = JobStatement::all_of("b.sql", &job(b.path())).unwrap();
    let (ra, rb) = tokio::join!(run_job(&job_a, &stopped, &Silent), run_job(&job_b, &other, &Silent));
    let err = ra.unwrap_err();
    assert!(matches!(&err, Error::StoppedAt(m) if m.starts_with("a.sql: stopped before statement")), "{err:?}");
    assert!(!a.path().join("out.lance").exists());
    let report = rb.unwrap();
    assert_eq!(report.rows_written(), 40, "{:?}", report.writes);
    assert!(!other.stop.requested());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_runs_and_resumes_through_the_library_with_a_typed_report() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    corpus(dir, 40);
    let statements = JobStatement::all_of("job.sql", &job(dir)).unwrap();
    let settings = RunOptions { plans: WorkPlanChoice::Off, ..RunOptions::default() };

    let first = Recorder::default();
    let report = run_job(&statements, &settings, &first).await.unwrap();
    // One commit of all 40 rows; 39 texts embedded and one NULL, written with a NULL vector.
    assert_eq!(report.writes.len(), 1, "{:?}", report.writes);
    assert_eq!(report.writes[0].rows, 40);
    assert!(report.writes[0].uri.ends_with("out.lance"), "{}", report.writes[0].uri);
    assert_eq!(report.rows_written(), 40);
    assert!(report.file_writes.is_empty());
    let e = &report.embedded;
    assert_eq!((e.docs, e.nulls, e.blank, e.truncated_docs), (39, 1, 0, 0));
    assert!(e.useful_tokens > 39 * 5 && e.processed_tokens >= e.useful_tokens, "{e:?}");
    let efficiency = report.padding_efficiency();
    assert!(efficiency > 0.0 && efficiency <= 1.0, "{efficiency}");
    assert_eq!(efficiency, e.useful_tokens as f64 / e.processed_tokens as f64);
    assert!(report.useful_tokens_per_second() > 0.0);
    assert!(report.first_model_call_seconds.is_some_and(|s| s <= report.wall_seconds));
    assert!(report.device.as_ref().is_some_and(|d| d.to_string().contains("ExecutionProvider")), "{:?}", report.device);
    assert_eq!(report.cluster, None);
    // The write was followed from start to end, and its progress reads as all done.
    assert_eq!(*first.writes.lock().unwrap(), (1, 1));
    let done = first.last_progress.lock().unwrap().as_ref().unwrap().snapshot();
    assert_eq!((done.docs, done.tokens), (39, e.useful_tokens), "{done:?}");
    // The query's result came to the reporter, not to standard output.
    assert_eq!(counts(&first.results.lock().unwrap()), (40, 39));
    assert_eq!(first.finished.lock().unwrap()[0].field(0).name(), "n");
    let notes = first.notes();
    assert!(notes.iter().any(|n| n.starts_with("wrote 40 rows to ") && n.contains("now at version 1")), "{notes:?}");
    assert!(first.warnings.lock().unwrap().is_empty());

    // Again: every id is there, nothing is embedded, and the report says so.
    let again = Recorder::default();
    let report = run_job(&statements, &settings, &again).await.unwrap();
    assert!(report.writes.is_empty(), "{:?}", report.writes);
    assert_eq!(report.embedded.docs, 0);
    let notes = again.notes();
    assert!(notes.iter().any(|n| n.starts_with("this job is done: all 40 ids are already in ")), "{notes:?}");
    assert!(!notes.iter().any(|n| n.starts_with("resuming") || n.starts_with("wrote")), "{notes:?}");
    assert_eq!(counts(&again.results.lock().unwrap()), (40, 39));
}

#[tokio::test(flavor = "multi_thread")]
async fn library_errors_are_typed_and_name_the_statement() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_jsonl(&dir.join("docs.jsonl"), &[("a", Some("one")), ("b", Some("two")), ("a", Some("three"))]);
    let statements = JobStatement::all_of("job.sql", &job(dir)).unwrap();
    let err = run_job(&statements, &RunOptions::default(), &Silent).await.unwrap_err();
    let Error::Statement { message, cause } = &err else { panic!("not a statement's error: {err:?}") };
    assert!(message.starts_with("job.sql: statement 3 (line 3) failed: "), "{message}");
    assert!(message.contains("1 ids occur more than once (first: a)"), "{message}");
    assert!(cause.is_some(), "the cause is kept");
    assert!(!dir.join("out.lance").exists(), "nothing was written");

    // A statement that does not parse is refused before any runs.
    let bad = JobStatement::all_of("bad.sql", &format!("{}SELEC 1;\n", job(dir))).unwrap();
    let err = run_job(&bad, &RunOptions::default(), &Silent).await.unwrap_err();
    assert!(
        matches!(&err, Error::Refused(m) if m.starts_with("bad.sql: statement 6 (line 6) does not parse, so nothing was run")),
        "{err:?}"
    );
    // A setting that is not one, before the first statement.
    let settings = RunOptions { sets: vec![("embed.nonsense".into(), "1".into())], ..RunOptions::default() };
    let err = run_job(&statements, &settings, &Silent).await.unwrap_err();
    assert!(matches!(&err, Error::Refused(m) if m.starts_with("--set embed.nonsense=1: ")), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_planned_through_the_library_runs_its_plan_with_the_tokens_it_counted() {
    let (tmp, file) = job_folder(60);
    let dir = tmp.path();

    let plans = plan_job(&file, &BTreeMap::new(), UnitSize::Count(3)).await.unwrap();
    assert_eq!(plans.len(), 1);
    let (plan, plan_dir) = &plans[0];
    let plan = plan.texts().expect("a text write's plan");
    assert_eq!(plan_dir, &dir.join("out.lance.plan"));
    assert!(plan_dir.join("plan.json").is_file() && plan_dir.join("worklist.parquet").is_file());
    let t = &plan.totals;
    assert_eq!((t.rows, t.documents, t.null_texts, t.truncated_documents), (60, 59, 1, 0));
    assert_eq!(plan.units.len(), 3, "{:?}", plan.units);
    assert_eq!(plan.units.iter().map(|u| u.useful_tokens).sum::<u64>(), t.useful_tokens);

    // The run finds the plan beside its output, executes it, and embeds exactly the tokens it counted.
    let statements = JobStatement::all_of("job.sql", &job(dir)).unwrap();
    let recorder = Recorder::default();
    let report = run_job(&statements, &RunOptions::default(), &recorder).await.unwrap();
    assert_eq!(report.embedded.useful_tokens, t.useful_tokens);
    assert_eq!(report.writes.iter().map(|w| w.rows).sum::<u64>(), 60);
    let notes = recorder.notes();
    assert!(notes.iter().any(|n| n.starts_with("executing the plan ") && n.contains("60 rows")), "{notes:?}");
    assert!(notes.iter().any(|n| n.ends_with(": 3 of 3 units done")), "{notes:?}");
    let done = recorder.last_progress.lock().unwrap().as_ref().unwrap().snapshot();
    assert_eq!(done.units, Some((3, 3)));
    assert_eq!(done.total_tokens(), Some(t.useful_tokens));

    // A job with no write into Lance has nothing to plan: a refusal, typed.
    let nothing = dir.join("nothing.sql");
    std::fs::write(&nothing, "SELECT 1;\n").unwrap();
    let err = plan_job(&nothing, &BTreeMap::new(), UnitSize::Tokens(1000)).await.unwrap_err();
    assert!(
        matches!(&err, Error::Refused(m) if m.ends_with("writes nothing into Lance (COPY … STORED AS LANCE, INSERT INTO a Lance table): nothing to plan")),
        "{err:?}"
    );

    // A job with `${NAME}` variables is planned with their values, as `pipeline run --var` runs it; without them it
    // is refused, naming the variable and its line.
    let templated = templated_job(dir);
    let err = plan_job(&templated, &BTreeMap::new(), UnitSize::Count(3)).await.unwrap_err();
    assert!(
        matches!(&err, Error::Refused(m) if m.ends_with("line 2: ${DIR} has no value; give it with --var DIR=… (in Python: vars={\"DIR\": …})")),
        "{err:?}"
    );
    let again = plan_job(&templated, &dir_var(dir), UnitSize::Count(3)).await.unwrap();
    assert_eq!(again[0].0.texts().unwrap().totals.useful_tokens, t.useful_tokens);
    assert_eq!(again[0].1, dir.join("out.lance.plan"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_is_probed_through_the_library_into_a_typed_report() {
    let (tmp, file) = job_folder(40);
    let dir = tmp.path();

    let report = embedding_pipeline::ops::probe::probe_job(&file, &BTreeMap::new(), None, 1024).await.unwrap();
    assert_eq!(report.longest_from, "a tokenising pass over the corpus");
    assert!(report.longest_tokens > 10, "{report:?}");
    // Steps of 512 and 1024 tokens a call, each measured, with the budget this machine affords.
    let tokens: Vec<usize> = report.steps.iter().map(|s| s.batch_tokens).collect();
    assert_eq!(tokens, [512, 1024], "{report:?}");
    assert!(report.steps.iter().all(|s| s.error.is_none() && s.useful_tokens_per_second > 0.0), "{report:?}");
    assert!(report.budget_bytes > 0 && report.loaded_bytes > 0);
    let chosen = report.recommended.as_ref().expect("a setting fits");
    assert!(tokens.contains(&chosen.batch_tokens), "{chosen:?}");
    assert!(chosen.set.iter().any(|line| line.contains("embed.batch_tokens")), "{chosen:?}");
    assert_eq!(report.no_fit(), None);

    // A job that writes nothing into Lance has nothing to probe.
    let nothing = dir.join("nothing.sql");
    std::fs::write(&nothing, "SELECT 1;\n").unwrap();
    let err = embedding_pipeline::ops::probe::probe_job(&nothing, &BTreeMap::new(), None, 1024).await.unwrap_err();
    assert!(matches!(&err, Error::Refused(m) if m.ends_with("nothing to probe")), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trial_costed_and_a_lineage_read_through_the_library() {
    use embedding_pipeline::ops::cost::cost_trials;
    use embedding_pipeline::ops::trial::{Trial, TrialOptions, TrialReport, run_trial};
    let (tmp, file) = job_folder(60);
    let dir = tmp.path();

    // A trial of 30 rows at the job's own batch setting: a plan made for it, the sample embedded, a prediction.
    let save = dir.join("trials/cpu.json");
    let args = TrialOptions {
        file: file.clone(),
        vars: BTreeMap::new(),
        minutes: 1.0,
        sample: Some(30),
        save: save.clone(),
        reference: None,
        memory_budget: None,
        no_probe: true,
        name: Some("this-cpu".into()),
    };
    let trial = run_trial(&args).await.unwrap();
    assert_eq!(trial.mismatch(), None);
    let Trial::Texts(trial) = trial else { panic!("a text write's trial") };
    assert_eq!(trial.name, "this-cpu");
    assert!(trial.plan_from.starts_with("a plan made now"), "{}", trial.plan_from);
    assert_eq!((trial.corpus.rows, trial.corpus.documents), (60, 59));
    assert!(trial.probe.is_none() && trial.settings.from == "the job (--no-probe)", "{:?}", trial.settings);
    assert!(trial.sample.rows > 0 && trial.sample.rows <= 60, "{:?}", trial.sample);
    assert!(trial.prediction.seconds > 0.0 && trial.prediction.useful_tokens_per_second > 0.0);
    assert_eq!(trial.mismatch(), None);
    // Saved as the report says, and read back the same.
    let saved = TrialReport::read(&save).unwrap();
    assert_eq!((saved.name.as_str(), saved.corpus.useful_tokens), ("this-cpu", trial.corpus.useful_tokens));
    assert!(Path::new(&trial.vectors).is_dir(), "{}", trial.vectors);

    // Costed with no prices: the hours are the prediction's, no cost, and the fastest device is the choice.
    let report = cost_trials(std::slice::from_ref(&save), None, Some(24.0), None).unwrap();
    assert_eq!(report.rows.len(), 1);
    let row = &report.rows[0];
    assert_eq!(row.name, "this-cpu");
    assert!((row.hours - trial.prediction.seconds / 3600.0).abs() < 1e-9, "{row:?}");
    assert_eq!((row.cost, row.meets_deadline), (None, Some(true)));
    assert_eq!(report.useful_tokens, trial.corpus.useful_tokens);
    assert_eq!(report.choice.as_deref(), Some("this-cpu"));
    assert!(report.why.contains("the fastest (no prices given)"), "{}", report.why);
    // No trial at all is a refusal, typed.
    let err = cost_trials(&[], None, None, None).unwrap_err();
    assert!(matches!(&err, Error::Refused(m) if m.starts_with("no trial to price")), "{err:?}");

    // The lineage of a run's output: the model directory, then the vectors, each link verified.
    let statements = JobStatement::all_of("job.sql", &job(dir)).unwrap();
    run_job(&statements, &RunOptions { plans: WorkPlanChoice::Off, ..RunOptions::default() }, &Silent).await.unwrap();
    let out = dir.join("out.lance").display().to_string();
    let lineage = embedding_pipeline::ops::lineage::report(&out, true).await.unwrap();
    assert_eq!(lineage.version, 1);
    let links: Vec<&str> = lineage.chain.iter().map(|l| l.link.as_str()).collect();
    assert!(links.ends_with(&["model directory", "vectors"]), "{links:?}");
    assert!(lineage.chain.last().unwrap().detail.starts_with("60 rows"), "{:?}", lineage.chain);
    assert!(lineage.broken().is_empty(), "{:?}", lineage.checks);
    assert!(lineage.checks.iter().any(|c| c.link == "model directory" && c.status == "ok"), "{:?}", lineage.checks);
}

/// Verify, the model checks, evaluate's overlap and the report page, through the library: typed reports, the
/// stages told to the reporter, refusals typed.
#[tokio::test(flavor = "multi_thread")]
async fn a_dataset_verified_checked_and_reported_through_the_library() {
    use embedding_pipeline::ops::checks::{SampleSource, check_invariance, compare_order};
    use embedding_pipeline::ops::evaluate::{EvaluateOptions, evaluate};
    use embedding_pipeline::ops::verify::{VerifyOptions, last_verify, save, verify};

    let (tmp, file) = job_folder(40);
    let dir = tmp.path();
    let statements = JobStatement::all_of("job.sql", &job(dir)).unwrap();
    run_job(&statements, &RunOptions { plans: WorkPlanChoice::Off, ..RunOptions::default() }, &Silent).await.unwrap();
    let out = dir.join("out.lance").display().to_string();

    // Texts embedded directly: the same vectors as the dataset's, under the same fingerprint.
    let options = embedding_pipeline::EmbedOptions::default().with_model(model_dir().display().to_string());
    let stop = embedding_pipeline::process::interrupt::StopToken::new();
    let direct = embedding_pipeline::ops::embed::embed_texts(vec!["a talking dog".into(), "x".into()], &options, &stop)
        .await
        .unwrap();
    assert_eq!((direct.fingerprint.dim, direct.rows().count()), (384, 2));
    let norm: f32 = direct.rows().next().unwrap().iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    let err = embedding_pipeline::ops::embed::embed_texts(Vec::new(), &options, &stop).await.unwrap_err();
    assert!(matches!(&err, Error::Refused(m) if m.starts_with("no texts")), "{err:?}");

    // The job as a template, its folder given as a variable (`--var`).
    let args = VerifyOptions {
        dataset: out.clone(),
        job: Some(templated_job(dir)),
        vars: dir_var(dir),
        sample: 12,
        seed: 7,
        min_cosine: 0.9999,
        model: None,
        device: None,
        id_column: None,
        column: "embedding".into(),
        stop: Default::default(),
    };
    let recorder = Recorder::default();
    let report = verify(&args, &recorder).await.unwrap();
    assert_eq!(report.verdict, "sound", "{:?} {:?}", report.findings, report.cannot_check);
    assert_eq!((report.rows, report.ids.distinct, report.ids.duplicated), (40, 40, 0));
    assert_eq!((report.ids.source_rows, report.ids.missing, report.ids.extra), (Some(40), Some(0), Some(0)));
    let sample = report.sample.as_ref().unwrap();
    assert_eq!((sample.requested, sample.rows, sample.below), (12, 12, 0), "{sample:?}");
    assert!(sample.min_cosine.unwrap() >= 0.9999, "{sample:?}");
    let notes = recorder.notes();
    assert!(notes.first().is_some_and(|n| n.starts_with("reading the corpus of")), "{notes:?}");
    assert_eq!(notes.last().map(String::as_str), Some("checking the lineage"), "{notes:?}");
    // Saved beside the dataset, found again by version.
    let saved = save(&report).unwrap().unwrap();
    assert!(saved.display().to_string().ends_with("out.lance.verify.json"), "{}", saved.display());
    assert_eq!(last_verify(&out, report.version).map(|r| r.verdict), Some("sound".into()));
    // Variables with no job to give them to are refused, typed.
    let err = verify(&VerifyOptions { job: None, ..args.clone() }, &Silent).await.unwrap_err();
    assert!(matches!(&err, Error::Refused(m) if m.contains("no job to give them to")), "{err:?}");
    // A dataset with no such id column is refused, typed, before any work.
    let err = verify(&VerifyOptions { id_column: Some("nope".into()), ..args.clone() }, &Silent).await.unwrap_err();
    assert!(matches!(&err, Error::Refused(m) if m.contains("has no id column `nope`")), "{err:?}");

    // The model checks on the job's corpus.
    let templated = SampleSource { vars: dir_var(dir), ..SampleSource::new(templated_job(dir)) };
    let invariance = check_invariance(&templated, 10, 1e-4).await.unwrap();
    assert_eq!((invariance.table.as_str(), invariance.sample), ("docs", 10));
    assert!(invariance.passed && invariance.min_cosine > 0.9999, "{invariance:?}");
    let order = compare_order(&SampleSource::new(&file), 20).await.unwrap();
    assert_eq!(order.sample, 20);
    assert_eq!(order.length.useful_tokens, order.original.useful_tokens, "{order:?}");
    assert!(order.passed && order.max_abs_diff <= 1e-5, "{order:?}");
    // A job whose last write reads an output the job makes first (not there yet) is checked on its corpus all
    // the same: the checks run the set-up alone, and plan no write.
    let chained = dir.join("chained.sql");
    let text = job(dir).replace("out.lance", "fresh.lance")
        + &format!("COPY (SELECT id, embedding FROM out) TO '{}/copy.parquet' STORED AS PARQUET;\n", dir.display());
    std::fs::write(&chained, text).unwrap();
    let invariance = check_invariance(&SampleSource::new(&chained), 5, 1e-4).await.unwrap();
    assert_eq!((invariance.table.as_str(), invariance.sample), ("docs", 5));
    let nowhere = SampleSource { table: Some("nowhere".into()), ..SampleSource::new(&file) };
    let err = check_invariance(&nowhere, 10, 1e-4).await.unwrap_err();
    assert!(err.chain_text().contains("nowhere"), "{err:?}");

    // Evaluate's overlap of a dataset with itself: the same neighbours.
    let args = EvaluateOptions {
        datasets: vec![out.clone(), out.clone()],
        judgements: None,
        ks: vec![10],
        model: None,
        query_prompt: None,
        id_column: None,
        column: "embedding".into(),
        overlap: Some(5),
        overlap_sample: 8,
        seed: 1,
    };
    let o = evaluate(&args).await.unwrap().overlap.unwrap();
    assert_eq!((o.k, o.sampled, o.mean, o.min), (5, 8, 1.0, 1.0));
    // Nothing asked (no judgements, no overlap) is a refusal.
    let err = evaluate(&EvaluateOptions { datasets: vec![out.clone()], overlap: None, ..args }).await.unwrap_err();
    assert!(matches!(&err, Error::Refused(m) if m.starts_with("nothing to evaluate")), "{err:?}");

    // The page: the commit, the lineage and the verify result just saved.
    let page = embedding_pipeline::ops::report::report(&out, &[], None).await.unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"), "{}", &page[..60]);
    assert!(page.contains("<h2>Lineage</h2>") && page.contains("<h2>Commits</h2>"), "{page}");
    let verified = format!("<span class=\"sound\">SOUND</span> at version {}", report.version);
    assert!(page.contains(&verified), "the verify result saved above is on the page: {page}");
    assert!(page.contains("Ids: 40 distinct, 0 held more than once; against the corpus: 0 missing, 0 extra"), "{page}");
}

/// Index and optimize through the library keep the command's promises: the write lock (refused while a write
/// holds it), the latest version only, a bad duration named.
#[tokio::test(flavor = "multi_thread")]
async fn maintenance_through_the_library_takes_the_write_lock() {
    use embedding_pipeline::lance::lock::{Holder, WriteLock};
    use embedding_pipeline::ops::maintain::{self, IndexKind, IndexOptions};

    let (tmp, _) = job_folder(300);
    let dir = tmp.path();
    let statements = JobStatement::all_of("job.sql", &job(dir)).unwrap();
    run_job(&statements, &RunOptions { plans: WorkPlanChoice::Off, ..RunOptions::default() }, &Silent).await.unwrap();
    let out = dir.join("out.lance").display().to_string();
    let request = IndexOptions {
        column: "embedding".into(),
        kind: IndexKind::IvfPq,
        metric: embedding_pipeline::lance::Metric::Cosine,
        partitions: Some(1),
    };

    let held = WriteLock::acquire(&embedding_pipeline::lance::dataset_uri(&out), Holder::Run).unwrap();
    let err = maintain::index(&out, &request).await.unwrap_err().to_string();
    assert!(err.contains("another pipeline run is writing to"), "{err}");
    let err = maintain::optimize(&out, "0s").await.unwrap_err().to_string();
    assert!(err.contains("another pipeline run is writing to"), "{err}");
    drop(held);

    let err = maintain::index(&format!("{out}@1"), &request).await.unwrap_err().to_string();
    assert!(err.contains("index works on a dataset's latest version"), "{err}");
    let err = maintain::optimize(&out, "soon").await.unwrap_err().to_string();
    assert!(err.contains("--older-than soon") && err.contains("7d"), "{err}");

    let built = maintain::index(&out, &request).await.unwrap();
    assert_eq!(built.version, 2);
    assert!(built.index.is_some(), "{built:?}");
    let optimized = maintain::optimize(&out, "0s").await.unwrap();
    assert!(optimized.version > built.version, "{optimized:?}");
}
