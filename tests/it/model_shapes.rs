//! The model shapes people bring (issue 34): a tiny, randomly initialised sentence-transformers model of each
//! shape is built here from a transformers configuration (no hub), exported by scripts/export-onnx (whose own
//! check compares `pipeline embed` with sentence-transformers), then embedded by `pipeline run` and compared with
//! sentence-transformers' `encode` of the same texts, which vary in length and run past the model's limit.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::lineage::{export_python, repo};
use crate::common::{cosine, model_dir, pipeline, session_on, sql, strings, text, vectors};

/// Texts from one word to past every shape's limit, in several scripts.
fn texts() -> Vec<String> {
    let mut t: Vec<String> = [
        "Ok",
        "A man is eating food.",
        "Zwei Männer stehen am Herd und kochen.",
        "東京は日本の首都です。",
        "SELECT id, embed(text) FROM docs ORDER BY length(text) DESC;",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    t.extend(
        (1..=12).map(|i| format!("document {i}: {}", "the quick brown fox jumps over the lazy dog ".repeat(i * i))),
    );
    t
}

/// Build `shape` in `dir/ckpt` with sentence-transformers' vectors of [`texts`], export it into `dir/model`,
/// and return the reference vectors by prompt name ("" for none).
fn build_and_export(dir: &Path, shape: &str, extra: &[&str]) -> Value {
    let reference = build(dir, shape);
    let o = export(dir, extra);
    let (_, err) = text(&o);
    assert!(o.status.success() && err.contains("verified on"), "{shape}: export: {err}");
    reference
}

/// scripts/export-onnx of `dir/ckpt` into `dir/model`, checked on [`texts`] too.
fn export(dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(repo().join("scripts/export-onnx"))
        .args(["ckpt", "model", "--check-texts", "texts.jsonl"])
        .args(extra)
        .env("PIPELINE", env!("CARGO_BIN_EXE_pipeline"))
        .stdin(std::process::Stdio::null())
        .current_dir(dir)
        .output()
        .unwrap()
}

/// Build `shape` in `dir/ckpt`; sentence-transformers' vectors of [`texts`] by prompt name.
///
/// The shape's model is random but seeded, so the same fixture script, texts, tokenizer and exporter environment
/// build the same files: each shape is built once for those inputs and kept under the target directory's
/// temporary folder (as the tiny model is), then copied here. A change to any of them builds it again.
fn build(dir: &Path, shape: &str) -> Value {
    use sha2::{Digest, Sha256};
    let lines: Vec<String> = texts().iter().map(|t| serde_json::to_string(t).unwrap()).collect();
    let texts_file = lines.join("\n") + "\n";
    std::fs::write(dir.join("texts.jsonl"), &texts_file).unwrap();
    let script = repo().join("tests/fixtures/make_st_shapes.py");
    let python = export_python();
    let mut key = Sha256::new();
    for part in [
        std::fs::read(&script).unwrap(),
        texts_file.into_bytes(),
        std::fs::read(model_dir().join("tokenizer.json")).unwrap(),
        python.display().to_string().into_bytes(),
        shape.as_bytes().to_vec(),
    ] {
        key.update((part.len() as u64).to_le_bytes());
        key.update(part);
    }
    let key = format!("{:x}", key.finalize());
    let shapes = Path::new(env!("CARGO_TARGET_TMPDIR")).join("st-shapes");
    let kept = shapes.join(format!("{shape}-{}", &key[..16]));
    if !kept.join("reference.json").is_file() {
        // Built beside it and renamed into place: another test may be building the same shape.
        let staging = shapes.join(format!("{shape}-{}.{}", &key[..16], std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).unwrap();
        let o = Command::new(&python)
            .arg(&script)
            .args([shape, &model_dir().display().to_string(), "ckpt"])
            .arg(dir.join("texts.jsonl"))
            .arg("reference.json")
            .stdin(std::process::Stdio::null())
            .current_dir(&staging)
            .output()
            .unwrap();
        assert!(o.status.success(), "{shape}: {}", String::from_utf8_lossy(&o.stderr));
        if std::fs::rename(&staging, &kept).is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        assert!(kept.join("reference.json").is_file(), "{} could not be built", kept.display());
    }
    super::maintain::copy_dir(&kept.join("ckpt"), &dir.join("ckpt"));
    std::fs::copy(kept.join("reference.json"), dir.join("reference.json")).unwrap();
    reference_of(dir)
}

/// The reference vectors [`build`] wrote into `dir`, by prompt name.
fn reference_of(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap()
}

/// `pipeline run` of the texts with `set` into `out`; the vectors in text order.
async fn run(dir: &Path, set: &str, out: &str) -> Vec<Vec<f32>> {
    let rows: Vec<String> = texts()
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({ "id": format!("t{i:02}"), "text": t }).to_string())
        .collect();
    std::fs::write(dir.join("docs.jsonl"), rows.join("\n") + "\n").unwrap();
    let job = format!(
        "SET embed.model = 'model';\n{set}\nCREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
         COPY (SELECT id, embed(text) AS embedding FROM docs) TO '{out}' STORED AS LANCE;\n"
    );
    std::fs::write(dir.join("job.sql"), job).unwrap();
    let o = pipeline(&["run", "-q", "job.sql"], dir);
    assert!(o.status.success(), "{:?}", text(&o));
    let path = dir.join(out);
    let batches = sql(
        &session_on(&dir.join("model")),
        &format!(
            "CREATE EXTERNAL TABLE v STORED AS LANCE LOCATION '{}'; SELECT id, embedding FROM v ORDER BY id",
            path.display()
        ),
    )
    .await
    .unwrap();
    assert_eq!(strings(&batches, "id").len(), texts().len());
    vectors(&batches, "embedding").into_iter().map(Option::unwrap).collect()
}

/// Every vector has the reference's length and a cosine of at least 0.9999 with it.
fn assert_matches(shape: &str, ours: &[Vec<f32>], reference: &Value) {
    let reference: Vec<Vec<f32>> = serde_json::from_value(reference.clone()).unwrap();
    assert_eq!(ours.len(), reference.len());
    for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
        assert_eq!(a.len(), b.len(), "{shape}: text {i} has {} values, sentence-transformers {}", a.len(), b.len());
        let c = cosine(a, b);
        assert!(c >= 0.9999, "{shape}: text {i}: cosine {c}");
    }
}

