//! Continuous batching: the engine keeps a queue of waiting sequences and a set of running
//! ones, each in its own KV slot. Every [`Engine::step`] builds one [`BatchLayout`] — each
//! decoding sequence's next token first, then whole prefill chunks of the others up to the
//! token budget — runs one forward, and samples per sequence. Memory is billed before the
//! forward; when it would pass the budget, free slots' kept prefixes and prompt-cache entries
//! go first, then the newest running sequence is preempted (its slot freed, itself requeued at
//! the front, to be recomputed).

pub mod budget;
pub mod lane;
pub(crate) mod slots;

use std::collections::VecDeque;
use std::sync::Arc;

use kiln_model::arch::LogitsWanted;
use kiln_model::backend::{Backend, BatchLayout, KvStore, SeqSpan};
use kiln_model::lora::AdapterStack;
use serde::Serialize;

pub use budget::KvBudget;
pub use lane::Lane;

use crate::EngineError;
use crate::engine::Engine;
use crate::request::{GenerateOutput, GenerateRequest};
use crate::sequence::{Decoding, Next};

/// Where one sequence's events go.
pub trait SequenceSink: Send {
    /// A piece of text safe to show, with the logprobs of the tokens behind it (empty unless
    /// asked for; the output at the end holds them all, including any whose text never came
    /// out); `false` when nobody listens any more (cancels).
    fn text(&mut self, piece: &str, logprobs: &[crate::request::TokenLogprob]) -> bool;
    /// Whether the listener left; polled every step, so a cancelled sequence frees its slot
    /// at the next step even while it prefills.
    fn is_closed(&self) -> bool;
    /// The sequence finished (cancelled included).
    fn finished(&mut self, out: GenerateOutput);
    /// The sequence failed; the message is safe to show.
    fn failed(&mut self, message: &str);
}

/// Decides whether a new sequence may start (`--job-policy exclusive`: not while a heavy job
/// waits for or holds the lease). The permit is held for the sequence's whole life.
pub trait StartGate: Send + Sync {
    /// A permit, or `None` to keep the sequence waiting (never blocks).
    fn try_start(&self) -> Option<Box<dyn Send>>;
}

/// One request in the scheduler.
pub(crate) struct Seq {
    id: u64,
    dec: Decoding,
    sink: Box<dyn SequenceSink>,
    slot: Option<usize>,
    /// Positions of `dec.history` the slot holds.
    computed: usize,
    permit: Option<Box<dyn Send>>,
    /// Whether it already had a slot once (then its reuse count is kept).
    started: bool,
    /// The LoRA adapters it runs with, kept to its end (an unmount does not change them).
    adapters: Option<Arc<AdapterStack>>,
}

impl Seq {
    fn remaining(&self) -> usize {
        self.dec.history.len() - self.computed
    }

    /// Where its prefixes may be reused: the adapters' namespace (`""`: the base model).
    fn namespace(&self) -> &str {
        self.adapters.as_deref().map_or("", AdapterStack::namespace)
    }
}

/// Counters of the scheduler, for `/stats` and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SchedulerStats {
    /// Sequences in the running batch.
    pub running: usize,
    /// Sequences waiting for a slot (preempted ones included).
    pub waiting: usize,
    /// Most sequences running at once (`--parallel`; 1 in a solo lane).
    pub max_sequences: usize,
    /// KV slots (running sequences and kept prefixes).
    pub slots: usize,
    /// Token budget of one step (`--batch-tokens`).
    pub batch_tokens: usize,
    /// Whether sequences share forwards, and why not.
    pub lane: Lane,
    /// Forwards run.
    pub steps: u64,
    /// Sequences in the last forward.
    pub last_batch_sequences: usize,
    /// Tokens in the last forward.
    pub last_step_tokens: usize,
    /// Tokens over all forwards.
    pub step_tokens_total: u64,
    /// Sequence-steps over all forwards (average batch size = this / steps).
    pub batch_sequences_total: u64,
    /// Preemptions since start (a sequence freed for memory, requeued and recomputed).
    pub preempted_total: u64,
    /// Sequences cancelled by their client.
    pub cancelled_total: u64,
    /// Sequences failed.
    pub failed_total: u64,
    /// KV positions free slots keep for reuse.
    pub parked_positions: usize,
    /// The memory budget's KV bill now and its highest so far, when there is a budget.
    pub kv_bill: Option<budget::BillStats>,
}

