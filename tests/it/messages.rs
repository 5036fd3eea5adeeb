//! Issue 18: every bad input named where it can first be known, in the job file's own terms.

use crate::cli::job;
use crate::common::{assert_text, pipeline, text};

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
    assert_text("a_syntax_error_late_in_the_job", tmp.path(), &err);
    assert!(!tmp.path().join("out/docs.lance").exists(), "the COPY before the typo ran");
}

mod options {
    use crate::common::{assert_text, session, sql, vectors};

    async fn set_error(statement: &str) -> String {
        sql(&session(), statement).await.unwrap_err().to_string()
    }

    #[tokio::test]
    async fn bad_values_are_refused_at_the_set_naming_the_key() {
        // Out of the type's range or in it, one range is named: 0 is refused, so -1 is not told "0 or more". Only
        // the SET runs: nothing embeds, so each refusal can only come from the SET itself.
        let mut said = String::new();
        for statement in [
            "SET embed.batch_tokens = -5",
            "SET embed.batch_tokens = 0",
            "SET embed.max_tokens = -1",
            "SET embed.blank_texts = 'skip'",
            "SET embed.commit_rows = 0",
            "SET embed.commit_seconds = 0",
            "SET embed.max_tokens = 1",
            "SET embed.device = 'tpu'",
            "SET embed.normalize = 'sometimes'",
            "SET embed.restart = 'perhaps'",
            "SET embed.order = 'random'",
            "SET embed.sessions_per_device = 99",
        ] {
            said += &format!("{statement}\n  {}\n", set_error(statement).await);
        }
        assert_text("bad_set_values", &std::env::temp_dir(), &said);
    }

    #[tokio::test]
    async fn a_misspelt_key_lists_the_valid_ones() {
        let err = set_error("SET embed.modle = 'x'").await;
        assert_text("a_misspelt_key", &std::env::temp_dir(), &err);
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
    assert_text("a_bad_device_flag", tmp.path(), &err);
}

#[test]
fn library_internals_stay_out_of_the_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let o = pipeline(&["inspect", "out/nonexistent.lance"], tmp.path());
    let (_, err) = text(&o);
    assert!(!o.status.success());
    // The dataset is named as the user typed it: not Lance's path without its leading '/', no source path.
    assert_text("an_inspect_of_nothing", tmp.path(), &err);

    let file = job(tmp.path(), "CREATE EXTERNAL TABLE d STORED AS JSON LOCATION 'gs://bucket/x.jsonl';");
    let (_, err) = text(&pipeline(&["run", &file], tmp.path()));
    // Not "bug in DataFusion", nor "External error".
    assert_text("a_gs_location", tmp.path(), &err);
}

#[test]
fn outputs_that_cannot_be_written_are_refused_before_touching_the_disk() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("afile"), "x").unwrap();
    let mut said = String::new();
    for output in ["gs://b/e.lance", "afile/e.lance", "afile/deeper/e.lance"] {
        let file = job(
            tmp.path(),
            &format!("COPY (SELECT 'a' AS id, embed('x') AS embedding) TO '{output}' STORED AS LANCE;"),
        );
        let o = pipeline(&["run", &file], tmp.path());
        let (_, err) = text(&o);
        assert!(!o.status.success());
        said += &format!("to {output}:\n{err}\n");
    }
    assert_text("outputs_that_cannot_be_written", tmp.path(), &said);
    assert!(!tmp.path().join("gs:").exists(), "a gs:// output made a local directory");
}

mod compare {
    use std::process::Output;

    use crate::common::{pipeline, text};
    use crate::common::{session, sql, write_jsonl};