async fn shape_matches(shape: &str) -> tempfile::TempDir {
    shape_exported_matches(shape, &[]).await
}

async fn shape_exported_matches(shape: &str, export_args: &[&str]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let reference = build_and_export(tmp.path(), shape, export_args);
    let ours = run(tmp.path(), "", "out.lance").await;
    assert_matches(shape, &ours, &reference[""]);
    tmp
}

/// BERT with mean and weighted mean concatenated, a Dense 64 -> 16 with tanh, Normalize, and a tokenizer that
/// cuts on the left: before, the Dense was left out (32 values, not 16), the weighted mean dropped, the cut
/// made on the right.
#[tokio::test(flavor = "multi_thread")]
async fn bert_with_concatenated_pooling_a_dense_and_left_truncation_matches_sentence_transformers() {
    let tmp = shape_matches("bert-concat-dense").await;
    let fp = pipeline(&["inspect", "out.lance", "--json"], tmp.path());
    let report: Value = serde_json::from_slice(&fp.stdout).unwrap();
    let f = &report["fingerprint"];
    assert_eq!(
        (f["pooling"].as_str(), f["truncation"].as_str(), f["dim"].as_u64()),
        (Some("mean+weightedmean"), Some("left"), Some(16)),
        "{report}"
    );
    assert!(f["dense_sha256"].as_str().is_some_and(|s| s.len() == 64), "{report}");
}

