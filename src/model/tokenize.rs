//! Tokenising texts for the model: the tokenizer's own truncation and padding settings are replaced
//! by ours (cut at `max_tokens` with the special tokens counted, no padding), and every cut is counted.

use std::path::Path;

use tokenizers::{Encoding, Tokenizer, TruncationDirection};

use crate::error::{Error, Result};

/// What happens to a text longer than `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TruncationSide {
    /// Cut the end, keeping the start of the text (sentence-transformers' behaviour).
    Right,
    /// Cut the start, keeping the end of the text.
    Left,
    /// Cut nothing: the caller refuses the text.
    Error,
}

impl TruncationSide {
    /// Parse 'right', 'left' or 'error' (any case).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "right" => Some(Self::Right),
            "left" => Some(Self::Left),
            "error" => Some(Self::Error),
            _ => None,
        }
    }

    /// The name used in options and records.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Right => "right",
            Self::Left => "left",
            Self::Error => "error",
        }
    }
}

/// Texts encoded at once: enough to keep the tokenizer's threads busy, few enough to bound memory.
const TOKENIZE_AT_ONCE: usize = 256;

/// One text as the model sees it, before padding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokenized {
    /// Token ids, special tokens included.
    pub ids: Vec<u32>,
    /// Segment ids, as long as `ids`.
    pub type_ids: Vec<u32>,
    /// Tokens beyond `max_tokens`: cut off, or with [`TruncationSide::Error`] the excess that was kept.
    pub dropped: usize,
}

/// A tokenizer loaded from `tokenizer.json`, with padding and truncation left to us.
#[derive(Debug)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Special tokens the post-processor adds to one sequence (2 for BERT: [CLS] and [SEP]).
    added: usize,
}

impl TextTokenizer {
    /// Load `tokenizer.json`. `dir` only serves to name the model in errors.
    pub fn from_file(path: &Path, dir: &Path) -> Result<Self> {
        let mut inner =
            Tokenizer::from_file(path).map_err(|e| Error::model(dir, "tokenizer.json", format!("cannot load: {e}")))?;
        // NOTE: all-MiniLM-L6-v2's tokenizer.json ships truncation at 128 and fixed padding to 128;
        // neither matches sentence-transformers, so both are switched off and done here.
        inner.with_truncation(None).map_err(|e| Error::model(dir, "tokenizer.json", e.to_string()))?;
        inner.with_padding(None);
        let added = inner.get_post_processor().map(|p| tokenizers::PostProcessor::added_tokens(p, false)).unwrap_or(0);
        Ok(Self { inner, added })
    }

    /// The largest token id this tokenizer can produce, special and added tokens included.
    pub fn max_id(&self) -> Option<u32> {
        self.inner.get_vocab(true).into_values().max()
    }

    /// A prompt's length in tokens as sentence-transformers counts it to leave the prompt out of the pooling
    /// (`include_prompt: false`): the prompt alone with the special tokens the post-processor adds, less a
    /// trailing special token (BERT's [SEP], a decoder's end of text), so a leading [CLS] counts as prompt.
    pub fn prompt_tokens(&self, prompt: &str) -> Result<usize> {
        let enc = self.inner.encode_fast(prompt, true).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let trailing_special = enc.get_special_tokens_mask().last() == Some(&1);
        Ok(enc.len() - usize::from(trailing_special))
    }

    /// Tokenise a batch of texts in parallel, each cut to at most `max_tokens` tokens.
    pub fn tokenize(&self, texts: &[&str], max_tokens: usize, side: TruncationSide) -> Result<Vec<Tokenized>> {
        let budget = max_tokens.saturating_sub(self.added);
        let mut out = Vec::with_capacity(texts.len());
        // NOTE: a raw encoding keeps every token of an uncut text with its string, offsets and masks (about
        // 100 bytes a token), so a few thousand long texts at once take hundreds of MB. A bounded share at a
        // time keeps that transient memory the same whatever the caller hands over.
        for share in texts.chunks(TOKENIZE_AT_ONCE) {
            let raw =
                self.inner.encode_batch_fast(share.to_vec(), false).map_err(|e| Error::Tokenizer(e.to_string()))?;
            for enc in raw {
                out.push(self.finish(enc, budget, side)?);
            }
        }
        Ok(out)
    }

    fn finish(&self, mut enc: Encoding, budget: usize, side: TruncationSide) -> Result<Tokenized> {
        let dropped = enc.len().saturating_sub(budget);
        let direction = match side {
            TruncationSide::Right => Some(TruncationDirection::Right),
            TruncationSide::Left => Some(TruncationDirection::Left),
            TruncationSide::Error => None,
        };
        if let Some(direction) = direction.filter(|_| dropped > 0) {
            enc.truncate(budget, 0, direction);
            drop(enc.take_overflowing());
        }
        let enc = self.inner.post_process(enc, None, true).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(Tokenized { ids: enc.get_ids().to_vec(), type_ids: enc.get_type_ids().to_vec(), dropped })
    }
}
