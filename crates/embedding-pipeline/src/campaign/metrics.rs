//! What a session has done so far: embedding counters summed over every `embed` call, and one
//! report per Lance write. The CLI prints them; later run records are built from them.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use datafusion::arrow::array::{Array, RecordBatch};

use crate::campaign::RunRecord;
use crate::campaign::work_plan::WorkPlanInUse;
use crate::campaign::{DeviceInfo, EmbedStats};
use crate::process::interrupt::StopToken;

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

/// Below this share of the wall time with a model call in flight, the host (reading, tokenising, pooling,
/// writing), not the model, set the pace.
pub const HOST_BOUND_BELOW: f64 = 0.7;

/// How busy the model was, and on a GPU how many cores would have kept it busy.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct HostShare {
    /// The share of the wall time each session had a model call in flight, on average over the sessions.
    pub model_busy: f64,
    /// The model sessions the share is averaged over.
    pub sessions: u64,
    /// The cores this process could use.
    pub cores: usize,
    /// On a GPU whose model waited for the host (busy below [`HOST_BOUND_BELOW`]): the cores at which the host
    /// would keep up, `cores / model_busy`, as the host's work (tokenising above all, text by text) spreads over
    /// cores about evenly. `None` on the CPU, where the model itself runs on the cores, and when the model set
    /// the pace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores_to_keep_busy: Option<usize>,
}

impl HostShare {
    /// From `stats` over `wall`, on `cores` cores, the model on a GPU or not; `None` without model calls.
    pub fn new(stats: &EmbedStats, wall: Duration, cores: usize, on_gpu: bool) -> Option<Self> {
        let model_busy = stats.model_busy(wall)?.min(1.0);
        let cores_to_keep_busy = (on_gpu && model_busy > 0.0 && model_busy < HOST_BOUND_BELOW)
            .then(|| (cores as f64 / model_busy).ceil() as usize);
        Some(Self { model_busy, sessions: stats.sessions, cores, cores_to_keep_busy })
    }

    /// Whether the host, not the model, set the pace.
    pub fn host_bound(&self) -> bool {
        self.model_busy < HOST_BOUND_BELOW
    }

    /// One line: `model busy 38% of the wall time (1 session): the host …; on 16 cores, about 43 would keep the GPU
    /// busy`.
    pub fn describe(&self) -> String {
        let sessions = match self.sessions {
            1 => "1 session".to_string(),
            n => format!("{n} sessions, on average"),
        };
        let mut line = format!("model busy {:.0}% of the wall time ({sessions})", self.model_busy * 100.0);
        if self.host_bound() {
            line.push_str(": the host (reading, tokenising, pooling, writing), not the model, set the pace");
        }
        if let Some(n) = self.cores_to_keep_busy {
            line.push_str(&format!(
                "; on {} cores, about {n} would keep the GPU busy (the host's work spreads over cores text by text)",
                self.cores
            ));
        }
        line
    }
}

/// The cores this process may run on (its affinity and cgroup limits), at least 1.
pub fn usable_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Counters shared by the `embed` function and the Lance sinks of one session.
#[derive(Debug, Default)]
pub struct RunMetrics {
    /// The session's request to stop, which everything holding these counters honours (see [`StopToken`]).
    stop: StopToken,
    /// Texts and useful tokens done so far, updated after every model call (for progress display).
    live_docs: std::sync::atomic::AtomicU64,
    live_tokens: std::sync::atomic::AtomicU64,
    /// Rows and tokens the ordering stage has counted so far (for progress display).
    counted_rows: std::sync::atomic::AtomicU64,
    counted_tokens: std::sync::atomic::AtomicU64,
    embed: Mutex<EmbedStats>,
    device: Mutex<Option<DeviceInfo>>,
    writes: Mutex<Vec<WriteReport>>,
    /// Writes by DataFusion's own writers (Parquet, CSV, JSON, Arrow files): (target, rows).
    file_writes: Mutex<Vec<(String, u64)>>,
    /// Counters of embedded rows on their way to a Lance sink, oldest first: (rows, counters) per batch
    /// the write path's `EmbedExec` sent.
    in_transit: Mutex<VecDeque<(u64, EmbedStats)>>,
    /// Embedding streams (`EmbedExec` partitions) alive now.
    embedding: std::sync::atomic::AtomicUsize,
    /// When the first model call of the session began.
    first_call: std::sync::OnceLock<std::time::Instant>,
    /// The plans the writes now running execute, by output URI.
    plans: Mutex<std::collections::HashMap<String, std::sync::Arc<WorkPlanInUse>>>,
    /// The rows left to write of each write whose ids were checked when planned, by output URI.
    ids_checked: Mutex<std::collections::HashMap<String, u64>>,
    /// The digest of each restarting write now running (see `RunRecord::write_digest`), by output URI.
    write_digests: Mutex<std::collections::HashMap<String, String>>,
    /// Nanoseconds the ordering stage spent tokenising that no embedded batch has been charged with yet.
    tokenizing: std::sync::atomic::AtomicU64,
    /// When kept (a trial): see [`Timeline`].
    timeline: Mutex<Option<Timeline>>,
}

