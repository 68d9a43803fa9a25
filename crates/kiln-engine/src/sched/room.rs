//! The memory budget at each step: the bill of every slot at its high-water mark plus the
//! prompt cache, and what gives way when a plan would pass it — free slots' kept prefixes
//! (least recently used first), then prompt-cache entries, then the newest running sequence.

use kiln_model::backend::KvStore;

use super::{PlannedSpan, Scheduler};

/// How the memory budget was met.
pub(super) enum Room {
    /// As planned.
    Fits,
    /// By preempting a running sequence: the plan is stale.
    Preempted,
}

impl Scheduler {
    /// [`Scheduler::plan`], after reclaiming memory or preempting until the plan fits the
    /// budget; a sequence left alone that still does not fit is failed.
    pub(super) fn plan_within_budget<K: KvStore>(&mut self, kv: &mut K) -> Vec<PlannedSpan> {
        loop {
            let plan = self.plan();
            let grows: Vec<(usize, usize)> = plan
                .iter()
                .filter_map(|p| {
                    let s = &self.running[p.running];
                    s.slot.map(|slot| (slot, s.computed + p.n_tokens))
                })
                .collect();
            match self.make_room(kv, &grows, None, true) {
                Ok(Room::Fits) => return plan,
                Ok(Room::Preempted) => {}
                Err(need) => {
                    // Only one sequence left and it still does not fit: it never will.
                    let Some(seq) = self.running.pop() else {
                        return Vec::new();
                    };
                    let msg = self.over_budget_message(need);
                    self.fail(kv, seq, &msg);
                }
            }
        }
    }

    /// Makes the budget hold every slot at `grows` (slot, positions after the step): first
    /// gives back free slots' kept prefixes (never `keep`'s), then prompt-cache entries, then —
    /// with `preempt` — preempts the newest running sequence while more than one runs (then
    /// the plan must be made again). `Err` carries the bytes still missing.
    pub(super) fn make_room<K: KvStore>(
        &mut self,
        kv: &mut K,
        grows: &[(usize, usize)],
        keep: Option<usize>,
        preempt: bool,
    ) -> Result<Room, u64> {
        let Some(room) = self.budget.as_ref().map(|b| b.room_bytes) else {
            return Ok(Room::Fits);
        };
        if !preempt {
            // Give nothing back unless that would be enough.
            let bill = self.bill_with(grows);
            let reclaimable = self.reclaimable_bytes(keep);
            if bill.saturating_sub(reclaimable) > room {
                return Err(bill - reclaimable - room);
            }
        }
        loop {
            let bill = self.bill_with(grows);
            if let Some(b) = self.budget.as_mut() {
                b.observe(bill.min(room));
            }
            if bill <= room {
                return Ok(Room::Fits);
            }
            if let Some(slot) = self.slots.least_recent_parked(keep) {
                self.release_slot(kv, slot);
                continue;
            }
            if self.prompt_cache.as_mut().is_some_and(|c| c.evict_oldest()) {
                continue;
            }
            if preempt && self.running.len() > 1 && self.preempt_newest(kv) {
                return Ok(Room::Preempted);
            }
            return Err(bill - room);
        }
    }

    /// Frees the newest running sequence's slot and requeues it at the front of the queue; it
    /// will be recomputed from its prompt and the tokens it already generated.
    fn preempt_newest<K: KvStore>(&mut self, kv: &mut K) -> bool {
        let running = &self.running;
        let Some(newest) = (0..running.len()).max_by_key(|&i| running[i].id) else {
            return false;
        };
        let mut seq = self.running.remove(newest);
        if let Some(slot) = seq.slot.take() {
            self.release_slot(kv, slot);
        }
        seq.computed = 0;
        self.stats.preempted_total += 1;
        tracing::info!(
            sequence = seq.id,
            "preempted for memory; it will be recomputed"
        );
        self.waiting.push_front(seq);
        true
    }

    /// Bytes that releasing free slots (but `keep`) and emptying the prompt cache would give.
    fn reclaimable_bytes(&self, keep: Option<usize>) -> u64 {
        let Some(b) = &self.budget else {
            return 0;
        };
        let slots: u64 = (self.slots.parked_high_water(keep))
            .map(|(_, high_water)| b.slot_bytes(high_water))
            .sum();
        slots + self.prompt_cache_bytes()
    }

    /// KV bytes billed now: every slot at its high-water mark, plus the prompt cache.
    pub(super) fn bill_now(&self) -> u64 {
        self.bill_with(&[])
    }

    fn bill_with(&self, grows: &[(usize, usize)]) -> u64 {
        let Some(b) = &self.budget else {
            return 0;
        };
        let slots: u64 = (0..self.slots.len())
            .map(|i| {
                let grown = grows
                    .iter()
                    .filter(|g| g.0 == i)
                    .map(|g| g.1)
                    .max()
                    .unwrap_or(0);
                b.slot_bytes(self.slots.high_water(i).max(grown))
            })
            .sum();
        slots + self.prompt_cache_bytes()
    }

    fn prompt_cache_bytes(&self) -> u64 {
        self.prompt_cache
            .as_ref()
            .map_or(0, |c| c.stats().bytes as u64)
    }

    pub(super) fn over_budget_message(&self, need: u64) -> String {
        let room = self.budget.as_ref().map_or(0, |b| b.room_bytes);
        format!(
            "the request does not fit the memory budget: its KV cache needs {need} bytes more than the {room} bytes the budget leaves for it"
        )
    }
}
