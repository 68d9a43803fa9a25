//! KV-cache schemes on the real starter model: delayed conversion (identical logits before the
//! boundary, one conversion per layer at it), measured bytes per token against the memory
//! formula, quality against the dense cache over `kl_text.txt`, and refusals naming the layer.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use kiln_engine::eval::compare_logits;
use kiln_engine::kv_scheme::memory::KvGeometry;
use kiln_engine::kv_scheme::{
    DenseDtype, KvQuantOverride, KvScheme, KvSchemeRequest, TurboQuant, resolve_kv_scheme,
};
use kiln_engine::{Engine, EngineOptions, load_model};
use kiln_model::backend::cpu::memory::CPU_KV_CAPS_SLIDING;
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::backend::{BatchLayout, KvLayerState, KvStore};

/// One engine for the whole file (loading is the slow part); tests take turns.
fn engine() -> std::sync::MutexGuard<'static, Engine<CpuBackend>> {
    static ENGINE: OnceLock<Mutex<Engine<CpuBackend>>> = OnceLock::new();
    let e = ENGINE.get_or_init(|| {
        let path = kiln_hub::ensure_starter_model(false).expect("starter model");
        let backend = CpuBackend::new(CpuOptions { dense: false });
        let model = load_model(&backend, &path).expect("load");
        let options = EngineOptions {
            context_len: 1100,
            prefill_chunk: 32,
            ..EngineOptions::default()
        };
        Mutex::new(Engine::new(backend, model, options).expect("engine"))
    });
    e.lock().unwrap_or_else(|p| p.into_inner())
}

fn scheme(req: KvSchemeRequest<'_>) -> KvScheme {
    resolve_kv_scheme(&req).expect("scheme")
}

fn affine(bits: u8, group: Option<usize>, start: Option<i64>) -> KvScheme {
    scheme(KvSchemeRequest {
        kv_quant: Some(KvQuantOverride::Bits(bits)),
        kv_group_size: group,
        quantized_kv_start: start,
        ..Default::default()
    })
}

fn turbo(k_bits: u8, v_bits: u8) -> KvScheme {
    scheme(KvSchemeRequest {
        turbo: Some(TurboQuant { k_bits, v_bits }),
        ..Default::default()
    })
}

fn kl_tokens(e: &Engine<CpuBackend>) -> Vec<u32> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/smollm2/kl_text.txt");
    let text = std::fs::read_to_string(path).expect("kl_text");
    let tokens = e.model().tokenizer.encode(&text, false).expect("encode");
    assert_eq!(tokens.len(), 1057);
    tokens
}

/// Feeds `tokens` one forward each and returns every forward's logits.
fn step_by_step(e: &mut Engine<CpuBackend>, tokens: &[u32]) -> Vec<Vec<f32>> {
    e.reset();
    tokens
        .iter()
        .enumerate()
        .map(|(pos, t)| {
            e.forward_batch(&[*t], &BatchLayout::single(0, pos, 1))
                .expect("forward")
        })
        .collect()
}

#[test]
fn delayed_start_is_dense_before_the_boundary_and_converts_each_layer_once_at_it() {
    let mut e = engine();
    let tokens: Vec<u32> = kl_tokens(&e)[..24].to_vec();
    // The pre-conversion store is the default dense storage (f16).
    e.set_kv_scheme(KvScheme::dense(DenseDtype::default()))
        .unwrap();
    let dense = step_by_step(&mut e, &tokens);

    let start = 16;
    e.set_kv_scheme(affine(4, None, Some(start))).unwrap();
    e.reset();
    let layers = e.model().config.num_layers as u64;
    for (pos, t) in tokens.iter().enumerate() {
        let logits = e
            .forward_batch(&[*t], &BatchLayout::single(0, pos, 1))
            .unwrap();
        let len = pos + 1;
        // Every forward up to and including the one that reaches the start ran on the dense
        // cache: its logits are bit-identical to the dense scheme's.
        if len <= start as usize {
            assert_eq!(
                logits, dense[pos],
                "position {pos} differs before the boundary"
            );
        }
        let expected = if len < start as usize { 0 } else { layers };
        assert_eq!(e.kv().conversions(), expected, "after {len} positions");
    }
    assert!(
        e.kv()
            .layer_states(0)
            .iter()
            .all(|s| matches!(s, KvLayerState::Quantized(_)))
    );
    assert_ne!(
        dense[23],
        step_by_step(&mut e, &tokens)[23],
        "kv4 changed nothing"
    );
    // A new sequence starts dense again and converts again, once.
    assert_eq!(e.kv().conversions(), 2 * layers);
}

#[test]
fn start_zero_never_converts_an_empty_cache_so_the_first_chunk_is_dense() {
    let mut e = engine();
    let tokens: Vec<u32> = kl_tokens(&e)[..40].to_vec();
    e.set_kv_scheme(KvScheme::dense(DenseDtype::default()))
        .unwrap();
    let dense = e.logits_all_chunked(&tokens, 20).unwrap();
    e.set_kv_scheme(affine(8, None, None)).unwrap();
    let kv8 = e.logits_all_chunked(&tokens, 20).unwrap();
    let vocab = e.model().config.vocab_size;
    assert_eq!(dense[..20 * vocab], kv8[..20 * vocab]);
    assert_ne!(dense[20 * vocab..], kv8[20 * vocab..]);
    assert_eq!(e.kv().conversions(), e.model().config.num_layers as u64);
}