/// Lane, limits and counters of an engine's scheduler.
pub(crate) struct Scheduler {
    pub(crate) slots: slots::Slots,
    pub(crate) waiting: VecDeque<Seq>,
    pub(crate) running: Vec<Seq>,
    pub(crate) gate: Option<Arc<dyn StartGate>>,
    pub(crate) budget: Option<KvBudget>,
    pub(crate) reuse_prefix: bool,
    pub(crate) stats: SchedulerStats,
    next_id: u64,
}

impl Scheduler {
    pub(crate) fn new(n_slots: usize, lane: Lane, batch_tokens: usize) -> Self {
        Self {
            slots: slots::Slots::new(n_slots),
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: SchedulerStats {
                max_sequences: if lane.batched { n_slots } else { 1 },
                slots: n_slots,
                batch_tokens,
                lane,
                ..Default::default()
            },
            gate: None,
            budget: None,
            reuse_prefix: true,
            next_id: 0,
        }
    }

    fn max_running(&self) -> usize {
        self.stats.max_sequences
    }
}

/// How the memory budget was met.
enum Room {
    /// As planned.
    Fits,
    /// By preempting a running sequence: the plan is stale.
    Preempted,
}

/// What one step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Sequences in the forward (0: nothing could run).
    pub sequences: usize,
    /// Tokens in the forward.
    pub tokens: usize,
}

impl<B: Backend> Engine<B> {
    /// Queues `req`; its events go to `sink`. Requests the engine can never serve (empty,
    /// longer than the context, bad sampling settings) are refused here.
    pub fn add(
        &mut self,
        req: &GenerateRequest,
        sink: Box<dyn SequenceSink>,
    ) -> Result<u64, EngineError> {
        let adapters = req.adapters.clone().filter(|a| !a.is_empty());
        self.check_adapters(adapters.as_deref())?;
        let dec = Decoding::new(&self.model, req, self.options.context_len)?;
        let s = &mut self.sched;
        s.next_id += 1;
        s.waiting.push_back(Seq {
            id: s.next_id,
            dec,
            sink,
            slot: None,
            computed: 0,
            permit: None,
            started: false,
            adapters,
        });
        Ok(s.next_id)
    }

