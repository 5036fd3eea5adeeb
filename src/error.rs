//! The library's error type. Each variant says what went wrong and what the user can do about it.

use std::path::PathBuf;

/// Errors raised by the model, the runtime loader and the Lance side of the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No ONNX Runtime shared library was found in any of the places we look.
    #[error(
        "ONNX Runtime {wanted} was not found (looked in: {tried}). Run `scripts/setup` to install it, \
         or point `--ort-lib` / ORT_DYLIB_PATH at libonnxruntime.so"
    )]
    RuntimeNotFound { wanted: &'static str, tried: String },

    /// A library was found but could not be loaded, or has the wrong version.
    #[error(
        "could not load ONNX Runtime from {path}: {message}. This tool needs ONNX Runtime {wanted}; \
         run `scripts/setup` to install it, or point `--ort-lib` / ORT_DYLIB_PATH at a matching libonnxruntime.so"
    )]
    RuntimeLoad { path: PathBuf, message: String, wanted: &'static str },

    /// The model directory, or a file inside it, is missing or inconsistent.
    #[error("model {}: {message}", model_location(.dir, .file))]
    Model { dir: PathBuf, file: String, message: String },

    /// The requested device cannot be used.
    #[error("embed.device = '{device}': {message}")]
    Device { device: String, message: String },

    /// ONNX Runtime failed while building a session or running the model.
    #[error("ONNX Runtime: {0}")]
    Onnx(String),

    /// The tokenizer failed on an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// A text is longer than `embed.max_tokens` under `embed.truncation = 'error'`. `row` is its
    /// position in the call; the caller names the row.
    #[error(
        "text at row {row} has {tokens} tokens, more than embed.max_tokens = {max_tokens} (embed.truncation = 'error')"
    )]
    TooLong { row: usize, tokens: usize, max_tokens: usize },

    /// A text has nothing to embed, and blank texts are refused. `row` is its position in the call; the caller
    /// names the row.
    #[error("the text at row {row} is blank (empty, or only whitespace or zero-width characters)")]
    BlankText { row: usize },

    /// An `embed.*` option has a value we cannot use.
    #[error("option embed.{key} = '{value}': {message}")]
    Option { key: String, value: String, message: String },

    /// `SET embed.<key>` with a key that does not exist.
    #[error("unknown option embed.{key}: {message}")]
    UnknownOption { key: String, message: String },

    /// A write stopped on request (ctrl-C, SIGTERM) after committing the rows it had finished.
    #[error(
        "interrupted: {rows} rows committed to {uri}{}; run the same job again to resume where it stopped",
        version.map(|v| format!(" (now at version {v})")).unwrap_or_default()
    )]
    Interrupted { uri: String, rows: u64, version: Option<u64> },

    /// A model call was not started because a stop was asked for (ctrl-C, SIGTERM).
    #[error("stopped before the next model call, as asked")]
    Stopped,

    /// Another command holds the dataset's write lock.
    #[error("another {holder} is writing to {uri} (it holds {lock}); {advice}")]
    Busy { uri: String, holder: String, lock: String, advice: String },

    /// A write into a dataset that holds rows, whose query picks its rows after `embed()` (a LIMIT over it, an
    /// aggregate, a window): its done ids could be dropped only after being embedded again.
    #[error(
        "cannot resume the write into {uri}, which holds {rows} rows: {why}, so the rows already written could be \
         left out only after embedding them again; nothing was embedded. Call embed() in the outermost SELECT (for \
         example SELECT id, embed(text) AS embedding FROM (SELECT … LIMIT n)), write to a new output, or SET \
         embed.restart = true to replace its rows"
    )]
    ResumeShape { uri: String, rows: u64, why: String },

    /// A write's output path cannot be written as asked.
    #[error("output {path}: {message}")]
    Output { path: String, message: String },

    /// The ids of a write's output are NULL or repeated.
    #[error("{0}")]
    Ids(String),

    /// A cluster (`--cluster df://…`) cannot be used as given.
    #[error("{0}")]
    Cluster(String),

    /// A Lance dataset could not be opened, read or written.
    #[error("Lance dataset {uri}: {message}")]
    Lance { uri: String, message: String },
}

/// A model directory as every message names it: its absolute path (a relative `embed.model` resolves against
/// the working directory), and the file within it.
fn model_location(dir: &std::path::Path, file: &str) -> String {
    let at = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()).display().to_string();
    if file.is_empty() { at } else { format!("{at}, file {file}") }
}

impl Error {
    pub(crate) fn model(dir: impl Into<PathBuf>, file: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Model { dir: dir.into(), file: file.into(), message: message.into() }
    }
}

impl From<ort::Error> for Error {
    fn from(e: ort::Error) -> Self {
        Self::Onnx(e.to_string())
    }
}

impl From<Error> for datafusion::error::DataFusionError {
    fn from(e: Error) -> Self {
        datafusion::error::DataFusionError::External(Box::new(e))
    }
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
