//! Which decode matmul follows which. A one-token forward calls the same matmuls in the same
//! order at every token, so after each one the weights of the call that followed it last time
//! are the best guess for the next; they go to the pool as a prefetch hint
//! ([`crate::pool::Pool::hint_next`]) for the workers that wait while the caller runs the
//! serial steps in between. Learned from the first token on; a wrong guess (another model, a
//! batch) only costs a prefetch.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::pool::Spans;

/// Calls remembered at most; past that the table starts over (a process that loads many
/// models in turn must not grow it without bound).
const CAPACITY: usize = 4096;

#[derive(Default)]
struct Successors {
    /// First weight address of the previous one-token call.
    last: Option<usize>,
    /// What followed each call, by its first weight address.
    next: HashMap<usize, Spans>,
}

static SUCCESSORS: Mutex<Option<Successors>> = Mutex::new(None);

/// Records a one-token matmul over the weights `ws` (in dispatch order) that has just
/// finished, and hints the pool with what came after it last time.
pub(crate) fn one_token_matmul_done(ws: &[&[u8]]) {
    let pool = crate::pool::global();
    if pool.threads() < 2 || ws.is_empty() {
        return;
    }
    let mut guard = SUCCESSORS.lock().unwrap_or_else(|p| p.into_inner());
    let next = guard.get_or_insert_with(Successors::default).record(ws);
    drop(guard);
    if let Some(next) = next {
        pool.hint_next(next);
    }
}

impl Successors {
    /// Notes that `ws` followed the previous call, and returns what followed `ws` last time.
    fn record(&mut self, ws: &[&[u8]]) -> Option<Spans> {
        let key = ws.first()?.as_ptr() as usize;
        if let Some(last) = self.last {
            if self.next.len() >= CAPACITY && !self.next.contains_key(&last) {
                self.next.clear();
            }
            self.next.insert(last, Spans::new(ws.iter().copied()));
        }
        self.last = Some(key);
        self.next.get(&key).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_call_that_followed_last_time_is_the_guess() {
        let (a, b, c) = (vec![1u8; 64], vec![2u8; 64], vec![3u8; 64]);
        let mut t = Successors::default();
        // First token: nothing known yet.
        assert!(t.record(&[&a]).is_none());
        assert!(t.record(&[&b, &c]).is_none());
        assert!(t.record(&[&c]).is_none());
        // Second token: each call predicts the one after it.
        assert_eq!(t.record(&[&a]), Some(Spans::new([&b[..], &c[..]])));
        assert_eq!(t.record(&[&b, &c]), Some(Spans::new([&c[..]])));
        assert_eq!(t.record(&[&c]), Some(Spans::new([&a[..]])));
    }
}
