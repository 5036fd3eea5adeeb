//! Criterion benchmark of the batch planner: ordering rows by token length and cutting token-budget
//! batches, on synthetic lengths shaped like a real corpus (many short rows, a long tail).

#![allow(clippy::print_stdout, clippy::print_stderr)] // a program that reports what it measured

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use embedding_pipeline::model::batching::plan_batches;

/// Deterministic lengths: mostly 10-120 tokens, one row in 20 at the 256-token cap.
fn lengths(n: usize) -> Vec<usize> {
    (0..n).map(|i| if i % 20 == 0 { 256 } else { 10 + (i * 7919) % 110 }).collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_batches");
    for n in [1_024usize, 8_192] {
        let l = lengths(n);
        for budget in [2_048usize, 8_192] {
            group.bench_with_input(BenchmarkId::new(format!("budget{budget}"), n), &l, |b, l| {
                b.iter(|| plan_batches(l, budget, 256))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
