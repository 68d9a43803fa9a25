//! The scheduler without a model: a fake KV store that only records lengths and releases, a
//! one-layer geometry billing one byte per position, and logits made up so greedy sampling
//! picks a chosen token. What is tested is the order of the plan, admission under the token
//! and memory budgets, and who is preempted.

use std::str::FromStr;
use std::sync::{Arc, Mutex};

use kiln_model::backend::{KvLayout, KvStore};

use super::*;
use crate::kv_scheme::KvLayerKind;
use crate::kv_scheme::memory::{KvGeometry, LayerKvBytes};
use crate::request::GenerateRequest;
use crate::sequence::Vocab;

const VOCAB: usize = 16;

/// Slot lengths, and which slots were released.
#[derive(Default)]
struct FakeKv {
    lens: Vec<usize>,
    released: Vec<usize>,
}

impl KvStore for FakeKv {
    fn layout(&self) -> KvLayout {
        KvLayout {
            n_layers: 1,
            n_kv_heads: 1,
            head_dim: 1,
            n_slots: self.lens.len(),
            capacity: 1 << 20,
        }
    }
    fn seq_len(&self, slot: usize) -> usize {
        self.lens[slot]
    }
    fn set_seq_len(&mut self, slot: usize, len: usize) {
        self.lens[slot] = len;
    }
    fn allocated_bytes(&self) -> usize {
        0
    }
    fn release(&mut self, slot: usize) -> bool {
        self.lens[slot] = 0;
        self.released.push(slot);
        true
    }
}

/// What a sequence's sink saw.
#[derive(Default)]
struct Seen {
    text: String,
    finished: Option<GenerateOutput>,
    failed: Option<String>,
    closed: bool,
}

struct Sink(Arc<Mutex<Seen>>);

impl SequenceSink for Sink {
    fn text(&mut self, piece: &str, _: &[TokenLogprob]) -> bool {
        let mut s = self.0.lock().unwrap();
        s.text.push_str(piece);
        !s.closed
    }
    fn is_closed(&self) -> bool {
        self.0.lock().unwrap().closed
    }
    fn finished(&mut self, out: GenerateOutput) {
        self.0.lock().unwrap().finished = Some(out);
    }
    fn failed(&mut self, message: &str) {
        self.0.lock().unwrap().failed = Some(message.to_string());
    }
}

fn vocab() -> Vocab {
    let words: Vec<String> = (0..VOCAB).map(|i| format!("\"w{i}\": {i}")).collect();
    let json = format!(
        r#"{{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
            "model": {{"type": "WordLevel", "vocab": {{{}}}, "unk_token": "w0"}}}}"#,
        words.join(", ")
    );
    Vocab {
        size: VOCAB,
        eos: vec![15],
        newline: vec![],
        tokenizer: Arc::new(tokenizers::Tokenizer::from_str(&json).expect("tokenizer")),
    }
}

/// A scheduler over `slots` slots in a batched lane; a budget of `room` positions if any.
fn scheduler(slots: usize, batch_tokens: usize, chunk: usize, room: Option<u64>) -> Scheduler {
    let geometry = KvGeometry {
        layers: vec![LayerKvBytes {
            kind: KvLayerKind::Full,
            window: None,
            dense_per_token: 1,
            stored_per_token: 1,
        }],
        start: 0,
        cap_sliding: false,
    };
    let lane = Lane {
        batched: true,
        solo_reason: None,
    };
    let budget = room.map(|r| KvBudget::new(r, geometry, chunk));
    Scheduler::new(slots, lane, batch_tokens, chunk, budget)
}

/// Queues a greedy request of a `prompt_len`-token prompt made of `token`, generating up to
/// `max_tokens`; returns its id and what its sink sees.
fn add(
    s: &mut Scheduler,
    prompt_len: usize,
    token: u32,
    max_tokens: usize,
) -> (u64, Arc<Mutex<Seen>>) {
    let req = GenerateRequest {
        prompt: vec![token; prompt_len],
        max_tokens,
        ..GenerateRequest::default()
    };
    let dec = Decoding::with_vocab(&vocab(), &req, 4096).expect("request");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let id = s.add(dec, Box::new(Sink(seen.clone())), None);
    (id, seen)
}

