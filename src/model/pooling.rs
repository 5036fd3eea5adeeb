//! Pooling token states into one vector per text, and L2 normalisation.

/// How token states become one vector, as in sentence-transformers' Pooling module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// Mean over the tokens the attention mask keeps.
    Mean,
    /// The first token's state.
    Cls,
    /// Element-wise maximum over the kept tokens.
    Max,
}

impl Pooling {
    /// Parse 'mean', 'cls' or 'max' (any case).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "mean" => Some(Self::Mean),
            "cls" => Some(Self::Cls),
            "max" => Some(Self::Max),
            _ => None,
        }
    }

    /// The name used in options and records.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::Cls => "cls",
            Self::Max => "max",
        }
    }

    /// Pool one row: `states` holds `mask.len()` token vectors of `dim` floats each; write `dim` floats to `out`.
    pub fn pool_row(&self, states: &[f32], mask: &[i64], dim: usize, out: &mut [f32]) {
        debug_assert_eq!(states.len(), mask.len() * dim);
        match self {
            Self::Cls => out.copy_from_slice(&states[..dim]),
            Self::Mean => {
                out.fill(0.0);
                let mut kept = 0usize;
                for (t, _) in mask.iter().enumerate().filter(|(_, m)| **m != 0) {
                    kept += 1;
                    for (o, s) in out.iter_mut().zip(&states[t * dim..(t + 1) * dim]) {
                        *o += *s;
                    }
                }
                let denom = (kept as f32).max(1e-9);
                out.iter_mut().for_each(|o| *o /= denom);
            }
            Self::Max => {
                out.fill(f32::NEG_INFINITY);
                for (t, _) in mask.iter().enumerate().filter(|(_, m)| **m != 0) {
                    for (o, s) in out.iter_mut().zip(&states[t * dim..(t + 1) * dim]) {
                        *o = o.max(*s);
                    }
                }
                // NOTE: an all-masked row (never produced by our tokeniser) would stay at -inf; make it zero.
                out.iter_mut().filter(|o| o.is_infinite()).for_each(|o| *o = 0.0);
            }
        }
    }
}

/// Scale a vector to unit L2 norm, as sentence-transformers' Normalize module does (eps 1e-12).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
}

#[cfg(test)]
mod tests {
    use super::*;

    // Three tokens of dim 2; the last token is padding.
    const STATES: [f32; 6] = [1.0, 4.0, 3.0, -2.0, 100.0, 100.0];
    const MASK: [i64; 3] = [1, 1, 0];

    fn pool(p: Pooling) -> Vec<f32> {
        let mut out = vec![0.0; 2];
        p.pool_row(&STATES, &MASK, 2, &mut out);
        out
    }

    #[test]
    fn mean_ignores_padding() {
        assert_eq!(pool(Pooling::Mean), vec![2.0, 1.0]);
    }

    #[test]
    fn cls_takes_the_first_token() {
        assert_eq!(pool(Pooling::Cls), vec![1.0, 4.0]);
    }

    #[test]
    fn max_ignores_padding() {
        assert_eq!(pool(Pooling::Max), vec![3.0, 4.0]);
    }

    #[test]
    fn normalize_gives_unit_norm_and_keeps_zero() {
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0, 0.0];
        normalize(&mut z);
        assert_eq!(z, vec![0.0, 0.0]);
    }

    #[test]
    fn parse_names() {
        assert_eq!(Pooling::parse("MEAN"), Some(Pooling::Mean));
        assert_eq!(Pooling::parse("median"), None);
        assert_eq!(Pooling::Max.as_str(), "max");
    }
}
