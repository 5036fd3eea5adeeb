//! Seeded samples of ids: each id's place in an order fixed by a seed, and the ids lowest in it kept in bounded
//! memory while a dataset or a corpus streams past (`verify`'s re-embedded sample, `evaluate`'s overlap).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use sha2::{Digest, Sha256};

/// An id's place in the seeded order: the first 8 bytes of SHA-256 of the seed and the id (the same on every
/// machine and in every version).
pub fn seeded_rank(seed: u64, id: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(id.as_bytes());
    u64::from_be_bytes(h.finalize()[..8].try_into().unwrap_or_default())
}

/// The `keep` items lowest in the seeded order among those offered, in memory for `keep` items only.
pub struct Lowest<T> {
    keep: usize,
    heap: BinaryHeap<Ranked<T>>,
}

/// An item and its rank, ordered by rank alone, so that the heap's top is the highest kept.
struct Ranked<T> {
    rank: u64,
    item: T,
}

impl<T> Lowest<T> {
    pub fn new(keep: usize) -> Self {
        Self { keep, heap: BinaryHeap::new() }
    }

    /// Keep the item of `rank` if it is among the lowest so far; `item` is made only then.
    pub fn offer(&mut self, rank: u64, item: impl FnOnce() -> T) {
        if self.keep == 0 {
            return;
        }
        if self.heap.len() < self.keep {
            self.heap.push(Ranked { rank, item: item() });
        } else if self.heap.peek().is_some_and(|top| rank < top.rank) {
            self.heap.pop();
            self.heap.push(Ranked { rank, item: item() });
        }
    }

    /// The items kept and their ranks, in no particular order.
    pub fn into_vec(self) -> Vec<(u64, T)> {
        self.heap.into_iter().map(|r| (r.rank, r.item)).collect()
    }
}

impl<T> PartialEq for Ranked<T> {
    fn eq(&self, other: &Self) -> bool {
        self.rank == other.rank
    }
}
impl<T> Eq for Ranked<T> {}
impl<T> PartialOrd for Ranked<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Ranked<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.rank.cmp(&other.rank)
    }
}

#[cfg(test)]
mod tests {
    use super::{Lowest, seeded_rank};

    #[test]
    fn the_seeded_order_is_fixed_and_depends_on_the_seed() {
        assert_eq!(seeded_rank(0, "a"), seeded_rank(0, "a"));
        assert_ne!(seeded_rank(0, "a"), seeded_rank(1, "a"));
        assert_ne!(seeded_rank(0, "a"), seeded_rank(0, "b"));
    }

    #[test]
    fn the_lowest_ranks_are_kept_whatever_the_order_they_come_in() {
        let ids: Vec<String> = (0..1000).map(|i| format!("id-{i}")).collect();
        let mut want: Vec<(u64, String)> = ids.iter().map(|id| (seeded_rank(7, id), id.clone())).collect();
        want.sort();
        want.truncate(25);
        for order in [ids.clone(), ids.iter().rev().cloned().collect()] {
            let mut lowest = Lowest::new(25);
            for id in &order {
                lowest.offer(seeded_rank(7, id), || id.clone());
            }
            let mut got = lowest.into_vec();
            got.sort();
            assert_eq!(got, want);
        }
        let mut none = Lowest::new(0);
        none.offer(1, || "x");
        assert!(none.into_vec().is_empty());
    }
}
