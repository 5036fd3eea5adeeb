//! sentence-transformers model features, on model directories built here from the default model's files: named
//! and default prompts, Matryoshka cuts (`embed.truncate_dim`) and float16 output (`embed.precision`), each
//! equal to what it stands for, recorded in the fingerprint, and refused where it would mix campaigns.

use std::path::Path;

use datafusion::arrow::datatypes::DataType;
use embedding_pipeline::campaign::Fingerprint;
use embedding_pipeline::lance::records::fingerprint_of_dataset;

use crate::common::{model_dir, norm, pipeline, session_on, sql, text, vectors, write_jsonl};
use crate::model::copy_configs;

/// The default model's files under `dir`, with these prompts in config_sentence_transformers.json.
fn prompted_model(dir: &Path, config: serde_json::Value) {
    copy_configs(&model_dir(), dir);
    std::fs::create_dir_all(dir.join("onnx")).unwrap();
    std::os::unix::fs::symlink(model_dir().join("onnx/model.onnx"), dir.join("onnx/model.onnx")).unwrap();
    std::fs::write(dir.join("config_sentence_transformers.json"), config.to_string()).unwrap();
}

const TEXTS: &str =
    "SELECT * FROM (VALUES ('a', 'how do dogs talk'), ('b', 'The cat sleeps on the sofa.')) AS t(id, text)";

async fn embedded(dir: &Path, set: &str, expr: &str) -> datafusion::error::Result<Vec<Vec<f32>>> {
    let s = session_on(dir);
    let batches = sql(&s, &format!("{set}\nSELECT {expr} AS v FROM ({TEXTS}) ORDER BY id")).await?;
    Ok(vectors(&batches, "v").into_iter().map(Option::unwrap).collect())
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().zip(b).flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs())).fold(0.0, f32::max)
}

