//! Continuous batching as a component: the [`Scheduler`] keeps a queue of waiting sequences
//! and a set of running ones, each in its own KV slot, with the slots' kept prefixes, the
//! prompt cache and the memory budget. Each step is three calls: [`Scheduler::schedule`]
//! builds one [`ScheduledBatch`] — each decoding sequence's next token first, then whole
//! prefill chunks of the others up to the token budget — the engine runs the forward, and
//! [`Scheduler::update`] samples per sequence from the logits. Memory is billed before the
//! forward; when it would pass the budget, free slots' kept prefixes and prompt-cache entries
//! go first, then the newest running sequence is preempted (its slot freed, itself requeued at
//! the front, to be recomputed). The scheduler sees the KV store only through [`KvStore`]: it
//! releases slots, sets their lengths and moves prompt-cache snapshots; it never runs a model.

mod admit;
pub mod budget;
pub mod lane;
mod room;
pub(crate) mod slots;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::Arc;

use kiln_model::backend::{BatchLayout, KvStore, SeqSpan};
use kiln_model::lora::AdapterStack;
use serde::Serialize;

pub use budget::KvBudget;
pub use lane::Lane;

use crate::prompt_cache::{PromptCache, PromptCacheStats};
use crate::request::{GenerateOutput, TokenLogprob};
use crate::sequence::{Decoding, Next};

/// Where one sequence's events go.
pub trait SequenceSink: Send {
    /// A piece of text safe to show, with the logprobs of the tokens behind it (empty unless
    /// asked for; the output at the end holds them all, including any whose text never came
    /// out); `false` when nobody listens any more (cancels).
    fn text(&mut self, piece: &str, logprobs: &[TokenLogprob]) -> bool;
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

/// The adapter ids `seqs` run with, each once, sorted (a stack counts each of its adapters).
fn adapter_ids<'a>(seqs: impl IntoIterator<Item = &'a Seq>) -> Vec<String> {
    let ids: std::collections::BTreeSet<&str> = seqs
        .into_iter()
        .filter_map(|s| s.adapters.as_deref())
        .flat_map(|stack| stack.adapters().iter().map(|a| a.id()))
        .collect();
    ids.into_iter().map(str::to_string).collect()
}

/// Counters of the scheduler, for `/stats` and `/metrics`. Requests that failed or were
/// cancelled are counted once, by whoever sees every request (the server's gateway counts its
/// refusals and the solo lane too), not here.
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
    /// KV positions free slots keep for reuse.
    pub parked_positions: usize,
    /// The memory budget's KV bill now and its highest so far, when there is a budget.
    pub kv_bill: Option<budget::BillStats>,
    /// KV positions the running sequences hold.
    pub running_positions: usize,
    /// The budget's bill of the running sequences' slots (their high-water marks), when there
    /// is a budget: what is in use, as opposed to kept prefixes a new request may reclaim.
    pub running_kv_bytes: Option<u64>,
    /// The LoRA adapters running sequences use, each id once, sorted.
    pub running_adapters: Vec<String>,
    /// The LoRA adapters waiting sequences ask for, each id once, sorted.
    pub waiting_adapters: Vec<String>,
}

/// What one step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Sequences in the forward (0: nothing could run).
    pub sequences: usize,
    /// Tokens in the forward.
    pub tokens: usize,
}

/// One running sequence's part of a forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlannedSpan {
    /// Its index among the running sequences (stable until [`Scheduler::update`]).
    pub(crate) running: usize,
    /// The sequence's id.
    pub(crate) seq: u64,
    /// Tokens it computes in this forward.
    pub(crate) n_tokens: usize,
}

/// The next forward: which sequences compute how many tokens, the tokens themselves, their
/// slots and positions, and the adapters of each span.
#[derive(Default)]
pub(crate) struct ScheduledBatch {
    pub(crate) spans: Vec<PlannedSpan>,
    pub(crate) tokens: Vec<u32>,
    pub(crate) layout: BatchLayout,
    /// Per span, its sequence's adapters; empty when every span runs the base model.
    pub(crate) adapters: Vec<Option<Arc<AdapterStack>>>,
}

impl ScheduledBatch {
    /// Whether nothing can run this step.
    pub(crate) fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

/// The waiting and running sequences, their KV slots, the prompt cache, the memory budget and
/// the counters.
pub(crate) struct Scheduler {
    slots: slots::Slots,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    gate: Option<Arc<dyn StartGate>>,
    budget: Option<KvBudget>,
    prompt_cache: Option<PromptCache>,
    reuse_prefix: bool,
    /// Prompt tokens one sequence computes per forward.
    chunk: usize,
    stats: SchedulerStats,
    next_id: u64,
}

impl Scheduler {
    /// `n_slots` empty slots in `lane`; forwards of at most `batch_tokens` tokens, prefills in
    /// chunks of `chunk`; KV billed against `budget` when there is one.
    pub(crate) fn new(
        n_slots: usize,
        lane: Lane,
        batch_tokens: usize,
        chunk: usize,
        budget: Option<KvBudget>,
    ) -> Self {
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
            budget,
            prompt_cache: None,
            reuse_prefix: true,
            chunk,
            next_id: 0,
        }
    }

