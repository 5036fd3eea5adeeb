//! What an embedding call returns (the vectors in input order, and its counters) and what the DataFusion side
//! asks of a model ([`TextEmbedder`]), kept small so that it stays free of `ort`.

use std::time::Duration;

use crate::error::Result;
use crate::model::settings::CallSettings;
use crate::model::tokenize::Tokenized;
use crate::model::{DeviceInfo, ModelSpec};

/// Counters of one embedding call; they add up across calls.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EmbedStats {
    /// Texts embedded (NULLs excluded).
    pub docs: u64,
    /// NULL texts, which get a NULL vector.
    pub nulls: u64,
    /// Texts with nothing to embed (empty, or only whitespace and zero-width characters), counted among `docs`:
    /// each gets the model's vector of no text, one and the same for all.
    pub blank: u64,
    /// Real tokens fed to the model (the attention-mask sum).
    pub useful_tokens: u64,
    /// Tokens the model processed, padding included (rows x padded length, summed over calls).
    pub processed_tokens: u64,
    /// Texts cut at `max_tokens`.
    pub truncated_docs: u64,
    /// Tokens those cuts removed.
    pub dropped_tokens: u64,
    /// Model calls made.
    pub model_calls: u64,
    /// Time spent tokenising.
    pub tokenize_time: Duration,
    /// Time spent in ONNX Runtime, pooling included.
    pub model_time: Duration,
    /// Time with a model call in flight: ONNX Runtime's runs alone (not building their inputs, nor pooling), summed
    /// over the sessions.
    pub run_time: Duration,
    /// The model sessions that made the calls (the most seen; they share the calls).
    pub sessions: u64,
    /// Images embedded (`embed_image`), counted among `docs` too; `tokenize_time` is then their decoding and
    /// processing.
    pub images: u64,
    /// Pixels of those images as decoded (width x height, before resizing).
    pub image_pixels: u64,
    /// Bytes of their files read.
    pub image_bytes: u64,
    /// Bad images skipped under `embed.bad_images = 'skip'` (not among `images`): each id (or row) and why.
    pub skipped_images: Vec<(String, String)>,
}

impl EmbedStats {
    /// What was done since `earlier`, a snapshot of the same counters.
    pub fn since(&self, earlier: &EmbedStats) -> EmbedStats {
        EmbedStats {
            docs: self.docs - earlier.docs,
            nulls: self.nulls - earlier.nulls,
            blank: self.blank - earlier.blank,
            useful_tokens: self.useful_tokens - earlier.useful_tokens,
            processed_tokens: self.processed_tokens - earlier.processed_tokens,
            truncated_docs: self.truncated_docs - earlier.truncated_docs,
            dropped_tokens: self.dropped_tokens - earlier.dropped_tokens,
            model_calls: self.model_calls - earlier.model_calls,
            tokenize_time: self.tokenize_time.saturating_sub(earlier.tokenize_time),
            model_time: self.model_time.saturating_sub(earlier.model_time),
            run_time: self.run_time.saturating_sub(earlier.run_time),
            sessions: self.sessions,
            images: self.images - earlier.images,
            image_pixels: self.image_pixels - earlier.image_pixels,
            image_bytes: self.image_bytes - earlier.image_bytes,
            skipped_images: self.skipped_images.iter().skip(earlier.skipped_images.len()).cloned().collect(),
        }
    }

    /// Add another call's counters to these.
    pub fn add(&mut self, o: &EmbedStats) {
        self.docs += o.docs;
        self.nulls += o.nulls;
        self.blank += o.blank;
        self.useful_tokens += o.useful_tokens;
        self.processed_tokens += o.processed_tokens;
        self.truncated_docs += o.truncated_docs;
        self.dropped_tokens += o.dropped_tokens;
        self.model_calls += o.model_calls;
        self.tokenize_time += o.tokenize_time;
        self.model_time += o.model_time;
        self.run_time += o.run_time;
        self.sessions = self.sessions.max(o.sessions);
        self.images += o.images;
        self.image_pixels += o.image_pixels;
        self.image_bytes += o.image_bytes;
        self.skipped_images.extend(o.skipped_images.iter().cloned());
    }

    /// The share of `wall` each session had a model call in flight, on average over the sessions: near 1 when the
    /// model sets the pace, low when it waits for the host (reading, tokenising, pooling, writing). `None` without
    /// calls or time.
    pub fn model_busy(&self, wall: Duration) -> Option<f64> {
        (self.sessions > 0 && !wall.is_zero())
            .then(|| self.run_time.as_secs_f64() / (self.sessions as f64 * wall.as_secs_f64()))
    }
}

/// Whether a text has nothing to embed: empty, or only whitespace and zero-width characters (which tokenizers
/// drop), so that it gets the vector of no text at all.
pub fn is_blank(text: &str) -> bool {
    text.chars()
        .all(|c| c.is_whitespace() || matches!(c, '\u{200B}' | '\u{200C}' | '\u{200D}' | '\u{2060}' | '\u{FEFF}'))
}

/// Vectors for a batch of texts, in input order.
#[derive(Debug, Clone)]
pub struct Embedded {
    /// `rows * dim` floats; a NULL row holds zeros (and is marked in `valid`).
    pub vectors: Vec<f32>,
    /// Whether each row had a text.
    pub valid: Vec<bool>,
    /// What the call did.
    pub stats: EmbedStats,
}

/// What the `embed` function needs from a model; kept small so the DataFusion side stays free of `ort`.
pub trait TextEmbedder: Send + Sync + std::fmt::Debug {
    /// The model's description.
    fn spec(&self) -> &ModelSpec;
    /// Where it runs.
    fn device(&self) -> &DeviceInfo;
    /// Embed texts; `None` rows give no vector.
    fn embed(&self, texts: &[Option<&str>], settings: &CallSettings) -> Result<Embedded> {
        self.embed_with_progress(texts, settings, &|_, _| {}, &|| false)
    }
    /// [`TextEmbedder::embed`], calling `progress(texts, useful_tokens)` after each model call, and asking
    /// `stop()` before each: when it says true, no further model call starts and the result is
    /// [`Error::Stopped`].
    fn embed_with_progress(
        &self,
        texts: &[Option<&str>],
        settings: &CallSettings,
        progress: &dyn Fn(u64, u64),
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<Embedded> {
        self.embed_tokenized(texts, None, settings, progress, stop)
    }
    /// [`TextEmbedder::embed_with_progress`], with each text's tokens, when given, already made by
    /// [`TextEmbedder::tokenize_texts`] under the same settings (`None` where the text is NULL), so that a text is
    /// tokenised once on the write path. Given tokens must be those of these texts: a NULL where a text is present,
    /// or the reverse, is refused.
    fn embed_tokenized(
        &self,
        texts: &[Option<&str>],
        tokens: Option<Vec<Option<Tokenized>>>,
        settings: &CallSettings,
        progress: &dyn Fn(u64, u64),
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<Embedded>;
    /// Each text as the model will see it (after the prefix and truncation, special tokens included); `None` for
    /// NULL. What the length ordering counts, and hands on to [`TextEmbedder::embed_tokenized`].
    fn tokenize_texts(&self, texts: &[Option<&str>], settings: &CallSettings) -> Result<Vec<Option<Tokenized>>>;
}
