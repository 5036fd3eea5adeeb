//! The model path against known answers: the sentence-transformers README similarity matrix.

use std::path::{Path, PathBuf};

use crate::common::{cosine, model_dir, norm, session, session_on, sql, vectors};

const SENTENCES: &str = "SELECT embed(column1) AS v FROM (VALUES ('The weather is lovely today.'), ('It''s so sunny outside!'), ('He drove to the stadium.'))";
/// similarity(0,1), (0,2), (1,2) as the sentence-transformers README prints them.
const EXPECTED: [f32; 3] = [0.6660, 0.1046, 0.1411];

async fn similarities(session: &embedding_pipeline::EmbedSession) -> [f32; 3] {
    let v: Vec<Vec<f32>> =
        vectors(&sql(session, SENTENCES).await.unwrap(), "v").into_iter().map(Option::unwrap).collect();
    for x in &v {
        assert_eq!(x.len(), 384);
        assert!((norm(x) - 1.0).abs() < 1e-5, "not unit norm: {}", norm(x));
    }
    [cosine(&v[0], &v[1]), cosine(&v[0], &v[2]), cosine(&v[1], &v[2])]
}

#[tokio::test]
async fn int8_model_reproduces_the_similarity_matrix() {
    let got = similarities(&session()).await;
    for (g, e) in got.iter().zip(EXPECTED) {
        assert!((g - e).abs() <= 0.005, "got {got:?}, expected {EXPECTED:?} within 0.005");
    }
}

#[tokio::test]
async fn fp32_model_reproduces_the_similarity_matrix_closely() {
    let got = similarities(&session_on(&fp32_model_dir())).await;
    for (g, e) in got.iter().zip(EXPECTED) {
        assert!((g - e).abs() <= 0.0005, "got {got:?}, expected {EXPECTED:?} within 0.0005");
    }
}

/// The float32 export of the default model, which `scripts/setup --models` makes (scripts/test runs it).
fn fp32_model_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2-fp32");
    assert!(dir.join("onnx/model.onnx").is_file(), "{} is missing: run scripts/setup --models first", dir.display());
    dir
}

/// Copy a model directory's tokenizer and configs, without its ONNX graph.
pub fn copy_configs(from: &Path, to: &Path) {
    for f in ["tokenizer.json", "config.json", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json"] {
        let dest = to.join(f);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(from.join(f), dest).unwrap();
    }
}

#[tokio::test]
async fn null_gives_null_and_empty_gives_a_vector() {
    let s = session();
    let b = sql(&s, "SELECT embed(column1) AS v FROM (VALUES ('a sentence'), (NULL), (''))").await.unwrap();
    let v = vectors(&b, "v");
    assert!(v[0].is_some());
    assert!(v[1].is_none(), "NULL text must give a NULL vector");
    let empty = v[2].as_ref().expect("an empty string gives a vector");
    assert!((norm(empty) - 1.0).abs() < 1e-5);
    let stats = s.metrics().embed_stats();
    assert_eq!((stats.docs, stats.nulls), (2, 1));
}

#[tokio::test]
async fn every_string_type_gives_the_same_vector() {
    let s = session();
    let b = sql(
        &s,
        "SELECT embed(t) AS a, embed(CAST(t AS VARCHAR)) AS b, embed(arrow_cast(t, 'LargeUtf8')) AS c, \
                embed(arrow_cast(t, 'Utf8View')) AS d, arrow_typeof(arrow_cast(t, 'Utf8View')) AS ty \
         FROM (VALUES ('Lance stores vectors.')) AS x(t)",
    )
    .await
    .unwrap();
    let a = vectors(&b, "a")[0].clone().unwrap();
    for col in ["b", "c", "d"] {
        assert_eq!(vectors(&b, col)[0].as_ref().unwrap(), &a, "column {col}");
    }
}