    /// Whether any sequence is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.sched.waiting.is_empty() || !self.sched.running.is_empty()
    }

    /// Gates the start of new sequences (`--job-policy exclusive`).
    pub fn set_start_gate(&mut self, gate: Arc<dyn StartGate>) {
        self.sched.gate = Some(gate);
    }

    /// Whether a new request may start from a prefix a free slot or the prompt cache holds.
    pub fn set_prefix_reuse(&mut self, reuse: bool) {
        self.sched.reuse_prefix = reuse;
    }

    /// The scheduler's counters.
    pub fn scheduler_stats(&self) -> SchedulerStats {
        let s = &self.sched;
        let mut stats = s.stats.clone();
        stats.running = s.running.len();
        stats.waiting = s.waiting.len();
        stats.parked_positions = s.slots.parked_positions();
        stats.kv_bill = s.budget.as_ref().map(|b| b.stats(self.bill_now()));
        stats
    }

    /// Fails every running sequence with `message` and gives their slots back (after a panic
    /// inside a forward: their KV may be half written). Waiting sequences stay queued.
    pub fn fail_running(&mut self, message: &str) {
        for mut seq in std::mem::take(&mut self.sched.running) {
            if let Some(slot) = seq.slot.take() {
                self.release_slot(slot);
            }
            seq.sink.failed(message);
            self.sched.stats.failed_total += 1;
        }
    }

    /// One scheduling step: drop cancelled sequences, admit waiting ones, run one forward over
    /// every running sequence's next tokens and sample where a sequence's tokens are all
    /// computed. A forward error fails the sequences in it and is returned.
    pub fn step(&mut self) -> Result<StepReport, EngineError> {
        self.reap_cancelled();
        self.admit();
        let plan = self.plan_within_budget();
        if plan.is_empty() {
            return Ok(StepReport::default());
        }
        let (tokens, layout) = self.layout_of(&plan);
        // Each span runs with its own sequence's adapters.
        let stacks: Vec<Option<Arc<AdapterStack>>> = plan
            .iter()
            .map(|&(i, _)| self.sched.running[i].adapters.clone())
            .collect();
        let stacks: Vec<Option<&AdapterStack>> = stacks.iter().map(Option::as_deref).collect();
        let stacks = if stacks.iter().all(Option::is_none) {
            &[][..]
        } else {
            &stacks[..]
        };
        let logits = match self.forward_spans(&tokens, &layout, LogitsWanted::LastOfEach, stacks) {
            Ok(l) => l,
            Err(e) => {
                self.fail_planned(&plan, &e.to_string());
                return Err(e);
            }
        };
        let report = StepReport {
            sequences: plan.len(),
            tokens: tokens.len(),
        };
        let st = &mut self.sched.stats;
        st.steps += 1;
        st.last_batch_sequences = report.sequences;
        st.last_step_tokens = report.tokens;
        st.step_tokens_total += report.tokens as u64;
        st.batch_sequences_total += report.sequences as u64;
        self.sample_planned(&plan, logits);
        Ok(report)
    }

    /// One forward of `layout` (span `i` with the adapters `adapters[i]`; an empty slice: the
    /// base model for all), then the conversion of every layer due in each of its slots.
    pub(crate) fn forward_spans(
        &mut self,
        tokens: &[u32],
        layout: &BatchLayout,
        want: LogitsWanted,
        adapters: &[Option<&AdapterStack>],
    ) -> Result<Vec<f32>, EngineError> {
        let logits = self.model.model.forward_with(
            &self.backend,
            &mut self.kv,
            tokens,
            layout,
            want,
            adapters,
        )?;
        for span in &layout.spans {
            self.kv.convert_due(span.slot)?;
            self.sched
                .slots
                .wrote(span.slot, span.start_pos + span.n_tokens);
        }
        Ok(logits)
    }

    fn reap_cancelled(&mut self) {
        let closed = |s: &Seq| s.sink.is_closed();
        let s = &mut self.sched;
        // Every step asks; the queues are rebuilt only when someone left.
        if !s.waiting.iter().chain(&s.running).any(closed) {
            return;
        }
        let (mut gone, waiting): (Vec<Seq>, Vec<Seq>) =
            std::mem::take(&mut s.waiting).into_iter().partition(closed);
        let (left, running): (Vec<Seq>, Vec<Seq>) =
            std::mem::take(&mut s.running).into_iter().partition(closed);
        (s.waiting, s.running) = (waiting.into(), running);
        gone.extend(left);
        for seq in gone {
            self.sched.stats.cancelled_total += 1;
            self.finish(seq, true);
        }
    }

    /// Ends `seq`: its slot keeps the computed prefix for reuse, its sink gets the output.
    fn finish(&mut self, mut seq: Seq, cancelled: bool) {
        if cancelled {
            seq.dec.cancel();
        }
        if let Some(slot) = seq.slot.take() {
            let namespace = seq.namespace();
            self.sched
                .slots
                .park(slot, &seq.dec.history[..seq.computed], namespace);
        }
        let sink = &mut seq.sink;
        match seq.dec.finish(&mut |t, lp| sink.text(t, lp)) {
            Ok(out) => sink.finished(out),
            Err(e) => {
                self.sched.stats.failed_total += 1;
                sink.failed(&e.to_string());
            }
        }
    }

    fn fail(&mut self, mut seq: Seq, message: &str) {
        if let Some(slot) = seq.slot.take() {
            self.release_slot(slot);
        }
        self.sched.stats.failed_total += 1;
        seq.sink.failed(message);
    }

    fn release_slot(&mut self, slot: usize) {
        let freed = self.kv.release(slot);
        self.sched.slots.released(slot, freed);
    }

    /// Moves waiting sequences into the batch, in order, while there is a slot and the memory
    /// budget holds them. A sequence that never started needs the start gate's permit; while
    /// the gate refuses (a heavy job waits: a drain), only sequences that already hold one —
    /// preempted ones — may start. A sequence the budget cannot hold yet stops the others
    /// behind it (first come, first served).
    fn admit(&mut self) {
        if self.sched.waiting.is_empty() || self.sched.running.len() >= self.sched.max_running() {
            return;
        }
        let mut queue = std::mem::take(&mut self.sched.waiting);
        let mut gate_closed = false;
        while let Some(mut seq) = queue.pop_front() {
            if self.sched.running.len() >= self.sched.max_running() {
                self.sched.waiting.push_back(seq);
                continue;
            }
            if seq.permit.is_none()
                && let Some(gate) = self.sched.gate.clone()
            {
                match (!gate_closed).then(|| gate.try_start()).flatten() {
                    Some(p) => seq.permit = Some(p),
                    None => {
                        gate_closed = true;
                        self.sched.waiting.push_back(seq);
                        continue;
                    }
                }
            }
            if let Err(mut seq) = self.start(seq) {
                // Only a sequence that never ran gives its permit back while it waits for
                // memory; one that ran keeps it, or a waiting job could never get the lease
                // while it also keeps that sequence from starting.
                if !seq.started {
                    seq.permit = None;
                }
                self.sched.waiting.push_back(seq);
                self.sched.waiting.extend(queue.drain(..));
            }
        }
    }

    /// Gives `seq` a slot (with the longest prefix it can reuse) if the budget holds it at its
    /// whole current length beside every running sequence's next step; `Err` hands it back.
    #[allow(clippy::result_large_err)]
    fn start(&mut self, mut seq: Seq) -> Result<(), Seq> {
        let reuse = self.sched.reuse_prefix;
        let namespace = seq.namespace().to_string();
        let Some((slot, common)) = self.sched.slots.choose(&seq.dec.history, &namespace, reuse)
        else {
            return Err(seq);
        };
        let common = self.restore_prefix(slot, &seq.dec.history, &namespace, common);
        if common == 0 && self.sched.slots.holds_pages(slot) {
            // Nothing to reuse: the old occupant's pages go, and with them its bill.
            self.release_slot(slot);
        }
        let mut grows = self.running_growth();
        grows.push((slot, seq.dec.history.len()));
        match self.make_room(&grows, Some(slot), false) {
            Ok(_) => {}
            Err(need) if self.sched.running.is_empty() => {
                let msg = self.over_budget_message(need);
                self.fail(seq, &msg);
                return Ok(());
            }
            Err(_) => return Err(seq),
        }
        self.sched.slots.claim(slot, seq.id);
        self.kv.set_seq_len(slot, common);
        seq.slot = Some(slot);
        seq.computed = common;
        if !seq.started {
            seq.dec.cached = common;
            seq.started = true;
        }
        self.sched.running.push(seq);
        Ok(())
    }

    /// Each running sequence's slot and its length after one more chunk.
    fn running_growth(&self) -> Vec<(usize, usize)> {
        let chunk = self.options.prefill_chunk;
        self.sched
            .running
            .iter()
            .filter_map(|s| {
                s.slot
                    .map(|slot| (slot, s.computed + s.remaining().min(chunk)))
            })
            .collect()
    }

    /// The prefix of `prompt` (run in `namespace`) slot `slot` holds after consulting the
    /// prompt cache: the slot's kept contents are saved there before being overwritten, and a
    /// saved entry of the namespace sharing more of the prompt is copied in.
    fn restore_prefix(
        &mut self,
        slot: usize,
        prompt: &[u32],
        namespace: &str,
        common: usize,
    ) -> usize {
        if !self.sched.reuse_prefix {
            return 0;
        }
        let Some(cache) = self.prompt_cache.as_mut() else {
            return common;
        };
        let (mut tokens, mut slot_namespace) = self.sched.slots.take_prefix(slot);
        let got = cache.swap_in(
            &mut self.kv,
            slot,
            &mut tokens,
            &mut slot_namespace,
            prompt,
            namespace,
            common,
        );
        if got > 0 {
            self.sched.slots.wrote(slot, got);
        }
        self.sched.slots.put_prefix(slot, tokens, slot_namespace);
        got
    }

    /// The spans of the next forward: every decoding sequence's token, then whole prefill
    /// chunks while the token budget lasts (always at least one, so prompts progress).
    fn plan(&self) -> Vec<(usize, usize)> {
        let running = &self.sched.running;
        let mut plan: Vec<(usize, usize)> = (0..running.len())
            .filter(|&i| running[i].remaining() == 1)
            .map(|i| (i, 1))
            .collect();
        let mut total = plan.len();
        let mut prefills = 0;
        for (i, seq) in running.iter().enumerate() {
            if seq.remaining() <= 1 {
                continue;
            }
            let n = seq.remaining().min(self.options.prefill_chunk);
            if prefills == 0 || total + n <= self.sched.stats.batch_tokens {
                plan.push((i, n));
                total += n;
                prefills += 1;
            }
        }
        plan
    }

    /// [`Self::plan`], after reclaiming memory or preempting until the plan fits the budget.
    fn plan_within_budget(&mut self) -> Vec<(usize, usize)> {
        loop {
            let plan = self.plan();
            let grows: Vec<(usize, usize)> = plan
                .iter()
                .filter_map(|&(i, n)| {
                    let s = &self.sched.running[i];
                    s.slot.map(|slot| (slot, s.computed + n))
                })
                .collect();
            match self.make_room(&grows, None, true) {
                Ok(Room::Fits) => return plan,
                Ok(Room::Preempted) => {}
                Err(need) => {
                    // Only one sequence left and it still does not fit: it never will.
                    let Some(seq) = self.sched.running.pop() else {
                        return Vec::new();
                    };
                    let msg = self.over_budget_message(need);
                    self.fail(seq, &msg);
                }
            }
        }
    }

    fn layout_of(&self, plan: &[(usize, usize)]) -> (Vec<u32>, BatchLayout) {
        let mut tokens = Vec::new();
        let mut layout = BatchLayout::default();
        for &(i, n) in plan {
            let s = &self.sched.running[i];
            tokens.extend_from_slice(&s.dec.history[s.computed..s.computed + n]);
            layout.spans.push(SeqSpan {
                slot: s.slot.unwrap_or_default(),
                start_pos: s.computed,
                n_tokens: n,
            });
        }
        (tokens, layout)
    }

    fn fail_planned(&mut self, plan: &[(usize, usize)], message: &str) {
        let mut idx: Vec<usize> = plan.iter().map(|&(i, _)| i).collect();
        idx.sort_unstable();
        for i in idx.into_iter().rev() {
            let seq = self.sched.running.remove(i);
            self.fail(seq, message);
        }
    }

    /// Advances each planned sequence by its span and samples where its tokens are all
    /// computed; finished sequences leave the batch.
    fn sample_planned(&mut self, plan: &[(usize, usize)], mut logits: Vec<f32>) {
        let vocab = self.model.config.vocab_size;
        let mut done = Vec::new();
        for (k, &(i, n)) in plan.iter().enumerate() {
            let seq = &mut self.sched.running[i];
            // Prompt chunks, and the recomputation of a preempted sequence (not decode steps).
            if n > 1 || seq.dec.generated() == 0 {
                seq.dec.computed_prompt_tokens(n);
            }
            seq.computed += n;
            if seq.remaining() > 0 {
                continue;
            }
            let row = &mut logits[k * vocab..(k + 1) * vocab];
            let Seq { dec, sink, .. } = seq;
            match dec.accept(row, &mut |t, lp| sink.text(t, lp)) {
                Ok(Next::Feed) => {}
                Ok(Next::Done) => done.push((i, None)),
                Err(e) => done.push((i, Some(e.to_string()))),
            }
        }
        done.sort_unstable_by_key(|d| d.0);
        for (i, err) in done.into_iter().rev() {
            let seq = self.sched.running.remove(i);
            match err {
                None => {
                    if seq.dec.cancelled() {
                        self.sched.stats.cancelled_total += 1;
                    }
                    self.finish(seq, false)
                }
                Some(msg) => self.fail(seq, &msg),
            }
        }
    }

    /// Makes the budget hold every slot at `grows` (slot, positions after the step): first
    /// gives back free slots' kept prefixes (never `keep`'s), then prompt-cache entries, then —
    /// with `preempt` — preempts the newest running sequence while more than one runs (then
    /// the plan must be made again). `Err` carries the bytes still missing.
    fn make_room(
        &mut self,
        grows: &[(usize, usize)],
        keep: Option<usize>,
        preempt: bool,
    ) -> Result<Room, u64> {
        let Some(room) = self.sched.budget.as_ref().map(|b| b.room_bytes) else {
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
            if let Some(b) = self.sched.budget.as_mut() {
                b.observe(bill.min(room));
            }
            if bill <= room {
                return Ok(Room::Fits);
            }
            if let Some(slot) = self.sched.slots.least_recent_parked(keep) {
                self.release_slot(slot);
                continue;
            }
            if self.prompt_cache.as_mut().is_some_and(|c| c.evict_oldest()) {
                continue;
            }
            if preempt && self.sched.running.len() > 1 && self.preempt_newest() {
                return Ok(Room::Preempted);
            }
            return Err(bill - room);
        }
    }

    /// Frees the newest running sequence's slot and requeues it at the front of the queue; it
    /// will be recomputed from its prompt and the tokens it already generated.
    fn preempt_newest(&mut self) -> bool {
        let running = &mut self.sched.running;
        let Some(newest) = (0..running.len()).max_by_key(|&i| running[i].id) else {
            return false;
        };
        let mut seq = running.remove(newest);
        if let Some(slot) = seq.slot.take() {
            self.release_slot(slot);
        }
        seq.computed = 0;
        self.sched.stats.preempted_total += 1;
        tracing::info!(
            sequence = seq.id,
            "preempted for memory; it will be recomputed"
        );
        self.sched.waiting.push_front(seq);
        true
    }

    /// Bytes that releasing free slots (but `keep`) and emptying the prompt cache would give.
    fn reclaimable_bytes(&self, keep: Option<usize>) -> u64 {
        let Some(b) = &self.sched.budget else {
            return 0;
        };
        let slots: u64 = (self.sched.slots.parked_high_water(keep))
            .map(|(_, high_water)| b.slot_bytes(high_water))
            .sum();
        let cache = self
            .prompt_cache
            .as_ref()
            .map_or(0, |c| c.stats().bytes as u64);
        slots + cache
    }

    /// KV bytes billed now: every slot at its high-water mark, plus the prompt cache.
    fn bill_now(&self) -> u64 {
        self.bill_with(&[])
    }

    fn bill_with(&self, grows: &[(usize, usize)]) -> u64 {
        let Some(b) = &self.sched.budget else {
            return 0;
        };
        let slots: u64 = (0..self.sched.slots.len())
            .map(|i| {
                let grown = grows
                    .iter()
                    .filter(|g| g.0 == i)
                    .map(|g| g.1)
                    .max()
                    .unwrap_or(0);
                b.slot_bytes(self.sched.slots.high_water(i).max(grown))
            })
            .sum();
        let cache = self
            .prompt_cache
            .as_ref()
            .map_or(0, |c| c.stats().bytes as u64);
        slots + cache
    }

    fn over_budget_message(&self, need: u64) -> String {
        let room = self.sched.budget.as_ref().map_or(0, |b| b.room_bytes);
        format!(
            "the request does not fit the memory budget: its KV cache needs {need} bytes more than the {room} bytes the budget leaves for it"
        )
    }
}
