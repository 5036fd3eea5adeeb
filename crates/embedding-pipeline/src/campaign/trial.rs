//! A trial's arithmetic, apart from any model or file: the length strata of a corpus in length order,
//! the rows a sample takes from each, and the full campaign's time extrapolated stratum by stratum from
//! the sample's measured calls.

use std::ops::Range;

use serde::{Deserialize, Serialize};

/// Length strata a trial measures: contiguous ranges of the rows in length order, holding about equal
/// useful tokens each. Short and long texts run at different useful tokens/s (attention grows with the
/// length; short calls pay more per-call overhead), so each stratum gets its own rate.
pub const STRATA: usize = 8;

/// Strata of rows in length order (`counts[i]`: useful tokens of row `i`): at most `n` contiguous ranges
/// covering every row, each ending at the row that brings it to 1/n of the tokens.
pub fn strata(counts: &[u32], n: usize) -> Vec<Range<usize>> {
    let total: u64 = counts.iter().map(|c| u64::from(*c)).sum();
    let n = n.max(1) as u64;
    let mut out = Vec::new();
    let (mut start, mut sum) = (0, 0u64);
    for (i, c) in counts.iter().enumerate() {
        sum += u64::from(*c);
        // Stratum k ends where the running total first reaches (k+1)/n of all tokens.
        if (out.len() as u64 + 1) < n && sum * n >= total * (out.len() as u64 + 1) {
            out.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < counts.len() {
        out.push(start..counts.len());
    }
    out
}

/// The spacing of a sample of about `fraction` of a stratum's rows: every `step`-th row, `step` a power of
/// two (the nearest to `1 / fraction` on a log scale). Powers of two nest: a sample at step 64 is part of
/// one at step 32, so trials of different sizes on the same plan (a slow card's and a fast one's) share
/// all the rows of the smaller, and their vectors compare by id.
pub fn step_for(fraction: f64) -> usize {
    if fraction.is_nan() || fraction <= 0.0 || fraction >= 1.0 {
        return 1;
    }
    let exponent = (1.0 / fraction).log2().round().clamp(0.0, 62.0) as u32;
    1usize << exponent
}

/// The step a stratum of `rows` rows takes: `step`, made smaller (still a power of two) where that would
/// leave it fewer than `min_rows` rows.
pub fn stratum_step(step: usize, rows: usize, min_rows: usize) -> usize {
    let mut s = step.max(1);
    while s > 1 && rows.div_ceil(s) < min_rows {
        s /= 2;
    }
    s
}

/// Whether the row at offset `j` of a stratum belongs to a sample of every `step`-th row: evenly spaced
/// through the stratum, so through its lengths.
pub fn picked(j: usize, step: usize) -> bool {
    j.is_multiple_of(step.max(1))
}

/// One stretch of the sample's calls: the seconds between two embedded chunks leaving the model, and the
/// useful tokens the later one held.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub seconds: f64,
    pub tokens: u64,
}

/// The intervals of a timeline of (seconds since the first call began, useful tokens embedded so far).
pub fn intervals(timeline: &[(f64, u64)]) -> Vec<Interval> {
    let mut last = (0.0, 0);
    timeline
        .iter()
        .map(|&(t, tokens)| {
            let i = Interval { seconds: (t - last.0).max(0.0), tokens: tokens.saturating_sub(last.1) };
            last = (t, tokens);
            i
        })
        .collect()
}

/// What one stratum holds in the corpus and in the sample, the rate measured on it, and the time it will
/// take in the full campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StratumRate {
    pub stratum: usize,
    /// Token counts of its longest and shortest text.
    pub longest: u32,
    pub shortest: u32,
    pub corpus_rows: u64,
    pub corpus_tokens: u64,
    pub sample_rows: u64,
    pub sample_tokens: u64,
    /// Model calls (chunks) timed in it, their useful tokens and seconds.
    pub timed_calls: u64,
    pub timed_tokens: u64,
    pub timed_seconds: f64,
    pub useful_tokens_per_second: f64,
    /// Set when too few calls were timed here and the rate is a neighbouring stratum's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_from_stratum: Option<usize>,
    /// The corpus's tokens of this stratum at that rate, and the range two standard errors give.
    pub predicted_seconds: f64,
    pub low_seconds: f64,
    pub high_seconds: f64,
}

