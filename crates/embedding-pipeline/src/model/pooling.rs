//! Pooling token states into one vector per text, and L2 normalisation, as sentence-transformers' Pooling and
//! Normalize modules compute them.

/// One way of turning token states into a vector: sentence-transformers' pooling modes, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolingMode {
    /// The first kept token's state.
    Cls,
    /// Element-wise maximum over the kept tokens.
    Max,
    /// Mean over the tokens the attention mask keeps.
    Mean,
    /// The sum over the kept tokens divided by the square root of their count.
    MeanSqrtLen,
    /// Mean weighted by position (the first token 1, the next 2, …): later tokens count more (SGPT).
    WeightedMean,
    /// The last kept token's state: decoder embedders (Qwen3-Embedding, gte-Qwen2).
    LastToken,
    /// An image-text model's own pooling and projection (CLIP's, SigLIP's `get_text_features`), inside its
    /// exported graph, whose output is the vector: never chosen by name, never computed here.
    Tower,
}

impl PoolingMode {
    /// Every mode, in sentence-transformers' order (the order its older one-flag-per-mode config concatenates).
    pub const ALL: [PoolingMode; 6] =
        [Self::Cls, Self::Max, Self::Mean, Self::MeanSqrtLen, Self::WeightedMean, Self::LastToken];

    /// sentence-transformers' name of the mode (`pooling_mode` in its Pooling config).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Cls => "cls",
            Self::Max => "max",
            Self::Mean => "mean",
            Self::MeanSqrtLen => "mean_sqrt_len_tokens",
            Self::WeightedMean => "weightedmean",
            Self::LastToken => "lasttoken",
            Self::Tower => "pooler_output",
        }
    }

    /// The older config's flag for the mode (`pooling_mode_mean_tokens`, …).
    pub fn flag(&self) -> &'static str {
        match self {
            Self::Cls => "pooling_mode_cls_token",
            Self::Max => "pooling_mode_max_tokens",
            Self::Mean => "pooling_mode_mean_tokens",
            Self::MeanSqrtLen => "pooling_mode_mean_sqrt_len_tokens",
            Self::WeightedMean => "pooling_mode_weightedmean_tokens",
            Self::LastToken => "pooling_mode_lasttoken",
            Self::Tower => "pooler_output",
        }
    }

    /// A mode by its sentence-transformers name (any case).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().chain([Self::Tower]).find(|m| m.as_str().eq_ignore_ascii_case(s))
    }

    /// Pool one row into `out` (`dim` floats): `states` holds `mask.len()` token vectors of `dim` floats each.
    fn pool(&self, states: &[f32], mask: &[i64], dim: usize, out: &mut [f32]) {
        let kept = || mask.iter().enumerate().filter(|(_, m)| **m != 0).map(|(t, _)| t);
        let token = |t: usize| &states[t * dim..(t + 1) * dim];
        match self {
            // The first kept token, as sentence-transformers takes it (argmax of the mask).
            // A graph with this pooling gives vectors, never token states (sessions::Io refuses others): the first
            // position stands in, unused.
            Self::Cls | Self::Tower => out.copy_from_slice(token(kept().next().unwrap_or(0))),
            Self::LastToken => match kept().next_back() {
                Some(t) => out.copy_from_slice(token(t)),
                // sentence-transformers gathers the last position times a zero mask: zeros.
                None => out.fill(0.0),
            },
            Self::Mean | Self::MeanSqrtLen | Self::WeightedMean => {
                out.fill(0.0);
                let mut total = 0.0f32;
                for t in kept() {
                    // Weighted mean: position weights from 1, counted from the first token (right padding).
                    let w = if *self == Self::WeightedMean { (t + 1) as f32 } else { 1.0 };
                    total += w;
                    for (o, s) in out.iter_mut().zip(token(t)) {
                        *o += w * *s;
                    }
                }
                let total = total.max(1e-9);
                let denom = if *self == Self::MeanSqrtLen { total.sqrt() } else { total };
                out.iter_mut().for_each(|o| *o /= denom);
            }
            Self::Max => {
                out.fill(f32::NEG_INFINITY);
                for t in kept() {
                    for (o, s) in out.iter_mut().zip(token(t)) {
                        *o = o.max(*s);
                    }
                }
                // NOTE: an all-masked row (never produced by our tokeniser) would stay at -inf; make it zero.
                out.iter_mut().filter(|o| o.is_infinite()).for_each(|o| *o = 0.0);
            }
        }
    }
}

/// How token states become one vector: one pooling mode, or several whose vectors are concatenated in the
/// order given (up to six), as sentence-transformers' Pooling module does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pooling {
    modes: [PoolingMode; 6],
    len: u8,
}

impl Pooling {
    /// Mean pooling alone.
    pub const MEAN: Self = Self::one(PoolingMode::Mean);
    /// The first token alone.
    pub const CLS: Self = Self::one(PoolingMode::Cls);
    /// The element-wise maximum alone.
    pub const MAX: Self = Self::one(PoolingMode::Max);