    fn json(o: &Output) -> serde_json::Value {
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o).0))
    }

    /// `n.lance` normalised, `u.lance` not, `dup.lance` every id twice, `half.lance` half the ids.
    async fn datasets(d: &std::path::Path) {
        let rows: Vec<(String, String)> = (0..6).map(|i| (format!("id{i}"), format!("text number {i}"))).collect();
        let rows: Vec<(&str, Option<&str>)> = rows.iter().map(|(i, t)| (i.as_str(), Some(t.as_str()))).collect();
        write_jsonl(&d.join("docs.jsonl"), &rows);
        let s = session();
        let p = |f: &str| d.join(f).display().to_string();
        sql(
            &s,
            &format!(
                "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}';
                 COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{}' STORED AS LANCE;
                 COPY (SELECT id, embed(text) AS embedding FROM docs WHERE id < 'id3') TO '{}' STORED AS LANCE;
                 SET embed.normalize = 'off';
                 COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{}' STORED AS LANCE;",
                p("docs.jsonl"),
                p("n.lance"),
                p("half.lance"),
                p("u.lance")
            ),
        )
        .await
        .unwrap();
        // Every id twice, written around the sink, which refuses a repeated id: n.lance's rows, appended to a copy.
        use futures::TryStreamExt;
        let n = lance::Dataset::open(&p("n.lance")).await.unwrap();
        let batches: Vec<_> = n.scan().try_into_stream().await.unwrap().try_collect().await.unwrap();
        let schema = batches[0].schema();
        for mode in [lance::dataset::WriteMode::Create, lance::dataset::WriteMode::Append] {
            let reader =
                datafusion::arrow::array::RecordBatchIterator::new(batches.clone().into_iter().map(Ok), schema.clone());
            let params = lance::dataset::WriteParams { mode, ..Default::default() };
            lance::Dataset::write(reader, p("dup.lance").as_str(), Some(params)).await.unwrap();
        }
    }

    #[tokio::test]
    async fn compare_fails_on_what_cosine_cannot_see_and_says_which_check_failed() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        datasets(d).await;

        // Normalised against unnormalised: cosine 1, but another fingerprint and other lengths.
        let o = pipeline(&["compare", "n.lance", "u.lance"], d);
        let (out, _) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{out}");
        assert!(out.contains("fingerprints differ in normalize: A true, B false"), "{out}");
        assert!(out.contains("FAIL: fingerprints differ (normalize;"), "{out}");
        let o = pipeline(&["compare", "n.lance", "u.lance", "--allow-different-fingerprints", "--json"], d);
        assert_eq!(o.status.code(), Some(1));
        let j = json(&o);
        assert!(j["min_cosine"].as_f64().unwrap() > 0.99999, "{j}");
        assert!(j["max_abs_diff"].as_f64().unwrap() > 0.01, "{j}");
        assert_eq!(j["failures"].as_array().unwrap().len(), 1, "{j}");
        assert!(j["failures"][0].as_str().unwrap().starts_with("max abs difference"), "{j}");
        assert_eq!(j["fingerprint_a"]["normalize"], true);
        assert_eq!(j["fingerprint_b"]["normalize"], false);

        // Every id twice: counted once, and failing as duplicates.
        let o = pipeline(&["compare", "n.lance", "dup.lance", "--json"], d);
        assert_eq!(o.status.code(), Some(1));
        let j = json(&o);
        assert_eq!((j["matched"].as_u64(), j["duplicates_in_b"].as_u64()), (Some(6), Some(6)), "{j}");
        assert_eq!(j["failures"][0].as_str().unwrap(), "duplicate ids (0 in A, 6 in B)");

        // Ids on one side only: the FAIL line says so, not the cosine; --shared-ids compares the rest.
        let o = pipeline(&["compare", "n.lance", "half.lance"], d);
        let (out, _) = text(&o);
        assert_eq!(o.status.code(), Some(1));
        assert!(out.contains("FAIL: ids differ (3 only in A, 0 only in B;") && !out.contains("threshold"), "{out}");
        let o = pipeline(&["compare", "n.lance", "half.lance", "--shared-ids"], d);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}{err}");
        assert!(out.contains("ids in both: 3") && out.contains("PASS"), "{out}");

        // A dataset that cannot be opened: exit code 2, not the 1 of "differ".
        let o = pipeline(&["compare", "n.lance", "missing.lance"], d);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
    }
}

mod reruns {
    use crate::common::{assert_text, model_dir, pipeline, text, write_jsonl};