#[test]
fn measured_bytes_per_token_equal_the_formula_for_every_scheme() {
    let mut e = engine();
    let tokens: Vec<u32> = kl_tokens(&e)[..64].to_vec();
    let cfg = e.model().config.clone();
    let capacity = e.options().context_len;
    let dense = |d| KvScheme::dense(d);
    for s in [
        dense(DenseDtype::F32),
        dense(DenseDtype::F16),
        dense(DenseDtype::Bf16),
        affine(8, None, None),
        affine(4, None, None),
        affine(4, Some(32), None),
        affine(8, Some(32), None),
        turbo(8, 3),
        turbo(4, 4),
        turbo(2, 2),
        turbo(5, 8),
    ] {
        let formula = KvGeometry::new(&cfg, &s, CPU_KV_CAPS_SLIDING).bytes_per_token() as usize;
        e.set_kv_scheme(s.clone()).unwrap();
        e.logits_all_chunked(&tokens, 16).unwrap();
        let kv = e.kv();
        assert_eq!(kv.slot_bytes(0), 64 * formula, "{}", s.cache_key());
        // What the store really reserves per position, now that every layer has converted.
        assert_eq!(
            kv.allocated_bytes(),
            capacity * formula,
            "{}",
            s.cache_key()
        );
    }
}

/// Teacher-forced quality against the dense f32 cache over kl_text (1,057 tokens, 32 per
/// forward; the first forward runs before conversion and is not scored). Measured on the
/// dense-weight path (f32 activations): the int8-activation path turns any perturbation of the
/// attention output — even lossless-looking f16 storage — into rounding flips worth ~2.8% of
/// top-1 (measured: f16 KV there gives 97.2%, here 100%). Bounds and measurements:
/// docs/testing.md, "KV-scheme quality".
#[test]
fn quality_against_the_dense_cache_over_kl_text() {
    let path = kiln_hub::ensure_starter_model(false).expect("starter model");
    let backend = CpuBackend::new(CpuOptions { dense: true });
    let model = load_model(&backend, &path).expect("load");
    let options = EngineOptions {
        context_len: 1100,
        prefill_chunk: 32,
        // The reference: exactly the activations.
        kv_scheme: KvScheme::dense(DenseDtype::F32),
        ..EngineOptions::default()
    };
    let mut e = Engine::new(backend, model, options).expect("engine");
    let tokens = kl_tokens(&e);
    let vocab = e.model().config.vocab_size;
    let reference = e.logits_all_chunked(&tokens, 32).unwrap();
    let mut measure = |s: KvScheme| {
        let key = s.cache_key();
        e.set_kv_scheme(s).unwrap();
        let logits = e.logits_all_chunked(&tokens, 32).unwrap();
        let c = compare_logits(&reference, &logits, vocab, 32..tokens.len());
        eprintln!(
            "{key}: top-1 {:.2}%, mean KL {:.5}, max KL {:.4}",
            100.0 * c.top1_agreement,
            c.mean_kl,
            c.max_kl
        );
        c
    };
    let f16 = measure(KvScheme::dense(DenseDtype::F16));
    assert!(f16.top1_agreement >= 0.999 && f16.mean_kl < 1e-5, "{f16:?}");
    // llama.cpp's q8_0 groups 32 values; with the same grouping kv8 meets 99%.
    let kv8_g32 = measure(affine(8, Some(32), None));
    assert!(kv8_g32.top1_agreement >= 0.99, "{kv8_g32:?}");
    assert!(kv8_g32.mean_kl <= 0.0004, "{kv8_g32:?}");
    let kv8 = measure(affine(8, None, None));
    assert!(kv8.top1_agreement >= 0.98, "{kv8:?}");
    assert!(kv8.mean_kl <= 0.0006, "{kv8:?}");
    let kv4 = measure(affine(4, None, None));
    assert!(kv4.top1_agreement >= 0.79, "{kv4:?}");
    assert!(kv4.mean_kl <= 0.13, "{kv4:?}");
    let turbo = measure(turbo(8, 3));
    assert!(turbo.top1_agreement >= 0.89, "{turbo:?}");
    assert!(turbo.mean_kl <= 0.035, "{turbo:?}");
}

#[test]
fn a_scheme_a_layer_cannot_use_is_an_error_naming_the_layer() {
    let mut e = engine();
    // SmolLM2's head dim is 64: a 128-element group does not divide it.
    let err = e
        .set_kv_scheme(affine(4, Some(128), None))
        .expect_err("group 128 on head dim 64");
    let msg = err.to_string();
    assert!(msg.contains("layer 0"), "{msg}");
    assert!(msg.contains("128"), "{msg}");
    // The engine keeps its previous scheme after a refusal.
    assert!(e.logits_all_chunked(&[1, 2, 3], 3).is_ok());
}
