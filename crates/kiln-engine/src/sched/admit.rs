//! Admission: waiting sequences move into the batch in order while there is a slot, the start
//! gate allows it and the memory budget holds them, each starting from the longest prefix a
//! free slot or the prompt cache keeps.

use kiln_model::backend::KvStore;

use super::{Scheduler, Seq};

impl Scheduler {
    /// Moves waiting sequences into the batch, in order, while there is a slot and the memory
    /// budget holds them. A sequence that never started needs the start gate's permit; while
    /// the gate refuses (a heavy job waits: a drain), only sequences that already hold one —
    /// preempted ones — may start. A sequence the budget cannot hold yet stops the others
    /// behind it (first come, first served).
    pub(super) fn admit<K: KvStore>(&mut self, kv: &mut K) {
        if self.waiting.is_empty() || self.running.len() >= self.max_running() {
            return;
        }
        let mut queue = std::mem::take(&mut self.waiting);
        let mut gate_closed = false;
        while let Some(mut seq) = queue.pop_front() {
            if self.running.len() >= self.max_running() {
                self.waiting.push_back(seq);
                continue;
            }
            if seq.permit.is_none()
                && let Some(gate) = self.gate.clone()
            {
                match (!gate_closed).then(|| gate.try_start()).flatten() {
                    Some(p) => seq.permit = Some(p),
                    None => {
                        gate_closed = true;
                        self.waiting.push_back(seq);
                        continue;
                    }
                }
            }
            if let Err(mut seq) = self.start(kv, seq) {
                // Only a sequence that never ran gives its permit back while it waits for
                // memory; one that ran keeps it, or a waiting job could never get the lease
                // while it also keeps that sequence from starting.
                if !seq.started {
                    seq.permit = None;
                }
                self.waiting.push_back(seq);
                self.waiting.extend(queue.drain(..));
            }
        }
    }

    fn max_running(&self) -> usize {
        self.stats.max_sequences
    }

    /// Gives `seq` a slot (with the longest prefix it can reuse) if the budget holds it at its
    /// whole current length beside every running sequence's next step; `Err` hands it back.
    #[allow(clippy::result_large_err)]
    fn start<K: KvStore>(&mut self, kv: &mut K, mut seq: Seq) -> Result<(), Seq> {
        let namespace = seq.namespace().to_string();
        let Some((slot, common)) =
            self.slots
                .choose(&seq.dec.history, &namespace, self.reuse_prefix)
        else {
            return Err(seq);
        };
        let common = self.restore_prefix(kv, slot, &seq.dec.history, &namespace, common);
        if common == 0 && self.slots.holds_pages(slot) {
            // Nothing to reuse: the old occupant's pages go, and with them its bill.
            self.release_slot(kv, slot);
        }
        let mut grows = self.running_growth();
        grows.push((slot, seq.dec.history.len()));
        match self.make_room(kv, &grows, Some(slot), false) {
            Ok(_) => {}
            Err(need) if self.running.is_empty() => {
                let msg = self.over_budget_message(need);
                self.fail(kv, seq, &msg);
                return Ok(());
            }
            Err(_) => return Err(seq),
        }
        self.slots.claim(slot, seq.id);
        kv.set_seq_len(slot, common);
        seq.slot = Some(slot);
        seq.computed = common;
        if !seq.started {
            seq.dec.cached = common;
            seq.started = true;
        }
        self.running.push(seq);
        Ok(())
    }

    /// Each running sequence's slot and its length after one more chunk.
    fn running_growth(&self) -> Vec<(usize, usize)> {
        self.running
            .iter()
            .filter_map(|s| {
                s.slot
                    .map(|slot| (slot, s.computed + s.remaining().min(self.chunk)))
            })
            .collect()
    }

    /// The prefix of `prompt` (run in `namespace`) slot `slot` holds after consulting the
    /// prompt cache: the slot's kept contents are saved there before being overwritten, and a
    /// saved entry of the namespace sharing more of the prompt is copied in.
    fn restore_prefix<K: KvStore>(
        &mut self,
        kv: &mut K,
        slot: usize,
        prompt: &[u32],
        namespace: &str,
        common: usize,
    ) -> usize {
        if !self.reuse_prefix {
            return 0;
        }
        let Some(cache) = self.prompt_cache.as_mut() else {
            return common;
        };
        let (mut tokens, mut slot_namespace) = self.slots.take_prefix(slot);
        let got = cache.swap_in(
            kv,
            slot,
            &mut tokens,
            &mut slot_namespace,
            prompt,
            namespace,
            common,
        );
        if got > 0 {
            self.slots.wrote(slot, got);
        }
        self.slots.put_prefix(slot, tokens, slot_namespace);
        got
    }
}
