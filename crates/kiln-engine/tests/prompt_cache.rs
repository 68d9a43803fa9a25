//! The prompt cache on the real starter model: alternating conversations restore their saved
//! prefix, and the output is the same as from a cold engine.

use kiln_engine::sampler::SamplingParams;
use kiln_engine::{Engine, EngineOptions, GenerateRequest, load_model};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};

fn engine() -> Engine<CpuBackend> {
    engine_with_slots(1)
}

fn engine_with_slots(slots: usize) -> Engine<CpuBackend> {
    let path = kiln_hub::ensure_starter_model(false).expect("starter model");
    let backend = CpuBackend::new(CpuOptions { dense: false });
    let model = load_model(&backend, &path).expect("load");
    let options = EngineOptions {
        context_len: 256,
        prefill_chunk: 32,
        slots,
        ..EngineOptions::default()
    };
    Engine::new(backend, model, options).expect("engine")
}

fn greedy(e: &Engine<CpuBackend>, text: &str) -> GenerateRequest {
    GenerateRequest {
        prompt: e.model().tokenizer.encode(text, true).expect("encode"),
        max_tokens: 8,
        sampling: SamplingParams::default(),
        stop: vec![],
        ignore_eos: true,
        adapters: None,
        grammar: None,
    }
}

#[test]
fn alternating_prompts_restore_their_prefix_with_identical_output() {
    let mut cold = engine();
    let mut warm = engine();
    warm.set_prompt_cache_bytes(64 << 20);
    let a = greedy(
        &warm,
        "The old lighthouse keeper climbed the stairs every night and",
    );
    let b = greedy(
        &warm,
        "In a small village at the edge of the forest there lived",
    );

    let a1 = warm.generate(&a, |_| true).unwrap();
    let b1 = warm.generate(&b, |_| true).unwrap();
    let a2 = warm.generate(&a, |_| true).unwrap();
    let b2 = warm.generate(&b, |_| true).unwrap();
    // Without the LRU only BOS would be shared; with it the whole prompt but its last token is.
    assert_eq!(a2.stats.cached_tokens, a.prompt.len() - 1);
    assert_eq!(b2.stats.cached_tokens, b.prompt.len() - 1);
    let stats = warm.prompt_cache_stats().unwrap();
    assert!(stats.restores >= 2 && stats.saves >= 3, "{stats:?}");

    for (req, outs) in [(&a, [&a1, &a2]), (&b, [&b1, &b2])] {
        cold.reset();
        let reference = cold.generate(req, |_| true).unwrap();
        for o in outs {
            assert_eq!(o.tokens, reference.tokens);
        }
    }
}

#[test]
fn without_the_cache_only_the_slot_is_reused() {
    let mut e = engine();
    let a = greedy(
        &e,
        "The old lighthouse keeper climbed the stairs every night and",
    );
    let b = greedy(
        &e,
        "In a small village at the edge of the forest there lived",
    );
    e.generate(&a, |_| true).unwrap();
    e.generate(&b, |_| true).unwrap();
    let again = e.generate(&a, |_| true).unwrap();
    assert!(again.stats.cached_tokens <= 1);
    assert!(e.prompt_cache_stats().is_none());
}

/// With several slots and no prompt cache, each conversation comes back to the slot that kept
/// its prefix (llama.cpp's slot choice), and the output matches a cold engine's.
#[test]
fn each_conversation_returns_to_the_slot_with_its_prefix() {
    let mut e = engine_with_slots(2);
    let a = greedy(
        &e,
        "The old lighthouse keeper climbed the stairs every night and",
    );
    let b = greedy(
        &e,
        "In a small village at the edge of the forest there lived",
    );
    let a1 = e.generate(&a, |_| true).unwrap();
    e.generate(&b, |_| true).unwrap();
    let a2 = e.generate(&a, |_| true).unwrap();
    let b2 = e.generate(&b, |_| true).unwrap();
    assert_eq!(a2.stats.cached_tokens, a.prompt.len() - 1);
    assert_eq!(b2.stats.cached_tokens, b.prompt.len() - 1);
    assert_eq!(a2.tokens, a1.tokens);
    assert!(e.prompt_cache_stats().is_none());
}
