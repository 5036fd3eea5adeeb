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

    /// The model directory, or a file inside it, is missing or inconsistent. `source` is the error beneath, when
    /// there was one (ONNX Runtime's refusal of the file, the file system's); `message` tells it already.
    #[error("model {}: {message}", model_location(.dir, .file))]
    Model {
        dir: PathBuf,
        file: String,
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// The requested device cannot be used. `source` is ONNX Runtime's own error, when it raised one; `message`
    /// tells it already.
    #[error("embed.device = '{device}': {message}")]
    Device {
        device: String,
        message: String,
        #[source]
        source: Option<ort::Error>,
    },

    /// ONNX Runtime failed while building a session or running the model, or the model's output was not what
    /// it promised. `source` is ONNX Runtime's own error, when it raised one (its text is the message).
    #[error("ONNX Runtime: {message}")]
    Onnx {
        message: String,
        #[source]
        source: Option<ort::Error>,
    },

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

    /// An image that cannot be embedded (empty, not an image, broken, too large), at a row of one call.
    #[error("the image at row {row} {why}")]
    BadImage { row: usize, why: String },

    /// An `embed.*` option has a value we cannot use.
    #[error("option embed.{key} = '{value}': {message}")]
    Option { key: String, value: String, message: String },

    /// `SET embed.<key>` with a key that does not exist.
    #[error("unknown option embed.{key}: {message}")]
    UnknownOption { key: String, message: String },

    /// A write stopped on request (ctrl-C, SIGTERM) after committing the rows it had finished. `restarted`: the
    /// write replaced the output's rows (`--restart`, `embed.restart`), so running it the same way again would
    /// replace the rows just committed.
    #[error(
        "interrupted: {rows} rows committed to {uri}{}; {}",
        version.map(|v| format!(" (now at version {v})")).unwrap_or_default(),
        resume_advice(*restarted, *rows, *resumable_by_restart)
    )]
    Interrupted { uri: String, rows: u64, version: Option<u64>, restarted: bool, resumable_by_restart: bool },

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

    /// A write into a dataset that holds rows, whose query chooses its rows by an expression that changes on every
    /// run (`ORDER BY random() LIMIT n`): a resume would add the other rows it chooses to the ones written.
    #[error(
        "cannot resume the write into {uri}, which holds {rows} rows: its query chooses its rows by {what}, which \
         gives other values on every run, so a resume would add other rows to the ones already written; nothing was \
         embedded. Choose them by something that stays the same (ORDER BY md5(id) LIMIT n for a fixed sample, say), \
         write to a new output, or SET embed.restart = true to replace its rows"
    )]
    ResumeChoice { uri: String, rows: u64, what: String },

    /// A write's output path cannot be written as asked.
    #[error("output {path}: {message}")]
    Output { path: String, message: String },

    /// The ids of a write's output are NULL or repeated.
    #[error("{0}")]
    Ids(String),

    /// A cluster (`--cluster df://…`) cannot be used as given.
    #[error("{0}")]
    Cluster(String),

    /// A Lance dataset could not be opened, read or written. `message` says what went wrong in the user's terms;
    /// `source` is the error beneath it, when there was one (Lance's own, the query engine's or the file
    /// system's), for a program to inspect. The message tells it already, so [`chain_text`] stops here: Lance's
    /// raw text names its own source files.
    #[error("Lance dataset {uri}: {message}")]
    Lance {
        uri: String,
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// A campaign operation refused its input before doing the work (or before writing any of it): the message
    /// names what is wrong and says what to do.
    #[error("{0}")]
    Refused(String),

    /// Something that cannot happen did (a worker thread panicked, a column the pipeline adds itself is
    /// missing): not the user's input but a fault of this tool, to report.
    #[error("internal error: {0} (a fault of this tool, not of the input; please report it)")]
    Internal(String),

    /// A job stopped on request (ctrl-C, SIGTERM) between its statements or while a query's result was read.
    #[error("{0}")]
    StoppedAt(String),

    /// One of a job's statements failed. `message` names it (where it came from, its number and line) and
    /// holds the cause's text with its lines counted in the job's file; `cause` is the error itself, when it
    /// was the library's (not a source of this error: its text is in the message already).
    #[error("{message}")]
    Statement { message: String, cause: Option<Box<Error>> },

    /// `source`, met while doing what `context` says ("refusing to search d.lance").
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: Box<Error>,
    },

    /// A file could not be read or written; `context` says which, and what for.
    #[error("{context}")]
    File {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// An I/O error with no more to say than its own text.
    #[error(transparent)]
    Io(#[from] std::io::Error),

    /// The query engine (DataFusion) failed to plan or run a statement.
    #[error(transparent)]
    DataFusion(Box<datafusion::error::DataFusionError>),

    /// Arrow failed to build, cast or write a batch.
    #[error(transparent)]
    Arrow(#[from] datafusion::arrow::error::ArrowError),

    /// Parquet failed to write a file (a plan's work list).
    #[error(transparent)]
    Parquet(#[from] datafusion::parquet::errors::ParquetError),

    /// A JSON document could not be written or read.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// What to run after an interrupted write: the same job. A restart that committed rows is resumed by the job
/// without `--restart`, and with it too where its sources could be checked (`resumable_by_restart`; see
/// `ops::restart`); else `--restart` would replace them again.
fn resume_advice(restarted: bool, rows: u64, resumable_by_restart: bool) -> &'static str {
    match (restarted, rows) {
        (false, _) => "run the same job again to resume where it stopped",
        (true, 0) => "nothing was replaced, the output's rows are as they were; run the same command again to restart",
        (true, _) if !resumable_by_restart => {
            "this run replaced the output's rows (--restart or SET embed.restart = true): to resume it, run the job \
             again without --restart and without SET embed.restart = true (with either, the rows just committed \
             would be replaced again: its sources are not files this machine can check)"
        }
        (true, _) => {
            "this run replaced the output's rows (--restart or SET embed.restart = true): run the same job again to \
             resume it, with or without --restart (a restart of the same query, sources and model resumes the one \
             that stopped; once they change, --restart replaces the rows again)"
        }
    }
}

/// A model directory as every message names it: its absolute path (a relative `embed.model` resolves against
/// the working directory), and the file within it.
fn model_location(dir: &std::path::Path, file: &str) -> String {
    let at = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()).display().to_string();
    if file.is_empty() { at } else { format!("{at}, file {file}") }
}

impl Error {
    /// An ONNX Runtime failure that ONNX Runtime did not raise itself (an output of the wrong shape).
    pub(crate) fn onnx(message: impl Into<String>) -> Self {
        Self::Onnx { message: message.into(), source: None }
    }

    /// A refusal about the Lance dataset at `uri`, with no error beneath it.
    pub(crate) fn lance(uri: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Lance { uri: uri.into(), message: message.into(), source: None }
    }

    /// `source`, met on the Lance dataset at `uri`, told as `message`.
    pub(crate) fn lance_because(
        uri: impl Into<String>,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Lance { uri: uri.into(), message: message.into(), source: Some(Box::new(source)) }
    }

    /// `source`, met on the Lance dataset at `uri`, told in its own words.
    pub(crate) fn lance_from(uri: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::lance_because(uri, source.to_string(), source)
    }

    /// That the device cannot be used, with ONNX Runtime's error when it raised one.
    pub(crate) fn device(device: impl Into<String>, message: impl Into<String>, source: Option<ort::Error>) -> Self {
        Self::Device { device: device.into(), message: message.into(), source }
    }

    /// This error with `source` beneath it, when it is a model error (ONNX Runtime's refusal of the file, say)
    /// that has none yet; any other error as it is.
    pub(crate) fn because(self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        match self {
            Self::Model { dir, file, message, source: None } => {
                Self::Model { dir, file, message, source: Some(Box::new(source)) }
            }
            e => e,
        }
    }

    /// `e` as this crate's error, when it is one: itself, or boxed (a `#[source] Box<Error>` is seen as the box).
    pub fn in_chain<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        e.downcast_ref::<Self>().or_else(|| e.downcast_ref::<Box<Self>>().map(|b| &**b))
    }

    /// Whether this error's message already tells its source in the user's words, so that the source's own text
    /// adds nothing a user should read (see [`chain_text`]).
    fn tells_its_source(&self) -> bool {
        matches!(self, Self::Lance { .. } | Self::Onnx { .. } | Self::Model { .. } | Self::Device { .. })
    }

    pub(crate) fn model(dir: impl Into<PathBuf>, file: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Model { dir: dir.into(), file: file.into(), message: message.into(), source: None }
    }
}

impl From<ort::Error> for Error {
    fn from(e: ort::Error) -> Self {
        Self::Onnx { message: e.to_string(), source: Some(e) }
    }
}

impl From<Error> for datafusion::error::DataFusionError {
    fn from(e: Error) -> Self {
        match e {
            Error::DataFusion(e) => *e,
            e => datafusion::error::DataFusionError::External(Box::new(e)),
        }
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Self::Internal(format!("a worker thread failed: {e}"))
    }
}

impl From<datafusion::error::DataFusionError> for Error {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        Self::DataFusion(Box::new(e))
    }
}

