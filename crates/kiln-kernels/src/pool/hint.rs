//! Prefetch hints for idle workers. Between two decode matmuls the calling thread runs the
//! serial steps (norms, activation quantization, RoPE, the attention merge) while the workers
//! spin with the memory bus idle. A hint names the weights of the matmul expected next; each
//! worker pulls the start of its share of them into cache until that job arrives, so the
//! job's first stretch comes from cache instead of memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, TryLockError};

/// Most byte spans a hint carries (one dispatch's matrices).
pub(crate) const MAX_SPANS: usize = 4;

/// Bytes of its share a worker prefetches at most per hint: the start of its stretch, well
/// inside L2, and about what one thread reads in a serial gap of a few microseconds.
const BUDGET: usize = 64 << 10;

/// Cache lines between two looks at whether the job has arrived.
const CHECK_EVERY: usize = 8;

/// The latest hint: address and length of each span, in the order the job will take them.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Spans {
    spans: [(usize, usize); MAX_SPANS],
    n: usize,
}

impl Spans {
    /// Up to [`MAX_SPANS`] spans of `bytes`; the rest are dropped.
    pub(crate) fn new<'a>(bytes: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut s = Self::default();
        for b in bytes.into_iter().take(MAX_SPANS) {
            s.spans[s.n] = (b.as_ptr() as usize, b.len());
            s.n += 1;
        }
        s
    }

    fn total(&self) -> usize {
        self.spans[..self.n].iter().map(|s| s.1).sum()
    }
}

/// A pool's hint slot.
#[derive(Default)]
pub(crate) struct HintSlot {
    spans: Mutex<Spans>,
    generation: AtomicU64,
}

impl HintSlot {
    /// Replaces the hint.
    pub(crate) fn post(&self, spans: Spans) {
        *self.spans.lock().unwrap_or_else(|p| p.into_inner()) = spans;
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The hint's generation, for a worker to tell a new one from one it has taken.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Prefetches worker `me`'s share (the `me`-th of `threads` equal parts of the spans'
    /// bytes, as a decode matmul's contiguous ranges give it), at most [`BUDGET`] bytes from
    /// its start; stops early once `arrived()` says the job is there.
    pub(crate) fn prefetch_share(&self, me: usize, threads: usize, arrived: impl Fn() -> bool) {
        let spans = match self.spans.try_lock() {
            Ok(s) => *s,
            Err(TryLockError::Poisoned(p)) => *p.into_inner(),
            // The caller is posting a newer hint: take that one on the next look.
            Err(TryLockError::WouldBlock) => return,
        };
        let share = spans.total() / threads.max(1);
        let (mut skip, mut left) = (share * me, share.min(BUDGET));
        let mut lines = 0;
        for &(addr, len) in &spans.spans[..spans.n] {
            if skip >= len {
                skip -= len;
                continue;
            }
            let take = (len - skip).min(left);
            for off in (skip..skip + take).step_by(64) {
                prefetch_line(addr.wrapping_add(off));
                lines += 1;
                if lines % CHECK_EVERY == 0 && arrived() {
                    return;
                }
            }
            left -= take;
            skip = 0;
            if left == 0 {
                return;
            }
        }
    }
}

/// Asks for the cache line at `addr`; a prefetch never faults, so a stale address (weights
/// since dropped) costs nothing but the request.
#[inline]
fn prefetch_line(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` only hints the cache; it reads no memory the program can observe
    // and never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_walks_only_its_part_and_stops_when_the_job_arrives() {
        let a = vec![0u8; 100_000];
        let b = vec![0u8; 50_000];
        let slot = HintSlot::default();
        let before = slot.generation();
        slot.post(Spans::new([&a[..], &b[..]]));
        assert_ne!(slot.generation(), before);
        // Every share, whole or cut short, runs without touching memory outside the spans
        // (prefetches cannot fault, but the walk must still end).
        for me in 0..3 {
            slot.prefetch_share(me, 3, || false);
            slot.prefetch_share(me, 3, || true);
        }
        slot.post(Spans::default());
        slot.prefetch_share(1, 2, || false);
    }
}
