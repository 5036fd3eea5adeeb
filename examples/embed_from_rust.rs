//! Using the library from Rust: a session, a SQL query with `embed`, and the vectors as Arrow.
//!
//! Run from the repository root after `scripts/setup`:
//!     cargo run --example embed_from_rust

#![allow(clippy::print_stdout, clippy::print_stderr)] // a program that reports what it measured

use datafusion::arrow::util::pretty::pretty_format_batches;
use embedding_pipeline::EmbedSession;

#[tokio::main]
async fn main() -> datafusion::error::Result<()> {
    let session = EmbedSession::new()?;
    let ctx = session.context();
    ctx.sql("CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'examples/data/fortunes.jsonl'").await?;
    let batches = ctx
        .sql("SELECT id, array_length(embed(text)) AS dims, embed_dim() AS model_dim FROM docs LIMIT 3")
        .await?
        .collect()
        .await?;
    println!("{}", pretty_format_batches(&batches)?);
    let stats = session.metrics().embed_stats();
    println!("{} documents, {} useful tokens", stats.docs, stats.useful_tokens);
    Ok(())
}