impl Error {
    /// This error, met while doing what `context` says.
    pub fn context(self, context: impl Into<String>) -> Self {
        Self::Context { context: context.into(), source: Box::new(self) }
    }

    /// `source` with what was being done when it happened, e.g. "cannot read the work list …".
    pub fn file(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::File { context: context.into(), source }
    }

    /// This error and its causes as one line, in plain words: each cause whose text is not already shown
    /// is added after a colon (DataFusion's External wrapper displays its source, which the chain would
    /// otherwise report twice). See [`plain`].
    pub fn chain_text(&self) -> String {
        chain_text(self)
    }
}

/// An error and its causes as one line, skipping a cause whose text is already shown, in plain words
/// (see [`plain`]). It ends at an error of this crate that tells its source in its own message (a Lance or ONNX
/// Runtime failure): the source stays reachable through [`std::error::Error::source`] for a program.
pub fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut next = Some(e);
    while let Some(cause) = next {
        let text = plain(&cause.to_string());
        if !out.contains(&text) {
            out = if out.is_empty() { text } else { format!("{out}: {text}") };
        }
        if Error::in_chain(cause).is_some_and(Error::tells_its_source) {
            break;
        }
        next = cause.source();
    }
    out
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// DataFusion's names for the kind of an error, which say nothing a user can act on.
const DATAFUSION_KINDS: [&str; 4] =
    ["External error: ", "Execution error: ", "Error during planning: ", "Schema error: "];

