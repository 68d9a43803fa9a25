//! Seeded choices that are the same on every platform and release (calibration order, dataset
//! split points), on the training crate's splitmix64.

pub use kiln_train::lora::SplitMix;

/// A value in `lo..=hi` (`lo` when the range is empty).
pub fn in_range(rng: &mut SplitMix, lo: usize, hi: usize) -> usize {
    if hi <= lo {
        return lo;
    }
    lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize
}
