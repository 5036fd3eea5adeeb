//! embedding-pipeline: embedding campaigns over text corpora with SQL, into versioned Lance datasets.
//!
//! The crate is laid out by the outside library each part talks to:
//! - [`campaign`]: the fingerprint that makes vectors comparable, and per-run records.
//! - [`model`]: ONNX Runtime (through `ort`) and `tokenizers`; no DataFusion.
//! - [`udf`]: the `embed(text)` DataFusion function, which talks to the model through [`model::TextEmbedder`].
//! - [`plan`]: the length-ordering stage ahead of `embed()` in the physical plan.
//! - [`lance`]: Lance tables (`STORED AS LANCE`) and the streaming Lance sink behind `COPY … STORED AS LANCE`.
//! - [`sources`]: JSON lines folders (`.jsonl`, `.ndjson`) as `STORED AS JSON` tables.
//! - [`memory`]: the process's memory from `/proc` (peaks for probes and run records), and sizes.
//! - [`session`]: a DataFusion session with all of the above registered.
//! - [`script`]: splitting a `.sql` job file into statements with their line numbers.
//! - [`cluster`]: the Ballista scheduler and executor processes, and what crosses between them.
//! - [`cli`]: the `pipeline` command.

pub mod campaign;
pub mod cli;
pub mod cluster;
pub mod error;
pub mod lance;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod options;
pub mod plan;
pub mod script;
pub mod search;
pub mod session;
pub mod sources;
pub mod stores;
pub mod udf;

pub use error::{Error, Result};
pub use options::EmbedOptions;
pub use session::EmbedSession;
