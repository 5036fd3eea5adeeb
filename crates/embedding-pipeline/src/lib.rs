//! embedding-pipeline: embedding campaigns over text corpora with SQL, into versioned Lance datasets.
//!
//! The crate is laid out by the outside library each part talks to:
//! - [`campaign`]: the fingerprint that makes vectors comparable, per-run records, the work plan, and what a session
//!   has done so far ([`campaign::metrics`]).
//! - [`process`]: a session's request to stop ([`process::interrupt::StopToken`], which ctrl-C and SIGTERM make) and
//!   the process's memory.
//! - [`search`]: a dataset's nearest rows to a query embedded under its fingerprint (`pipeline search`,
//!   `embed_search()`).
//! - [`uri`]: which locations this build reads and writes (local paths, `s3://`).
//! - [`model`]: ONNX Runtime (through `ort`) and `tokenizers`; no DataFusion.
//! - [`udf`]: the `embed(text)` DataFusion function, which talks to the model through [`model::TextEmbedder`].
//! - [`exec`]: the write path's execution nodes: the length-ordering stage ahead of `embed()`, a plan's work
//!   list, `embed()` a model call at a time, and the optimizer rule that places them; and its planning pieces:
//!   resume's rule and the done ids it joins against, and the checks every write passes when planned.
//! - [`lance`]: Lance readers and writers: tables (`STORED AS LANCE`), the streaming sink behind `COPY … STORED AS
//!   LANCE`, where a write goes, the write lock, and what a dataset records of its history ([`lance::records`]).
//! - [`session`]: a DataFusion session with all of the above registered, and what it reads through: folders of
//!   JSON lines ([`session::sources`]) and object stores ([`session::stores`]).
//! - [`cluster`]: the Ballista scheduler and executor processes, and what crosses between them.
//! - [`ops`]: the campaign operations, one per command (run, plan, probe, trial, cost, lineage, verify, evaluate,
//!   the report page, search, compare, inspect, index and optimize, devices, the model checks, texts embedded
//!   directly) as a library: typed settings in, a typed report out, progress
//!   told to a [`ops::Reporter`]; and a job's text split into statements ([`ops::script`]).
//!
//! The `pipeline` command (the repository's root crate) parses arguments, calls [`ops`] and prints what they
//! return; the Python package (python/) calls the same operations. [`cluster`] is built with the `cluster` feature,
//! which the command turns on (and the Python package, so that the two share one build of the stack); a Rust
//! program that needs no cluster leaves it off, and builds no Ballista.

pub mod campaign;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod error;
pub mod exec;
pub mod lance;
pub mod model;
pub mod ops;
pub mod options;
pub mod process;
pub mod search;
pub mod session;
pub mod udf;
pub mod uri;

pub use error::{Error, Result};
pub use options::EmbedOptions;
pub use session::EmbedSession;

/// The log without -v: warnings, less Lance's note that a COPY creates a new dataset (the command's and the
/// Python package's).
pub const QUIET_LOGS: &str = "warn,lance::dataset::write::insert=error";