#[tokio::test]
async fn a_vector_does_not_depend_on_its_batch_neighbours() {
    let s = session();
    let alone = vectors(&sql(&s, "SELECT embed('He drove to the stadium.') AS v").await.unwrap(), "v");
    let long = "word ".repeat(300);
    let batch = vectors(
        &sql(&s, &format!("SELECT embed(t) AS v FROM (VALUES ('He drove to the stadium.'), ('{long}')) AS x(t)"))
            .await
            .unwrap(),
        "v",
    );
    let (a, b) = (alone[0].as_ref().unwrap(), batch[0].as_ref().unwrap());
    assert!(cosine(a, b) > 0.99999, "cosine {}", cosine(a, b));
}

#[tokio::test]
async fn long_texts_are_truncated_and_counted() {
    let s = session();
    sql(&s, "SET embed.max_tokens = 16").await.unwrap();
    // 40 words of one token each, plus [CLS] and [SEP]: 42 tokens, cut to 16.
    let text = "cat ".repeat(40);
    sql(&s, &format!("SELECT embed(t) AS v FROM (VALUES ('{text}'), ('short')) AS x(t)")).await.unwrap();
    let stats = s.metrics().embed_stats();
    assert_eq!(stats.truncated_docs, 1);
    assert_eq!(stats.dropped_tokens, 42 - 16);
    assert_eq!(stats.useful_tokens, 16 + 3);
    assert_eq!(stats.processed_tokens, 32, "both rows in one call, padded to 16");
}

#[tokio::test]
async fn a_float16_model_is_converted_to_float32_before_pooling() {
    // tests/fixtures/fp16-tiny: last_hidden_state = float16(input_ids) * W, so the mean-pooled,
    // normalised vector of any text is W / |W|.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fp16-tiny");
    let tmp = tempfile::tempdir().unwrap();
    for f in ["modules.json", "1_Pooling/config.json", "sentence_bert_config.json", "config.json", "onnx/model.onnx"] {
        std::fs::create_dir_all(tmp.path().join(f).parent().unwrap()).unwrap();
        std::fs::copy(fixture.join(f), tmp.path().join(f)).unwrap();
    }
    std::fs::copy(model_dir().join("tokenizer.json"), tmp.path().join("tokenizer.json")).unwrap();
    let b = sql(
        &session_on(tmp.path()),
        "SELECT embed(t) AS v FROM (VALUES ('hello world'), ('a longer text to embed')) AS x(t)",
    )
    .await
    .unwrap();
    let w = [0.5f32, -1.0, 0.25, 2.0, -0.75, 1.5, 0.125, -0.5];
    let n = norm(&w);
    for v in vectors(&b, "v") {
        let v = v.unwrap();
        assert_eq!(v.len(), 8);
        for (got, want) in v.iter().zip(w.iter().map(|x| x / n)) {
            assert!((got - want).abs() < 1e-3, "{v:?}");
        }
    }
    let mut options = embedding_pipeline::EmbedOptions::default();
    options.model = tmp.path().display().to_string();
    let (_, fingerprint) = embedding_pipeline::campaign::Fingerprint::for_options(&options).unwrap();
    assert_eq!(fingerprint.model_dtype, "float16", "the fingerprint records the weights' type");
}

#[test]
fn the_fingerprint_records_the_weight_type_of_the_int8_and_fp32_models() {
    use embedding_pipeline::model::onnx_weights::weight_types;
    let int8 = weight_types(&model_dir().join("onnx/model.onnx")).unwrap();
    assert_eq!(int8.dominant(), "int8");
    assert!(int8.0["float32"] > 0, "layer norms and biases stay float32: {int8:?}");
    assert_eq!(weight_types(&fp32_model_dir().join("onnx/model.onnx")).unwrap().dominant(), "float32");
    let not_onnx = weight_types(&model_dir().join("tokenizer.json")).unwrap_err();
    assert!(not_onnx.contains("not an ONNX model"), "{not_onnx}");
}

