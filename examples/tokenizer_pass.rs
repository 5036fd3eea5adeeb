//! The host's ceiling for the benchmarks: one bare pass of Hugging Face `tokenizers` over a corpus's texts, with
//! the truncation the pipeline applies and no padding, timing only `encode_batch_fast` (the texts are read first).
//! No ordering, no model, no Arrow, no Lance: what the pipeline's host path is measured against (`benches/run.sh
//! ceiling`).
//!
//!     cargo run --example tokenizer_pass -- CORPUS.jsonl [MODEL_DIR] [MAX_TOKENS]
//!
//! Threads: the tokenizer's own (rayon, one per core the process may use; `taskset -c 0` for one).
//!
//! Prints one JSON line: texts, tokens, seconds, tokens/s, threads.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a program that reports what it measured

use std::io::BufRead;
use std::path::Path;
use std::time::Instant;

use tokenizers::{Tokenizer, TruncationParams};

/// Texts encoded per call: the pipeline counts a slice of this many at a time.
const AT_ONCE: usize = 1024;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().collect();
    let corpus = args.get(1).ok_or("usage: tokenizer_pass CORPUS.jsonl [MODEL_DIR] [MAX_TOKENS]")?;
    let model = args.get(2).cloned().unwrap_or_else(|| "models/all-MiniLM-L6-v2".into());
    let max_tokens: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(256);

    let texts: Vec<String> = std::io::BufReader::new(std::fs::File::open(corpus)?)
        .lines()
        .map(|l| -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
            let v: serde_json::Value = serde_json::from_str(&l?)?;
            Ok(v["text"].as_str().unwrap_or_default().to_string())
        })
        .collect::<Result<_, _>>()?;

    let mut tokenizer = Tokenizer::from_file(Path::new(&model).join("tokenizer.json"))?;
    tokenizer.with_truncation(Some(TruncationParams { max_length: max_tokens, ..Default::default() }))?;
    tokenizer.with_padding(None);

    let pipeline = args.get(4).is_some_and(|m| m == "pipeline");
    let ours = embedding_pipeline::model::tokenize::TextTokenizer::from_file(
        &Path::new(&model).join("tokenizer.json"),
        Path::new(&model),
    )?;
    let started = Instant::now();
    let mut tokens = 0usize;
    for share in texts.chunks(AT_ONCE) {
        let share: Vec<&str> = share.iter().map(String::as_str).collect();
        if pipeline {
            let side = embedding_pipeline::model::TruncationSide::Right;
            tokens += ours.tokenize(&share, max_tokens, side)?.iter().map(|t| t.ids.len()).sum::<usize>();
        } else {
            tokens += tokenizer.encode_batch_fast(share, true)?.iter().map(|e| e.len()).sum::<usize>();
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{}",
        serde_json::json!({
            "texts": texts.len(),
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_second": tokens as f64 / seconds,
            "threads": threads,
        })
    );
    Ok(())
}
