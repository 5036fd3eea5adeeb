//! What a session has done so far: embedding counters summed over every `embed` call, and one
//! report per Lance write. The CLI prints them; later run records are built from them.

use std::sync::Mutex;
use std::time::Duration;

use crate::campaign::RunRecord;
use crate::model::{DeviceInfo, EmbedStats};

/// One finished write into a Lance dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteReport {
    /// The dataset's location.
    pub uri: String,
    /// Rows committed.
    pub rows: u64,
    /// The version the write committed.
    pub version: u64,
    /// Time from the first batch asked for to the commit.
    pub elapsed: Duration,
    /// What the write did, as committed with the version.
    pub record: RunRecord,
}

/// Counters shared by the `embed` function and the Lance sinks of one session.
#[derive(Debug, Default)]
pub struct RunMetrics {
    /// Texts and useful tokens done so far, updated after every model call (for progress display).
    live_docs: std::sync::atomic::AtomicU64,
    live_tokens: std::sync::atomic::AtomicU64,
    embed: Mutex<EmbedStats>,
    device: Mutex<Option<DeviceInfo>>,
    writes: Mutex<Vec<WriteReport>>,
}

impl RunMetrics {
    /// Count texts and useful tokens as each model call finishes.
    pub fn record_progress(&self, docs: u64, useful_tokens: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.live_docs.fetch_add(docs, Relaxed);
        self.live_tokens.fetch_add(useful_tokens, Relaxed);
    }

    /// Texts and useful tokens done so far, finer-grained than [`RunMetrics::embed_stats`].
    pub fn progress(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.live_docs.load(Relaxed), self.live_tokens.load(Relaxed))
    }

    /// Add one embedding call's counters.
    pub fn record_embed(&self, stats: &EmbedStats) {
        self.embed.lock().unwrap_or_else(|e| e.into_inner()).add(stats);
    }

    /// Note where the vectors are being computed.
    pub fn record_device(&self, device: &DeviceInfo) {
        let mut d = self.device.lock().unwrap_or_else(|e| e.into_inner());
        if d.as_ref() != Some(device) {
            *d = Some(device.clone());
        }
    }

    /// Where the last vectors were computed, once any were.
    pub fn device(&self) -> Option<DeviceInfo> {
        self.device.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Record a committed write.
    pub fn record_write(&self, report: WriteReport) {
        self.writes.lock().unwrap_or_else(|e| e.into_inner()).push(report);
    }

    /// The embedding counters so far.
    pub fn embed_stats(&self) -> EmbedStats {
        self.embed.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every write so far, in commit order.
    pub fn writes(&self) -> Vec<WriteReport> {
        self.writes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