/// A write's embedded batches, as a trial times them: when its first model call began, and the moment each
/// batch was sent on with the useful tokens and images sent so far.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub first_call: Option<std::time::Instant>,
    pub points: Vec<TimelinePoint>,
}

/// One embedded batch sent on: when, and the useful tokens and images embedded so far.
#[derive(Debug, Clone, Copy)]
pub struct TimelinePoint {
    pub at: std::time::Instant,
    pub tokens: u64,
    pub images: u64,
}

impl Timeline {
    /// A batch sent on; one that embedded nothing (an image write's rows pass the text path's counters too) is no
    /// point of the timeline.
    fn add(&mut self, tokens: u64, images: u64) {
        if tokens == 0 && images == 0 {
            return;
        }
        let last = self.points.last().map_or((0, 0), |p| (p.tokens, p.images));
        self.points.push(TimelinePoint {
            at: std::time::Instant::now(),
            tokens: last.0 + tokens,
            images: last.1 + images,
        });
    }
}

/// Held by a live embedding stream; see [`RunMetrics::embedding_started`].
#[derive(Debug)]
pub struct EmbeddingStream(std::sync::Arc<RunMetrics>);

impl Drop for EmbeddingStream {
    fn drop(&mut self) {
        self.0.embedding.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl RunMetrics {
    /// Counters of a session that `stop` asks to stop.
    pub fn stopped_by(stop: StopToken) -> Self {
        Self { stop, ..Self::default() }
    }

    /// The session's request to stop.
    pub fn stop(&self) -> &StopToken {
        &self.stop
    }

    /// Count texts and useful tokens as each model call finishes.
    pub fn record_progress(&self, docs: u64, useful_tokens: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.live_docs.fetch_add(docs, Relaxed);
        self.live_tokens.fetch_add(useful_tokens, Relaxed);
    }

    /// Note rows whose tokens the ordering stage has counted, before they are embedded.
    pub fn record_counted(&self, rows: u64, tokens: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.counted_rows.fetch_add(rows, Relaxed);
        self.counted_tokens.fetch_add(tokens, Relaxed);
    }

    /// Note time the ordering stage spent tokenising: the write path's texts are tokenised there, once, and
    /// the time is charged to the next embedded batch sent (so a commit's record counts the tokenising done up to
    /// it, and the sums are exact).
    pub fn record_tokenizing(&self, took: Duration) {
        self.tokenizing.fetch_add(took.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Rows and tokens counted by the ordering stage so far.
    pub fn counted(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.counted_rows.load(Relaxed), self.counted_tokens.load(Relaxed))
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

    /// Note that a model call begins (only the first is kept).
    pub fn record_call_started(&self) {
        let now = std::time::Instant::now();
        let _ = self.first_call.set(now);
        if let Some(timeline) = self.timeline.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            timeline.first_call.get_or_insert(now);
        }
    }

    /// Note, on a kept timeline, a call of `embed_image` done with `images` embedded (text batches are noted as
    /// they are sent on, by [`Self::send_embedded`]).
    pub fn record_images_done(&self, images: u64) {
        if let Some(timeline) = self.timeline.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            timeline.add(0, images);
        }
    }

    /// When the session's first model call began, once one has.
    pub fn first_call(&self) -> Option<std::time::Instant> {
        self.first_call.get().copied()
    }

    /// Have the writes into `uri` read `plan`'s work list instead of their query's input, until
    /// [`Self::forget_plan`]. Its checks against the job are the caller's.
    pub fn use_plan(&self, uri: &str, plan: std::sync::Arc<WorkPlanInUse>) {
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).insert(uri.to_string(), plan);
    }

    /// The plan the writes into `uri` execute, if any.
    pub fn plan_for(&self, uri: &str) -> Option<std::sync::Arc<WorkPlanInUse>> {
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).get(uri).cloned()
    }