    fn write_job(d: &std::path::Path, model: &std::path::Path, extra: &str) {
        let sql = format!(
            "SET embed.model = '{}';\n{extra}\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
             COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out.lance' STORED AS LANCE;\n",
            model.display()
        );
        std::fs::write(d.join("job.sql"), sql).unwrap();
    }

    #[test]
    fn a_finished_tagged_job_reruns_as_a_no_op_and_new_ids_need_a_new_tag() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write_jsonl(&d.join("docs.jsonl"), &[("a", Some("one")), ("b", None)]);
        write_job(d, &model_dir(), "SET embed.tag = 'v1';");
        let o = pipeline(&["run", "job.sql"], d);
        assert!(o.status.success(), "{}", text(&o).1);
        let (out, _) = text(&o);
        assert!(out.contains("note: 1 rows had a NULL text"), "{out}");

        let o = pipeline(&["run", "job.sql"], d);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}{err}");
        // One line says so: not also "resuming", nor a plan's or a write's count.
        assert_text("a_finished_tagged_job_run_again", d, &out);

        write_jsonl(&d.join("docs.jsonl"), &[("a", Some("one")), ("b", None), ("c", Some("three"))]);
        let o = pipeline(&["run", "job.sql"], d);
        let (out, err) = text(&o);
        assert!(!o.status.success(), "{out}");
        assert_text("a_finished_tagged_job_with_new_ids", d, &err);
    }

    #[test]
    fn a_fingerprint_refusal_names_the_ways_on_before_any_resume_count() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write_jsonl(&d.join("docs.jsonl"), &[("a", Some("one"))]);
        write_job(d, &model_dir(), "");
        assert!(pipeline(&["run", "job.sql"], d).status.success());
        write_job(d, &model_dir(), "SET embed.pooling = 'cls';");
        let o = pipeline(&["run", "job.sql"], d);
        let (out, err) = text(&o);
        assert!(!o.status.success());
        assert!(!out.contains("resuming:"), "{out}");
        assert_text("a_fingerprint_refusal", d, &err);
    }

    #[test]
    fn the_same_model_under_another_directory_name_appends() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let moved = d.join("minilm-moved");
        crate::model::copy_configs(&model_dir(), &moved);
        std::fs::create_dir_all(moved.join("onnx")).unwrap();
        std::fs::copy(model_dir().join("onnx/model.onnx"), moved.join("onnx/model.onnx")).unwrap();
        write_jsonl(&d.join("docs.jsonl"), &[("a", Some("one"))]);
        write_job(d, &model_dir(), "");
        assert!(pipeline(&["run", "job.sql"], d).status.success());
        write_jsonl(&d.join("docs.jsonl"), &[("a", Some("one")), ("b", Some("two"))]);
        write_job(d, &moved, "");
        let o = pipeline(&["run", "job.sql"], d);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}{err}");
        assert!(out.contains("wrote 1 rows"), "{out}");
    }
}

mod model_checks {
    use crate::common::{assert_text, model_dir, session, sql};

    #[tokio::test]
    async fn a_tokenizer_of_another_model_is_refused_at_load_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("mixed");
        crate::model::copy_configs(&model_dir(), &dir);
        std::fs::create_dir_all(dir.join("onnx")).unwrap();
        std::fs::copy(model_dir().join("onnx/model.onnx"), dir.join("onnx/model.onnx")).unwrap();
        // A tokenizer whose ids run past the 30,522-row embedding table, as a 50k BPE vocabulary's do.
        let mut tokenizer: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
        tokenizer["model"]["vocab"]["zyzzyva"] = serde_json::json!(32534);
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        let err = sql(&session(), &format!("SET embed.model = '{}'; SELECT embed('zyzzyva')", dir.display()))
            .await
            .unwrap_err()
            .to_string();
        // Named in the model's own files' terms, not in the graph's (no Gather node, no runtime's words).
        assert_text("a_tokenizer_of_another_model", tmp.path(), &err);
    }

    #[tokio::test]
    async fn max_tokens_past_the_models_positions_is_refused_before_embedding() {
        let s = session();
        let err = sql(&s, "SET embed.max_tokens = 513; SELECT embed('x')").await.unwrap_err().to_string();
        // Named in config.json's terms, not the graph's (no "broadcast").
        assert_text("max_tokens_past_the_positions", &model_dir(), &err);
        // 512 itself is the model's limit, and works.
        sql(&s, "SET embed.max_tokens = 512; SELECT embed('x')").await.unwrap();

        // Issue 54: a model type that numbers positions from pad_token_id + 1 (XLM-R here, on the same graph) takes
        // two fewer tokens than its table.
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join("xlmr");
        crate::maintain::copy_dir(&model_dir(), &copy);
        let config = std::fs::read_to_string(copy.join("config.json"))
            .unwrap()
            .replace("\"model_type\": \"bert\"", "\"model_type\": \"xlm-roberta\"")
            .replace("\"pad_token_id\": 0", "\"pad_token_id\": 1");
        std::fs::write(copy.join("config.json"), config).unwrap();
        let model = format!("SET embed.model = '{}'; ", copy.display());
        let err =
            sql(&s, &format!("{model}SET embed.max_tokens = 511; SELECT embed('x')")).await.unwrap_err().to_string();
        assert_text("max_tokens_past_the_positions_from_the_pad_id", tmp.path(), &err);
        sql(&s, &format!("{model}SET embed.max_tokens = 510; SELECT embed('x')")).await.unwrap();
    }
}

