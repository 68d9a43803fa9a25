//! The order examples are trained in (spec §8.2 batching rules), reproducible from the seed with
//! the same mulberry32 generator optiq uses, so a run can be repeated or resumed by epoch.

/// A batch of more than one is padded to a multiple of this many tokens.
const PAD_MULTIPLE: usize = 32;

/// The order of one epoch (spec §8.2 batching rules): `batch_size` 1 (or 0) → every index once,
/// shuffled by a mulberry32 generator seeded from (`seed`, `epoch`); `batch_size` > 1 →
/// examples sorted by length (stable), cut into contiguous windows of `batch_size`, remainder
/// dropped, windows shuffled by the same generator. Fewer examples than `batch_size` give no
/// batch at all.
pub fn epoch_batches(
    lengths: &[usize],
    batch_size: usize,
    seed: u64,
    epoch: u64,
) -> Vec<Vec<usize>> {
    let mut rng = Mulberry32::for_epoch(seed, epoch);
    let mut batches: Vec<Vec<usize>> = if batch_size <= 1 {
        (0..lengths.len()).map(|i| vec![i]).collect()
    } else {
        let mut order: Vec<usize> = (0..lengths.len()).collect();
        // Similar lengths share a batch, so little of it is padding.
        order.sort_by_key(|&i| lengths.get(i).copied().unwrap_or(0));
        order
            .chunks_exact(batch_size)
            .map(<[usize]>::to_vec)
            .collect()
    };
    rng.shuffle(&mut batches);
    batches
}

/// The padded length of a batch of B>1 (the longest rounded up to a multiple of 32, at most
/// `max_seq_length`) — spec §8.2.
pub fn padded_len(longest: usize, max_seq_length: usize) -> usize {
    longest
        .div_ceil(PAD_MULTIPLE)
        .saturating_mul(PAD_MULTIPLE)
        .min(max_seq_length)
}

/// The mulberry32 generator: 32 bits of state, a full-period Weyl sequence through a mixer.
struct Mulberry32(u32);

impl Mulberry32 {
    /// Seeded with `seed ^ epoch·0x9E3779B9` (both truncated to 32 bits), so each epoch has its
    /// own order.
    fn for_epoch(seed: u64, epoch: u64) -> Self {
        Mulberry32((seed as u32) ^ (epoch as u32).wrapping_mul(0x9E37_79B9))
    }

    /// The next 32-bit output, as JavaScript's `mulberry32()` returns it before dividing by 2^32.
    fn next_u32(&mut self) -> u32 {
        self.0 = self.0.wrapping_add(0x6D2B_79F5);
        let a = self.0;
        let mut t = (a ^ (a >> 15)).wrapping_mul(a | 1);
        t ^= t.wrapping_add((t ^ (t >> 7)).wrapping_mul(t | 61));
        t ^ (t >> 14)
    }

    /// Fisher–Yates from the end with `j = floor(next / 2^32 · (i + 1))`, computed in f64 as the
    /// JavaScript reference does so the orders agree exactly.
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let unit = f64::from(self.next_u32()) / 4_294_967_296.0;
            let j = (unit * (i + 1) as f64).floor() as usize;
            // The product is below i + 1 for any realistic length; the min keeps it in range.
            items.swap(i, j.min(i));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mulberry32_matches_the_javascript_reference() {
        // node: mulberry32(0) → 1144304738, 1416247, 958946056 (outputs before the / 2^32).
        let mut rng = Mulberry32(0);
        let got = [rng.next_u32(), rng.next_u32(), rng.next_u32()];
        assert_eq!(got, [1144304738, 1416247, 958946056]);
        let mut rng = Mulberry32(42);
        assert_eq!(rng.next_u32(), 2581720956);
    }

    fn flat(batches: &[Vec<usize>]) -> Vec<usize> {
        batches.iter().flatten().copied().collect()
    }

    #[test]
    fn single_batches_follow_the_reference_shuffle() {
        // The same Fisher–Yates run in node over 0..10, seeds 0 and 7 ^ imul(3, 0x9E3779B9).
        let lengths = [5; 10];
        let e0 = epoch_batches(&lengths, 1, 0, 0);
        assert_eq!(flat(&e0), [3, 8, 6, 4, 5, 9, 7, 1, 0, 2]);
        assert!(e0.iter().all(|b| b.len() == 1));
        assert_eq!(
            flat(&epoch_batches(&lengths, 1, 7, 3)),
            [1, 2, 5, 0, 7, 3, 4, 6, 9, 8]
        );
    }

    #[test]
    fn single_batches_are_a_permutation_per_epoch_and_repeatable() {
        let lengths: Vec<usize> = (0..100).map(|i| i % 7).collect();
        let e0 = flat(&epoch_batches(&lengths, 1, 11, 0));
        let e1 = flat(&epoch_batches(&lengths, 1, 11, 1));
        for order in [&e0, &e1] {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        }
        assert_ne!(e0, e1, "epochs must differ");
        assert_eq!(
            e0,
            flat(&epoch_batches(&lengths, 1, 11, 0)),
            "same seed, same order"
        );
        assert_ne!(
            e0,
            flat(&epoch_batches(&lengths, 1, 12, 0)),
            "seeds must matter"
        );
        assert_eq!(
            flat(&epoch_batches(&lengths, 0, 11, 0)),
            e0,
            "0 behaves as 1"
        );
    }

    #[test]
    fn larger_batches_are_sorted_windows_without_the_remainder() {
        let lengths = [9, 1, 5, 3, 7, 2, 8, 4, 6, 5, 0];
        let batches = epoch_batches(&lengths, 3, 5, 2);
        assert_eq!(batches.len(), 3, "11 examples in 3s: 3 windows, 2 dropped");
        // By length, ties in index order (2 before 9): 10 1 5 | 3 7 2 | 9 8 4 | 6 0 (dropped).
        let mut windows = batches.clone();
        windows.sort_unstable();
        assert_eq!(windows, [vec![3, 7, 2], vec![9, 8, 4], vec![10, 1, 5]]);
        let shuffled = (0..20).any(|e| epoch_batches(&lengths, 3, 5, e) != batches);
        assert!(shuffled, "the windows' order must change with the epoch");
        assert!(epoch_batches(&lengths, 12, 0, 0).is_empty());
    }

    #[test]
    fn padding_rounds_up_to_32_within_the_limit() {
        assert_eq!(padded_len(1, 512), 32);
        assert_eq!(padded_len(32, 512), 32);
        assert_eq!(padded_len(33, 512), 64);
        assert_eq!(padded_len(500, 512), 512);
        assert_eq!(padded_len(100, 80), 80);
        assert_eq!(padded_len(0, 512), 0);
        assert_eq!(padded_len(usize::MAX, 512), 512);
    }
}
