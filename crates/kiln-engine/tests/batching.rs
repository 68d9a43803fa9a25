//! Continuous batching on the starter model: results do not depend on what else shares the
//! forward, a tight memory budget preempts and recomputes without losing anything, the KV
//! scheme's `batchable()` picks the lane, and a cancelled prefill frees its slot at once.

use std::sync::{Arc, Mutex};

use kiln_engine::kv_scheme::memory::KvGeometry;
use kiln_engine::kv_scheme::{
    KvModelShape, KvQuantOverride, KvScheme, KvSchemeRequest, TurboQuant, resolve_kv_scheme,
};
use kiln_engine::sampler::SamplingParams;
use kiln_engine::sched::Lane;
use kiln_engine::sched::lane::StoreAbilities;
use kiln_engine::{
    Engine, EngineOptions, FinishReason, GenerateOutput, GenerateRequest, SequenceSink, load_model,
};
use kiln_model::backend::cpu::memory::CPU_KV_CAPS_SLIDING;
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::chat_template::prompt_ids;

fn engine(options: EngineOptions) -> Engine<CpuBackend> {
    let path = kiln_hub::ensure_starter_model(false).expect("starter model");
    let backend = CpuBackend::new(CpuOptions { dense: false });
    let model = load_model(&backend, &path).expect("load");
    Engine::new(backend, model, options).expect("engine")
}

fn options(slots: usize) -> EngineOptions {
    EngineOptions {
        context_len: 512,
        prefill_chunk: 32,
        slots,
        batch_tokens: 96,
        ..EngineOptions::default()
    }
}

fn chat(e: &Engine<CpuBackend>, user: &str) -> Vec<u32> {
    let m = e.model();
    let text = m
        .chat_template
        .as_ref()
        .expect("template")
        .render(
            &[serde_json::json!({"role": "user", "content": user})],
            None,
            true,
            None,
        )
        .expect("render");
    prompt_ids(&m.tokenizer, &text).expect("ids")
}

fn request(prompt: Vec<u32>, max_tokens: usize, seed: Option<u64>) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams {
            temperature: if seed.is_some() { 0.9 } else { 0.0 },
            seed: seed.unwrap_or(0),
            ..SamplingParams::default()
        },
        ..GenerateRequest::default()
    }
}

/// What one sequence reported.
#[derive(Default)]
struct Record {
    text: String,
    out: Option<GenerateOutput>,
    failed: Option<String>,
    closed: bool,
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Record>>);

impl SequenceSink for Sink {
    fn text(&mut self, piece: &str, _: &[kiln_engine::request::TokenLogprob]) -> bool {
        self.0.lock().unwrap().text.push_str(piece);
        true
    }
    fn is_closed(&self) -> bool {
        self.0.lock().unwrap().closed
    }
    fn finished(&mut self, out: GenerateOutput) {
        self.0.lock().unwrap().out = Some(out);
    }
    fn failed(&mut self, message: &str) {
        self.0.lock().unwrap().failed = Some(message.to_owned());
    }
}

/// Adds every request, each with its own recording sink.
fn add_all(e: &mut Engine<CpuBackend>, reqs: &[GenerateRequest]) -> Vec<Sink> {
    reqs.iter()
        .map(|r| {
            let s = Sink::default();
            e.add(r, Box::new(s.clone())).expect("add");
            s
        })
        .collect()
}

/// Adds every request at once, steps until all end, and returns their outputs in order.
fn run_all(e: &mut Engine<CpuBackend>, reqs: &[GenerateRequest]) -> Vec<GenerateOutput> {
    let sinks = add_all(e, reqs);
    let mut steps = 0;
    while e.has_work() {
        e.step().expect("step");
        steps += 1;
        assert!(steps < 10_000, "the scheduler stopped making progress");
    }
    sinks
        .into_iter()
        .map(|s| {
            let mut r = s.0.lock().unwrap();
            assert!(r.failed.is_none(), "failed: {:?}", r.failed);
            let out = r.out.take().expect("finished");
            assert_eq!(r.text, out.text, "streamed text is the output's text");
            out
        })
        .collect()
}

#[test]
fn eight_identical_greedy_requests_match_one_alone() {
    let mut alone = engine(options(1));
    let prompt = chat(&alone, "Write one sentence about the sea.");
    let one = run_all(&mut alone, &[request(prompt.clone(), 24, None)]);
    let mut batched = engine(options(8));
    let eight = run_all(&mut batched, &vec![request(prompt, 24, None); 8]);
    for out in &eight {
        assert_eq!(out.tokens, one[0].tokens);
        assert_eq!(out.text, one[0].text);
    }
    let stats = batched.scheduler_stats();
    assert!(
        stats.batch_sequences_total > stats.steps,
        "the requests shared forwards: {stats:?}"
    );
}