mod probe {
    use crate::common::{model_dir, session, sql};

    #[tokio::test]
    async fn damaged_weights_are_refused_when_the_model_loads() {
        assert!(model_dir().join("probe.json").is_file(), "scripts/setup installs the default model's probe.json");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("damaged");
        crate::model::copy_configs(&model_dir(), &dir);
        std::fs::copy(model_dir().join("probe.json"), dir.join("probe.json")).unwrap();
        std::fs::create_dir_all(dir.join("onnx")).unwrap();
        let mut weights = std::fs::read(model_dir().join("onnx/model.onnx")).unwrap();
        // 4 KB of flipped bits in the encoder's weights (the file's sha256 is pinned, so this is always the
        // same place; most such flips move the probe's cosine to 0.991-0.999, this one to 0.887): the file
        // still loads and runs.
        let at = weights.len() * 25 / 48;
        weights[at..at + 4096].iter_mut().for_each(|b| *b = !*b);
        std::fs::write(dir.join("onnx/model.onnx"), weights).unwrap();
        let err = sql(&session(), &format!("SET embed.model = '{}'; SELECT embed('x')", dir.display()))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("its vectors are not the model's") && err.contains("probe.json"), "{err}");
        // The intact model passes its own probe.
        sql(&session(), "SELECT embed('x')").await.unwrap();
    }
}

#[test]
fn writes_to_other_formats_are_reported_and_carry_the_fingerprint() {
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let file = job(
        d,
        "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';
COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'x.parquet' STORED AS PARQUET;
COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'x.arrow' STORED AS ARROW;
SELECT id FROM docs WHERE id = 'none';",
    );
    let o = pipeline(&["run", &file], d);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    // Each write's line and the summary's; an empty result as its header and "(0 rows)".
    assert_text("writes_to_other_formats", d, &out);

    let key = "embedding_pipeline.fingerprint";
    let parquet = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(d.join("x.parquet")).unwrap()).unwrap();
    let fp = parquet.schema().field_with_name("embedding").unwrap().metadata().get(key).cloned();
    assert!(fp.as_deref().is_some_and(|f| f.contains("model_sha256")), "Parquet field metadata: {fp:?}");
    let arrow =
        datafusion::arrow::ipc::reader::FileReader::try_new(std::fs::File::open(d.join("x.arrow")).unwrap(), None)
            .unwrap();
    let fp = arrow.schema().field_with_name("embedding").unwrap().metadata().get(key).cloned();
    assert!(fp.as_deref().is_some_and(|f| f.contains("model_sha256")), "Arrow field metadata: {fp:?}");
}

#[test]
fn a_read_only_job_says_nothing_was_written() {
    let tmp = tempfile::tempdir().unwrap();
    let file = job(tmp.path(), "SELECT 1 AS a;");
    let (out, _) = text(&pipeline(&["run", &file], tmp.path()));
    assert_text("a_read_only_job", tmp.path(), &out);
}