    /// Takes `old`'s start gate, prefix-reuse setting and prompt-cache size (emptied: its
    /// entries hold another store's data), for a scheduler replacing it.
    pub(crate) fn keep_settings_of(&mut self, old: &Scheduler) {
        self.gate = old.gate.clone();
        self.reuse_prefix = old.reuse_prefix;
        if let Some(cache) = &old.prompt_cache {
            self.prompt_cache = Some(PromptCache::new(cache.stats().max_bytes));
        }
    }

    /// Queues a checked sequence running `adapters`; its events go to `sink`. Returns its id.
    pub(crate) fn add(
        &mut self,
        dec: Decoding,
        sink: Box<dyn SequenceSink>,
        adapters: Option<Arc<AdapterStack>>,
    ) -> u64 {
        self.next_id += 1;
        self.waiting.push_back(Seq {
            id: self.next_id,
            dec,
            sink,
            slot: None,
            computed: 0,
            permit: None,
            started: false,
            adapters,
        });
        self.next_id
    }

    /// Whether any sequence is waiting or running.
    pub(crate) fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Gates the start of new sequences.
    pub(crate) fn set_start_gate(&mut self, gate: Arc<dyn StartGate>) {
        self.gate = Some(gate);
    }

    /// Whether a new request may start from a prefix a free slot or the prompt cache holds.
    pub(crate) fn set_prefix_reuse(&mut self, reuse: bool) {
        self.reuse_prefix = reuse;
    }

    /// Keeps up to `max_bytes` of prompt snapshots; 0 turns the cache off.
    pub(crate) fn set_prompt_cache_bytes(&mut self, max_bytes: usize) {
        self.prompt_cache = (max_bytes > 0).then(|| PromptCache::new(max_bytes));
    }

    /// Counters of the prompt cache, when it is on.
    pub(crate) fn prompt_cache_stats(&self) -> Option<PromptCacheStats> {
        self.prompt_cache.as_ref().map(PromptCache::stats)
    }

    /// The lane sequences run in.
    pub(crate) fn lane(&self) -> &Lane {
        &self.stats.lane
    }

    /// The slots' records (what each holds, who owns it).
    pub(crate) fn slots(&self) -> &slots::Slots {
        &self.slots
    }

    /// The slots' records, for raw forwards that write slots with no sequence in flight.
    pub(crate) fn slots_mut(&mut self) -> &mut slots::Slots {
        &mut self.slots
    }

    /// The counters now.
    pub(crate) fn stats(&self) -> SchedulerStats {
        let mut stats = self.stats.clone();
        stats.running = self.running.len();
        stats.waiting = self.waiting.len();
        stats.parked_positions = self.slots.parked_positions();
        stats.kv_bill = self.budget.as_ref().map(|b| b.stats(self.bill_now()));
        stats.running_positions = self.running.iter().map(|s| s.computed).sum();
        stats.running_kv_bytes = self.budget.as_ref().map(|b| {
            let slots = self.running.iter().filter_map(|s| s.slot);
            slots.map(|i| b.slot_bytes(self.slots.high_water(i))).sum()
        });
        stats.running_adapters = adapter_ids(&self.running);
        stats.waiting_adapters = adapter_ids(&self.waiting);
        stats
    }

    /// Records that a forward of `layout` wrote its spans' positions.
    pub(crate) fn wrote(&mut self, layout: &BatchLayout) {
        for span in &layout.spans {
            self.slots.wrote(span.slot, span.start_pos + span.n_tokens);
        }
    }

    /// Fails every running sequence with `message` and gives their slots back (after a panic
    /// inside a forward: their KV may be half written). Waiting sequences stay queued.
    pub(crate) fn fail_running<K: KvStore>(&mut self, kv: &mut K, message: &str) {
        for seq in std::mem::take(&mut self.running) {
            self.fail(kv, seq, message);
        }
    }

    /// The next forward: drops cancelled sequences, admits waiting ones, plans every running
    /// sequence's next tokens and makes the memory budget hold them (reclaiming, preempting or
    /// failing what can never fit). Empty when nothing can run.
    pub(crate) fn schedule<K: KvStore>(&mut self, kv: &mut K) -> ScheduledBatch {
        self.reap_cancelled();
        self.admit(kv);
        let plan = self.plan_within_budget(kv);
        self.batch_of(plan)
    }