/// A library's error text as a user should read it: without the source locations Lance appends
/// (`…/.cargo/registry/…/commit.rs:653:26`), DataFusion's kind prefixes (`External error: `, `Execution error: `…),
/// or its advice to report a bug in DataFusion for what is a location this version cannot read.
pub fn plain(text: &str) -> String {
    let mut out = text.to_string();
    for kind in DATAFUSION_KINDS {
        out = out.replace(kind, "");
    }
    if let Some(at) = out.find("No suitable object store found for ") {
        let rest = &out[at + "No suitable object store found for ".len()..];
        let url = rest.split(|c: char| c.is_whitespace()).next().unwrap_or_default().trim_end_matches('.');
        out = format!("{url}: this build reads local paths and s3:// only; copy the data to one of them");
    }
    out = out.replace("LanceError(IO): ", "");
    out = s3_reply(&out);
    if let Some(at) = out.find("This issue was likely caused by a bug in DataFusion") {
        out.truncate(at);
    }
    if out.contains("Failed to resolve region") {
        out += "\n(set AWS_REGION for the bucket, and AWS_ENDPOINT for an S3-compatible server other than AWS)";
    }
    // Source locations: whitespace-separated words holding a Cargo registry or toolchain path.
    let is_location = |w: &str| ["/.cargo/registry/", "/.cargo/git/", "/rustc/"].iter().any(|p| w.contains(p));
    let mut kept: Vec<String> = Vec::new();
    for word in out.split(' ') {
        if is_location(word) {
            continue;
        }
        kept.push(with_leading_slash(word));
    }
    let mut out = without_runtime_location(&kept.join(" "));
    // A location list leaves its separators behind: "found: x/_versions, , " or a dangling ", ".
    while out.contains(", ,") {
        out = out.replace(", ,", ",");
    }
    out.trim_end_matches([',', ' ', '\n']).replace(",\n", "\n").trim().to_string()
}