#[test]
fn inspect_prints_fingerprint_values_as_typed() {
    let tmp = tempfile::tempdir().unwrap();
    let file = job(
        tmp.path(),
        "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';
COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out.lance' STORED AS LANCE;",
    );
    assert!(pipeline(&["run", &file], tmp.path()).status.success());
    let (out, _) = text(&pipeline(&["inspect", "out.lance"], tmp.path()));
    assert!(out.contains("  model: all-MiniLM-L6-v2\n") && out.contains("  pooling: mean\n"), "{out}");
    assert!(out.contains("  prefix: (empty)\n") && !out.contains('"'), "{out}");
    assert_text("inspect_of_a_campaign", tmp.path(), &out);
}

#[test]
fn options_are_offered_only_where_they_do_something() {
    let tmp = tempfile::tempdir().unwrap();
    // inspect offers no --ort-lib or --format; -v and -q set the log level of every command, so every command
    // offers them; run offers all of them.
    let (help, _) = text(&pipeline(&["inspect", "--help"], tmp.path()));
    assert_text("inspect_help", tmp.path(), &help);
    let (help, _) = text(&pipeline(&["run", "--help"], tmp.path()));
    assert_text("run_help", tmp.path(), &help);
    let o = pipeline(&["compare", "a", "b", "--format", "csv"], tmp.path());
    assert_eq!(o.status.code(), Some(2), "clap refuses an argument a command does not take");
}

#[test]
fn the_default_model_is_found_outside_the_repository() {
    let tmp = tempfile::tempdir().unwrap();
    crate::common::write_jsonl(&tmp.path().join("docs.jsonl"), &[("a", Some("one"))]);
    // The README's job, without SET embed.model, run from a directory that has no models/.
    std::fs::write(
        tmp.path().join("job.sql"),
        "CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out/docs.lance' STORED AS LANCE;\n",
    )
    .unwrap();
    let o = pipeline(&["run", "job.sql"], tmp.path());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("/models/all-MiniLM-L6-v2 (the default model as scripts/setup installed it"), "{out}");
    assert_text("a_job_without_a_model_on_the_installed_default", tmp.path(), &out);
}

#[tokio::test]
async fn json_lines_folders_of_any_usual_extension_are_read() {
    use crate::common::{scalar_i64, session, sql, write_jsonl};
    let tmp = tempfile::tempdir().unwrap();
    let (jsonl, ndjson, mixed) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("c"));
    for d in [&jsonl, &ndjson, &mixed] {
        std::fs::create_dir_all(d).unwrap();
    }
    write_jsonl(&jsonl.join("part-1.jsonl"), &[("a", Some("one")), ("b", Some("two"))]);
    write_jsonl(&jsonl.join("part-2.jsonl"), &[("c", Some("three"))]);
    write_jsonl(&ndjson.join("part-1.ndjson"), &[("d", Some("four"))]);
    write_jsonl(&mixed.join("x.json"), &[("e", Some("five"))]);
    write_jsonl(&mixed.join("y.jsonl"), &[("f", Some("six")), ("g", Some("seven"))]);
    let s = session();
    let count = |table: &str, create: String| {
        let s = s.clone();
        let table = table.to_string();
        async move {
            sql(&s, &create).await?;
            sql(&s, &format!("SELECT count(*) FROM {table}")).await.map(|b| scalar_i64(&b))
        }
    };
    let at = |d: &std::path::Path| format!("{}/", d.display());
    let n = count("t1", format!("CREATE EXTERNAL TABLE t1 STORED AS JSON LOCATION '{}'", at(&jsonl))).await.unwrap();
    assert_eq!(n, 3);
    let n = count("t2", format!("CREATE EXTERNAL TABLE t2 STORED AS JSON LOCATION '{}'", at(&ndjson))).await.unwrap();
    assert_eq!(n, 1);
    let err = count("t3", format!("CREATE EXTERNAL TABLE t3 STORED AS JSON LOCATION '{}'", at(&mixed)))
        .await
        .unwrap_err()
        .to_string();
    assert_text("a_json_folder_of_mixed_extensions", tmp.path(), &err);
    let n = count(
        "t4",
        format!(
            "CREATE EXTERNAL TABLE t4 STORED AS JSON LOCATION '{}' OPTIONS ('format.file_extension' '.jsonl')",
            at(&mixed)
        ),
    )
    .await
    .unwrap();
    assert_eq!(n, 2);
}