#[test]
fn a_seeded_request_samples_the_same_alone_and_under_load() {
    let mut alone = engine(options(1));
    let prompt = chat(&alone, "Name three colours.");
    let seeded = request(prompt, 20, Some(42));
    let one = run_all(&mut alone, std::slice::from_ref(&seeded));
    let mut loaded = engine(options(6));
    // Other requests of other lengths, greedy and sampled, before and after it.
    let mut reqs: Vec<GenerateRequest> = ["Hi.", "Count to five.", "What is rust?"]
        .iter()
        .enumerate()
        .map(|(i, q)| request(chat(&loaded, q), 12 + 4 * i, (i == 1).then_some(7)))
        .collect();
    reqs.insert(2, seeded.clone());
    reqs.push(request(chat(&loaded, "Tell me a long story."), 30, None));
    let outs = run_all(&mut loaded, &reqs);
    assert_eq!(outs[2].tokens, one[0].tokens);
    assert_eq!(outs[2].text, one[0].text);
}

#[test]
fn a_budget_for_three_sequences_serves_eight_by_preempting() {
    let probe = engine(options(1));
    let cfg = &probe.model().config;
    let geometry = KvGeometry::new(cfg, &probe.options().kv_scheme, CPU_KV_CAPS_SLIDING);
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|i| {
            chat(
                &probe,
                &format!("Question {i}: say something about the number {i}."),
            )
        })
        .collect();
    let max_tokens = 40;
    let longest = prompts.iter().map(Vec::len).max().unwrap() + max_tokens;
    let per_sequence = geometry.peak_bytes_at(longest, 32);
    let room = 3 * per_sequence;
    let reqs: Vec<GenerateRequest> = prompts
        .iter()
        .map(|p| request(p.clone(), max_tokens, None))
        .collect();
    let mut alone = engine(options(1));
    let expected: Vec<GenerateOutput> = reqs
        .iter()
        .map(|r| {
            alone.reset();
            run_all(&mut alone, std::slice::from_ref(r)).remove(0)
        })
        .collect();
    let mut tight = engine(EngineOptions {
        kv_budget_bytes: Some(room),
        ..options(8)
    });
    tight.set_prefix_reuse(false);
    let outs = run_all(&mut tight, &reqs);
    let stats = tight.scheduler_stats();
    assert!(
        stats.preempted_total > 0,
        "nothing was preempted: {stats:?}"
    );
    let bill = stats.kv_bill.expect("a budget");
    assert!(bill.peak_billed_bytes <= room, "{bill:?} over {room}");
    for (got, want) in outs.iter().zip(&expected) {
        // Recomputed sequences finish every token they were due.
        assert_eq!(got.tokens.len(), want.tokens.len());
        assert_eq!(got.finish_reason, want.finish_reason);
        assert!(!got.text.is_empty());
    }
}

#[test]
fn a_cancelled_prefill_frees_its_slot_at_the_next_step() {
    let mut e = engine(EngineOptions {
        prefill_chunk: 8,
        batch_tokens: 8,
        ..options(2)
    });
    let long = chat(&e, &"many words here ".repeat(20));
    assert!(long.len() > 40);
    let sink = Sink::default();
    e.add(&request(long, 8, None), Box::new(sink.clone()))
        .expect("add");
    e.step().expect("first chunk");
    assert_eq!(e.scheduler_stats().running, 1, "still prefilling");
    sink.0.lock().unwrap().closed = true;
    let report = e.step().expect("step");
    assert_eq!(
        report.sequences, 0,
        "nothing computed for a cancelled sequence"
    );
    let stats = e.scheduler_stats();
    assert_eq!((stats.running, stats.waiting), (0, 0));
    let out = sink.0.lock().unwrap().out.take().expect("finished");
    assert_eq!(out.finish_reason, FinishReason::Cancelled);
    assert!(out.tokens.is_empty());
    // The slot serves the next request.
    let short = chat(&e, "Hi.");
    assert_eq!(run_all(&mut e, &[request(short, 4, None)]).len(), 1);
}

fn scheme(bits: Option<u8>, turbo: bool, start: Option<i64>) -> KvScheme {
    resolve_kv_scheme(&KvSchemeRequest {
        kv_quant: bits.map(KvQuantOverride::Bits),
        turbo: turbo.then_some(TurboQuant {
            k_bits: 8,
            v_bits: 3,
        }),
        quantized_kv_start: start,
        ..KvSchemeRequest::default()
    })
    .expect("scheme")
}