#[tokio::test]
async fn prompts_apply_by_name_or_default_and_equal_the_same_text_as_a_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("e5-like");
    prompted_model(
        &m,
        serde_json::json!({"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage"}),
    );
    let plain = model_dir();
    let by_default = embedded(&m, "", "embed(text)").await.unwrap();
    let typed = embedded(&plain, "", "embed('passage: ' || text)").await.unwrap();
    assert_eq!(max_diff(&by_default, &typed), 0.0, "the default prompt is the text put before each input");
    let query = embedded(&m, "SET embed.prompt_name = 'query';", "embed(text)").await.unwrap();
    assert_eq!(max_diff(&query, &embedded(&plain, "SET embed.prefix = 'query: ';", "embed(text)").await.unwrap()), 0.0);
    let none = embedded(&m, "SET embed.prompt_name = 'none';", "embed(text)").await.unwrap();
    assert_eq!(max_diff(&none, &embedded(&plain, "", "embed(text)").await.unwrap()), 0.0);
    assert!(max_diff(&none, &by_default) > 0.01);

    // A name the model lacks, and a prefix beside a prompt, are refused naming what there is.
    let e = embedded(&m, "SET embed.prompt_name = 'document';", "embed(text)").await.unwrap_err().to_string();
    assert!(e.contains("no prompt 'document'") && e.contains("'passage', 'query'"), "{e}");
    let e = embedded(&m, "SET embed.prefix = 'search: ';", "embed(text)").await.unwrap_err().to_string();
    assert!(e.contains("prompt 'passage'") && e.contains("embed.prompt_name = 'none'"), "{e}");
    let alone =
        embedded(&m, "SET embed.prompt_name = 'none'; SET embed.prefix = 'query: ';", "embed(text)").await.unwrap();
    assert_eq!(max_diff(&alone, &query), 0.0);

    // The fingerprint records the prompt's text and name; a campaign under another prompt is refused.
    write_jsonl(&tmp.path().join("docs.jsonl"), &[("a", Some("how do dogs talk")), ("b", Some("a sleeping cat"))]);
    let job = |set: &str| {
        format!(
            "SET embed.model = '{}';\n{set}\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
             COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out.lance' STORED AS LANCE;\n",
            m.display()
        )
    };
    std::fs::write(tmp.path().join("job.sql"), job("")).unwrap();
    let o = pipeline(&["run", "-q", "job.sql"], tmp.path());
    assert!(o.status.success(), "{:?}", text(&o));
    let fp = dataset_fingerprint(&tmp.path().join("out.lance")).await;
    assert_eq!((fp.prompt_name.as_str(), fp.prefix.as_str()), ("passage", "passage: "));
    std::fs::write(tmp.path().join("query.sql"), job("SET embed.prompt_name = 'query';")).unwrap();
    let o = pipeline(&["run", "query.sql"], tmp.path());
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("prefix") && err.contains("query: "), "{err}");

    // Search embeds the query under the documents' prompt, or under the query prompt when asked.
    for extra in [&[][..], &["--prompt-name", "query"][..]] {
        let mut args = vec!["search", "out.lance", "how do dogs talk", "-k", "1", "--json"];
        args.extend_from_slice(extra);
        let o = pipeline(&args, tmp.path());
        assert!(o.status.success(), "{extra:?}: {:?}", text(&o));
        let hits: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(hits[0]["id"], "a", "{extra:?}: {hits}");
    }
    let o = pipeline(&["search", "out.lance", "dogs", "--prompt-name", "question"], tmp.path());
    assert!(!o.status.success() && text(&o).1.contains("no prompt 'question'"), "{:?}", text(&o));

    // A model whose pooling leaves the prompt out (include_prompt: false, INSTRUCTOR-style): the prompt still
    // reaches the model, its tokens are not pooled, and the fingerprint says so. (Before, it was refused;
    // sentence-transformers' own vectors for such a model: tests/it/model_shapes.rs.)
    let pooled = embedded(&m, "", "embed(text)").await.unwrap();
    let pooling = m.join("1_Pooling/config.json");
    let mut p: serde_json::Value = serde_json::from_slice(&std::fs::read(&pooling).unwrap()).unwrap();
    p["include_prompt"] = false.into();
    std::fs::remove_file(&pooling).unwrap();
    std::fs::write(&pooling, p.to_string()).unwrap();
    let unpooled = embedded(&m, "", "embed(text)").await.unwrap();
    assert_eq!(unpooled.len(), pooled.len());
    assert!(
        unpooled.iter().zip(&pooled).all(|(a, b)| max_diff(std::slice::from_ref(a), std::slice::from_ref(b)) > 1e-3)
    );
    let options = embedding_pipeline::EmbedOptions::default().with_model(m.display().to_string());
    assert!(Fingerprint::for_options(&options).unwrap().1.prompt_unpooled);
    let mut none = options;
    none.prompt_name = "none".into();
    assert!(!Fingerprint::for_options(&none).unwrap().1.prompt_unpooled, "no prompt: nothing left out");
}

async fn dataset_fingerprint(path: &Path) -> Fingerprint {
    let ds = lance::Dataset::open(&path.display().to_string()).await.unwrap();
    fingerprint_of_dataset(&ds).unwrap().unwrap()
}

#[tokio::test]
async fn truncate_dim_cuts_then_normalises_and_is_fingerprinted() {
    let m = model_dir();
    let full = embedded(&m, "SET embed.normalize = 'false';", "embed(text)").await.unwrap();
    let cut = embedded(&m, "SET embed.truncate_dim = 128;", "embed(text)").await.unwrap();
    for (c, f) in cut.iter().zip(&full) {
        assert_eq!(c.len(), 128);
        assert!((norm(c) - 1.0).abs() < 1e-5, "re-normalised after the cut");
        let n = norm(&f[..128]);
        let expect: Vec<f32> = f[..128].iter().map(|x| x / n).collect();
        assert!(max_diff(std::slice::from_ref(c), &[expect]) <= 1e-6);
    }
    let s = session_on(&m);
    let dim = sql(&s, "SET embed.truncate_dim = 128; SELECT embed_dim()").await.unwrap();
    assert_eq!(crate::common::scalar_i64(&dim), 128);
    let mut options = embedding_pipeline::EmbedOptions::default().with_model(m.display().to_string());
    options.truncate_dim = 128;
    let fp = Fingerprint::for_options(&options).unwrap().1;
    assert_eq!((fp.dim, fp.truncate_dim), (128, 128));

    let e = embedded(&m, "SET embed.truncate_dim = 500;", "embed(text)").await.unwrap_err().to_string();
    assert!(e.contains("embed.truncate_dim") && e.contains("384-dimensional"), "{e}");
}

