//! `pipeline evaluate DATASET[@VERSION]… (--queries Q.jsonl --qrels QRELS.tsv | --pairs PAIRS.jsonl)`: the
//! retrieval scores of [`embedding_pipeline::ops::evaluate`], printed side by side (or as JSON).

use std::path::PathBuf;

use super::ExitStatus;
use super::args::{Columns, Runtime};
use super::printer::{Printer, out, out_text};
use embedding_pipeline::ops::evaluate::{EvaluateReport, evaluate, read_pairs, read_queries_and_qrels};

/// `pipeline evaluate`'s arguments.
#[derive(Debug, clap::Args)]
pub struct EvaluateArgs {
    /// Lance datasets (`path`, `path@version` or `path@tag`), shown side by side.
    #[arg(required = true)]
    datasets: Vec<String>,
    /// Held-out queries, JSON lines with `id` (or `_id`) and `text` (BEIR's queries.jsonl).
    #[arg(long, value_name = "FILE", requires = "qrels", conflicts_with = "pairs")]
    queries: Option<PathBuf>,
    /// Relevance judgements: `query-id corpus-id score` per line (BEIR's qrels TSV; TREC's four columns too).
    #[arg(long, value_name = "FILE", requires = "queries")]
    qrels: Option<PathBuf>,
    /// Held-out pairs instead: JSON lines with `query` and the relevant document's `id`.
    #[arg(long, value_name = "FILE")]
    pairs: Option<PathBuf>,
    /// Cut-offs of recall (comma-separated).
    #[arg(short, long = "k", value_delimiter = ',', default_values_t = [1, 5, 10, 100])]
    ks: Vec<usize>,
    /// Embed the queries with this prompt of the model (e5's `query`), not the documents' own.
    #[arg(long, value_name = "NAME")]
    query_prompt: Option<String>,
    /// The model directory, where the run records do not name it (one dataset only).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// With two datasets of the same ids: compare each sampled id's K nearest neighbours in both.
    #[arg(long, value_name = "K")]
    overlap: Option<usize>,
    /// Ids sampled for --overlap.
    #[arg(long, default_value_t = 200)]
    overlap_sample: usize,
    /// The seed of the --overlap sample.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    columns: Columns,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    runtime: Runtime,
}

/// Score each dataset on the judged queries (or the overlap of two), and print the scores side by side.
pub async fn run(args: EvaluateArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let EvaluateArgs {
        datasets,
        queries,
        qrels,
        pairs,
        ks,
        query_prompt,
        model,
        overlap,
        overlap_sample,
        seed,
        columns: Columns { id_column, column },
        json,
        runtime,
    } = args;
    runtime.apply();
    let judgements = match (queries, qrels, pairs) {
        (Some(q), Some(r), _) => Some(read_queries_and_qrels(&q, &r)?),
        (_, _, Some(p)) => Some(read_pairs(&p)?),
        _ => None,
    };
    let options = embedding_pipeline::ops::evaluate::EvaluateOptions {
        datasets,
        judgements,
        ks,
        model,
        query_prompt,
        id_column,
        column,
        overlap,
        overlap_sample,
        seed,
    };
    let report = evaluate(&options).await?;
    if json {
        out!(printer, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        out_text!(printer, "{}", to_text(&report));
    }
    Ok(ExitStatus::Success)
}

/// The report as the command prints it: one column per dataset.
pub fn to_text(r: &EvaluateReport) -> String {
    let mut out = String::new();
    if let Some(source) = &r.judgements {
        out += &format!(
            "evaluate: {} queries ({} with a relevant document) from {source}; exact cosine over every vector\n",
            r.queries, r.judged
        );
        let width = 12;
        out += &format!("{:<14}", "");
        for i in 0..r.datasets.len() {
            out += &format!("{:>width$}", format!("[{}]", i + 1));
        }
        out += "\n";
        let mut row = |name: String, values: Vec<f64>| {
            out += &format!("{name:<14}");
            for v in values {
                out += &format!("{v:>width$.4}");
            }
            out += "\n";
        };
        for (i, (k, _)) in r.datasets.first().map_or(&[][..], |d| &d.recall[..]).iter().enumerate() {
            row(format!("recall@{k}"), r.datasets.iter().map(|d| d.recall[i].1).collect());
        }
        row("MRR@10".into(), r.datasets.iter().map(|d| d.mrr_at_10).collect());
        row("nDCG@10".into(), r.datasets.iter().map(|d| d.ndcg_at_10).collect());
        for (i, d) in r.datasets.iter().enumerate() {
            out += &format!(
                "[{}] {} (version {}, {} rows): {} (sha256 {}…){}, {:.1} s{}\n",
                i + 1,
                d.dataset,
                d.version,
                d.rows,
                d.model,
                d.model_sha256.get(..12).unwrap_or(&d.model_sha256),
                if d.differs.is_empty() { String::new() } else { format!("; against [1]: {}", d.differs.join(", ")) },
                d.seconds,
                if d.relevant_missing > 0 {
                    format!("; {} relevant documents are not in it (counted as not retrieved)", d.relevant_missing)
                } else {
                    String::new()
                }
            );
        }
    }
    if let Some(o) = &r.overlap {
        out += &format!(
            "neighbour overlap@{}: {:.4} mean, {:.4} least, over {} sampled ids (seed {}){}\n",
            o.k,
            o.mean,
            o.min,
            o.sampled,
            o.seed,
            if o.not_in_second > 0 {
                format!("; {} sampled ids not in the second", o.not_in_second)
            } else {
                String::new()
            }
        );
    }
    out
}
