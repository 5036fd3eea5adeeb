//! What shapes each model call (ordering, truncation, pooling, normalisation, batch budgets), resolved
//! by the caller (the SQL side resolves its `embed.*` options into these) before the model sees them.

use crate::model::{ModelSpec, Pooling, TruncationSide};

/// How rows are grouped into model calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Longest first, with token-budget batches.
    Length,
    /// Input order, in fixed batches of [`ORIGINAL_BATCH_ROWS`] rows (the baseline).
    Original,
}

/// Rows per model call in the 'original' order: sentence-transformers' default batch size.
pub const ORIGINAL_BATCH_ROWS: usize = 32;

/// The settings that shape each model call, resolved against the model's own configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct CallSettings {
    pub order: Order,
    pub max_tokens: usize,
    pub truncation: TruncationSide,
    pub pooling: Pooling,
    pub normalize: bool,
    pub batch_tokens: usize,
    pub max_batch_rows: usize,
    pub prefix: String,
    /// Whether the prefix's tokens count in the pooling. False for a model whose Pooling config has
    /// `include_prompt: false`: the first [`super::tokenize::TextTokenizer::prompt_tokens`] tokens of each text
    /// are then left out of it, as sentence-transformers leaves a prompt's out (they still reach the model).
    pub pool_prefix: bool,
    /// Keep only the first this many dimensions of each pooled vector, then normalise (if normalising):
    /// Matryoshka models. 0 keeps them all.
    pub truncate_dim: usize,
    /// Refuse a blank text (see [`super::embedded::is_blank`]) rather than give it the vector of no text.
    pub refuse_blank: bool,
}

impl CallSettings {
    /// The length of the vectors these settings make with this model.
    pub fn out_dim(&self, spec: &ModelSpec) -> usize {
        cut_dim(spec.vector_dim(self.pooling), self.truncate_dim)
    }
}

/// The length of a model's `model_dim`-long vectors cut to `truncate_dim` (0 keeps them whole).
pub fn cut_dim(model_dim: usize, truncate_dim: usize) -> usize {
    match truncate_dim {
        0 => model_dim,
        n => n.min(model_dim),
    }
}