    /// One mode.
    pub const fn one(mode: PoolingMode) -> Self {
        Self { modes: [mode; 6], len: 1 }
    }

    /// Several modes, concatenated in this order; `None` for none or more than six.
    pub fn of(modes: &[PoolingMode]) -> Option<Self> {
        let (&first, _) = modes.split_first()?;
        if modes.len() > 6 {
            return None;
        }
        let mut all = [first; 6];
        all[..modes.len()].copy_from_slice(modes);
        Some(Self { modes: all, len: modes.len() as u8 })
    }

    /// The modes, in the order their vectors are concatenated.
    pub fn modes(&self) -> &[PoolingMode] {
        &self.modes[..self.len as usize]
    }

    /// Parse a mode's name, or several joined by '+' ('mean+weightedmean'); any case.
    pub fn parse(s: &str) -> Option<Self> {
        let modes: Option<Vec<PoolingMode>> = s.split('+').map(|m| PoolingMode::parse(m.trim())).collect();
        Self::of(&modes?)
    }

    /// The name used in options and records: the mode's name, or the modes' joined by '+'.
    pub fn name(&self) -> String {
        self.modes().iter().map(PoolingMode::as_str).collect::<Vec<_>>().join("+")
    }

    /// Whether this is mean pooling alone (which a GPU's graph can compute, see `onnx_pooling`).
    pub fn is_mean(&self) -> bool {
        self.modes() == [PoolingMode::Mean]
    }

    /// The length of the pooled vector of `dim`-dimensional token states.
    pub fn out_dim(&self, dim: usize) -> usize {
        dim * self.modes().len()
    }

    /// Pool one row: `states` holds `mask.len()` token vectors of `dim` floats each; write
    /// [`Pooling::out_dim`] floats to `out`, one mode's vector after another.
    pub fn pool_row(&self, states: &[f32], mask: &[i64], dim: usize, out: &mut [f32]) {
        debug_assert_eq!(states.len(), mask.len() * dim);
        for (mode, out) in self.modes().iter().zip(out.chunks_mut(dim)) {
            mode.pool(states, mask, dim, out);
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
        let mut out = vec![0.0; p.out_dim(2)];
        p.pool_row(&STATES, &MASK, 2, &mut out);
        out
    }

    fn mode(m: PoolingMode) -> Vec<f32> {
        pool(Pooling::one(m))
    }

    #[test]
    fn each_mode_ignores_padding() {
        assert_eq!(mode(PoolingMode::Mean), vec![2.0, 1.0]);
        assert_eq!(mode(PoolingMode::Cls), vec![1.0, 4.0]);
        assert_eq!(mode(PoolingMode::Max), vec![3.0, 4.0]);
        assert_eq!(mode(PoolingMode::LastToken), vec![3.0, -2.0], "the last kept token, not the padding");
        // sum / sqrt(2)
        let s = 2f32.sqrt();
        assert_eq!(mode(PoolingMode::MeanSqrtLen), vec![4.0 / s, 2.0 / s]);
        // weights 1 and 2: (1*1 + 2*3) / 3, (1*4 + 2*-2) / 3
        assert_eq!(mode(PoolingMode::WeightedMean), vec![7.0 / 3.0, 0.0]);
    }

    #[test]
    fn several_modes_are_concatenated_in_the_order_given() {
        let p = Pooling::parse("mean+lasttoken").unwrap();
        assert_eq!(pool(p), vec![2.0, 1.0, 3.0, -2.0]);
        assert_eq!(p.name(), "mean+lasttoken");
        assert_eq!(p.out_dim(384), 768);
        let q = Pooling::of(&[PoolingMode::LastToken, PoolingMode::Mean]).unwrap();
        assert_eq!(pool(q), vec![3.0, -2.0, 2.0, 1.0]);
        assert_ne!(p, q);
        assert!(Pooling::of(&[]).is_none() && Pooling::of(&[PoolingMode::Cls; 7]).is_none());
    }

    #[test]
    fn a_row_with_no_kept_token_pools_to_zeros() {
        let mut out = vec![9.0; 2];
        for m in PoolingMode::ALL {
            Pooling::one(m).pool_row(&STATES, &[0, 0, 0], 2, &mut out);
            assert!(out.iter().all(|v| v.is_finite()), "{m:?}: {out:?}");
        }
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
        assert_eq!(Pooling::parse("MEAN"), Some(Pooling::MEAN));
        assert_eq!(Pooling::parse("weightedmean"), Some(Pooling::one(PoolingMode::WeightedMean)));
        assert_eq!(Pooling::parse("mean_sqrt_len_tokens").map(|p| p.name()).as_deref(), Some("mean_sqrt_len_tokens"));
        assert_eq!(Pooling::parse("median"), None);
        assert_eq!(Pooling::parse("mean+"), None);
        assert_eq!(Pooling::MAX.name(), "max");
        assert!(Pooling::MEAN.is_mean() && !Pooling::parse("mean+max").unwrap().is_mean());
    }
}
