//! embedding-pipeline: embedding campaigns over text corpora with SQL, into versioned Lance datasets.
//!
//! The crate is laid out by the outside library each part talks to:
//! - [`campaign`]: the fingerprint that makes vectors comparable, and per-run records.
//! - [`model`]: ONNX Runtime (through `ort`) and `tokenizers`; no DataFusion.
//! - [`udf`]: the `embed(text)` DataFusion function, which talks to the model through [`model::TextEmbedder`].
//! - [`exec`]: the write path's execution nodes: the length-ordering stage ahead of `embed()`, a plan's work
//!   list, `embed()` a model call at a time, and the optimizer rule that places them.
//! - [`lance`]: Lance tables (`STORED AS LANCE`), the streaming Lance sink behind `COPY … STORED AS LANCE`, what
//!   a dataset records of its history ([`lance::records`]), and search by a query text ([`lance::search`]).
//! - [`sources`]: JSON lines folders (`.jsonl`, `.ndjson`) as `STORED AS JSON` tables.
//! - [`memory`]: the process's memory from `/proc` (peaks for probes and run records), and sizes.
//! - [`session`]: a DataFusion session with all of the above registered.
//! - [`script`]: splitting a `.sql` job file into statements with their line numbers.
//! - [`cluster`]: the Ballista scheduler and executor processes, and what crosses between them.
//! - [`ops`]: the campaign operations (run, plan, probe, trial, cost, lineage) as a library: typed settings in,
//!   a typed report out, progress told to a [`ops::Reporter`].
//! - [`cli`]: the `pipeline` command: arguments, printing, and the operations not yet in [`ops`].

pub mod campaign;
pub mod cli;
pub mod cluster;
pub mod error;
pub mod exec;
pub mod lance;
pub mod model;
pub mod ops;
pub mod options;
pub mod session;
pub mod udf;

pub use error::{Error, Result};
pub use options::EmbedOptions;
pub use session::EmbedSession;