#[test]
fn several_sessions_share_the_batches_and_give_the_same_vectors() {
    use embedding_pipeline::model::{Placement, TextEmbedder, registry};
    let texts: Vec<String> = (0..120).map(|i| format!("document number {i} {}", "word ".repeat(i % 13))).collect();
    let texts: Vec<Option<&str>> = texts.iter().map(|t| Some(t.as_str())).collect();
    let mut options = embedding_pipeline::EmbedOptions::default();
    options.batch_tokens = 48; // many small batches, so that both sessions surely get some
    let (settings, _) = embedding_pipeline::campaign::Fingerprint::for_options(
        &options.clone().with_model(model_dir().display().to_string()),
    )
    .unwrap();
    let one = registry::get_or_load(&model_dir(), Placement::cpu(1)).unwrap();
    let two = registry::get_or_load(&model_dir(), Placement { sessions_per_device: 2, ..Placement::cpu(1) }).unwrap();
    let progress = std::sync::Mutex::new((0u64, 0u64));
    let a = one.embed(&texts, &settings).unwrap();
    let b = two
        .embed_with_progress(
            &texts,
            &settings,
            &|docs, tokens| {
                let mut p = progress.lock().unwrap();
                p.0 += docs;
                p.1 += tokens;
            },
            &|| false,
        )
        .unwrap();
    assert_eq!(a.vectors, b.vectors, "the same vectors whichever session ran each batch");
    assert_eq!(a.stats.model_calls, b.stats.model_calls);
    assert_eq!(*progress.lock().unwrap(), (120, b.stats.useful_tokens), "progress saw every batch once");
    let calls = two.calls_per_session();
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|(device, n)| device == "cpu" && *n > 0), "both sessions took batches: {calls:?}");
    assert_eq!(calls.iter().map(|(_, n)| n).sum::<u64>(), b.stats.model_calls);
}

#[test]
fn a_profiled_probe_batch_shows_where_the_real_work_runs() {
    use embedding_pipeline::model::{ModelSpec, Placement, node_placement};
    let spec = ModelSpec::load(model_dir()).unwrap();
    // On the CPU, judged as the CPU run it is: every node on the CPU provider, nothing fell back.
    let cpu = node_placement(&spec, &Placement::cpu(1), "CPUExecutionProvider").unwrap();
    let nodes = cpu.nodes_per_provider["CPUExecutionProvider"];
    assert!(nodes > 50, "{cpu:?}");
    assert_eq!(cpu.nodes_per_provider.len(), 1);
    assert!(cpu.refusal("CPUExecutionProvider").is_none());
    // Judged as a CUDA run would be, the same profile names the model's real work as a fallback (the
    // matrix products among it) and leaves the shape arithmetic alone: what a CUDA run with a provider
    // that took none of the model would be refused with.
    let as_cuda = node_placement(&spec, &Placement::cpu(1), "CUDAExecutionProvider").unwrap();
    assert!(as_cuda.fallback_nodes.iter().any(|n| n.starts_with("MatMul")), "{as_cuda:?}");
    assert!(as_cuda.fallback_nodes.iter().all(|n| !n.starts_with("Shape")), "{as_cuda:?}");
    assert!((as_cuda.fallback_nodes.len() as u64) < nodes, "shape arithmetic is not counted");
    let refusal = as_cuda.refusal("CUDAExecutionProvider").unwrap();
    assert!(refusal.contains("embed.allow_cpu_fallback = true"), "{refusal}");
}

#[test]
fn mean_pooling_in_the_graph_equals_pooling_on_the_host() {
    use embedding_pipeline::model::onnx_pooling::{POOLED_OUTPUT, output_names, with_mean_pooling};
    use embedding_pipeline::model::{Pooling, runtime};
    use ort::value::Tensor;
    let bytes = std::fs::read(model_dir().join("onnx/model.onnx")).unwrap();
    assert!(output_names(&bytes).unwrap().contains(&"last_hidden_state".to_string()));
    let pooled = with_mean_pooling(&bytes, "last_hidden_state").unwrap().expect("opset 17, no external data");
    let mut session =
        ort::session::Session::builder(runtime::environment().unwrap()).unwrap().commit_from_memory(&pooled).unwrap();
    // Two rows of 6 tokens, the second padded after 3: the mask must keep padding out of the mean.
    let ids = vec![101i64, 7592, 2088, 2003, 2307, 102, 101, 7592, 102, 0, 0, 0];
    let mask: Vec<i64> = ids.iter().enumerate().map(|(i, id)| i64::from(*id != 0 || i % 6 == 0)).collect();
    let outputs = session
        .run(ort::inputs![
            "input_ids" => Tensor::from_array(([2usize, 6], ids.clone())).unwrap(),
            "attention_mask" => Tensor::from_array(([2usize, 6], mask.clone())).unwrap(),
            "token_type_ids" => Tensor::from_array(([2usize, 6], vec![0i64; 12])).unwrap(),
        ])
        .unwrap();
    let (_, states) = outputs["last_hidden_state"].try_extract_tensor::<f32>().unwrap();
    let (shape, in_graph) = outputs[POOLED_OUTPUT].try_extract_tensor::<f32>().unwrap();
    assert_eq!(**shape, [2, 384]);
    for r in 0..2 {
        let mut host = vec![0.0; 384];
        Pooling::MEAN.pool_row(&states[r * 6 * 384..(r + 1) * 6 * 384], &mask[r * 6..(r + 1) * 6], 384, &mut host);
        let diff = host.iter().zip(&in_graph[r * 384..(r + 1) * 384]).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(diff < 1e-5, "row {r}: max difference {diff}");
    }
}