/// object_store names a local file by its path without the leading `/` (`Error when processing CSV file
/// tmp/corpus.csv`, `Not found: tmp/out.lance/_versions`): the `/` is put back on a word that names a path under
/// a folder at the root whose name is not one here.
fn with_leading_slash(word: &str) -> String {
    let core = word.trim_start_matches(['(', '\'', '"', '`']);
    let Some((first, _)) = core.split_once('/') else { return word.to_string() };
    let at_root = std::path::Path::new("/").join(first).is_dir();
    if first.is_empty() || first.contains(':') || !at_root || std::path::Path::new(first).exists() {
        return word.to_string();
    }
    let at = word.len() - core.len();
    format!("{}/{}", &word[..at], &word[at..])
}

/// ONNX Runtime's text without the places in its own source it was raised at: `failed:/onnxruntime_src/…/model.cc:245
/// onnxruntime::Model::Model(onnx::ModelProto&&, …) Missing opset …` becomes `failed: Missing opset …`, and a CUDA
/// call's `… ; file=/onnxruntime_src/…/cuda_execution_provider.cc ; line=282 ; expr=cudaSetDevice(…);` loses its
/// `file=` and `line=` parts.
fn without_runtime_location(text: &str) -> String {
    const AT: &str = "/onnxruntime_src/";
    let mut out = text.to_string();
    while let Some(start) = out.find(AT) {
        let head = out[..start].trim_end();
        // A CUDA call's `file=…` field, with the `line=` that follows it.
        if let Some(head) = head.strip_suffix("file=") {
            let rest = &out[start..];
            let mut tail = rest.find(" ; ").map_or("", |at| &rest[at + 3..]);
            if tail.starts_with("line=") {
                tail = tail.find(" ; ").map_or("", |at| &tail[at + 3..]);
            }
            out = format!("{head}{tail}").trim_end_matches([' ', ';']).to_string();
            continue;
        }
        // A path and the signature of the function that raised it, up to its closing parenthesis (and a template's
        // `[with …]` after it), within the field it is in.
        let rest = &out[start..];
        let field = rest.find(" ; ").unwrap_or(rest.len());
        let closing = |from: usize, open: char, close: char| {
            let mut depth = 0usize;
            rest[from..field].char_indices().find_map(|(i, c)| {
                depth = if c == open {
                    depth + 1
                } else if c == close {
                    depth.saturating_sub(1)
                } else {
                    depth
                };
                (c == close && depth == 0).then_some(from + i + 1)
            })
        };
        let mut end = match rest[..field].find('(') {
            Some(open) => closing(open, '(', ')').unwrap_or(field),
            None => rest.find(' ').unwrap_or(rest.len()).min(field),
        };
        if rest[end..field].trim_start().starts_with("[with ") {
            let open = end + rest[end..].find('[').unwrap_or(0);
            end = closing(open, '[', ']').unwrap_or(end);
        }
        let tail = out[start + end..].trim_start();
        out = if head.ends_with(':') || head.is_empty() { format!("{head} {tail}") } else { format!("{head}: {tail}") };
        out = out.trim_start().to_string();
    }
    out
}

