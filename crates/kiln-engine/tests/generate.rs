//! The generation loop on the real starter model: greedy parity through the engine, EOS, stop
//! strings with hold-back, seeds, prefix reuse, cancellation and request errors.

use std::path::PathBuf;

use kiln_engine::sampler::SamplingParams;
use kiln_engine::{Engine, EngineOptions, FinishReason, GenerateRequest, load_model};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::chat_template::prompt_ids;
use serde_json::json;

fn reference() -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/smollm2/transformers_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("reference")).expect("json")
}

fn engine(dense: bool) -> Engine<CpuBackend> {
    let path = kiln_hub::ensure_starter_model(false).expect("starter model");
    let backend = CpuBackend::new(CpuOptions { dense });
    let model = load_model(&backend, &path).expect("load");
    Engine::new(
        backend,
        model,
        EngineOptions {
            context_len: 512,
            prefill_chunk: 16,
            ..EngineOptions::default()
        },
    )
    .expect("engine")
}

fn chat_prompt(e: &Engine<CpuBackend>, user: &str) -> Vec<u32> {
    let m = e.model();
    let rendered = m
        .chat_template
        .as_ref()
        .expect("template")
        .render(
            &[json!({"role": "user", "content": user})],
            None,
            true,
            None,
        )
        .expect("render");
    prompt_ids(&m.tokenizer, &rendered).expect("ids")
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams::default(),
        stop: vec![],
        ignore_eos: false,
        adapters: None,
        grammar: None,
    }
}

#[test]
fn greedy_through_the_engine_matches_transformers() {
    let mut e = engine(true);
    let r = reference();
    let case = &r["cases"]["chat_capital_france"];
    let prompt = chat_prompt(&e, "What is the capital of France?");
    let want_prompt: Vec<u32> = case["prompt_token_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect();
    assert_eq!(prompt, want_prompt, "rendered chat prompt ids");
    let want: Vec<u32> = case["greedy_40"]["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect();
    // Chunked prefill (16 tokens a chunk) must not change anything.
    let out = e
        .generate(
            &GenerateRequest {
                ignore_eos: true,
                ..greedy(prompt.clone(), 40)
            },
            |_| true,
        )
        .expect("generate");
    assert_eq!(out.tokens, want);
    assert_eq!(out.finish_reason, FinishReason::Length);

    // Without ignore_eos it stops at EOS (id 2), which is not emitted.
    let out = e.generate(&greedy(prompt, 40), |_| true).expect("generate");
    assert_eq!(out.text, "The capital of France is Paris.");
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.tokens, want[..7].to_vec());
}

#[test]
fn stop_strings_never_leak_and_prefix_is_reused() {
    let mut e = engine(true);
    let prompt = chat_prompt(&e, "What is the capital of France?");
    let mut streamed = String::new();
    let req = GenerateRequest {
        stop: vec!["s Par".into()],
        ..greedy(prompt.clone(), 40)
    };
    let out = e
        .generate(&req, |piece| {
            streamed.push_str(piece);
            true
        })
        .expect("generate");
    assert_eq!(out.text, "The capital of France i");
    assert_eq!(
        streamed, out.text,
        "streamed text equals the final text; no part of the stop string leaked"
    );
    assert_eq!(out.stop_index, Some(0));
    assert_eq!(out.finish_reason, FinishReason::Stop);

    // Same prompt again: everything but the last prompt token comes from the cache.
    let out = e
        .generate(&greedy(prompt.clone(), 8), |_| true)
        .expect("generate");
    assert_eq!(out.stats.cached_tokens, prompt.len() - 1);
    assert_eq!(out.text, "The capital of France is Paris.");
}

#[test]
fn seeds_reproduce_and_cancellation_stops() {
    let mut e = engine(false);
    let prompt = chat_prompt(&e, "Tell me a story.");
    let sampled = |seed| GenerateRequest {
        sampling: SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed,
            ..SamplingParams::default()
        },
        ignore_eos: true,
        ..greedy(prompt.clone(), 24)
    };
    let a = e.generate(&sampled(7), |_| true).expect("a");
    let b = e.generate(&sampled(7), |_| true).expect("b");
    let c = e.generate(&sampled(8), |_| true).expect("c");
    assert_eq!(a.tokens, b.tokens, "same seed, same tokens");
    assert_ne!(a.tokens, c.tokens, "another seed, other tokens");

    let mut pieces = 0;
    let out = e
        .generate(&sampled(7), |_| {
            pieces += 1;
            pieces < 3
        })
        .expect("cancelled run");
    assert_eq!(out.finish_reason, FinishReason::Cancelled);
    assert!(out.tokens.len() < 24);
}

#[test]
fn bad_requests_are_errors() {
    let mut e = engine(false);
    assert!(
        e.generate(&greedy(vec![], 4), |_| true).is_err(),
        "empty prompt"
    );
    assert!(
        e.generate(&greedy(vec![1; 600], 4), |_| true).is_err(),
        "prompt longer than the context"
    );
    assert!(
        e.generate(&greedy(vec![u32::MAX], 4), |_| true).is_err(),
        "token outside the vocabulary"
    );
    let bad = GenerateRequest {
        sampling: SamplingParams {
            top_p: 2.0,
            temperature: 1.0,
            ..SamplingParams::default()
        },
        ..greedy(vec![1, 2], 4)
    };
    let err = e.generate(&bad, |_| true).expect_err("top_p 2").to_string();
    assert!(err.contains("top_p"), "{err}");
    let bad = GenerateRequest {
        stop: vec![String::new()],
        ..greedy(vec![1, 2], 4)
    };
    assert!(e.generate(&bad, |_| true).is_err(), "empty stop string");
    // The engine still works afterwards.
    let out = e
        .generate(&greedy(vec![1, 2, 3], 3), |_| true)
        .expect("still alive");
    assert!(out.tokens.len() <= 3);
}

#[test]
fn generation_fills_the_context_then_reports_length() {
    let mut e = engine(false);
    let prompt: Vec<u32> = (100..600).collect();
    let out = e
        .generate(
            &GenerateRequest {
                ignore_eos: true,
                ..greedy(prompt, 100)
            },
            |_| true,
        )
        .expect("generate");
    assert_eq!(
        out.tokens.len(),
        12,
        "512-token context minus a 500-token prompt"
    );
    assert_eq!(out.finish_reason, FinishReason::Length);
}
