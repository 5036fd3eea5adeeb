//! The run record: what one write did, kept with the Lance version it committed, as the transaction
//! property [`RUN_RECORD_KEY`] (pylance: `ds.read_transaction(v).transaction_properties`).

use serde::{Deserialize, Serialize};

/// The record's parts as the model reports them: a write's counters and where it ran. The sink and the
/// metrics take them from here, where records live, not from the model.
pub use crate::model::{DeviceInfo, EmbedStats};

/// Transaction-property key of the run record.
pub const RUN_RECORD_KEY: &str = "embedding_pipeline.run";

/// Counters, timings and device of one write. Field order is the JSON order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunRecord {
    /// Rows this write committed.
    pub rows_written: u64,
    /// Texts embedded.
    pub documents: u64,
    /// NULL texts, which were given NULL vectors.
    pub null_texts: u64,
    /// Blank texts among the documents (empty, or only whitespace or zero-width characters), which got one and
    /// the same vector.
    #[serde(default)]
    pub blank_texts: u64,
    /// Real tokens fed to the model (attention-mask sum).
    pub useful_tokens: u64,
    /// Tokens the model processed, padding included (rows x padded length, summed over calls).
    pub processed_tokens: u64,
    /// useful_tokens / processed_tokens.
    pub padding_efficiency: f64,
    /// Texts cut at max_tokens.
    pub truncated_documents: u64,
    /// Tokens those cuts removed.
    pub dropped_tokens: u64,
    /// Model calls.
    pub model_calls: u64,
    /// Wall time of the write, seconds.
    pub wall_seconds: f64,
    /// Time tokenising, seconds (summed over calls, which may overlap).
    pub tokenize_seconds: f64,
    /// Time in the model, pooling included, seconds (not the wait for a session another call holds).
    pub model_seconds: f64,
    /// Time with a model call in flight, seconds: ONNX Runtime's runs alone, summed over the sessions.
    #[serde(default)]
    pub model_run_seconds: f64,
    /// The model sessions that shared the calls.
    #[serde(default)]
    pub model_sessions: u64,
    /// The share of the wall time each session had a model call in flight (model_run_seconds / (model_sessions x
    /// wall_seconds)): low when the host, not the model, sets the pace.
    #[serde(default)]
    pub model_busy: f64,
    /// Time in the Lance writer and commit, seconds.
    pub write_seconds: f64,
    /// useful_tokens / wall_seconds.
    pub useful_tokens_per_second: f64,
    /// Images among the documents (`embed_image`), the pixels decoded from them and the bytes of their files read;
    /// absent for texts. `tokenize_seconds` is then the images' decoding and processing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub images: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub image_pixels: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub image_bytes: u64,
    /// Bad images skipped (`embed.bad_images = 'skip'`): how many, and the first 1,000 ids with why.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_images: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_image_ids: Vec<SkippedImage>,
    /// The process's peak resident memory so far, bytes (0 where it cannot be read).
    #[serde(default)]
    pub peak_memory_bytes: u64,
    /// Where the vectors were computed: provider, device, ONNX Runtime version.
    pub device: Option<DeviceInfo>,
    /// Set when the dataset's previous run computed its vectors elsewhere (another device, provider or
    /// ONNX Runtime version): allowed, since the fingerprint matched, and recorded here.
    pub previous_device: Option<DeviceInfo>,
    /// The plan the write executed (`pipeline plan`), and the units done after this commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<super::work_plan::PlanRecord>,
    /// The model directory the vectors were made with, as an absolute path (for `pipeline lineage
    /// --verify`; absent in records written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_dir: Option<String>,
    /// The model directory's `lineage.json`, whole, when it has one (its sha256 is the fingerprint's
    /// `lineage_sha256`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<serde_json::Value>,
    /// On a cluster: each executor's share of the rows and counters this commit holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub executors: Vec<ExecutorShare>,
    /// Whether this commit ended its write (false for the intermediate commits of a long write).
    pub last_commit: bool,
    /// Set on the last commit of a write that did not reach its end (a stop asked for, a failure): its rows are
    /// committed, the rest of its input is not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Set on every commit of a write that replaced the output's rows (`--restart`, `embed.restart`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restarted: bool,
    /// For a restarting write: SHA-256 of what it writes (its query, id column and its sources' files as it read
    /// them). A restart of the same write that finds its restart unfinished resumes it instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_digest: Option<String>,
    /// This tool's version.
    pub tool_version: String,
}