/// An S3 server's XML error reply (and the request that drew it) cut down to its code and message:
/// `… Generic S3 error: Error performing list request: … <Error><Code>NoSuchBucket</Code><Message>The specified
/// bucket does not exist</Message>…</Error>` becomes `S3: NoSuchBucket: The specified bucket does not exist`.
fn s3_reply(text: &str) -> String {
    let between = |s: &str, open: &str, close: &str| -> Option<(usize, String)> {
        let start = s.find(open)? + open.len();
        let len = s[start..].find(close)?;
        Some((start, s[start..start + len].to_string()))
    };
    let (Some((_, code)), Some((_, message))) =
        (between(text, "<Code>", "</Code>"), between(text, "<Message>", "</Message>"))
    else {
        return text.to_string();
    };
    let Some(end) = text.find("</Error>").map(|i| i + "</Error>".len()) else { return text.to_string() };
    let start = ["Object Store error: ", "Generic S3 error: "]
        .iter()
        .filter_map(|m| text.find(m))
        .min()
        .or_else(|| text.find("<?xml"))
        .unwrap_or(end);
    format!("{}S3: {code}: {message}{}", &text[..start.min(end)], &text[end..])
}

#[cfg(test)]
mod tests {
    use super::{Error, chain_text, plain};

    #[test]
    fn onnx_runtime_source_locations_are_left_out() {
        let raw = "cannot load: Load model from /m/onnx/model.onnx failed:/onnxruntime_src/onnxruntime/core/graph/\
                   model.cc:245 onnxruntime::Model::Model(onnx::ModelProto&&, const onnxruntime::PathString&, const \
                   onnxruntime::logging::Logger&) Missing opset in the model.";
        assert_eq!(plain(raw), "cannot load: Load model from /m/onnx/model.onnx failed: Missing opset in the model.");
        assert_eq!(plain("a text without one"), "a text without one");
        // DataFusion's kind prefixes go, wherever a cause sits in the text.
        let df = "job.sql: statement 4 failed: Execution error: refusing to append; Error during planning: No files";
        assert_eq!(plain(df), "job.sql: statement 4 failed: refusing to append; No files");
    }

    #[test]
    fn a_local_path_gets_back_the_leading_slash_object_store_drops() {
        let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
        let file = dir.path().join("q.csv");
        std::fs::write(&file, "id\n").unwrap();
        let bare = file.display().to_string().trim_start_matches('/').to_string();
        let missing =
            format!("{}/_versions", dir.path().join("out.lance").display()).trim_start_matches('/').to_string();
        assert_eq!(
            plain(&format!("Error when processing CSV file {bare}")),
            format!("Error when processing CSV file /{bare}")
        );
        assert_eq!(plain(&format!("Not found: {missing},")), format!("Not found: /{missing}"));
        assert_eq!(plain(&format!("read ({bare}) twice")), format!("read (/{bare}) twice"));
        // Paths that name nothing at the root, and relative paths that are here, stay as written.
        for kept in ["Not found: d/_versions", "see src/error.rs", "s3://bucket/x.lance", "a/b"] {
            assert_eq!(plain(kept), kept);
        }
        // A CUDA call's error: the raising function's signature and template, and the file and line fields.
        let cuda = "/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_call.cc:129 std::conditional_t<THRW, void, \
                    onnxruntime::common::Status> onnxruntime::CudaCall(ERRTYPE, const char*, const char*, SUCCTYPE, \
                    const char*, const char*, int) [with ERRTYPE = cudaError; bool THRW = true; SUCCTYPE = cudaError; \
                    std::conditional_t<THRW, void, common::Status> = void] CUDA failure 100: no CUDA-capable device is \
                    detected ; GPU=0 ; hostname=h ; file=/onnxruntime_src/onnxruntime/core/providers/cuda/\
                    cuda_execution_provider.cc ; line=282 ; expr=cudaSetDevice(info_.device_id); ";
        assert_eq!(
            plain(cuda),
            "CUDA failure 100: no CUDA-capable device is detected ; GPU=0 ; hostname=h ; \
             expr=cudaSetDevice(info_.device_id)"
        );
    }