#[test]
fn a_bound_run_equals_a_plain_run_and_a_gpu_feed_without_pinned_memory_says_why() {
    use embedding_pipeline::model::feed::{Feed, InputMemory};
    use embedding_pipeline::model::onnx_pooling::{POOLED_OUTPUT, with_mean_pooling};
    use embedding_pipeline::model::runtime;
    use ort::session::{Session, SessionOutputs};
    use ort::value::Tensor;
    let bytes = std::fs::read(model_dir().join("onnx/model.onnx")).unwrap();
    let pooled = with_mean_pooling(&bytes, "last_hidden_state").unwrap().unwrap();
    let mut session = Session::builder(runtime::environment().unwrap()).unwrap().commit_from_memory(&pooled).unwrap();
    // Two batches of different shapes: 2 rows of 6 tokens (the second padded after 3), and 1 row of 3.
    let ids_a = vec![101i64, 7592, 2088, 2003, 2307, 102, 101, 7592, 102, 0, 0, 0];
    let mask_a: Vec<i64> = ids_a.iter().enumerate().map(|(i, id)| i64::from(*id != 0 || i % 6 == 0)).collect();
    let batches = [(2usize, 6usize, ids_a, mask_a), (1, 3, vec![101, 2088, 102], vec![1, 1, 1])];
    let mut expected = Vec::new();
    for (rows, len, ids, mask) in &batches {
        let plain = session
            .run(ort::inputs![
                "input_ids" => Tensor::from_array(([*rows, *len], ids.clone())).unwrap(),
                "attention_mask" => Tensor::from_array(([*rows, *len], mask.clone())).unwrap(),
                "token_type_ids" => Tensor::from_array(([*rows, *len], vec![0i64; rows * len])).unwrap(),
            ])
            .unwrap();
        let out = |name: &str| plain[name].try_extract_tensor::<f32>().unwrap().1.to_vec();
        expected.push([("last_hidden_state", out("last_hidden_state")), (POOLED_OUTPUT, out(POOLED_OUTPUT))]);
    }

    // A CPU session fed as if it ran on GPU 0 has no pinned allocator: the feed says why and falls back
    // to ordinary host memory. A feed whose inputs come from one of the session's own allocators (on a
    // GPU the pinned one; here the CPU's) takes the allocator path. All three give the plain runs'
    // outputs bit for bit, whichever output is asked for, as the batch shape changes from call to call.
    let host = Feed::new(&session, None).unwrap();
    assert_eq!(*host.memory(), InputMemory::Host);
    let gpu = Feed::new(&session, Some(0)).unwrap();
    let InputMemory::PinnedUnavailable(why) = gpu.memory() else { panic!("{:?}", gpu.memory()) };
    assert!(why.contains("No requested allocator available"), "{why}");
    assert!(gpu.memory().describe().starts_with("pageable host memory (no pinned allocator: "));
    let cpu_allocator = ort::memory::Allocator::new(
        &session,
        ort::memory::MemoryInfo::new(
            ort::memory::AllocationDevice::CPU,
            0,
            ort::memory::AllocatorType::Device,
            ort::memory::MemoryType::Default,
        )
        .unwrap(),
    )
    .unwrap();
    let allocated = Feed::with_input_allocator(&session, cpu_allocator).unwrap();
    assert!(
        matches!(allocated.memory(), InputMemory::Allocator { device, .. } if device == "Cpu"),
        "{:?}",
        allocated.memory()
    );
    let read = |o: &SessionOutputs<'_>| {
        assert_eq!(o.len(), 1, "only the bound output comes back");
        Ok(o[0].try_extract_tensor::<f32>()?.1.to_vec())
    };
    for mut feed in [host, gpu, allocated] {
        let mut run = |b: usize, output: &str, names: [&str; 3]| {
            let (rows, len, ids, mask) = &batches[b];
            let ids_t = feed.input(*rows, *len, |d| d.copy_from_slice(ids)).unwrap();
            let mask_t = feed.input(*rows, *len, |d| d.copy_from_slice(mask)).unwrap();
            let types_t = feed.input(*rows, *len, |_| {}).unwrap();
            assert!(types_t.try_extract_tensor::<i64>().unwrap().1.iter().all(|v| *v == 0), "inputs start zeroed");
            let all = [(names[0], &ids_t), (names[1], &mask_t), (names[2], &types_t)];
            let inputs: Vec<_> = all.into_iter().filter(|(n, _)| !n.is_empty()).collect();
            // The run's own time comes back beside what was read.
            feed.run(&mut session, &inputs, output, read).map(|(out, ran)| {
                assert!(ran > std::time::Duration::ZERO);
                out
            })
        };
        let names = ["input_ids", "attention_mask", "token_type_ids"];
        for (b, o) in [(0, 1), (1, 0), (0, 0), (1, 1), (0, 1)] {
            let (name, want) = &expected[b][o];
            assert_eq!(&run(b, name, names).unwrap(), want, "batch {b}, {name}");
        }
        // Each call starts from an empty binding: an input left out is missing, not the last call's.
        let err = run(1, POOLED_OUTPUT, ["input_ids", "attention_mask", ""]).unwrap_err();
        assert!(err.to_string().contains("token_type_ids"), "{err}");
        // An output or input the model lacks is an error, and the feed works again after each.
        let err = run(1, "no_such_output", names).unwrap_err();
        assert!(err.to_string().contains("no_such_output"), "{err}");
        let err = run(1, POOLED_OUTPUT, ["input_ids", "no_such_input", "token_type_ids"]).unwrap_err();
        assert!(err.to_string().contains("no_such_input"), "{err}");
        assert_eq!(run(0, POOLED_OUTPUT, names).unwrap(), expected[0][1].1);
    }
}