impl RunRecord {
    /// A record from a write's embedding counters and its times.
    pub fn new(
        stats: &EmbedStats,
        rows_written: u64,
        wall_seconds: f64,
        write_seconds: f64,
        device: Option<DeviceInfo>,
    ) -> Self {
        let ratio = |a: u64, b: f64| if b > 0.0 { a as f64 / b } else { 0.0 };
        Self {
            rows_written,
            documents: stats.docs,
            null_texts: stats.nulls,
            blank_texts: stats.blank,
            useful_tokens: stats.useful_tokens,
            processed_tokens: stats.processed_tokens,
            padding_efficiency: ratio(stats.useful_tokens, stats.processed_tokens as f64),
            truncated_documents: stats.truncated_docs,
            dropped_tokens: stats.dropped_tokens,
            model_calls: stats.model_calls,
            wall_seconds,
            tokenize_seconds: stats.tokenize_time.as_secs_f64(),
            model_seconds: stats.model_time.as_secs_f64(),
            model_run_seconds: stats.run_time.as_secs_f64(),
            model_sessions: stats.sessions,
            model_busy: stats.model_busy(std::time::Duration::from_secs_f64(wall_seconds.max(0.0))).unwrap_or(0.0),
            write_seconds,
            useful_tokens_per_second: ratio(stats.useful_tokens, wall_seconds),
            images: stats.images,
            image_pixels: stats.image_pixels,
            image_bytes: stats.image_bytes,
            skipped_images: stats.skipped_images.len() as u64,
            skipped_image_ids: stats
                .skipped_images
                .iter()
                .take(SKIPPED_LISTED)
                .map(|(id, why)| SkippedImage { id: id.clone(), why: why.clone() })
                .collect(),
            peak_memory_bytes: 0,
            device,
            previous_device: None,
            plan: None,
            model_dir: None,
            lineage: None,
            executors: Vec::new(),
            last_commit: true,
            interrupted: false,
            restarted: false,
            write_digest: None,
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// What a commit records beside its counters: the model directory and lineage that made vectors under
    /// `fingerprint`, when this process knows them, and `previous` (the device of the dataset's newest record)
    /// when it differs from this record's device.
    pub fn note_origin(&mut self, fingerprint: Option<&super::Fingerprint>, previous: Option<DeviceInfo>) {
        self.previous_device = previous.filter(|p| self.device.as_ref().is_some_and(|d| d != p));
        if let Some(origin) = fingerprint.and_then(|f| super::lineage::recall(&f.model_sha256, &f.lineage_sha256)) {
            self.model_dir = Some(origin.dir.display().to_string());
            self.lineage = origin.lineage.map(|l| l.record);
        }
    }

    /// Whether the write that made this commit went on after it: an intermediate commit (the process was then
    /// killed, if this is the newest), or the last commit of a write that stopped before its end.
    pub fn unfinished(&self) -> bool {
        !self.last_commit || self.interrupted
    }

    /// The embedding counters this record holds.
    pub fn stats(&self) -> EmbedStats {
        EmbedStats {
            docs: self.documents,
            nulls: self.null_texts,
            blank: self.blank_texts,
            useful_tokens: self.useful_tokens,
            processed_tokens: self.processed_tokens,
            truncated_docs: self.truncated_documents,
            dropped_tokens: self.dropped_tokens,
            model_calls: self.model_calls,
            tokenize_time: std::time::Duration::from_secs_f64(self.tokenize_seconds.max(0.0)),
            model_time: std::time::Duration::from_secs_f64(self.model_seconds.max(0.0)),
            run_time: std::time::Duration::from_secs_f64(self.model_run_seconds.max(0.0)),
            sessions: self.model_sessions,
            images: self.images,
            image_pixels: self.image_pixels,
            image_bytes: self.image_bytes,
            skipped_images: self.skipped_image_ids.iter().map(|s| (s.id.clone(), s.why.clone())).collect(),
        }
    }
}

/// One executor's part of a write on a cluster: where it ran, and what its tasks did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ExecutorShare {
    /// The executor's address (`HOST:PORT`).
    pub executor: String,
    /// Where its model calls ran.
    pub device: Option<DeviceInfo>,
    /// Its tasks (partitions of the input) in this write.
    pub tasks: u64,
    /// Rows its tasks wrote.
    pub rows_written: u64,
    /// Texts its tasks embedded.
    pub documents: u64,
    /// Real tokens its tasks fed to the model.
    pub useful_tokens: u64,
    /// Tokens its model processed, padding included.
    pub processed_tokens: u64,
    /// Its tasks' time in the model, seconds (summed over tasks).
    pub model_seconds: f64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The most skipped images a run record lists by id.
const SKIPPED_LISTED: usize = 1000;

/// One bad image skipped, by its id (or its row in the call, when the query names no id), and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SkippedImage {
    pub id: String,
    pub why: String,
}