impl StratumRate {
    /// Stratum `k` over `rows` of the corpus in length order (`counts`: each row's useful tokens), of which
    /// the sample holds `sample_rows` rows and `sample_tokens` tokens; not yet timed.
    pub fn new(k: usize, counts: &[u32], rows: Range<usize>, sample_rows: u64, sample_tokens: u64) -> Self {
        let of = &counts[rows.clone()];
        StratumRate {
            stratum: k,
            longest: of.first().copied().unwrap_or(0),
            shortest: of.last().copied().unwrap_or(0),
            corpus_rows: of.len() as u64,
            corpus_tokens: of.iter().map(|c| u64::from(*c)).sum(),
            sample_rows,
            sample_tokens,
            timed_calls: 0,
            timed_tokens: 0,
            timed_seconds: 0.0,
            useful_tokens_per_second: 0.0,
            rate_from_stratum: None,
            predicted_seconds: 0.0,
            low_seconds: 0.0,
            high_seconds: 0.0,
        }
    }
}

/// Relative standard error assumed for a stratum with fewer than two timed calls (its spread cannot be
/// measured).
const UNMEASURED_SPREAD: f64 = 0.1;

/// The time the corpus's strata take at the rates measured on the sample. `sample_ends[k]` is the useful
/// tokens of the sample up to the end of stratum `k` (cumulative, in the order embedded); each interval
/// of `calls` counts toward the stratum its tokens' midpoint falls in. A stratum's seconds per token is
/// its intervals' ratio estimate; its range, two standard errors of that ratio.
pub fn extrapolate(strata: &mut [StratumRate], sample_ends: &[u64], calls: &[Interval]) {
    let mut per: Vec<Vec<Interval>> = vec![Vec::new(); strata.len()];
    let mut done = 0u64;
    for call in calls {
        let middle = done + call.tokens / 2;
        done += call.tokens;
        let k = sample_ends.iter().position(|end| middle < *end).unwrap_or(strata.len().saturating_sub(1));
        if let Some(p) = per.get_mut(k) {
            p.push(*call);
        }
    }
    // (seconds per token, its standard error) of each stratum that has timed calls.
    let measured: Vec<Option<(f64, f64)>> = per
        .iter()
        .map(|calls| {
            let (secs, tokens) = calls.iter().fold((0.0, 0u64), |(s, t), c| (s + c.seconds, t + c.tokens));
            if calls.is_empty() || tokens == 0 {
                return None;
            }
            let r = secs / tokens as f64;
            let n = calls.len() as f64;
            let se = if calls.len() < 2 {
                r * UNMEASURED_SPREAD
            } else {
                let mean_tokens = tokens as f64 / n;
                let ss: f64 = calls.iter().map(|c| (c.seconds - r * c.tokens as f64).powi(2)).sum();
                (ss / (n * (n - 1.0))).sqrt() / mean_tokens
            };
            Some((r, se))
        })
        .collect();
    for (k, s) in strata.iter_mut().enumerate() {
        let calls = &per[k];
        s.timed_calls = calls.len() as u64;
        s.timed_tokens = calls.iter().map(|c| c.tokens).sum();
        s.timed_seconds = calls.iter().map(|c| c.seconds).sum();
        // The nearest stratum with a rate, the longer side first on a tie.
        let source = (0..measured.len())
            .filter(|j| measured[*j].is_some())
            .min_by_key(|j| (j.abs_diff(k), *j > k))
            .filter(|j| *j != k || measured[k].is_some());
        let Some(j) = source else {
            s.useful_tokens_per_second = 0.0;
            continue;
        };
        let (r, se) = measured[j].expect("filtered");
        s.rate_from_stratum = (j != k).then_some(j);
        s.useful_tokens_per_second = if r > 0.0 { 1.0 / r } else { 0.0 };
        let tokens = s.corpus_tokens as f64;
        s.predicted_seconds = tokens * r;
        s.low_seconds = tokens * (r - 2.0 * se).max(0.0);
        s.high_seconds = tokens * (r + 2.0 * se);
    }
}

