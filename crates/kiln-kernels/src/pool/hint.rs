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

    /// The address ranges of share `me` of `threads` (the `me`-th of equal parts of the
    /// spans' bytes in order, as a decode matmul's contiguous task ranges give it), cut to its
    /// first `budget` bytes.
    fn share(&self, me: usize, threads: usize, budget: usize) -> Spans {
        let per = self.total() / threads.max(1);
        let (mut skip, mut left) = (per * me, per.min(budget));
        let mut out = Spans::default();
        for &(addr, len) in &self.spans[..self.n] {
            if left == 0 {
                break;
            }
            if skip >= len {
                skip -= len;
                continue;
            }
            let take = (len - skip).min(left);
            out.spans[out.n] = (addr.wrapping_add(skip), take);
            out.n += 1;
            left -= take;
            skip = 0;
        }
        out
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
        let share = spans.share(me, threads, BUDGET);
        let mut lines = 0;
        for &(addr, len) in &share.spans[..share.n] {
            for off in (0..len).step_by(64) {
                prefetch_line(addr.wrapping_add(off));
                lines += 1;
                if lines % CHECK_EVERY == 0 && arrived() {
                    return;
                }
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
    fn shares_are_equal_parts_in_order_cut_to_the_budget() {
        let s = Spans {
            spans: [(1000, 300), (5000, 100), (9000, 200), (0, 0)],
            n: 3,
        };
        let share = |me, threads, budget| {
            let r = s.share(me, threads, budget);
            r.spans[..r.n].to_vec()
        };
        // 600 bytes in halves: the second starts 300 bytes in, at the second span.
        assert_eq!(share(0, 2, 1000), [(1000, 300)]);
        assert_eq!(share(1, 2, 1000), [(5000, 100), (9000, 200)]);
        // Thirds cross span boundaries; a budget cuts a share short.
        assert_eq!(share(1, 3, 1000), [(1200, 100), (5000, 100)]);
        assert_eq!(share(2, 3, 150), [(9000, 150)]);
        assert_eq!(share(1, 2, 50), [(5000, 50)]);
        assert!(Spans::default().share(0, 2, 1000).n == 0);
    }

    #[test]
    fn a_worker_walks_its_share_and_stops_when_the_job_arrives() {
        let a = vec![0u8; 100_000];
        let b = vec![0u8; 50_000];
        let slot = HintSlot::default();
        let before = slot.generation();
        slot.post(Spans::new([&a[..], &b[..]]));
        assert_ne!(slot.generation(), before);
        let looks = |arrived: bool| {
            let n = std::cell::Cell::new(0);
            slot.prefetch_share(1, 2, || {
                n.set(n.get() + 1);
                arrived
            });
            n.get()
        };
        // The whole budget (64 KiB: 1,024 lines) with a look every 8 lines, or one look.
        assert_eq!(looks(false), BUDGET / 64 / CHECK_EVERY);
        assert_eq!(looks(true), 1);
    }
}
