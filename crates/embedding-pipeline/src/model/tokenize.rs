//! Tokenising texts for the model: the tokenizer's own truncation and padding settings are replaced
//! by ours (cut at `max_tokens` with the special tokens counted, no padding), and every cut is counted.

use std::path::Path;

use tokenizers::utils::parallelism::MaybeParallelRefIterator;
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

impl Tokenized {
    /// The bytes the write path carries a text's tokens in from the ordering stage to the model, so that each
    /// text is tokenised once: the id count and `dropped` (u32 each), the ids, then the segment ids only where
    /// one is not 0 (all little-endian u32).
    pub fn to_bytes(&self, out: &mut Vec<u8>) {
        let typed = self.type_ids.iter().any(|&t| t != 0);
        out.reserve(8 + self.ids.len() * if typed { 8 } else { 4 });
        out.extend_from_slice(&(self.ids.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.dropped as u32).to_le_bytes());
        for id in &self.ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        if typed {
            for t in &self.type_ids {
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
    }

    /// Read what [`Tokenized::to_bytes`] wrote; `None` when the bytes are not such a record.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let word = |i: usize| bytes.get(i * 4..i * 4 + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let (n, dropped) = (word(0)? as usize, word(1)? as usize);
        let ids: Vec<u32> = (2..2 + n).map(word).collect::<Option<_>>()?;
        let type_ids = match bytes.len() {
            l if l == 8 + 4 * n => vec![0; n],
            l if l == 8 + 8 * n => (2 + n..2 + 2 * n).map(word).collect::<Option<_>>()?,
            _ => return None,
        };
        Some(Self { ids, type_ids, dropped })
    }
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
        // NOTE: each text is encoded, cut and post-processed in one step on the tokenizer's threads (rayon, unless
        // TOKENIZERS_PARALLELISM says no), so that a raw encoding (every token with its string, offsets and masks,
        // about 100 bytes a token) lives only as long as its own text's step, and the cutting runs in parallel too:
        // done after `encode_batch_fast` on the caller's thread, it held the pipeline at 0.79 of a bare pass.
        texts
            .maybe_par_iter()
            .map(|text| {
                let enc = self.inner.encode_fast(*text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
                self.finish(enc, budget, side)
            })
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_survive_their_bytes_with_and_without_segment_ids() {
        for t in [
            Tokenized { ids: vec![101, 7592, 102], type_ids: vec![0, 0, 0], dropped: 0 },
            Tokenized { ids: vec![101, 7592, 102, 2088, 102], type_ids: vec![0, 0, 0, 1, 1], dropped: 17 },
            Tokenized { ids: vec![], type_ids: vec![], dropped: 0 },
        ] {
            let mut bytes = Vec::new();
            t.to_bytes(&mut bytes);
            assert_eq!(Tokenized::from_bytes(&bytes).as_ref(), Some(&t));
        }
        // Untyped records carry no segment ids.
        let mut bytes = Vec::new();
        Tokenized { ids: vec![1, 2], type_ids: vec![0, 0], dropped: 0 }.to_bytes(&mut bytes);
        assert_eq!(bytes.len(), 16);
    }

    #[test]
    fn bytes_that_are_not_a_record_are_refused() {
        assert_eq!(Tokenized::from_bytes(&[]), None);
        assert_eq!(Tokenized::from_bytes(&[1, 0, 0, 0]), None);
        // Says 2 ids, holds one.
        let bytes = [2u32, 0, 7].iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(Tokenized::from_bytes(&bytes), None);
        // Two ids and a stray word.
        let bytes = [2u32, 0, 7, 8, 9].iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(Tokenized::from_bytes(&bytes), None);
    }
}