/// XLM-RoBERTa (pad id 1, positions counted from it) with cls pooling and a Dense 32 -> 32 without activation
/// or Normalize, LaBSE's shape: before, the dimensions agreed and the vectors did not (cosine -0.17). Exported
/// with its weights in an external data file, as every model over 2 GB is: ONNX Runtime loads them from beside
/// the graph, and the fingerprint's model digest covers them.
#[tokio::test(flavor = "multi_thread")]
async fn xlm_roberta_with_cls_and_a_dense_and_external_weights_matches_sentence_transformers() {
    let tmp = shape_exported_matches("xlmr-cls-dense", &["--external-data"]).await;
    // 130 positions from pad id 1: 128 tokens, not 130 (issue 54).
    the_largest_max_tokens_embeds_and_one_more_is_refused(tmp.path(), 128);
    let onnx = tmp.path().join("model/onnx");
    let (graph, data) = (onnx.join("model.onnx"), onnx.join("model.onnx_data"));
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert!(size(&data) > 3_000_000 && size(&graph) < 200_000, "{} / {}", size(&graph), size(&data));
    let entries: Vec<_> = std::fs::read_dir(&onnx).unwrap().collect();
    assert_eq!(entries.len(), 2, "one graph and one weights file");
    // Readable as the graph is (onnx writes the data file 0600, which a service user cannot load).
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), mode(&graph), "{:o} / {:o}", mode(&data), mode(&graph));
    let report: Value =
        serde_json::from_slice(&pipeline(&["inspect", "out.lance", "--json"], tmp.path()).stdout).unwrap();
    let graph_sha = embedding_pipeline::campaign::fingerprint::sha256_file(&graph).unwrap();
    let fp = &report["fingerprint"];
    assert!(fp["model_sha256"].as_str().is_some_and(|s| s.len() == 64 && s != graph_sha), "{report}");
    let lineage: Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("model/lineage.json")).unwrap()).unwrap();
    let facet = &lineage["outputs"][0]["facets"]["embeddingPipeline_onnx"];
    assert!(facet["external_data_sha256"]["model.onnx_data"].is_string(), "{facet}");

    // `lineage --verify` follows the external data too: before, it compared the graph's hash alone with the
    // fingerprint's model digest (which covers the data) and called a sound campaign broken.
    let verify = || {
        let o = pipeline(&["lineage", "out.lance", "--verify", "--json"], tmp.path());
        (o.status.success(), serde_json::from_slice::<Value>(&o.stdout).unwrap_or(Value::Null))
    };
    let status = |report: &Value, link: &str| {
        let checks = report["checks"].as_array().cloned().unwrap_or_default();
        checks.into_iter().find(|c| c["link"] == link).map(|c| (c["status"].clone(), c["detail"].clone()))
    };
    let (ok, report) = verify();
    assert!(ok, "{report}");
    for link in ["ONNX export", "model directory"] {
        assert_eq!(status(&report, link).map(|s| s.0), Some("ok".into()), "{link}: {report}");
    }
    let export = report["chain"].as_array().unwrap().iter().find(|l| l["link"] == "ONNX export").cloned();
    assert!(export.is_some_and(|l| l["sha256"]["onnx/model.onnx_data"].is_string()), "{report}");
    // One weight changed in the data file: the model directory no longer holds what made the vectors.
    let mut bytes = std::fs::read(&data).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&data, bytes).unwrap();
    let (ok, report) = verify();
    assert!(!ok, "{report}");
    let (state, detail) = status(&report, "model directory").unwrap();
    assert!(state == "BROKEN" && detail.as_str().unwrap().contains("onnx/model.onnx hashes"), "{report}");
}

/// A Qwen3 decoder with last-token pooling, whose tokenizer pads on the left in sentence-transformers (the
/// pipeline pads on the right and takes each text's last token), with and without its query prompt.
#[tokio::test(flavor = "multi_thread")]
async fn a_qwen3_decoder_with_last_token_pooling_and_its_prompt_matches_sentence_transformers() {
    shape_and_its_query_prompt_match("qwen3-lasttoken").await;
}

/// `shape` matches sentence-transformers without a prompt, then with its query prompt (into query.lance).
async fn shape_and_its_query_prompt_match(shape: &str) -> tempfile::TempDir {
    let tmp = shape_matches(shape).await;
    let ours = run(tmp.path(), "SET embed.prompt_name = 'query';", "query.lance").await;
    assert_matches(&format!("{shape}, query prompt"), &ours, &reference_of(tmp.path())["query"]);
    tmp
}

