//! A model's reference vectors. `probe.json` beside a model holds a few sentences and the vectors the
//! intact model gives them under its own settings; `scripts/setup` installs one for the default model.
//! When the model loads, the sentences are embedded again and compared: weights damaged on disk, or
//! swapped for another model's, give other vectors, and are refused before they embed a corpus.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// The file, in the model directory.
pub const PROBE_FILE: &str = "probe.json";

/// Below this cosine on any sentence the model is refused. The same weights on another device or ONNX
/// Runtime build stay above 0.99999. Damage does not always show much: 4 KB of flipped bits in the
/// default int8 model gave 0.887 at one place in the file, and between 0.991 and 0.9990 at 23 others.
pub const REFUSE_BELOW: f64 = 0.9999;

/// Below this (and not refused) a warning says the vectors moved.
pub const WARN_BELOW: f64 = 0.99999;

/// The sentences and their reference vectors.
#[derive(Debug, Clone, Deserialize)]
pub struct Probe {
    pub texts: Vec<String>,
    pub vectors: Vec<Vec<f32>>,
}

impl Probe {
    /// The probe in `dir`, if it has one. A file that cannot be read is an error that names it.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(PROBE_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        let bad = |m: String| Error::model(dir, PROBE_FILE, m);
        let text = std::fs::read_to_string(&path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let probe: Probe = serde_json::from_str(&text).map_err(|e| bad(format!("not a probe file: {e}")))?;
        if probe.texts.is_empty() || probe.texts.len() != probe.vectors.len() {
            return Err(bad(format!("has {} texts and {} vectors", probe.texts.len(), probe.vectors.len())));
        }
        Ok(Some(probe))
    }

    /// The lowest cosine between the reference vectors and `vectors` (`dim` floats per text, in order),
    /// with the text it was found on.
    pub fn worst(&self, vectors: &[f32], dim: usize) -> (f64, &str) {
        let mut worst = (f64::INFINITY, "");
        for (i, (text, reference)) in self.texts.iter().zip(&self.vectors).enumerate() {
            let now = vectors.get(i * dim..(i + 1) * dim).unwrap_or_default();
            let c = if reference.len() == now.len() { cosine(reference, now) } else { -1.0 };
            if c < worst.0 {
                worst = (c, text);
            }
        }
        worst
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    let c = dot / (na.sqrt() * nb.sqrt()).max(1e-300);
    if c.is_nan() { -1.0 } else { c }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_cosine_names_its_text_and_mismatched_or_nan_vectors_count_as_worst() {
        let p = Probe { texts: vec!["a".into(), "b".into()], vectors: vec![vec![1.0, 0.0], vec![0.0, 1.0]] };
        assert_eq!(p.worst(&[1.0, 0.0, 0.0, 1.0], 2), (1.0, "a"));
        let (c, t) = p.worst(&[1.0, 0.0, 1.0, 1.0], 2);
        assert!((c - 0.5f64.sqrt()).abs() < 1e-9 && t == "b");
        assert_eq!(p.worst(&[1.0, 0.0, f32::NAN, 1.0], 2), (-1.0, "b"));
        assert_eq!(p.worst(&[1.0, 0.0], 2).0, -1.0);
    }

    #[test]
    fn a_broken_probe_file_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(Probe::load(tmp.path()).unwrap().is_none());
        std::fs::write(tmp.path().join(PROBE_FILE), r#"{"texts": ["a"], "vectors": []}"#).unwrap();
        let err = Probe::load(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("probe.json") && err.contains("1 texts and 0 vectors"), "{err}");
    }
}
