//! The prompt cache (spec §11.1): a byte-capped LRU of KV snapshots keyed by their tokens.
//! The engine's live slot is the most recent entry; when a request would overwrite part of
//! it, the slot is saved here first, and a request that shares a longer prefix with a saved
//! entry than with the slot gets that entry's KV copied back in. So alternating conversations
//! each re-prefill only their new turn. Entries are namespaced by the adapters their KV was
//! computed with (spec §11.1): an entry is only ever restored for a request in its namespace.

use kiln_model::backend::{KvSnapshot, KvStore};
use serde::Serialize;

/// Counters of the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptCacheStats {
    /// Saved entries (the live slot not included).
    pub entries: usize,
    /// Bytes of KV they hold.
    pub bytes: usize,
    /// The cap.
    pub max_bytes: usize,
    /// Entries taken back into the slot.
    pub restores: u64,
    /// Slot contents saved.
    pub saves: u64,
    /// Entries dropped to stay under the cap.
    pub evictions: u64,
}

struct Entry {
    tokens: Vec<u32>,
    namespace: String,
    kv: KvSnapshot,
    last_used: u64,
}

/// The LRU.
pub struct PromptCache {
    entries: Vec<Entry>,
    max_bytes: usize,
    clock: u64,
    stats: PromptCacheStats,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptCache {
    /// An empty cache holding at most `max_bytes` of KV.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            entries: Vec::new(),
            max_bytes,
            clock: 0,
            stats: PromptCacheStats {
                max_bytes,
                ..Default::default()
            },
        }
    }

    /// Removes and returns the entry of `namespace` whose usable prefix with `prompt` is
    /// longest, if that is longer than `better_than`; the usable prefix leaves at least one
    /// prompt token to compute.
    pub fn take(
        &mut self,
        prompt: &[u32],
        namespace: &str,
        better_than: usize,
    ) -> Option<(Vec<u32>, KvSnapshot, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let (i, p) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.namespace == namespace)
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt).min(limit).min(e.kv.len)))
            .max_by_key(|&(_, p)| p)?;
        if p <= better_than {
            return None;
        }
        let e = self.entries.swap_remove(i);
        self.stats.restores += 1;
        self.refresh();
        Some((e.tokens, e.kv, p))
    }

    /// Saves `tokens` with their KV, computed in `namespace`, evicting least recently used
    /// entries over the cap.
    pub fn put(&mut self, tokens: Vec<u32>, kv: KvSnapshot, namespace: &str) {
        if tokens.is_empty() || kv.bytes() > self.max_bytes {
            return;
        }
        // An entry of the same namespace that is a prefix of the new one is superseded; one
        // that extends it makes the new one redundant.
        let same = |e: &Entry| e.namespace == namespace;
        if self
            .entries
            .iter()
            .any(|e| same(e) && e.tokens.starts_with(&tokens))
        {
            return;
        }
        self.entries
            .retain(|e| !(same(e) && tokens.starts_with(&e.tokens)));
        self.clock += 1;
        self.entries.push(Entry {
            tokens,
            namespace: namespace.to_string(),
            kv,
            last_used: self.clock,
        });
        self.stats.saves += 1;
        while self.bytes() > self.max_bytes && self.entries.len() > 1 && self.evict_oldest() {}
        self.refresh();
    }

    fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.kv.bytes()).sum()
    }

    fn refresh(&mut self) {
        self.stats.entries = self.entries.len();
        self.stats.bytes = self.bytes();
    }

    /// Drops the least recently used entry (to make room for running sequences); false when
    /// the cache is empty.
    pub fn evict_oldest(&mut self) -> bool {
        let oldest = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.last_used)
            .map(|(i, _)| i);
        let Some(i) = oldest else {
            return false;
        };
        self.entries.swap_remove(i);
        self.stats.evictions += 1;
        self.refresh();
        true
    }

    /// Consults the cache before `slot` of `kv` (holding `slot_tokens`, computed in
    /// `slot_namespace`) is overwritten past `common`: saves the slot's contents (in its own
    /// namespace), and restores a saved entry of `namespace` that shares more of `prompt` (then
    /// the slot holds that namespace's tokens). Returns the prefix length now valid in the slot.
    #[allow(clippy::too_many_arguments)]
    pub fn swap_in<K: KvStore>(
        &mut self,
        kv: &mut K,
        slot: usize,
        slot_tokens: &mut Vec<u32>,
        slot_namespace: &mut String,
        prompt: &[u32],
        namespace: &str,
        common: usize,
    ) -> usize {
        let taken = self.take(prompt, namespace, common);
        if (taken.is_some() || common < slot_tokens.len())
            && let Some(snap) = kv.export_prefix(slot, slot_tokens.len())
        {
            self.put(slot_tokens.clone(), snap, slot_namespace);
        }
        match taken {
            Some((tokens, snap, p)) if kv.import_prefix(slot, &snap, p) => {
                *slot_tokens = tokens[..p].to_vec();
                *slot_namespace = namespace.to_string();
                p
            }
            // A failed import leaves the slot as it was.
            _ => common,
        }
    }

    /// Current counters.
    pub fn stats(&self) -> PromptCacheStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(len: usize) -> KvSnapshot {
        KvSnapshot {
            len,
            layers: vec![(vec![0.0; len], vec![0.0; len])],
        }
    }

    #[test]
    fn takes_the_longest_prefix_and_keeps_one_token_to_compute() {
        let mut c = PromptCache::new(1 << 20);
        c.put(vec![1, 2, 3], snap(3), "");
        c.put(vec![1, 9, 9, 9], snap(4), "");
        let (tokens, _, p) = c.take(&[1, 2, 3], "", 0).unwrap();
        assert_eq!((tokens, p), (vec![1, 2, 3], 2));
        assert_eq!(c.stats().entries, 1);
        assert!(c.take(&[1, 9, 9, 9, 5], "", 4).is_none());
        assert!(c.take(&[7], "", 0).is_none());
    }

    #[test]
    fn entries_are_restored_only_in_their_namespace() {
        let mut c = PromptCache::new(1 << 20);
        c.put(vec![1, 2, 3, 4], snap(4), "a#1");
        // The same tokens under the base model neither supersede nor are superseded.
        c.put(vec![1, 2], snap(2), "");
        c.put(vec![1, 2, 3, 4, 5], snap(5), "b#2");
        assert_eq!(c.stats().entries, 3);
        assert!(c.take(&[1, 2, 3, 4, 5, 6], "a#2", 0).is_none());
        let (_, _, p) = c.take(&[1, 2, 3, 4, 5, 6], "", 0).unwrap();
        assert_eq!(p, 2);
        let (tokens, _, p) = c.take(&[1, 2, 3, 4, 5, 6], "a#1", 0).unwrap();
        assert_eq!((tokens, p), (vec![1, 2, 3, 4], 4));
        assert_eq!(c.stats().entries, 1);
    }

    #[test]
    fn evicts_least_recently_used_over_the_cap() {
        // Each snapshot of 4 positions is 32 bytes.
        let mut c = PromptCache::new(70);
        c.put(vec![1, 1, 1, 1], snap(4), "");
        c.put(vec![2, 2, 2, 2], snap(4), "");
        c.put(vec![3, 3, 3, 3], snap(4), "");
        assert_eq!(c.stats().entries, 2);
        assert_eq!(c.stats().evictions, 1);
        assert!(c.take(&[1, 1, 1, 1, 0], "", 0).is_none());
        assert!(c.take(&[3, 3, 3, 3, 0], "", 0).is_some());
        // Too big for the cap: not kept.
        let mut c = PromptCache::new(8);
        c.put(vec![1, 2], snap(2), "");
        assert_eq!(c.stats().entries, 0);
    }

    #[test]
    fn prefixes_supersede() {
        let mut c = PromptCache::new(1 << 20);
        c.put(vec![1, 2], snap(2), "");
        c.put(vec![1, 2, 3], snap(3), "");
        assert_eq!(c.stats().entries, 1);
        c.put(vec![1], snap(1), "");
        assert_eq!(c.stats().entries, 1);
    }
}