/// The same decoder exported in float16: the converter turned the float32 casts of its RMSNorms and rotary
/// embedding into a graph ONNX Runtime refused (`Type Error` on `input_layernorm/Cast`); those modules now stay
/// in float32, and the float16 graph matches sentence-transformers' float32 vectors.
#[tokio::test(flavor = "multi_thread")]
async fn a_qwen3_decoder_exports_in_float16_and_matches() {
    let tmp = shape_exported_matches("qwen3-lasttoken", &["--dtype", "float16"]).await;
    let report: Value =
        serde_json::from_slice(&pipeline(&["inspect", "out.lance", "--json"], tmp.path()).stdout).unwrap();
    assert_eq!(report["fingerprint"]["model_dtype"].as_str(), Some("float16"), "{report}");
}

/// The decoder with its weights saved in bfloat16, as Qwen3-Embedding and gte-Qwen2 ship them: the export
/// stopped with a Python traceback (transformers 5 loaded it in bfloat16 and the trace failed); it now loads in
/// float32, and both the float32 and the float16 export match sentence-transformers' float32 vectors.
#[tokio::test(flavor = "multi_thread")]
async fn a_decoder_saved_in_bfloat16_exports_and_matches() {
    let tmp = shape_matches("qwen3-bfloat16").await;
    let config: Value = serde_json::from_slice(&std::fs::read(tmp.path().join("ckpt/config.json")).unwrap()).unwrap();
    assert_eq!(config["dtype"], "bfloat16", "the checkpoint is saved in bfloat16: {config}");
    let reference = reference_of(tmp.path());
    std::fs::rename(tmp.path().join("model"), tmp.path().join("model-fp32")).unwrap();
    let o = export(tmp.path(), &["--dtype", "float16"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ours = run(tmp.path(), "", "fp16.lance").await;
    assert_matches("qwen3-bfloat16, float16 export", &ours, &reference[""]);
}

/// A Pooling config with include_prompt false (INSTRUCTOR's way), cls and mean: with the query prompt, its tokens
/// ([CLS] included, sentence-transformers' count) reach the model and are left out of both poolings, so cls takes
/// the first token after the prompt. Before, a prompt on such a model was refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_left_out_of_the_pooling_matches_sentence_transformers() {
    let tmp = shape_and_its_query_prompt_match("bert-prompt-unpooled").await;
    let report: Value =
        serde_json::from_slice(&pipeline(&["inspect", "query.lance", "--json"], tmp.path()).stdout).unwrap();
    assert_eq!(report["fingerprint"]["prompt_unpooled"], true, "{report}");
}

/// The older pooling config (one flag per mode) with max and mean_sqrt_len_tokens on: concatenated in
/// sentence-transformers' flag order, max first.
#[tokio::test(flavor = "multi_thread")]
async fn the_older_pooling_flags_concatenate_in_sentence_transformers_order() {
    shape_matches("bert-legacy-max-sqrt").await;
}

/// ModernBERT (no token_type_ids, global and local attention) with mean pooling.
#[tokio::test(flavor = "multi_thread")]
async fn modernbert_with_mean_pooling_matches_sentence_transformers() {
    shape_matches("modernbert-mean").await;
}

/// Issue 54: the largest `embed.max_tokens` the model's positions allow embeds texts past it (cut there), and one
/// more is refused naming the limit, before any model call; `usable` is that largest value.
fn the_largest_max_tokens_embeds_and_one_more_is_refused(dir: &Path, usable: usize) {
    let job = |n: usize| {
        let sql = format!(
            "SET embed.model = 'model';\nSET embed.max_tokens = {n};\n\
             CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'docs.jsonl';\n\
             COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'limit-{n}.lance' STORED AS LANCE;\n"
        );
        std::fs::write(dir.join("limit.sql"), sql).unwrap();
        pipeline(&["run", "-q", "limit.sql"], dir)
    };
    let o = job(usable);
    assert!(o.status.success(), "{:?}", text(&o));
    let report: Value =
        serde_json::from_slice(&pipeline(&["inspect", &format!("limit-{usable}.lance"), "--json"], dir).stdout)
            .unwrap();
    let run = &report["versions"][0]["run"];
    assert!(run["truncated_documents"].as_u64().unwrap() > 0, "texts past {usable} tokens were cut: {run}");
    let o = job(usable + 1);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains(&format!("use at most {usable}")), "{err}");
    assert!(!dir.join(format!("limit-{}.lance", usable + 1)).exists(), "nothing written");
}