#[tokio::test]
async fn float16_output_is_stored_as_float16_within_half_precision_and_refused_beside_float32() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let texts: Vec<(String, String)> = (0..50)
        .map(|i| (format!("d{i:02}"), format!("Document {i} talks about dogs, cats and topic {}.", i % 7)))
        .collect();
    let rows: Vec<(&str, Option<&str>)> = texts.iter().map(|(i, t)| (i.as_str(), Some(t.as_str()))).collect();
    write_jsonl(&d.join("docs.jsonl"), &rows);
    let job = |set: &str, out: &str| {
        format!(
            "SET embed.model = '{}';\n{set}\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
             COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{out}' STORED AS LANCE;\n",
            model_dir().display()
        )
    };
    std::fs::write(d.join("half.sql"), job("SET embed.precision = 'float16';", "half.lance")).unwrap();
    std::fs::write(d.join("full.sql"), job("", "full.lance")).unwrap();
    std::fs::write(d.join("mixed.sql"), job("", "half.lance")).unwrap();
    for j in ["half.sql", "full.sql"] {
        let o = pipeline(&["run", "-q", j], d);
        assert!(o.status.success(), "{j}: {:?}", text(&o));
    }
    let ds = lance::Dataset::open(&d.join("half.lance").display().to_string()).await.unwrap();
    let field = ds.schema().field("embedding").unwrap().data_type();
    assert!(matches!(&field, DataType::FixedSizeList(f, 384) if f.data_type() == &DataType::Float16), "{field}");
    assert_eq!(dataset_fingerprint(&d.join("half.lance")).await.dtype, "float16");
    assert_eq!(dataset_fingerprint(&d.join("full.lance")).await.dtype, "float32");

    // Within float16's rounding of the float32 vectors (a unit vector's elements are below 1: < 2^-11 apart).
    let o = pipeline(&["compare", "full.lance", "half.lance", "--json", "--allow-different-fingerprints"], d);
    let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(c["matched"].as_u64(), Some(50), "{c}");
    assert!(c["max_abs_diff"].as_f64().unwrap() <= 1.0 / 2048.0, "{c}");
    assert!(c["min_cosine"].as_f64().unwrap() >= 0.99999, "{c}");

    // float32 rows into the float16 dataset are refused by the fingerprint, naming dtype.
    let o = pipeline(&["run", "mixed.sql"], d);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("dtype"), "{err}");

    // Search reads float16 vectors with a float16 query, and pylance sees half floats.
    let o = pipeline(&["search", "half.lance", "a dog", "-k", "3", "--json"], d);
    assert!(o.status.success(), "{:?}", text(&o));
    let hits: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(hits.as_array().unwrap().len(), 3);
    let py = crate::common::python(
        "import sys, lance; print(lance.dataset(sys.argv[1]).schema.field('embedding').type.value_type)",
        &[&d.join("half.lance").display().to_string()],
        &[],
    );
    assert_eq!(py.trim(), "halffloat");

    let e = embedded(&model_dir(), "SET embed.precision = 'float64';", "embed(text)").await.unwrap_err().to_string();
    assert!(e.contains("embed.precision") && e.contains("'float32' or 'float16'"), "{e}");
}