    /// Processes the forward of `batch`, whose `logits` hold one row per span: advances each
    /// sequence by its span and samples where its tokens are all computed; finished sequences
    /// leave the batch.
    pub(crate) fn update<K: KvStore>(
        &mut self,
        kv: &mut K,
        batch: &ScheduledBatch,
        mut logits: Vec<f32>,
    ) -> StepReport {
        let report = StepReport {
            sequences: batch.spans.len(),
            tokens: batch.tokens.len(),
        };
        let st = &mut self.stats;
        st.steps += 1;
        st.last_batch_sequences = report.sequences;
        st.last_step_tokens = report.tokens;
        st.step_tokens_total += report.tokens as u64;
        st.batch_sequences_total += report.sequences as u64;
        let row_len = logits.len() / batch.spans.len().max(1);
        let mut done = Vec::new();
        for (k, span) in batch.spans.iter().enumerate() {
            let seq = &mut self.running[span.running];
            debug_assert_eq!(seq.id, span.seq, "the batch is not the running set's");
            let n = span.n_tokens;
            // Prompt chunks, and the recomputation of a preempted sequence (not decode steps).
            if n > 1 || seq.dec.generated() == 0 {
                seq.dec.computed_prompt_tokens(n);
            }
            seq.computed += n;
            if seq.remaining() > 0 {
                continue;
            }
            let row = &mut logits[k * row_len..(k + 1) * row_len];
            let Seq { dec, sink, .. } = seq;
            match dec.accept(row, &mut |t, lp| sink.text(t, lp)) {
                Ok(Next::Feed) => {}
                Ok(Next::Done) => done.push((span.running, None)),
                Err(e) => done.push((span.running, Some(e.to_string()))),
            }
        }
        done.sort_unstable_by_key(|d| d.0);
        for (i, err) in done.into_iter().rev() {
            let seq = self.running.remove(i);
            match err {
                None => self.finish(seq, false),
                Some(msg) => self.fail(kv, seq, &msg),
            }
        }
        report
    }

    /// Fails the sequences of `batch` with `message` (its forward failed).
    pub(crate) fn fail_batch<K: KvStore>(
        &mut self,
        kv: &mut K,
        batch: &ScheduledBatch,
        message: &str,
    ) {
        let mut idx: Vec<usize> = batch.spans.iter().map(|s| s.running).collect();
        idx.sort_unstable();
        for i in idx.into_iter().rev() {
            let seq = self.running.remove(i);
            self.fail(kv, seq, message);
        }
    }

    fn reap_cancelled(&mut self) {
        let closed = |s: &Seq| s.sink.is_closed();
        // Every step asks; the queues are rebuilt only when someone left.
        if !self.waiting.iter().chain(&self.running).any(closed) {
            return;
        }
        let (mut gone, waiting): (Vec<Seq>, Vec<Seq>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(closed);
        let (left, running): (Vec<Seq>, Vec<Seq>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(closed);
        (self.waiting, self.running) = (waiting.into(), running);
        gone.extend(left);
        for seq in gone {
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
            self.slots
                .park(slot, &seq.dec.history[..seq.computed], namespace);
        }
        let sink = &mut seq.sink;
        match seq.dec.finish(&mut |t, lp| sink.text(t, lp)) {
            Ok(out) => sink.finished(out),
            Err(e) => sink.failed(&e.to_string()),
        }
    }

    fn fail<K: KvStore>(&mut self, kv: &mut K, mut seq: Seq, message: &str) {
        if let Some(slot) = seq.slot.take() {
            self.release_slot(kv, slot);
        }
        seq.sink.failed(message);
    }

    fn release_slot<K: KvStore>(&mut self, kv: &mut K, slot: usize) {
        let freed = kv.release(slot);
        self.slots.released(slot, freed);
    }

    /// The spans of the next forward: every decoding sequence's token, then whole prefill
    /// chunks while the token budget lasts (always at least one, so prompts progress).
    fn plan(&self) -> Vec<PlannedSpan> {
        let span = |i: usize, n_tokens: usize| PlannedSpan {
            running: i,
            seq: self.running[i].id,
            n_tokens,
        };
        let mut plan: Vec<PlannedSpan> = (0..self.running.len())
            .filter(|&i| self.running[i].remaining() == 1)
            .map(|i| span(i, 1))
            .collect();
        let mut total = plan.len();
        let mut prefills = 0;
        for (i, seq) in self.running.iter().enumerate() {
            if seq.remaining() <= 1 {
                continue;
            }
            let n = seq.remaining().min(self.chunk);
            if prefills == 0 || total + n <= self.stats.batch_tokens {
                plan.push(span(i, n));
                total += n;
                prefills += 1;
            }
        }
        plan
    }

    fn batch_of(&self, spans: Vec<PlannedSpan>) -> ScheduledBatch {
        let mut batch = ScheduledBatch::default();
        for p in &spans {
            let s = &self.running[p.running];
            let n = p.n_tokens;
            batch
                .tokens
                .extend_from_slice(&s.dec.history[s.computed..s.computed + n]);
            batch.layout.spans.push(SeqSpan {
                slot: s.slot.unwrap_or_default(),
                start_pos: s.computed,
                n_tokens: n,
            });
            batch.adapters.push(s.adapters.clone());
        }
        if batch.adapters.iter().all(Option::is_none) {
            batch.adapters.clear();
        }
        batch.spans = spans;
        batch
    }
}
