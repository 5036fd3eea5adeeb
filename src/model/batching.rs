//! Cutting tokenised texts into model calls: longest first, so the first call is the most expensive
//! one, with rows x padded length kept within a token budget.

/// One model call: which rows go in, and the length they are padded to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Indices into the tokenised input.
    pub rows: Vec<usize>,
    /// The longest row's length; every row is padded to it.
    pub padded_len: usize,
}

/// Order rows by length, longest first, and cut batches of at most `max_rows` rows whose
/// `rows * padded_len` stays within `batch_tokens`. A single row longer than the budget gets a call
/// of its own.
pub fn plan_batches(lengths: &[usize], batch_tokens: usize, max_rows: usize) -> Vec<Batch> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|a, b| lengths[*b].cmp(&lengths[*a]));
    let mut batches = Vec::new();
    let mut rest = &order[..];
    while let Some(&first) = rest.first() {
        let padded_len = lengths[first].max(1);
        let fit = (batch_tokens / padded_len).clamp(1, max_rows.max(1));
        let take = fit.min(rest.len());
        batches.push(Batch { rows: rest[..take].to_vec(), padded_len: lengths[first] });
        rest = &rest[take..];
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_once_and_within_budget() {
        let lengths: Vec<usize> = (0..1000).map(|i| (i * 7919) % 300 + 2).collect();
        let batches = plan_batches(&lengths, 2048, 64);
        let mut seen = vec![0; lengths.len()];
        for b in &batches {
            assert!(b.rows.len() <= 64);
            assert!(b.rows.len() * b.padded_len <= 2048 || b.rows.len() == 1);
            for &r in &b.rows {
                assert!(lengths[r] <= b.padded_len);
                seen[r] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
    }

    #[test]
    fn longest_first_and_oversized_rows_alone() {
        let batches = plan_batches(&[3, 5000, 4], 100, 8);
        assert_eq!(batches[0], Batch { rows: vec![1], padded_len: 5000 });
        assert_eq!(batches[1], Batch { rows: vec![2, 0], padded_len: 4 });
    }

    #[test]
    fn empty_input_gives_no_batches() {
        assert!(plan_batches(&[], 100, 8).is_empty());
    }
}