/// The full campaign's predicted wall time: fixed costs plus every stratum's, with its range (the strata's
/// standard errors added in quadrature).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Prediction {
    pub seconds: f64,
    pub low_seconds: f64,
    pub high_seconds: f64,
    /// Of which: loading the model, the write's start before its first call, and its end after its last.
    pub model_load_seconds: f64,
    pub startup_seconds: f64,
    pub finish_seconds: f64,
    /// The strata's seconds together.
    pub embedding_seconds: f64,
    /// The corpus's useful tokens over the predicted seconds.
    pub useful_tokens_per_second: f64,
}

/// Sum the strata and the fixed costs into a prediction.
pub fn predict(strata: &[StratumRate], model_load: f64, startup: f64, finish: f64) -> Prediction {
    let embedding: f64 = strata.iter().map(|s| s.predicted_seconds).sum();
    let half_range = strata.iter().map(|s| ((s.high_seconds - s.low_seconds) / 2.0).powi(2)).sum::<f64>().sqrt();
    let fixed = model_load + startup + finish;
    let seconds = fixed + embedding;
    let tokens: u64 = strata.iter().map(|s| s.corpus_tokens).sum();
    Prediction {
        seconds,
        low_seconds: fixed + (embedding - half_range).max(0.0),
        high_seconds: fixed + embedding + half_range,
        model_load_seconds: model_load,
        startup_seconds: startup,
        finish_seconds: finish,
        embedding_seconds: embedding,
        useful_tokens_per_second: if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stratum `k` of one row holding `corpus_tokens` tokens.
    fn stratum(k: usize, corpus_tokens: u64) -> StratumRate {
        StratumRate::new(k, &[corpus_tokens as u32], 0..1, 0, 0)
    }

    #[test]
    fn strata_cover_every_row_in_order_with_about_equal_tokens() {
        let counts: Vec<u32> = (0..10_000u32).map(|i| 512 - (i * 511 / 9_999)).collect();
        let s = strata(&counts, 8);
        assert_eq!(s.len(), 8);
        assert_eq!((s[0].start, s[7].end), (0, counts.len()));
        assert!(s.windows(2).all(|w| w[0].end == w[1].start), "contiguous: {s:?}");
        let total: u64 = counts.iter().map(|c| u64::from(*c)).sum();
        for r in &s {
            let t: u64 = counts[r.clone()].iter().map(|c| u64::from(*c)).sum();
            assert!((t as f64 - total as f64 / 8.0).abs() < 600.0, "{r:?}: {t} of {total}");
        }
        // Long rows first: the first stratum has fewer rows than the last.
        assert!(s[0].len() < s[7].len());
        assert!(strata(&[], 8).is_empty());
        assert_eq!(strata(&[5, 5], 8), [0..1, 1..2], "never more strata than rows");
    }

    #[test]
    fn a_sample_is_evenly_spaced_nested_across_sizes_and_its_length_mix_matches_the_corpus() {
        assert_eq!((step_for(0.05), step_for(0.033), step_for(0.5), step_for(1.0), step_for(0.0)), (16, 32, 2, 1, 1));
        assert_eq!(stratum_step(64, 100, 8), 8, "100 rows keep at least 8");
        assert_eq!((stratum_step(64, 10_000, 8), stratum_step(64, 3, 8)), (64, 1));
        let picks = |step: usize| (0..1_000).filter(|j| picked(*j, step)).collect::<Vec<usize>>();
        assert_eq!(picks(16).len(), 63);
        assert!(picks(32).iter().all(|j| picks(16).contains(j)), "a smaller sample is part of a larger one");
        // A skewed corpus (many short texts, few long), binned in 10s: the sample's bin shares follow it.
        let lengths: Vec<u32> = (0..20_000u32).map(|i| 1 + (i * i % 97_003) / 200).collect();
        let mut sorted = lengths.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let sample: Vec<u32> = (0..sorted.len()).filter(|j| picked(*j, 16)).map(|j| sorted[j]).collect();
        let shares = |v: &[u32]| {
            let mut bins = vec![0.0; 60];
            v.iter().for_each(|l| bins[(*l as usize / 10).min(59)] += 1.0 / v.len() as f64);
            bins
        };
        let (all, got) = (shares(&sorted), shares(&sample));
        let worst = all.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst < 0.002, "largest bin share difference {worst}");
    }

    #[test]
    fn each_stratum_is_timed_on_its_own_calls_and_extrapolated_to_its_corpus_tokens() {
        // Two strata; the sample's stratum 0 ends at 320 tokens. Stratum 0 runs 100 tokens/s, stratum 1
        // 200 tokens/s; the call straddling the boundary (300..360) counts where its middle (330) falls.
        let timeline = [(1.0, 100), (2.0, 200), (3.0, 300), (3.3, 360), (4.3, 560)];
        let calls = intervals(&timeline);
        assert_eq!(calls[3].tokens, 60);
        let mut s = vec![stratum(0, 10_000), stratum(1, 20_000)];
        extrapolate(&mut s, &[320, 560], &calls);
        assert_eq!((s[0].timed_calls, s[0].timed_tokens), (3, 300));
        assert_eq!((s[1].timed_calls, s[1].timed_tokens), (2, 260));
        assert!((s[0].useful_tokens_per_second - 100.0).abs() < 1e-9);
        assert!((s[1].useful_tokens_per_second - 200.0).abs() < 1e-9);
        assert!((s[0].predicted_seconds - 100.0).abs() < 1e-9, "10,000 tokens at 100/s");
        assert!((s[1].predicted_seconds - 100.0).abs() < 1e-9, "20,000 tokens at 200/s");
        // Calls at an even rate have no spread.
        assert!((s[0].high_seconds - s[0].low_seconds).abs() < 1e-9);

        let p = predict(&s, 1.0, 0.5, 0.5);
        assert!((p.seconds - 202.0).abs() < 1e-9);
        assert!((p.embedding_seconds - 200.0).abs() < 1e-9);
        assert!((p.useful_tokens_per_second - 30_000.0 / 202.0).abs() < 1e-9);
    }

    #[test]
    fn uneven_calls_give_a_range_and_a_stratum_without_calls_borrows_its_neighbours_rate() {
        let calls = [
            Interval { seconds: 1.0, tokens: 100 },
            Interval { seconds: 1.4, tokens: 100 },
            Interval { seconds: 0.6, tokens: 100 },
        ];
        let mut s = vec![stratum(0, 1_000), stratum(1, 1_000), stratum(2, 1_000)];
        // Every call in stratum 0; strata 1 and 2 have none.
        extrapolate(&mut s, &[300, 300, 300], &calls);
        assert!((s[0].predicted_seconds - 10.0).abs() < 1e-9);
        // Ratio estimate 0.01 s/token; residuals 0, 0.4, -0.4: se = sqrt(0.32 / 6) / 100.
        let se = (0.32f64 / 6.0).sqrt() / 100.0;
        assert!((s[0].high_seconds - 1_000.0 * (0.01 + 2.0 * se)).abs() < 1e-9);
        assert!(s[0].low_seconds < s[0].predicted_seconds && s[0].predicted_seconds < s[0].high_seconds);
        assert_eq!((s[1].rate_from_stratum, s[2].rate_from_stratum), (Some(0), Some(0)));
        assert!((s[2].predicted_seconds - 10.0).abs() < 1e-9);
        let p = predict(&s, 0.0, 0.0, 0.0);
        assert!(p.low_seconds < p.seconds && p.seconds < p.high_seconds);
    }
}