    #[test]
    fn the_chain_stops_where_the_message_tells_its_source() {
        let beneath = std::io::Error::other("raw text /home/u/.cargo/registry/src/lance-14/src/x.rs:12:3");
        let e =
            Error::lance_because("d.lance", "cannot open: not found", beneath).context("refusing to search d.lance");
        assert_eq!(chain_text(&e), "refusing to search d.lance: Lance dataset d.lance: cannot open: not found");
        let source = std::error::Error::source(&e).and_then(std::error::Error::source);
        assert!(source.is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some()), "the source stays reachable");
        // Other errors' causes are still told.
        let file = Error::file("cannot read jobs.sql", std::io::Error::other("denied"));
        assert_eq!(chain_text(&file), "cannot read jobs.sql: denied");
    }

    #[test]
    fn s3_replies_are_cut_to_their_code_and_message() {
        let e = "job.sql: statement 2 failed: Object Store error: Generic S3 error: Error performing list request: \
                 Error performing GET http://127.0.0.1:1/nosuchbucket?list-type=2 in 11ms - Server returned non-2xx \
                 status code: 404 Not Found: <?xml version=\"1.0\" encoding=\"utf-8\"?>\n<Error><Code>NoSuchBucket\
                 </Code><Message>The specified bucket does not exist</Message><BucketName>nosuchbucket</BucketName>\
                 <RequestId>x</RequestId></Error>\n  CREATE EXTERNAL TABLE docs";
        assert_eq!(
            plain(e),
            "job.sql: statement 2 failed: S3: NoSuchBucket: The specified bucket does not exist\n  CREATE EXTERNAL TABLE docs"
        );
    }

    #[test]
    fn an_unknown_region_says_which_variables_to_set() {
        let e = "Lance dataset s3://b/x.lance: cannot open: Generic S3 error: Failed to resolve region for bucket 'b'";
        assert!(
            plain(e).ends_with(
                "(set AWS_REGION for the bucket, and AWS_ENDPOINT for an S3-compatible server other than AWS)"
            )
        );
    }

    #[test]
    fn library_source_locations_and_wrappers_are_dropped() {
        let lance = "Lance dataset /d/x.lance: Invalid user input: No object store provider found for scheme: 'gs'\n\
                     Valid schemes: memory, file, /root/.cargo/registry/src/index.crates.io-1/lance-io-14.0.2/src/\
                     object_store/providers.rs:205:9";
        assert_eq!(
            plain(&format!("External error: {lance}")),
            "Lance dataset /d/x.lance: Invalid user input: No object store provider found for scheme: 'gs'\n\
             Valid schemes: memory, file"
        );
        let two = "Not found: d/_versions, /root/.cargo/registry/a/commit.rs:653:26, /root/.cargo/registry/b.rs:921:29";
        assert_eq!(plain(two), "Not found: d/_versions");
        let internal = "Internal error: No suitable object store found for gs://bucket/x.jsonl. See \
                        `RuntimeEnv::register_object_store`.\nThis issue was likely caused by a bug in DataFusion's \
                        code. Please help us";
        let p = plain(internal);
        assert!(p.starts_with("gs://bucket/x.jsonl: this build reads local paths and s3:// only"), "{p}");
        assert!(!p.contains("bug"), "{p}");
        assert_eq!(plain("nothing to change"), "nothing to change");
    }
}
