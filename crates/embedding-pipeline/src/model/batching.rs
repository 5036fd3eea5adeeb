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

/// Keep the input order and cut batches of `rows` rows, each padded to its longest row (the baseline).
pub fn plan_fixed_batches(lengths: &[usize], rows: usize) -> Vec<Batch> {
    let order: Vec<usize> = (0..lengths.len()).collect();
    order
        .chunks(rows.max(1))
        .map(|c| Batch { rows: c.to_vec(), padded_len: c.iter().map(|&r| lengths[r]).max().unwrap_or(0) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_batches_keep_the_input_order() {
        let b = plan_fixed_batches(&[3, 9, 4, 1, 7], 2);
        assert_eq!(
            b.iter().map(|b| (b.rows.clone(), b.padded_len)).collect::<Vec<_>>(),
            [(vec![0, 1], 9), (vec![2, 3], 4), (vec![4], 7)]
        );
    }

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
