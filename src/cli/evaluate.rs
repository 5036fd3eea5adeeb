//! `pipeline evaluate DATASET[@VERSION]… (--queries Q.jsonl --qrels QRELS.tsv | --pairs PAIRS.jsonl)`: the
//! retrieval scores of [`embedding_pipeline::ops::evaluate`], printed side by side (or as JSON).

use embedding_pipeline::ops::evaluate::{EvaluateArgs, EvaluateReport, evaluate};

/// `pipeline evaluate`.
pub async fn evaluate_command(args: &EvaluateArgs, json: bool) -> anyhow::Result<()> {
    let report = evaluate(args).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", to_text(&report));
    }
    Ok(())
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
