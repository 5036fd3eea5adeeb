//! The throughput floor for the benchmarks: the bare ONNX Runtime session on the same token batches the
//! pipeline makes (the sample tokenised and cut by the pipeline's own planner), timing only
//! `Session::run`: no tokenising, no Arrow, no Lance, no pooling.
//!
//!     cargo run --example bare_session -- CORPUS.jsonl N [MODEL_DIR] [BATCH_TOKENS] [THREADS] [DEVICE]
//!
//! DEVICE is `cpu` (default) or `cuda:N`: ONNX Runtime's CUDA provider on that GPU, as the pipeline
//! registers it.
//!
//! Prints one JSON line: documents, useful and processed tokens, seconds in the model, useful tokens/s.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a program that reports what it measured

use std::io::BufRead;
use std::path::Path;
use std::time::Instant;

use embedding_pipeline::model::batching::plan_batches;
use embedding_pipeline::model::tokenize::TextTokenizer;
use embedding_pipeline::model::{Device, ModelSpec, TruncationSide, runtime};
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::Tensor;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let corpus = args.get(1).ok_or("usage: bare_session CORPUS.jsonl N [MODEL_DIR] [BATCH_TOKENS] [THREADS]")?;
    let n: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let model = args.get(3).cloned().unwrap_or_else(|| "models/all-MiniLM-L6-v2".into());
    let budget: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(2048);
    let threads: usize = args.get(5).map(|s| s.parse()).transpose()?.unwrap_or(2);
    let device = args.get(6).map(String::as_str).unwrap_or("cpu");
    let gpu: Option<i32> = match Device::parse(device) {
        Some(Device::Cpu) => None,
        Some(Device::Cuda(ids)) if ids.len() == 1 => Some(ids[0]),
        _ => return Err(format!("device {device}: use cpu or cuda:N").into()),
    };

    let texts: Vec<String> = std::io::BufReader::new(std::fs::File::open(corpus)?)
        .lines()
        .take(n)
        .map(|l| {
            Ok::<_, Box<dyn std::error::Error>>(
                serde_json::from_str::<serde_json::Value>(&l?)?["text"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect::<Result<_, _>>()?;
    let spec = ModelSpec::load(&model)?;
    let tokenizer = TextTokenizer::from_file(&spec.tokenizer_path, Path::new(&model))?;
    let strs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let tokens = tokenizer.tokenize(&strs, spec.max_seq_length, TruncationSide::Right)?;
    let lengths: Vec<usize> = tokens.iter().map(|t| t.ids.len()).collect();
    let batches = plan_batches(&lengths, budget, 256);

    let env = runtime::environment()?;
    let mut builder = Session::builder(env)?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(|e| e.to_string())?
        .with_intra_threads(threads)
        .map_err(|e| e.to_string())?;
    if let Some(id) = gpu {
        let cuda = ort::ep::CUDA::default().with_device_id(id).build().error_on_failure();
        builder = builder.with_execution_providers([cuda]).map_err(|e| e.to_string())?;
    }
    let mut session = builder.commit_from_file(&spec.onnx_path)?;
    // Build every input first, so that only the model calls are timed.
    let mut inputs = Vec::new();
    let (mut useful, mut processed) = (0u64, 0u64);
    for b in &batches {
        let (rows, len) = (b.rows.len(), b.padded_len);
        let (mut ids, mut mask) = (vec![0i64; rows * len], vec![0i64; rows * len]);
        for (r, &row) in b.rows.iter().enumerate() {
            for (j, &id) in tokens[row].ids.iter().enumerate() {
                ids[r * len + j] = id as i64;
                mask[r * len + j] = 1;
            }
        }
        useful += b.rows.iter().map(|&r| lengths[r] as u64).sum::<u64>();
        processed += (rows * len) as u64;
        inputs.push(([rows, len], ids, mask));
    }
    type Input = ([usize; 2], Vec<i64>, Vec<i64>);
    let mut run = |(shape, ids, mask): Input| -> Result<(), Box<dyn std::error::Error>> {
        let types = vec![0i64; ids.len()];
        session.run(ort::inputs![
            "input_ids" => Tensor::from_array((shape, ids))?,
            "attention_mask" => Tensor::from_array((shape, mask))?,
            "token_type_ids" => Tensor::from_array((shape, types))?,
        ])?;
        Ok(())
    };
    // One untimed call first: CUDA builds its kernels and memory pools on the first run.
    if let Some(first) = inputs.first().cloned() {
        run(first)?;
    }
    let started = Instant::now();
    for input in inputs {
        run(input)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "documents": texts.len(), "useful_tokens": useful, "processed_tokens": processed,
            "model_calls": batches.len(), "seconds": seconds, "useful_tokens_per_second": useful as f64 / seconds,
            "device": device
        })
    );
    Ok(())
}
