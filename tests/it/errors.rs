//! Bad input gets an error that names what is wrong and says what to do.

use crate::common::{assert_text, session, sql, write_jsonl};

#[tokio::test]
async fn unknown_embed_option_is_named() {
    let err = sql(&session(), "SET embed.modle = 'x'").await.unwrap_err().to_string();
    assert!(err.contains("modle"), "{err}");
}

#[tokio::test]
async fn bad_option_value_is_named_at_the_set() {
    let err = sql(&session(), "SET embed.pooling = 'median'; SELECT embed('x')").await.unwrap_err().to_string();
    assert_text("a_bad_pooling", &std::env::temp_dir(), &err);
}

#[tokio::test]
async fn missing_model_directory_is_named() {
    let err =
        sql(&session(), "SET embed.model = '/nonexistent/model'; SELECT embed('x')").await.unwrap_err().to_string();
    // Named, and where the default model comes from said.
    assert_text("a_missing_model_directory", &std::env::temp_dir(), &err);
}

#[tokio::test]
async fn a_model_directory_missing_a_file_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    crate::model::copy_configs(&crate::common::model_dir(), tmp.path());
    let err = sql(&session(), &format!("SET embed.model = '{}'; SELECT embed('x')", tmp.path().display()))
        .await
        .unwrap_err()
        .to_string();
    assert_text("a_model_directory_missing_its_graph", tmp.path(), &err);
}

#[tokio::test]
async fn set_embed_model_switches_the_model_and_its_dimension() {
    let s = session();
    let dim = sql(&s, "SELECT embed_dim()").await.unwrap();
    assert_eq!(crate::common::scalar_i64(&dim), 384);
    // A second, valid model directory: the same files under another name.
    let tmp = tempfile::tempdir().unwrap();
    crate::model::copy_configs(&crate::common::model_dir(), tmp.path());
    std::fs::create_dir_all(tmp.path().join("onnx")).unwrap();
    std::fs::copy(crate::common::model_dir().join("onnx/model.onnx"), tmp.path().join("onnx/model.onnx")).unwrap();
    let b = sql(&s, &format!("SET embed.model = '{}'; SELECT embed('x') AS v", tmp.path().display())).await.unwrap();
    assert_eq!(crate::common::vectors(&b, "v")[0].as_ref().unwrap().len(), 384);
    // Back to a broken one: the next plan fails instead of using the old model.
    assert!(sql(&s, "SET embed.model = '/nonexistent'; SELECT embed('x')").await.is_err());
}

#[tokio::test]
async fn missing_source_file_is_named() {
    let err = sql(&session(), "CREATE EXTERNAL TABLE t STORED AS JSON LOCATION '/nonexistent/docs.jsonl'")
        .await
        .unwrap_err()
        .to_string();
    assert_text("a_missing_source_file", &std::env::temp_dir(), &err);
}

#[tokio::test]
async fn missing_lance_dataset_says_how_to_create_it() {
    let err = sql(&session(), "CREATE EXTERNAL TABLE t STORED AS LANCE LOCATION '/nonexistent/x.lance'")
        .await
        .unwrap_err()
        .to_string();
    assert_text("a_missing_lance_dataset", &std::env::temp_dir(), &err);
}

#[tokio::test]
async fn a_text_column_that_is_not_a_string_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("nums.jsonl");
    std::fs::write(&path, "{\"id\": 1, \"body\": 42}\n").unwrap();
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE t STORED AS JSON LOCATION '{}'", path.display())).await.unwrap();
    let err = sql(&s, "SELECT embed(body) FROM t").await.unwrap_err().to_string();
    assert_text("a_text_column_that_is_not_a_string", tmp.path(), &err);
}

#[tokio::test]
async fn appending_an_incompatible_schema_is_refused_and_keeps_the_data() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("docs.jsonl");
    write_jsonl(&corpus, &[("a", Some("one")), ("b", Some("two"))]);
    let o = tmp.path().join("out.lance").display().to_string();
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'", corpus.display())).await.unwrap();
    sql(&s, &format!("COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{o}' STORED AS LANCE")).await.unwrap();
    let err =
        sql(&s, &format!("COPY (SELECT id, text FROM docs) TO '{o}' STORED AS LANCE")).await.unwrap_err().to_string();
    assert_text("an_incompatible_append", tmp.path(), &err);
    let ds = lance::Dataset::open(&o).await.unwrap();
    assert_eq!((ds.version().version, ds.count_rows(None).await.unwrap()), (1, 2));
}