#[test]
fn batchable_decides_the_lane_for_each_scheme() {
    let e = engine(options(1));
    let shape = KvModelShape::from_config(&e.model().config);
    let all = |_: usize| true;
    let per_slot = StoreAbilities {
        converts_per_slot: true,
    };
    let shared_boundary = StoreAbilities {
        converts_per_slot: false,
    };
    let lane = |s: &KvScheme, a: StoreAbilities| Lane::decide(s, &shape, &all, a, "test");
    assert!(
        lane(&e.options().kv_scheme, shared_boundary).batched,
        "dense"
    );
    assert!(
        lane(&scheme(Some(8), false, Some(0)), shared_boundary).batched,
        "kv8 from 0"
    );
    let delayed = lane(&scheme(Some(4), false, Some(256)), shared_boundary);
    assert!(
        !delayed.batched,
        "kv4 delayed on a store without per-slot conversion"
    );
    assert!(
        delayed.solo_reason.as_deref().unwrap_or("").contains("256"),
        "{delayed:?}"
    );
    assert!(lane(&scheme(Some(4), false, Some(256)), per_slot).batched);
    assert!(
        lane(&scheme(None, true, Some(256)), shared_boundary).batched,
        "turbo"
    );
    let none = |_: usize| false;
    let refused = Lane::decide(
        &scheme(Some(8), false, Some(0)),
        &shape,
        &none,
        per_slot,
        "test",
    );
    assert!(!refused.batched && refused.solo_reason.is_some());
    // The CPU store converts per slot: a delayed kv4 engine batches.
    let kv4 = engine(EngineOptions {
        kv_scheme: scheme(Some(4), false, Some(256)),
        ..options(4)
    });
    assert!(kv4.lane().batched);
    assert_eq!(kv4.scheduler_stats().max_sequences, 4);
}

/// A start gate that can be closed (a heavy job waiting for the lease).
struct Gate(Arc<std::sync::atomic::AtomicBool>);

impl kiln_engine::StartGate for Gate {
    fn try_start(&self) -> Option<Box<dyn Send>> {
        self.0
            .load(std::sync::atomic::Ordering::SeqCst)
            .then(|| Box::new(()) as Box<dyn Send>)
    }
}

/// While the gate is closed nothing new starts, but a preempted sequence (which already holds
/// its permit) still comes back and finishes, so the drain always ends.
#[test]
fn a_closed_gate_still_lets_preempted_sequences_finish() {
    let probe = engine(options(1));
    let cfg = &probe.model().config;
    let geometry = KvGeometry::new(cfg, &probe.options().kv_scheme, CPU_KV_CAPS_SLIDING);
    let reqs: Vec<GenerateRequest> = (0..3)
        .map(|i| {
            request(
                chat(&probe, &format!("Tell me about the number {i}.")),
                40,
                None,
            )
        })
        .collect();
    let len = reqs.iter().map(|r| r.prompt.len()).max().unwrap();
    // Room for one whole sequence and the start of another: the newer one is preempted.
    let room = geometry.peak_bytes_at(len + 40, 32) + geometry.peak_bytes_at(len + 8, 32);
    let mut e = engine(EngineOptions {
        kv_budget_bytes: Some(room),
        ..options(4)
    });
    e.set_prefix_reuse(false);
    let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
    e.set_start_gate(Arc::new(Gate(open.clone())));
    let sinks = add_all(&mut e, &reqs[..2]);
    let mut steps = 0;
    while e.scheduler_stats().preempted_total == 0 {
        e.step().expect("step");
        steps += 1;
        assert!(steps < 500, "no preemption: {:?}", e.scheduler_stats());
    }
    open.store(false, std::sync::atomic::Ordering::SeqCst);
    let late = Sink::default();
    e.add(&reqs[2], Box::new(late.clone())).expect("add");
    while sinks.iter().any(|s| s.0.lock().unwrap().out.is_none()) {
        e.step().expect("step");
        steps += 1;
        assert!(
            steps < 2_000,
            "the drain never ended: {:?}",
            e.scheduler_stats()
        );
    }
    let stats = e.scheduler_stats();
    assert_eq!(
        (stats.running, stats.waiting),
        (0, 1),
        "only the late one waits"
    );
    assert!(
        late.0.lock().unwrap().out.is_none(),
        "it started while the gate was closed"
    );
    open.store(true, std::sync::atomic::Ordering::SeqCst);
    while e.has_work() {
        e.step().expect("step");
    }
    assert_eq!(
        late.0.lock().unwrap().out.as_ref().map(|o| o.tokens.len()),
        Some(40)
    );
}