    /// Writes into `uri` read their query's input again.
    pub fn forget_plan(&self, uri: &str) {
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).remove(uri);
    }

    /// Note what the write into `uri` about to run writes (`RunRecord::write_digest`), or forget it (`None`).
    pub fn note_write_digest(&self, uri: &str, digest: Option<String>) {
        let mut digests = self.write_digests.lock().unwrap_or_else(|e| e.into_inner());
        match digest {
            Some(d) => digests.insert(uri.to_string(), d),
            None => digests.remove(uri),
        };
    }

    /// What the write into `uri` writes, when noted.
    pub fn write_digest(&self, uri: &str) -> Option<String> {
        self.write_digests.lock().unwrap_or_else(|e| e.into_inner()).get(uri).cloned()
    }

    /// Note that the ids of a write into `uri` were checked when it was planned: `rows` are left to write.
    pub fn note_ids_checked(&self, uri: &str, rows: u64) {
        self.ids_checked.lock().unwrap_or_else(|e| e.into_inner()).insert(uri.to_string(), rows);
    }

    /// The rows the last write planned into `uri` had left to write, taken (so a later write's is not mistaken
    /// for it); `None` when none was planned since.
    pub fn take_ids_checked(&self, uri: &str) -> Option<u64> {
        self.ids_checked.lock().unwrap_or_else(|e| e.into_inner()).remove(uri)
    }

    /// Note a write made by DataFusion's own writer (not a Lance sink).
    pub fn record_file_write(&self, target: &str, rows: u64) {
        self.file_writes.lock().unwrap_or_else(|e| e.into_inner()).push((target.to_string(), rows));
    }

    /// The writes noted by [`Self::record_file_write`], in order.
    pub fn file_writes(&self) -> Vec<(String, u64)> {
        self.file_writes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Send the counters of a batch of `rows` embedded rows on to the sink that will receive them.
    pub fn send_embedded(&self, rows: u64, mut stats: EmbedStats) {
        let tokenizing = Duration::from_nanos(self.tokenizing.swap(0, std::sync::atomic::Ordering::Relaxed));
        if !tokenizing.is_zero() {
            stats.tokenize_time += tokenizing;
            self.embed.lock().unwrap_or_else(|e| e.into_inner()).tokenize_time += tokenizing;
        }
        if let Some(timeline) = self.timeline.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            timeline.add(stats.useful_tokens, 0);
        }
        self.in_transit.lock().unwrap_or_else(|e| e.into_inner()).push_back((rows, stats));
    }

    /// The counters of the next `rows` rows a sink receives, in the order they were sent. A batch's
    /// counters go with its first row, so they stay exact per batch; sums stay exact however batches are
    /// cut on the way.
    pub fn receive_embedded(&self, rows: u64) -> EmbedStats {
        let mut queue = self.in_transit.lock().unwrap_or_else(|e| e.into_inner());
        let (mut left, mut out) = (rows, EmbedStats::default());
        while left > 0 {
            let Some((sent, stats)) = queue.front_mut() else { break };
            out.add(&std::mem::take(stats));
            let take = left.min(*sent);
            (*sent, left) = (*sent - take, left - take);
            if *sent == 0 {
                queue.pop_front();
            }
        }
        out
    }

    /// Count an embedding stream as alive until the guard is dropped.
    pub fn embedding_started(self: &std::sync::Arc<Self>) -> EmbeddingStream {
        self.embedding.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        EmbeddingStream(std::sync::Arc::clone(self))
    }

    /// Whether an embedding stream is alive: one that ends by itself soon after a stop request.
    pub fn embedding_active(&self) -> bool {
        self.embedding.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Keep a timeline of the embedded batches from now on (see [`Self::take_timeline`]).
    pub fn keep_timeline(&self) {
        *self.timeline.lock().unwrap_or_else(|e| e.into_inner()) = Some(Timeline::default());
    }

    /// The timeline kept since [`Self::keep_timeline`]; keeping stops.
    pub fn take_timeline(&self) -> Timeline {
        self.timeline.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default()
    }

    /// Forget counters no sink received (a write that failed or stopped early), before a new write.
    pub fn clear_in_transit(&self) {
        self.in_transit.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// The bytes a batch's rows take, counting only the rows of a slice (not the buffers it shares). For
/// string and binary views, each row's view and the bytes of its text when not held inline.
pub fn batch_bytes(batch: &RecordBatch) -> usize {
    batch.columns().iter().map(|c| column_bytes(c.as_ref())).sum()
}

fn column_bytes(c: &dyn Array) -> usize {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::DataType;
    let views =
        |lengths: &mut dyn Iterator<Item = u32>| lengths.map(|n| 16 + if n > 12 { n as usize } else { 0 }).sum();
    match c.data_type() {
        DataType::Utf8View => views(&mut c.as_string_view().views().iter().map(|v| *v as u32)),
        DataType::BinaryView => views(&mut c.as_binary_view().views().iter().map(|v| *v as u32)),
        _ => c.to_data().get_slice_memory_size().unwrap_or_else(|_| c.get_array_memory_size()),
    }
}

/// `batch` with its string and binary view columns holding only their own rows' bytes: a `take` or a
/// slice of a view column keeps the whole data buffers of the batch it came from.
pub fn compact_views(batch: RecordBatch) -> datafusion::error::Result<RecordBatch> {
    use datafusion::arrow::array::{ArrayRef, AsArray};
    use datafusion::arrow::datatypes::DataType;
    use std::sync::Arc;
    if !batch.columns().iter().any(|c| matches!(c.data_type(), DataType::Utf8View | DataType::BinaryView)) {
        return Ok(batch);
    }
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8View => Arc::new(c.as_string_view().gc()) as ArrayRef,
            DataType::BinaryView => Arc::new(c.as_binary_view().gc()) as ArrayRef,
            _ => Arc::clone(c),
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(docs: u64) -> EmbedStats {
        EmbedStats { docs, useful_tokens: docs * 10, ..Default::default() }
    }

    #[test]
    fn counters_follow_their_rows_in_order() {
        let m = RunMetrics::default();
        m.send_embedded(3, stats(3));
        m.send_embedded(2, stats(2));
        m.send_embedded(4, stats(4));
        assert_eq!(m.receive_embedded(3), stats(3));
        assert_eq!(m.receive_embedded(6), stats(6));
        assert_eq!(m.receive_embedded(1), EmbedStats::default(), "nothing left in transit");
    }

    #[test]
    fn view_columns_count_their_text_once_per_row() {
        use datafusion::arrow::array::{StringArray, StringViewArray};
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use std::sync::Arc;
        let long = "x".repeat(1000);
        let texts = vec![long.as_str(), "short"];
        let schema = |t| Arc::new(Schema::new(vec![Field::new("t", t, false)]));
        let view =
            RecordBatch::try_new(schema(DataType::Utf8View), vec![Arc::new(StringViewArray::from(texts.clone()))])
                .unwrap();
        let plain = RecordBatch::try_new(schema(DataType::Utf8), vec![Arc::new(StringArray::from(texts))]).unwrap();
        assert_eq!(batch_bytes(&view), 16 + 1000 + 16);
        assert!((1005..1030).contains(&batch_bytes(&plain)), "{}", batch_bytes(&plain));
        assert_eq!(batch_bytes(&view.slice(1, 1)), 16, "a slice counts only its own rows");
        let compact = compact_views(view.slice(1, 1)).unwrap();
        assert!(compact.get_array_memory_size() < 200, "the 1000-byte text is no longer held");
    }

    #[test]
    fn the_cores_to_keep_a_waiting_gpu_busy_scale_with_its_idle_share() {
        let busy = |run_secs: u64, sessions: u64| EmbedStats {
            run_time: Duration::from_secs(run_secs),
            sessions,
            ..EmbedStats::default()
        };
        let wall = Duration::from_secs(100);
        let waiting = HostShare::new(&busy(38, 1), wall, 16, true).unwrap();
        assert!(waiting.host_bound());
        assert_eq!(waiting.cores_to_keep_busy, Some(43), "16 / 0.38, rounded up");
        let line = waiting.describe();
        assert!(line.starts_with("model busy 38% of the wall time (1 session): the host"), "{line}");
        assert!(
            line.ends_with(
                "on 16 cores, about 43 would keep the GPU busy (the host's work spreads over cores text by text)"
            ),
            "{line}"
        );
        // Two sessions each busy 90 of 100 s: the model set the pace, no advice.
        let fed = HostShare::new(&busy(180, 2), wall, 16, true).unwrap();
        assert!((fed.model_busy - 0.9).abs() < 1e-9 && !fed.host_bound() && fed.cores_to_keep_busy.is_none());
        assert_eq!(fed.describe(), "model busy 90% of the wall time (2 sessions, on average)");
        // On the CPU the model runs on the cores: the share is said, no core count.
        let cpu = HostShare::new(&busy(10, 1), wall, 2, false).unwrap();
        assert!(cpu.host_bound() && cpu.cores_to_keep_busy.is_none());
        assert!(!cpu.describe().contains("cores"));
        assert_eq!(HostShare::new(&EmbedStats::default(), wall, 2, true), None, "no calls, nothing to say");
    }

    #[test]
    fn a_batch_cut_on_the_way_counts_with_its_first_rows() {
        let m = RunMetrics::default();
        m.send_embedded(4, stats(4));
        m.send_embedded(2, stats(2));
        assert_eq!(m.receive_embedded(1), stats(4));
        assert_eq!(m.receive_embedded(3), EmbedStats::default());
        assert_eq!(m.receive_embedded(2), stats(2));
        m.send_embedded(5, stats(5));
        m.clear_in_transit();
        assert_eq!(m.receive_embedded(5), EmbedStats::default());
    }
}