/// A stop asked between model calls: the call running finishes, no other starts, and the result says
/// it stopped.
#[test]
fn a_stop_request_starts_no_further_model_call() {
    use embedding_pipeline::model::{Placement, TextEmbedder, registry};
    use std::sync::atomic::{AtomicU64, Ordering};
    let texts: Vec<String> = (0..64).map(|i| format!("sentence number {i} about stopping")).collect();
    let texts: Vec<Option<&str>> = texts.iter().map(|t| Some(t.as_str())).collect();
    let mut options = embedding_pipeline::EmbedOptions::default();
    options.batch_tokens = 48; // about 16 calls
    let (settings, _) =
        embedding_pipeline::campaign::Fingerprint::for_options(&options.with_model(model_dir().display().to_string()))
            .unwrap();
    let embedder = registry::get_or_load(&model_dir(), Placement::cpu(1)).unwrap();
    let (done, asked) = (AtomicU64::new(0), AtomicU64::new(0));
    let err = embedder
        .embed_with_progress(
            &texts,
            &settings,
            &|_, _| {
                done.fetch_add(1, Ordering::SeqCst);
            },
            &|| {
                asked.fetch_add(1, Ordering::SeqCst);
                done.load(Ordering::SeqCst) >= 2
            },
        )
        .unwrap_err();
    assert!(matches!(err, embedding_pipeline::Error::Stopped), "{err}");
    assert_eq!((done.load(Ordering::SeqCst), asked.load(Ordering::SeqCst)), (2, 3), "asked before every call");
}