#[test]
fn json_errors_name_the_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let good: String = (0..50).map(|i| format!("{{\"id\": \"{i}\", \"text\": \"t{i}\"}}\n")).collect();
    std::fs::write(d.join("bad.jsonl"), format!("{good}{{\"id\": \"x\", \"text\": \"y\"\n")).unwrap();
    let file = job(d, "CREATE EXTERNAL TABLE b STORED AS JSON LOCATION 'bad.jsonl';\nSELECT count(*) FROM b;");
    let (_, err) = text(&pipeline(&["run", &file], d));
    assert_text("json_lines_not_valid_json", d, &err);
    let mut bytes = good.into_bytes();
    bytes.extend(b"{\"id\": \"x\", \"text\": \"\xff\xfe\"}\n");
    std::fs::write(d.join("bad.jsonl"), bytes).unwrap();
    let (_, err) = text(&pipeline(&["run", &file], d));
    assert_text("json_lines_not_valid_utf8", d, &err);
}

#[test]
fn a_missing_model_is_named_by_its_absolute_path() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("job.sql"), "SET embed.model = 'nomodel/here';\nSELECT embed('x');\n").unwrap();
    let (_, err) = text(&pipeline(&["run", "job.sql"], tmp.path()));
    // [DIR]/nomodel/here, the absolute path.
    assert_text("a_missing_model", tmp.path(), &err);
}

#[tokio::test]
async fn a_write_of_constants_alone_is_embedded() {
    // No FROM: the ordering stage sees rows without columns, which arrow's take refused ("must either
    // specify a row count or at least one column").
    use crate::common::{scalar_i64, session, sql};
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c.lance").display().to_string();
    let s = session();
    sql(&s, &format!("COPY (SELECT 'a' AS id, embed('x') AS embedding) TO '{out}' STORED AS LANCE")).await.unwrap();
    let n = sql(&s, &format!("CREATE EXTERNAL TABLE c STORED AS LANCE LOCATION '{out}'; SELECT count(*) FROM c"))
        .await
        .unwrap();
    assert_eq!(scalar_i64(&n), 1);
}

/// An empty corpus says so, and nothing is planned or written: an empty JSON lines file at its CREATE, an empty
/// Parquet file (its columns known, no rows) at `plan` and at `run`, which exits non-zero with no dataset made.
#[test]
fn an_empty_corpus_is_named_and_nothing_is_written() {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("empty.jsonl"), "").unwrap();
    let copy = "COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out.lance' STORED AS LANCE;";
    let file = job(dir, &format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'empty.jsonl';\n{copy}"));
    let mut said = String::new();
    for command in ["run", "plan"] {
        let o = pipeline(&[command, &file], dir);
        let (_, err) = text(&o);
        assert!(!o.status.success(), "{command}: {err}");
        said += &format!("{command}, an empty JSON lines file:\n{err}\n");
    }

    let schema = std::sync::Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("text", DataType::Utf8, true),
    ]));
    let parquet = std::fs::File::create(dir.join("empty.parquet")).unwrap();
    datafusion::parquet::arrow::ArrowWriter::try_new(parquet, schema, None).unwrap().close().unwrap();
    let file = job(dir, &format!("CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION 'empty.parquet';\n{copy}"));
    for command in ["plan", "run"] {
        let o = pipeline(&[command, &file], dir);
        let (_, err) = text(&o);
        assert!(!o.status.success(), "{command}: {err}");
        said += &format!("{command}, an empty Parquet file:\n{err}\n");
    }
    // "the corpus is empty" and "has no rows ... nothing was planned/written", not "No field named" or "Error
    // during planning".
    assert_text("an_empty_corpus", dir, &said);
    assert!(!dir.join("out.lance").exists() && !dir.join("out.lance.plan").exists());
}
