//! The small files every sentence-transformers directory has, read the same way for text and image-text models.

use std::path::Path;

use serde::Deserialize;

use super::tokenize::TruncationSide;
use crate::error::{Error, Result};

/// One entry of modules.json.
#[derive(Deserialize)]
pub(super) struct Module {
    #[serde(rename = "type")]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) path: String,
}

/// A JSON file of the directory, each error naming it.
pub(super) fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, file: &str) -> Result<T> {
    let path = dir.join(file);
    let text =
        std::fs::read_to_string(&path).map_err(|e| Error::model(dir, file, format!("cannot read: {e}")).because(e))?;
    serde_json::from_str(&text).map_err(|e| Error::model(dir, file, format!("invalid: {e}")).because(e))
}

/// `tokenizer_config.json`, where sentence-transformers 6 keeps the max_seq_length (as `model_max_length`), and
/// where the tokenizer says which end it cuts.
#[derive(Deserialize, Default)]
pub(super) struct TokenizerConfig {
    pub(super) model_max_length: Option<f64>,
    pub(super) truncation_side: Option<String>,
    /// The transformers class of the tokenizer (`LlamaTokenizerFast`, …).
    pub(super) tokenizer_class: Option<String>,
}

/// The tokenizer config at `file` in `dir` (its defaults when there is none) and the side it cuts (right when it
/// says none); a side other than right and left is refused, naming the file.
pub(super) fn read_tokenizer_config(dir: &Path, file: &str) -> Result<(TokenizerConfig, TruncationSide)> {
    let config: TokenizerConfig = match dir.join(file).is_file() {
        true => read_json(dir, file)?,
        false => TokenizerConfig::default(),
    };
    let side = match config.truncation_side.as_deref() {
        None | Some("right") => TruncationSide::Right,
        Some("left") => TruncationSide::Left,
        Some(other) => {
            return Err(Error::model(dir, file, format!("truncation_side {other:?} is not one of 'right' and 'left'")));
        }
    };
    Ok((config, side))
}