/// One step with a pretend forward whose every row picks `token`: returns each span's
/// sequence id and token count.
fn step(s: &mut Scheduler, kv: &mut FakeKv, token: u32) -> Vec<(u64, usize)> {
    let batch = s.schedule(kv);
    if batch.is_empty() {
        return Vec::new();
    }
    for span in &batch.layout.spans {
        kv.set_seq_len(span.slot, span.start_pos + span.n_tokens);
    }
    s.wrote(&batch.layout);
    let mut logits = vec![0.0; batch.spans.len() * VOCAB];
    for row in logits.chunks_mut(VOCAB) {
        row[token as usize] = 10.0;
    }
    let spans = batch.spans.iter().map(|p| (p.seq, p.n_tokens)).collect();
    s.update(kv, &batch, logits);
    spans
}

fn kv(slots: usize) -> FakeKv {
    FakeKv {
        lens: vec![0; slots],
        released: Vec::new(),
    }
}

#[test]
fn decodes_go_first_then_whole_prefill_chunks_while_the_token_budget_lasts() {
    let mut s = scheduler(3, 6, 4, None);
    let mut kv = kv(3);
    let (a, _) = add(&mut s, 3, 1, 10);
    assert_eq!(step(&mut s, &mut kv, 2), vec![(a, 3)]);
    let (b, _) = add(&mut s, 8, 3, 10);
    let (c, _) = add(&mut s, 8, 4, 10);
    // A decodes (1), B's chunk (4) fits the 6-token budget, C's would not.
    assert_eq!(step(&mut s, &mut kv, 2), vec![(a, 1), (b, 4)]);
    assert_eq!(step(&mut s, &mut kv, 2), vec![(a, 1), (b, 4)]);
    // B now decodes too; C's chunk still fits beside the two decodes.
    assert_eq!(step(&mut s, &mut kv, 2), vec![(a, 1), (b, 1), (c, 4)]);
    let st = s.stats();
    assert_eq!(
        (st.steps, st.step_tokens_total, st.running),
        (4, 3 + 5 + 5 + 6, 3)
    );
}

#[test]
fn one_prefill_chunk_always_goes_even_over_the_token_budget() {
    let mut s = scheduler(2, 2, 8, None);
    let mut kv = kv(2);
    let (a, _) = add(&mut s, 20, 1, 4);
    assert_eq!(step(&mut s, &mut kv, 2), vec![(a, 8)]);
    assert_eq!(step(&mut s, &mut kv, 2), vec![(a, 8)]);
    assert_eq!(step(&mut s, &mut kv, 2), vec![(a, 4)]);
    assert_eq!(step(&mut s, &mut kv, 2), vec![(a, 1)]);
}

#[test]
fn admission_waits_for_memory_first_come_first_served() {
    // 20 positions: A (12 prompt) is billed at its next chunk (8) when B (14) asks: 22.
    let mut s = scheduler(3, 64, 8, Some(20));
    let mut kv = kv(3);
    let (a, seen_a) = add(&mut s, 12, 1, 3);
    let (b, _) = add(&mut s, 14, 2, 3);
    let (_c, _) = add(&mut s, 2, 3, 3);
    assert_eq!(step(&mut s, &mut kv, 5), vec![(a, 8)]);
    // C would fit, but waits behind B.
    let st = s.stats();
    assert_eq!((st.running, st.waiting), (1, 2));
    while seen_a.lock().unwrap().finished.is_none() {
        assert!(!step(&mut s, &mut kv, 5).is_empty());
    }
    // A's slot kept its prefix; B needs it back and gets it by releasing slot 0.
    assert_eq!(s.waiting.front().map(|q| q.id), Some(b));
    let spans = step(&mut s, &mut kv, 5);
    assert_eq!(spans[0], (b, 8));
    assert_eq!(kv.released, vec![0]);
    assert!(s.stats().kv_bill.unwrap().peak_billed_bytes <= 20);
}

#[test]
fn the_newest_sequence_is_preempted_and_requeued_before_later_arrivals() {
    let mut s = scheduler(3, 64, 8, Some(18));
    let mut kv = kv(3);
    let (a, seen_a) = add(&mut s, 6, 1, 100);
    let (b, seen_b) = add(&mut s, 6, 2, 100);
    assert_eq!(step(&mut s, &mut kv, 5), vec![(a, 6), (b, 6)]);
    let (c, _) = add(&mut s, 6, 3, 100);
    // A and B decode, 2 positions a step; C (6) cannot be admitted beside them.
    let mut preempted_at = None;
    for i in 0..20 {
        step(&mut s, &mut kv, 5);
        if s.stats().preempted_total > 0 {
            preempted_at = Some(i);
            break;
        }
    }
    assert!(preempted_at.is_some(), "the budget never preempted");
    assert_eq!(s.running.iter().map(|q| q.id).collect::<Vec<_>>(), vec![a]);
    let queue: Vec<u64> = s.waiting.iter().map(|q| q.id).collect();
    assert_eq!(queue, vec![b, c]);
    assert_eq!(s.waiting[0].computed, 0);
    assert!(kv.released.contains(&1), "B's slot was not given back");
    // Nothing was lost or failed on the way.
    assert!(seen_a.lock().unwrap().failed.is_none());
    assert!(seen_b.lock().unwrap().failed.is_none());
    assert!(s.stats().kv_bill.unwrap().peak_billed_bytes <= 18);
}