#[tokio::test]
async fn asking_for_cuda_without_a_cuda_runtime_fails_clearly_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("docs.jsonl");
    write_jsonl(&corpus, &[("a", Some("one"))]);
    let out = tmp.path().join("out.lance");
    let s = session();
    sql(&s, &format!("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION '{}'", corpus.display())).await.unwrap();
    let err = sql(
        &s,
        &format!(
            "SET embed.device = 'cuda'; COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{}' STORED AS LANCE",
            out.display()
        ),
    )
    .await
    .unwrap_err()
    .to_string();
    // With the CPU build (what scripts/setup installs) the provider is missing; with the GPU build
    // (scripts/setup --gpu) on a machine without a GPU, the driver is missing. Either way: a clear stop.
    let missing = err.contains("no CUDA execution provider") && err.contains("scripts/setup --gpu");
    let cannot_start = ["no NVIDIA driver", "the CUDA driver failed", "could not start", "cannot load the CUDA"]
        .iter()
        .any(|m| err.contains(m));
    assert!(err.contains("embed.device = 'cuda:0'") && (missing || cannot_start), "{err}");
    assert!(!out.join("_versions").exists(), "nothing may be written");
    let err = sql(&s, "SET embed.device = 'tpu'; SELECT embed('x')").await.unwrap_err().to_string();
    assert!(err.contains("embed.device") && err.contains("tpu"), "{err}");
    let err = sql(&s, "SET embed.device = 'cuda:0,0'; SELECT embed('x')").await.unwrap_err().to_string();
    assert!(err.contains("embed.device") && err.contains("each GPU once"), "{err}");
    let err = sql(&s, "SET embed.device = 'cpu'; SET embed.sessions_per_device = 99; SELECT embed('x')")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("embed.sessions_per_device") && err.contains("1 to 16"), "{err}");
}

/// The first error of type `T` in `e`'s chain of sources.
fn beneath<'a, T: std::error::Error + 'static>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a T> {
    let mut next = Some(e);
    while let Some(cause) = next {
        if let Some(found) = cause.downcast_ref::<T>() {
            return Some(found);
        }
        next = cause.source();
    }
    None
}

#[tokio::test]
async fn lance_errors_keep_their_source_beneath_a_plain_message() {
    let err = embedding_pipeline::lance::open_dataset("/nonexistent/x.lance").await.unwrap_err();
    assert!(matches!(beneath::<lance::Error>(&err), Some(lance::Error::DatasetNotFound { .. })), "{err:?}");
    // The user reads the crate's message only: Lance's own text names its source files.
    assert_eq!(
        err.chain_text(),
        "Lance dataset /nonexistent/x.lance: cannot open: not found (the path does not exist, or holds no _versions directory)"
    );
}

#[tokio::test]
async fn onnx_runtime_errors_keep_their_source_beneath_the_model_error() {
    let tmp = tempfile::tempdir().unwrap();
    crate::model::copy_configs(&crate::common::model_dir(), tmp.path());
    std::fs::create_dir_all(tmp.path().join("onnx")).unwrap();
    // A model file that decodes (a ModelProto holding an empty graph) but that ONNX Runtime refuses: no opset.
    std::fs::write(tmp.path().join("onnx/model.onnx"), [0x3a, 0x00]).unwrap();
    let err =
        sql(&session(), &format!("SET embed.model = '{}'; SELECT embed('x')", tmp.path().display())).await.unwrap_err();
    assert!(beneath::<ort::Error>(&err).is_some(), "{err:?}");
    let mut model = None;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(cause) = next {
        model = model
            .or(embedding_pipeline::Error::in_chain(cause)
                .filter(|e| matches!(e, embedding_pipeline::Error::Model { .. })));
        next = cause.source();
    }
    assert!(model.is_some(), "a model error, with ONNX Runtime's beneath it: {err:?}");
    let text = embedding_pipeline::error::chain_text(&err);
    assert!(text.contains("file onnx/model.onnx: cannot load") && text.contains("Missing opset"), "{text}");
    assert!(
        !text.contains("onnxruntime_src") && !text.contains("::"),
        "ONNX Runtime's source location is left out: {text}"
    );
}
