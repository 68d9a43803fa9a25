//! The KV slots: which sequence owns each, and what a free slot still holds, so a new
//! request can start from the longest common prefix any free slot keeps (as llama.cpp's
//! slots do). A slot's prefix is reused only by a request running the same adapters (its
//! namespace, spec §11.1): keys and values computed under one adapter are another model's.

/// One KV slot.
#[derive(Debug, Clone, Default)]
struct Slot {
    /// Tokens whose KV a free slot holds (empty while owned: the owner's history says).
    tokens: Vec<u32>,
    /// The adapters `tokens` were computed with (`AdapterStack::namespace`, `""`: the base).
    namespace: String,
    /// The sequence using it.
    owner: Option<u64>,
    /// Most positions written since the slot was last released: what its pages hold.
    high_water: usize,
    /// When it was last freed (a logical clock), for least-recently-used choice.
    last_used: u64,
}

/// Every slot of the KV store.
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    slots: Vec<Slot>,
    clock: u64,
}

/// Leading tokens two sequences share.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Slots {
    /// `n` empty slots.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            slots: vec![Slot::default(); n],
            clock: 0,
        }
    }

    /// The free slot for `prompt` (run in `namespace`) and the prefix of it that slot already
    /// holds: the longest usable common prefix among the slots of that namespace (leaving one
    /// prompt token to compute; none when `reuse` is off), else an empty slot, else the least
    /// recently used one.
    pub(crate) fn choose(
        &self,
        prompt: &[u32],
        namespace: &str,
        reuse: bool,
    ) -> Option<(usize, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let free = || {
            self.slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.owner.is_none())
        };
        if reuse {
            let best = free()
                .filter(|(_, s)| s.namespace == namespace)
                .map(|(i, s)| (i, common_prefix(&s.tokens, prompt).min(limit)))
                .max_by_key(|&(i, p)| (p, std::cmp::Reverse(i)));
            if let Some((i, p)) = best.filter(|&(_, p)| p > 0) {
                return Some((i, p));
            }
        }
        free()
            .min_by_key(|(_, s)| (s.high_water > 0 || !s.tokens.is_empty(), s.last_used))
            .map(|(i, _)| (i, 0))
    }

    /// How many slots there are.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no sequence owns `slot`.
    pub(crate) fn is_free(&self, slot: usize) -> bool {
        self.slots[slot].owner.is_none()
    }

    /// The slot a report calls current: the first owned one, else the most recently freed.
    pub(crate) fn current(&self) -> usize {
        let slots = &self.slots;
        slots
            .iter()
            .position(|s| s.owner.is_some())
            .or_else(|| (0..slots.len()).max_by_key(|&i| slots[i].last_used))
            .unwrap_or(0)
    }

    /// Keeps only the first `len` tokens of what `slot` records (benchmarks cutting the cache
    /// back); a slot that does not exist is left alone.
    pub(crate) fn truncate(&mut self, slot: usize, len: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.tokens.truncate(len);
        }
    }

    /// Records that `slot` holds the KV of `tokens` computed in `namespace` (a raw forward,
    /// with no sequence in flight).
    pub(crate) fn record(&mut self, slot: usize, tokens: &[u32], namespace: &str) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.tokens = tokens.to_vec();
            s.namespace = namespace.to_string();
        }
    }

    /// Takes `slot`'s recorded prefix and namespace out, to be edited by the prompt cache and
    /// put back with [`Slots::put_prefix`].
    pub(crate) fn take_prefix(&mut self, slot: usize) -> (Vec<u32>, String) {
        let s = &mut self.slots[slot];
        (
            std::mem::take(&mut s.tokens),
            std::mem::take(&mut s.namespace),
        )
    }

    /// Puts back what [`Slots::take_prefix`] took, as the prompt cache left it.
    pub(crate) fn put_prefix(&mut self, slot: usize, tokens: Vec<u32>, namespace: String) {
        let s = &mut self.slots[slot];
        s.tokens = tokens;
        s.namespace = namespace;
    }

    /// `(slot, positions written)` of each free slot with a recorded prefix, but `except`:
    /// what releasing them would give back.
    pub(crate) fn parked_high_water(
        &self,
        except: Option<usize>,
    ) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(move |&(i, s)| s.owner.is_none() && !s.tokens.is_empty() && Some(i) != except)
            .map(|(i, s)| (i, s.high_water))
    }

    /// Gives `slot` to sequence `owner`.
    pub(crate) fn claim(&mut self, slot: usize, owner: u64) {
        let s = &mut self.slots[slot];
        s.owner = Some(owner);
        s.tokens.clear();
    }

    /// Frees `slot`, which keeps the KV of `tokens`, computed in `namespace`.
    pub(crate) fn park(&mut self, slot: usize, tokens: &[u32], namespace: &str) {
        self.clock += 1;
        let s = &mut self.slots[slot];
        s.owner = None;
        s.tokens = tokens.to_vec();
        s.namespace = namespace.to_string();
        s.last_used = self.clock;
    }

    /// Marks `slot` written up to `len` positions.
    pub(crate) fn wrote(&mut self, slot: usize, len: usize) {
        let s = &mut self.slots[slot];
        s.high_water = s.high_water.max(len);
    }

    /// `slot` is free and holds nothing; with `pages_freed` its pages went back too (else
    /// they are still billed).
    pub(crate) fn released(&mut self, slot: usize, pages_freed: bool) {
        let s = &mut self.slots[slot];
        s.owner = None;
        s.tokens.clear();
        s.namespace.clear();
        if pages_freed {
            s.high_water = 0;
        }
    }

    /// Most positions written to `slot` since its pages were last given back.
    pub(crate) fn high_water(&self, slot: usize) -> usize {
        self.slots[slot].high_water
    }

    /// Whether `slot` holds pages a release could give back.
    pub(crate) fn holds_pages(&self, slot: usize) -> bool {
        self.slots[slot].high_water > 0
    }

    /// The free slot holding pages that was used longest ago.
    pub(crate) fn least_recent_parked(&self, except: Option<usize>) -> Option<usize> {
        self.parked_high_water(except)
            .min_by_key(|&(i, _)| self.slots[i].last_used)
            .map(|(i, _)| i)
    }

    /// Positions free slots hold for reuse.
    pub(crate) fn parked_positions(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.owner.is_none())
            .map(|s| s.tokens.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_takes_the_slot_with_the_longest_prefix_else_an_empty_one() {
        let mut s = Slots::new(3);
        s.claim(0, 1);
        s.wrote(0, 4);
        s.park(0, &[1, 2, 3, 4], "");
        s.claim(1, 2);
        s.wrote(1, 3);
        s.park(1, &[1, 2, 9], "");
        assert_eq!(s.choose(&[1, 2, 3, 4, 5], "", true), Some((0, 4)));
        // At least one prompt token is left to compute.
        assert_eq!(s.choose(&[1, 2, 3, 4], "", true), Some((0, 3)));
        assert_eq!(s.choose(&[1, 2, 9, 9], "", true), Some((1, 3)));
        // Nothing shared: the empty slot, not one holding someone's prefix.
        assert_eq!(s.choose(&[7, 7], "", true), Some((2, 0)));
        assert_eq!(s.choose(&[1, 2, 3, 4, 5], "", false), Some((2, 0)));
        s.claim(2, 3);
        // No empty slot: the least recently used.
        assert_eq!(s.choose(&[7, 7], "", true), Some((0, 0)));
        s.claim(0, 4);
        s.claim(1, 5);
        assert_eq!(s.choose(&[7, 7], "", true), None);
    }

    #[test]
    fn a_prefix_is_reused_only_under_the_adapters_it_was_computed_with() {
        let mut s = Slots::new(3);
        s.claim(0, 1);
        s.wrote(0, 4);
        s.park(0, &[1, 2, 3, 4], "a#1");
        s.claim(1, 2);
        s.wrote(1, 2);
        s.park(1, &[1, 2], "");
        assert_eq!(s.choose(&[1, 2, 3, 4, 5], "a#1", true), Some((0, 4)));
        // The base model reuses the base's shorter prefix, never the adapter's.
        assert_eq!(s.choose(&[1, 2, 3, 4, 5], "", true), Some((1, 2)));
        // Another adapter (or the same id mounted again) reuses neither: the empty slot.
        assert_eq!(s.choose(&[1, 2, 3, 4, 5], "a#2", true), Some((2, 0)));
        assert_eq!(s.choose(&[1, 2, 3, 4, 5], "a#1+b#3", true), Some((2, 0)));
        s.released(0, true);
        assert_eq!(s.slots[0].namespace, "");
    }

    #[test]
    fn parked_slots_are_reclaimed_least_recent_first() {
        let mut s = Slots::new(3);
        for (slot, owner) in [(2, 1), (0, 2)] {
            s.claim(slot, owner);
            s.wrote(slot, 8);
            s.park(slot, &[5; 8], "");
        }
        assert_eq!(s.least_recent_parked(None), Some(2));
        assert_eq!(s.least_recent_parked(Some(2)), Some(0));
        s.released(2, true);
        assert_eq!(s.least_recent_parked(None), Some(0));
        assert_eq!(s.parked_positions(), 8);
    }
}