#[test]
fn a_sequence_that_can_never_fit_fails_naming_the_bytes() {
    let mut s = scheduler(2, 64, 8, Some(10));
    let mut kv = kv(2);
    let (_, seen) = add(&mut s, 12, 1, 4);
    assert!(step(&mut s, &mut kv, 5).is_empty());
    let failed = seen.lock().unwrap().failed.clone().expect("failed");
    assert!(
        failed.contains("2 bytes more than the 10 bytes"),
        "{failed}"
    );
    assert!(!s.has_work());
}

#[test]
fn a_cancelled_sequence_leaves_at_the_next_schedule_and_parks_its_prefix() {
    let mut s = scheduler(2, 64, 8, None);
    let mut kv = kv(2);
    let (a, seen) = add(&mut s, 4, 1, 50);
    assert_eq!(step(&mut s, &mut kv, 5), vec![(a, 4)]);
    seen.lock().unwrap().closed = true;
    assert!(step(&mut s, &mut kv, 5).is_empty());
    let out = seen.lock().unwrap().finished.clone().expect("finished");
    assert_eq!(out.finish_reason, crate::FinishReason::Cancelled);
    assert_eq!(s.slots().parked_positions(), 4);
}

#[test]
fn a_finished_sequence_hands_over_its_tokens_and_text() {
    let mut s = scheduler(1, 64, 8, None);
    let mut kv = kv(1);
    let (_, seen) = add(&mut s, 3, 1, 2);
    while seen.lock().unwrap().finished.is_none() {
        assert!(!step(&mut s, &mut kv, 7).is_empty());
    }
    let seen = seen.lock().unwrap();
    let out = seen.finished.as_ref().expect("finished");
    assert_eq!(out.tokens, vec![7, 7]);
    assert_eq!(out.text, seen.text);
    assert!(out.text.contains("w7"), "{}", out.text);
}

struct Gate(Arc<Mutex<bool>>);

impl StartGate for Gate {
    fn try_start(&self) -> Option<Box<dyn Send>> {
        (*self.0.lock().unwrap()).then(|| Box::new(()) as Box<dyn Send>)
    }
}

#[test]
fn a_closed_gate_keeps_new_sequences_waiting() {
    let mut s = scheduler(2, 64, 8, None);
    let mut kv = kv(2);
    let open = Arc::new(Mutex::new(false));
    s.set_start_gate(Arc::new(Gate(open.clone())));
    let (a, _) = add(&mut s, 4, 1, 4);
    assert!(step(&mut s, &mut kv, 5).is_empty());
    assert_eq!(s.stats().waiting, 1);
    *open.lock().unwrap() = true;
    assert_eq!(step(&mut s, &mut kv, 5), vec![(a, 4)]);
}

#[test]
fn the_in_use_kv_counts_running_sequences_only_and_grows_with_them() {
    let mut s = scheduler(2, 64, 8, Some(100));
    let mut kv = kv(2);
    let (_a, _) = add(&mut s, 5, 1, 3);
    step(&mut s, &mut kv, 2);
    let st = s.stats();
    assert_eq!((st.running_positions, st.running_kv_bytes), (5, Some(5)));
    step(&mut s, &mut kv, 2);
    assert_eq!(s.stats().running_positions, 6);
    // Finished: its prefix stays parked in the slot, billed but not in use.
    step(&mut s, &mut kv, 2);
    step(&mut s, &mut kv, 2);
    let st = s.stats();
    assert_eq!((st.running, st.running_positions), (0, 0));
    assert_eq!(st.running_kv_bytes, Some(0));
    assert!(st.kv_bill.is_some_and(|b| b.billed_bytes > 0));
    assert!(st.running_adapters.is_empty() && st.waiting_adapters.is_empty());
}