/// MPNet and RoBERTa number positions from `pad_token_id + 1`: each matches sentence-transformers at its most
/// tokens (128 of 130 positions), takes 128 and refuses 129 (issue 54: 513 and 514 of 514 failed mid-run).
#[tokio::test(flavor = "multi_thread")]
async fn mpnet_and_roberta_match_at_their_most_tokens_and_refuse_more() {
    for shape in ["mpnet-mean", "roberta-mean"] {
        let tmp = shape_matches(shape).await;
        the_largest_max_tokens_embeds_and_one_more_is_refused(tmp.path(), 128);
    }
}

/// Issue 54: EmbeddingGemma's shape (a bidirectional Gemma3 text model, a Dense chain, query and document
/// prompts). torch's tracer stops on its attention mask (before, a 222-line traceback); the exporter says so in one
/// line, exports with torch's dynamo exporter, records which, and the export matches with and without the prompt.
#[tokio::test(flavor = "multi_thread")]
async fn an_embeddinggemma_shape_exports_through_dynamo_and_matches_with_its_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let reference = build(dir, "gemma3-bidirectional");
    let o = export(dir, &[]);
    let (_, err) = text(&o);
    assert!(o.status.success() && err.contains("trying torch's dynamo exporter"), "{err}");
    assert!(!err.contains("Traceback") && err.lines().count() < 8, "{err}");
    let lineage: Value = serde_json::from_slice(&std::fs::read(dir.join("model/lineage.json")).unwrap()).unwrap();
    assert_eq!(lineage["run"]["facets"]["embeddingPipeline_exporter"]["exporter"], "dynamo", "{lineage}");
    assert_matches("gemma3-bidirectional", &run(dir, "", "out.lance").await, &reference[""]);
    let ours = run(dir, "SET embed.prompt_name = 'query';", "query.lance").await;
    assert_matches("gemma3-bidirectional, query prompt", &ours, &reference["query"]);
}

/// Issue 54: Dropout modules, the identity when sentence-transformers encodes, are left out of the chain (they
/// were refused), before and after a Dense.
#[tokio::test(flavor = "multi_thread")]
async fn dropout_modules_are_the_identity_and_match_sentence_transformers() {
    shape_matches("bert-dropout").await;
}

/// Issue 54: the other encoders its trial matched: DistilBERT (its own configuration names, no token_type_ids),
/// DeBERTa-v2 (relative positions only) and ELECTRA (embeddings narrower than the body, projected).
#[tokio::test(flavor = "multi_thread")]
async fn distilbert_deberta_v2_and_electra_match_sentence_transformers() {
    for shape in ["distilbert-mean", "deberta-v2-mean", "electra-mean"] {
        shape_matches(shape).await;
    }
}

/// Issue 54: without a Normalize module the vectors keep their lengths, as sentence-transformers gives them (the
/// comparison is by cosine, so the lengths are checked apart).
#[tokio::test(flavor = "multi_thread")]
async fn mpnet_without_normalize_keeps_the_lengths_sentence_transformers_gives() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = build_and_export(tmp.path(), "mpnet-plain", &[]);
    let ours = run(tmp.path(), "", "out.lance").await;
    assert_matches("mpnet-plain", &ours, &reference[""]);
    let theirs: Vec<Vec<f32>> = serde_json::from_value(reference[""].clone()).unwrap();
    let length = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert!((length(a) - length(b)).abs() <= 1e-4 * length(b), "text {i}: {} against {}", length(a), length(b));
    }
    assert!(ours.iter().any(|v| (length(v) - 1.0).abs() > 0.01), "some vector is not of unit length");
}

/// Issue 54: the decoders its trial matched, each with last-token pooling under left padding (e5-mistral's and
/// gte-Qwen2's way): Qwen2 (biases on q, k and v), Mistral and Llama.
#[tokio::test(flavor = "multi_thread")]
async fn qwen2_mistral_and_llama_decoders_match_sentence_transformers() {
    for shape in ["qwen2-lasttoken", "mistral-lasttoken", "llama-lasttoken"] {
        shape_matches(shape).await;
    }
}

/// Issue 54: NomicBERT (rotary positions, SwiGLU), which transformers 5 builds without nomic's remote code, with
/// nomic-embed's query and document prompts.
#[tokio::test(flavor = "multi_thread")]
async fn nomic_bert_matches_sentence_transformers_with_each_of_its_prompts() {
    let tmp = shape_and_its_query_prompt_match("nomic-bert-mean").await;
    let ours = run(tmp.path(), "SET embed.prompt_name = 'document';", "document.lance").await;
    assert_matches("nomic-bert-mean, document prompt", &ours, &reference_of(tmp.path())["document"]);
}

/// Issue 54: a causal Gemma3 (a sliding window on every other layer) under last-token pooling, then a Dense chain.
#[tokio::test(flavor = "multi_thread")]
async fn a_causal_gemma3_with_a_dense_chain_matches_sentence_transformers() {
    shape_matches("gemma3-causal-dense").await;
}

/// Issue 54: what the pipeline would refuse of a checkpoint and needs no torch to see is refused before torch
/// loads, naming the user's checkpoint, without a traceback: another model class (a CrossEncoder), a saved
/// truncate_dim, another transformer_task, a chain without Pooling, remote code kept in another repository (gte's;
/// before, a 70-line traceback). Nothing is written.
#[test]
fn the_exporter_refuses_what_needs_no_torch_to_see_naming_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ckpt = dir.join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    std::fs::write(dir.join("texts.jsonl"), "\"a text\"\n").unwrap();
    let chain = r#"[{"path":"","type":"sentence_transformers.models.Transformer"},
                    {"path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#;
    let cases: [(&str, &str, &str, &[&str]); 4] = [
        (
            chain,
            "config_sentence_transformers.json",
            r#"{"model_type": "CrossEncoder"}"#,
            &["CrossEncoder", "reranker"],
        ),
        (
            chain,
            "config_sentence_transformers.json",
            r#"{"truncate_dim": 64}"#,
            &["truncate_dim 64", "embed.truncate_dim"],
        ),
        (chain, "sentence_bert_config.json", r#"{"transformer_task": "fill-mask"}"#, &["transformer_task 'fill-mask'"]),
        (
            r#"[{"path":"","type":"sentence_transformers.models.Transformer"}]"#,
            "sentence_bert_config.json",
            "{}",
            &["no Pooling module"],
        ),
    ];
    let remote = r#"{"auto_map": {"AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
                                  "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"}}"#;
    let cases: Vec<(&str, &str, &str, &[&str])> = cases
        .into_iter()
        .chain([(
            chain,
            "config.json",
            remote,
            &["another repository (Alibaba-NLP/new-impl)", "modeling.py", "configuration.py"][..],
        )])
        .collect();
    for (modules, file, content, says) in cases {
        for name in ["config_sentence_transformers.json", "sentence_bert_config.json", "config.json"] {
            let _ = std::fs::remove_file(ckpt.join(name));
        }
        std::fs::write(ckpt.join("modules.json"), modules).unwrap();
        std::fs::write(ckpt.join(file), content).unwrap();
        let o = export(dir, &[]);
        let (_, err) = text(&o);
        assert!(!o.status.success() && !err.contains("Traceback"), "{content}: {err}");
        assert!(err.contains(&ckpt.canonicalize().unwrap().display().to_string()), "{content}: {err}");
        assert!(says.iter().all(|s| err.contains(s)), "{content}: {err}");
        assert!(!dir.join("model").exists(), "nothing written");
    }
}

/// A checkpoint whose model is its own code (config.json's auto_map, as nomic's and jina's): refused without
/// `--trust-remote-code`, with that advice instead of a traceback, and exported and matched with it.
#[tokio::test(flavor = "multi_thread")]
async fn a_custom_code_checkpoint_exports_only_with_trust_remote_code_and_then_matches() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let reference = build(dir, "bert-remote-code");
    let o = export(dir, &[]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("--trust-remote-code") && !err.contains("Traceback"), "{err}");
    assert!(!dir.join("model").exists(), "nothing written");
    let o = export(dir, &["--trust-remote-code"]);
    let (_, err) = text(&o);
    assert!(o.status.success() && err.contains("verified on"), "{err}");
    let ours = run(dir, "", "out.lance").await;
    assert_matches("bert-remote-code", &ours, &reference[""]);
}
