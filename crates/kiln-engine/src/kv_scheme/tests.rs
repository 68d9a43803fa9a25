//! One test per row of the seed's tables (spec §6.1 resolution and cache keys, §6.2 the file,
//! §6.3 batchable, §6.4 memory); each names its row.

use kiln_model::config::{Activation, Architecture, LayerAttention, ModelConfig, RopeConfig};

use kiln_model::backend::cpu::memory::{RUNTIME_OVERHEAD_BYTES, forward_transient_bytes};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};

use super::memory::{
    FitParams, KvGeometry, affine_bytes_per_token, fit, load_peak_bytes, parse_cgroup_limit,
    parse_mem_available,
};
use super::*;

fn cpu() -> CpuBackend {
    CpuBackend::new(CpuOptions::default())
}

fn uniform(bits: u8, group: Option<usize>, start: Option<usize>) -> KvScheme {
    KvScheme {
        kind: KvSchemeKind::AffineUniform,
        options: KvSchemeOptions {
            kv_bits: Some(bits),
            kv_group_size: group,
            quantized_kv_start: start,
            ..KvSchemeOptions::default()
        },
    }
}

fn config_scheme(entries: &[KvQuantSpec], start: Option<usize>) -> KvScheme {
    KvScheme {
        kind: KvSchemeKind::AffineConfig,
        options: KvSchemeOptions {
            kv_config: Some(entries.to_vec()),
            quantized_kv_start: start,
            ..KvSchemeOptions::default()
        },
    }
}

fn turbo(k: u8, v: u8, start: Option<usize>) -> KvScheme {
    KvScheme {
        kind: KvSchemeKind::Turbo,
        options: KvSchemeOptions {
            turbo: Some(TurboQuant {
                k_bits: k,
                v_bits: v,
            }),
            quantized_kv_start: start,
            ..KvSchemeOptions::default()
        },
    }
}

fn spec(layer_idx: usize, bits: u8) -> KvQuantSpec {
    KvQuantSpec {
        layer_idx,
        bits,
        group_size: 64,
    }
}

fn req() -> KvSchemeRequest<'static> {
    KvSchemeRequest::default()
}

// ---- §6.1 resolveKvScheme --------------------------------------------------------------------

#[test]
fn resolve_row_start_must_be_nonnegative_integer() {
    for bad in [-1, i64::MIN, 1 << 53] {
        let r = KvSchemeRequest {
            quantized_kv_start: Some(bad),
            kv_quant: Some(KvQuantOverride::Bits(8)),
            ..req()
        };
        let e = resolve_kv_scheme(&r).unwrap_err();
        assert_eq!(e, KvSchemeError::BadStart(bad));
        assert!(
            e.to_string()
                .starts_with("quantized_kv_start must be a nonnegative integer")
        );
    }
    // The check runs before every branch, dense included (the seed throws first).
    let r = KvSchemeRequest {
        quantized_kv_start: Some(-5),
        ..req()
    };
    assert!(resolve_kv_scheme(&r).is_err());
}

#[test]
fn resolve_row_turbo_given_wins_with_start_or_zero() {
    let t = TurboQuant {
        k_bits: 8,
        v_bits: 3,
    };
    let r = KvSchemeRequest {
        turbo: Some(t),
        kv_quant: Some(KvQuantOverride::Off),
        ..req()
    };
    let s = resolve_kv_scheme(&r).unwrap();
    assert_eq!(s.kind, KvSchemeKind::Turbo);
    assert_eq!(s.options.quantized_kv_start, Some(0));
    assert_eq!(s.cache_key(), "turbo-k8v3");
    let r = KvSchemeRequest {
        turbo: Some(t),
        quantized_kv_start: Some(100),
        ..req()
    };
    assert_eq!(
        resolve_kv_scheme(&r).unwrap().cache_key(),
        "turbo-k8v3-start100"
    );
}

#[test]
fn resolve_row_off_or_unset_is_dense() {
    for kv_quant in [None, Some(KvQuantOverride::Off)] {
        let s = resolve_kv_scheme(&KvSchemeRequest { kv_quant, ..req() }).unwrap();
        // f16 unless asked otherwise, as llama.cpp and Ollama.
        assert_eq!(s, KvScheme::dense(DenseDtype::F16));
    }
    let s = resolve_kv_scheme(&KvSchemeRequest {
        dense: DenseDtype::Bf16,
        ..req()
    })
    .unwrap();
    assert_eq!(s.cache_key(), "bf16");
}

#[test]
fn resolve_row_config_missing_errors_or_falls_back_to_dense() {
    for config in [None, Some(&[][..])] {
        let r = KvSchemeRequest {
            kv_quant: Some(KvQuantOverride::Config),
            config,
            missing_config: MissingConfig::Error,
            ..req()
        };
        let e = resolve_kv_scheme(&r).unwrap_err();
        assert_eq!(
            e.to_string(),
            "model has no kv_config.json (--kv-quant config)"
        );
        let r = KvSchemeRequest {
            missing_config: MissingConfig::Dense,
            ..r
        };
        assert_eq!(resolve_kv_scheme(&r).unwrap().kind, KvSchemeKind::Dense);
    }
}

#[test]
fn resolve_row_config_start_only_if_given() {
    let entries = [spec(0, 8), spec(5, 4)];
    let r = KvSchemeRequest {
        kv_quant: Some(KvQuantOverride::Config),
        config: Some(&entries),
        ..req()
    };
    let s = resolve_kv_scheme(&r).unwrap();
    assert_eq!(s.kind, KvSchemeKind::AffineConfig);
    assert_eq!(s.options.quantized_kv_start, None);
    assert_eq!(s.cache_key(), "config");
    let r = KvSchemeRequest {
        quantized_kv_start: Some(100),
        ..r
    };
    let s = resolve_kv_scheme(&r).unwrap();
    assert_eq!(s.options.quantized_kv_start, Some(100));
    assert_eq!(s.cache_key(), "config-start100");
}

#[test]
fn resolve_row_bits_is_uniform_with_start_or_zero() {
    // The flag path (`--kv-quant 4|8`) starts at 0, not mlx-lm's 5000.
    let r = KvSchemeRequest {
        kv_quant: Some(KvQuantOverride::Bits(4)),
        ..req()
    };
    let s = resolve_kv_scheme(&r).unwrap();
    assert_eq!(s.kind, KvSchemeKind::AffineUniform);
    assert_eq!(s.options.quantized_kv_start, Some(0));
    assert_eq!(s.effective_start(), 0);
    assert_eq!(s.cache_key(), "kv4");
    let r = KvSchemeRequest {
        kv_quant: Some(KvQuantOverride::Bits(8)),
        quantized_kv_start: Some(5000),
        ..req()
    };
    assert_eq!(resolve_kv_scheme(&r).unwrap().cache_key(), "kv8-start5000");
}

#[test]
fn resolve_validation_bits_group_and_turbo_widths() {
    for bits in [0, 1, 2, 3, 5, 6, 16] {
        let r = KvSchemeRequest {
            kv_quant: Some(KvQuantOverride::Bits(bits)),
            ..req()
        };
        assert_eq!(
            resolve_kv_scheme(&r).unwrap_err(),
            KvSchemeError::BadBits(bits)
        );
    }
    for g in [0, 16, 48, 256] {
        let r = KvSchemeRequest {
            kv_quant: Some(KvQuantOverride::Bits(4)),
            kv_group_size: Some(g),
            ..req()
        };
        assert_eq!(
            resolve_kv_scheme(&r).unwrap_err(),
            KvSchemeError::BadGroupSize(g)
        );
    }
    let r = KvSchemeRequest {
        kv_quant: Some(KvQuantOverride::Bits(4)),
        kv_group_size: Some(32),
        ..req()
    };
    assert_eq!(resolve_kv_scheme(&r).unwrap().cache_key(), "kv4-g32");
    let r = KvSchemeRequest {
        turbo: Some(TurboQuant {
            k_bits: 8,
            v_bits: 7,
        }),
        ..req()
    };
    assert_eq!(
        resolve_kv_scheme(&r).unwrap_err(),
        KvSchemeError::BadTurboBits {
            which: "v",
            bits: 7
        }
    );
    // A group size for a scheme that has none is refused, not ignored.
    for kv_quant in [
        None,
        Some(KvQuantOverride::Off),
        Some(KvQuantOverride::Config),
    ] {
        let r = KvSchemeRequest {
            kv_quant,
            kv_group_size: Some(64),
            ..req()
        };
        assert!(matches!(
            resolve_kv_scheme(&r),
            Err(KvSchemeError::Unused { .. })
        ));
    }
}

// ---- §6.1 cacheKey (0.4.0) and label -----------------------------------------------------

#[test]
fn cache_key_rows() {
    // bf16 row: `bf16`; kiln's f32 store keys as `f32`.
    assert_eq!(KvScheme::dense(DenseDtype::Bf16).cache_key(), "bf16");
    assert_eq!(KvScheme::dense(DenseDtype::F32).cache_key(), "f32");
    assert_eq!(KvScheme::dense(DenseDtype::F16).cache_key(), "f16");
    // affine-uniform row: `kv{bits}[-g{group} if ≠64][-start{N} if N>0]`, N = start ?? 5000.
    assert_eq!(uniform(8, None, None).cache_key(), "kv8-start5000");
    assert_eq!(uniform(8, None, Some(0)).cache_key(), "kv8");
    assert_eq!(uniform(4, None, Some(0)).cache_key(), "kv4");
    assert_eq!(uniform(4, Some(32), Some(0)).cache_key(), "kv4-g32");
    assert_eq!(uniform(4, Some(32), None).cache_key(), "kv4-g32-start5000");
    assert_eq!(uniform(4, Some(64), Some(7)).cache_key(), "kv4-start7");
    assert_eq!(
        uniform(8, Some(128), Some(1)).cache_key(),
        "kv8-g128-start1"
    );
    // affine-config row: `config[-start{N}]`, N = start ?? 0.
    assert_eq!(config_scheme(&[spec(0, 8)], None).cache_key(), "config");
    assert_eq!(config_scheme(&[spec(0, 8)], Some(0)).cache_key(), "config");
    assert_eq!(
        config_scheme(&[spec(0, 8)], Some(100)).cache_key(),
        "config-start100"
    );
    // turbo row: `turbo-k{K}v{V}[-start{N}]`, N = start ?? 0.
    assert_eq!(turbo(8, 3, None).cache_key(), "turbo-k8v3");
    assert_eq!(turbo(4, 4, Some(0)).cache_key(), "turbo-k4v4");
    assert_eq!(turbo(8, 3, Some(256)).cache_key(), "turbo-k8v3-start256");
}

#[test]
fn label_rows() {
    assert_eq!(KvScheme::dense(DenseDtype::Bf16).label(), "bf16");
    assert_eq!(KvScheme::dense(DenseDtype::F32).label(), "f32");
    assert_eq!(uniform(8, None, None).label(), "uniform-kv8");
    assert_eq!(uniform(4, Some(32), Some(0)).label(), "uniform-kv4");
    assert_eq!(
        config_scheme(&[spec(0, 8)], None).label(),
        "mixed (kv_config.json)"
    );
    assert_eq!(turbo(8, 3, Some(9)).label(), "turbo k8v3");
}

#[test]
fn effective_start_defaults() {
    // §6.3: start = quantizedKvStart ?? (uniform ? 5000 : 0).
    assert_eq!(uniform(8, None, None).effective_start(), 5000);
    assert_eq!(config_scheme(&[spec(0, 8)], None).effective_start(), 0);
    assert_eq!(turbo(8, 3, None).effective_start(), 0);
    assert_eq!(KvScheme::dense(DenseDtype::F32).effective_start(), 0);
}

// ---- §6.2 kv_config.json -----------------------------------------------------------------

#[test]
fn kv_config_parses_list_with_default_group() {
    let text = r#"[{"layer_idx": 0, "bits": 8, "group_size": 64},
                   {"layer_idx": 5, "bits": 4},
                   {"layer_idx": 7, "bits": 4, "group_size": 32}]"#;
    let v = parse_kv_config("m/kv_config.json", text, 30).unwrap();
    assert_eq!(
        v,
        vec![
            spec(0, 8),
            spec(5, 4),
            KvQuantSpec {
                layer_idx: 7,
                bits: 4,
                group_size: 32
            }
        ]
    );
}

#[test]
fn kv_config_errors_name_the_file_and_entry() {
    let cases = [
        ("{}", "expected a JSON list"),
        ("[", "not JSON"),
        ("[1]", "entry 0: expected an object"),
        (r#"[{"bits": 8}]"#, "entry 0: layer_idx is missing"),
        (r#"[{"layer_idx": 0}]"#, "entry 0: bits is missing"),
        (
            r#"[{"layer_idx": 0, "bits": 8}, {"layer_idx": 30, "bits": 8}]"#,
            "entry 1: layer_idx 30 is out of range (the model has 30 layers)",
        ),
        (
            r#"[{"layer_idx": -1, "bits": 8}]"#,
            "entry 0: layer_idx must be a nonnegative integer",
        ),
        (
            r#"[{"layer_idx": 1, "bits": 3}]"#,
            "entry 0: bits must be 4 or 8",
        ),
        (
            r#"[{"layer_idx": 1, "bits": 4, "group_size": 100}]"#,
            "entry 0: group_size must be 32, 64 or 128",
        ),
        (
            r#"[{"layer_idx": 1, "bits": 4}, {"layer_idx": 1, "bits": 8}]"#,
            "entry 1: layer_idx 1 is listed twice",
        ),
    ];
    for (text, want) in cases {
        let e = parse_kv_config("m/kv_config.json", text, 30).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("m/kv_config.json: "), "{msg}");
        assert!(msg.contains(want), "{text}: {msg}");
    }
}

#[test]
fn kv_config_file_absent_is_none() {
    let dir = std::env::temp_dir().join(format!("kiln-kvcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(load_kv_config(&dir, 4).unwrap(), None);
    std::fs::write(dir.join(KV_CONFIG_FILE), r#"[{"layer_idx": 3, "bits": 8}]"#).unwrap();
    assert_eq!(load_kv_config(&dir, 4).unwrap(), Some(vec![spec(3, 8)]));
    assert!(
        load_kv_config(&dir, 3).is_err(),
        "layer 3 of a 3-layer model"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- §6.3 batchable ----------------------------------------------------------------------

fn shape(types: &[KvLayerKind]) -> KvModelShape {
    KvModelShape {
        num_hidden_layers: types.len(),
        layer_types: types.to_vec(),
    }
}

const ALL: BatchCapabilities = BatchCapabilities {
    delayed_affine: true,
};
const NONE: BatchCapabilities = BatchCapabilities {
    delayed_affine: false,
};

#[test]
fn batchable_row_dense_always() {
    let s = shape(&[KvLayerKind::Full; 4]);
    let d = KvScheme::dense(DenseDtype::Bf16);
    assert!(d.batchable(&s, None, 4, NONE));
    assert!(d.batchable(&s, Some(&|_| false), 4, NONE));
}

#[test]
fn batchable_row_quantized_without_probe_is_false() {
    let s = shape(&[KvLayerKind::Full; 4]);
    for scheme in [
        uniform(8, None, Some(0)),
        config_scheme(&[spec(0, 8)], None),
        turbo(8, 3, None),
    ] {
        assert!(
            !scheme.batchable(&s, None, 4, ALL),
            "{}",
            scheme.cache_key()
        );
        assert!(scheme.batchable(&s, Some(&|_| true), 4, ALL));
    }
}

#[test]
fn batchable_row_delayed_affine_needs_capability_turbo_exempt() {
    let s = shape(&[KvLayerKind::Full; 4]);
    let yes: &dyn Fn(usize) -> bool = &|_| true;
    // Uniform with no start: the 5000 default is a delayed start.
    assert!(!uniform(8, None, None).batchable(&s, Some(yes), 4, NONE));
    assert!(uniform(8, None, None).batchable(&s, Some(yes), 4, ALL));
    assert!(uniform(8, None, Some(0)).batchable(&s, Some(yes), 4, NONE));
    assert!(!config_scheme(&[spec(0, 8)], Some(100)).batchable(&s, Some(yes), 4, NONE));
    assert!(config_scheme(&[spec(0, 8)], Some(100)).batchable(&s, Some(yes), 4, ALL));
    assert!(config_scheme(&[spec(0, 8)], None).batchable(&s, Some(yes), 4, NONE));
    assert!(turbo(8, 3, Some(100)).batchable(&s, Some(yes), 4, NONE));
}

#[test]
fn batchable_row_uniform_and_turbo_probe_every_non_linear_cache_layer() {
    use KvLayerKind::*;
    let s = shape(&[Full, Linear, Sliding, Full]);
    let not_linear_one: &dyn Fn(usize) -> bool = &|l| l != 1;
    let not_three: &dyn Fn(usize) -> bool = &|l| l != 3;
    for scheme in [uniform(4, None, Some(0)), turbo(8, 3, None)] {
        // Linear layer 1 is skipped, so a probe refusing it does not matter.
        assert!(scheme.batchable(&s, Some(not_linear_one), 4, NONE));
        assert!(!scheme.batchable(&s, Some(not_three), 4, NONE));
        // Only the real cache list (3 layers: a donor-shared tail) is probed.
        assert!(scheme.batchable(&s, Some(not_three), 3, NONE));
        // Layers past the end of layer_types count as full attention and are probed.
        assert!(!scheme.batchable(&s, Some(&|l| l < 4), 5, NONE));
    }
}

#[test]
fn batchable_row_config_entries_in_range_not_linear_and_convertible() {
    use KvLayerKind::*;
    let s = shape(&[Full, Linear, Full]);
    let yes: &dyn Fn(usize) -> bool = &|_| true;
    assert!(config_scheme(&[spec(0, 8), spec(2, 4)], None).batchable(&s, Some(yes), 3, NONE));
    // Out of range (≥ num_hidden_layers) refused.
    assert!(!config_scheme(&[spec(3, 8)], None).batchable(&s, Some(yes), 3, NONE));
    // A linear-attention layer listed is refused.
    assert!(!config_scheme(&[spec(1, 8)], None).batchable(&s, Some(yes), 3, NONE));
    // The probe decides for listed layers only.
    assert!(!config_scheme(&[spec(2, 8)], None).batchable(&s, Some(&|l| l != 2), 3, NONE));
    assert!(config_scheme(&[spec(0, 8)], None).batchable(&s, Some(&|l| l != 2), 3, NONE));
}

// ---- a scheme that cannot apply to a layer names it -----------------------------------------

#[test]
fn check_model_names_the_layer() {
    let s = shape(&[KvLayerKind::Full; 3]);
    assert!(turbo(8, 3, None).check_model(&s, 64).is_ok());
    let e = turbo(8, 3, None).check_model(&s, 80).unwrap_err();
    assert!(matches!(e, KvSchemeError::Layer { layer: 0, .. }), "{e}");
    assert!(e.to_string().contains("head dims 64, 128, 256 and 512"));
    let e = uniform(4, Some(128), Some(0))
        .check_model(&s, 64)
        .unwrap_err();
    assert!(e.to_string().starts_with("layer 0: head dim 64"), "{e}");
    // Config: only listed layers are checked; an unlisted bad layer stays dense.
    let e = config_scheme(&[spec(2, 8)], None)
        .check_model(&s, 48)
        .unwrap_err();
    assert!(matches!(e, KvSchemeError::Layer { layer: 2, .. }), "{e}");
    let e = config_scheme(&[spec(5, 8)], None)
        .check_model(&s, 64)
        .unwrap_err();
    assert!(matches!(e, KvSchemeError::Layer { layer: 5, .. }), "{e}");
}

// ---- §6.4 memory ---------------------------------------------------------------------------

/// SmolLM2-135M's shape.
fn smollm2() -> ModelConfig {
    ModelConfig {
        arch: Architecture::Llama,
        vocab_size: 49152,
        hidden_size: 576,
        intermediate_size: 1536,
        num_layers: 30,
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        rms_norm_eps: 1e-5,
        layer_attention: vec![LayerAttention::Full; 30],
        rope_global: RopeConfig::plain(100000.0),
        rope_local: RopeConfig::plain(100000.0),
        max_position_embeddings: 8192,
        tie_word_embeddings: true,
        activation: Activation::Silu,
        attention_scale: 0.125,
        attention_bias: false,
        qk_norm: false,
        norm_weight_offset: 0.0,
        embedding_scale: None,
        position_offset: 0,
        bidirectional: false,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
    }
}

#[test]
fn affine_bytes_follow_bits_over_8_plus_4_over_group() {
    // kv4 g64, head dim 64, 3 KV heads: 2·3·64 elements × (0.5 + 4/64) = 216 bytes.
    assert_eq!(affine_bytes_per_token(3, 64, 4, 64), 216);
    // kv8 g64: 384 × (1 + 1/16) = 408.
    assert_eq!(affine_bytes_per_token(3, 64, 8, 64), 408);
    // kv4 g32: 384 × (0.5 + 0.125) = 240.
    assert_eq!(affine_bytes_per_token(3, 64, 4, 32), 240);
}

#[test]
fn kv_bytes_per_token_per_scheme_on_smollm2() {
    let cfg = smollm2();
    let per = |s: &KvScheme| KvGeometry::new(&cfg, s, false).bytes_per_token();
    // Dense f32: 30 layers × 2 × 192 × 4.
    assert_eq!(per(&KvScheme::dense(DenseDtype::F32)), 30 * 2 * 192 * 4);
    assert_eq!(per(&KvScheme::dense(DenseDtype::Bf16)), 30 * 2 * 192 * 2);
    // The default, f16: 23,040 bytes a token.
    assert_eq!(per(&KvScheme::dense(DenseDtype::default())), 23_040);
    assert_eq!(per(&uniform(4, None, Some(0))), 30 * 216);
    assert_eq!(per(&uniform(8, None, Some(0))), 30 * 408);
    // Turbo at what kiln's store holds: per KV head 64 + 24 index bytes and two f16 norms.
    assert_eq!(per(&turbo(8, 3, None)), 30 * 3 * (64 + 2 + 24 + 2));
    assert_eq!(per(&turbo(4, 2, None)), 30 * 3 * (32 + 2 + 16 + 2));
    // Config: listed layers affine, the rest dense (f16 by default).
    assert_eq!(
        per(&config_scheme(&[spec(0, 8), spec(1, 4)], None)),
        408 + 216 + 28 * 768
    );
}

#[test]
fn sliding_layers_capped_at_window_when_the_store_caps() {
    let mut cfg = smollm2();
    cfg.layer_attention[0] = LayerAttention::Sliding { window: 100 };
    let s = KvScheme::dense(DenseDtype::Bf16);
    let capped = KvGeometry::new(&cfg, &s, true);
    let uncapped = KvGeometry::new(&cfg, &s, false);
    let per_layer = 2 * 192 * 2;
    assert_eq!(capped.bytes_at(1000, false), per_layer * (29 * 1000 + 100));
    assert_eq!(uncapped.bytes_at(1000, false), per_layer * 30 * 1000);
    assert_eq!(capped.bytes_at(50, false), per_layer * 30 * 50);
}

#[test]
fn peak_kv_bills_the_dense_prefix_and_one_converted_layer() {
    let cfg = smollm2();
    // The default dense storage, f16.
    let dense_per = 30 * 768u64;
    // Before the start everything is dense.
    let g = KvGeometry::new(&cfg, &uniform(4, None, Some(1000)), false);
    assert_eq!(g.peak_bytes_at(999, 512), 999 * dense_per);
    // After: the larger of the converted cache and the conversion moment (dense up to
    // start + chunk, plus one converted layer).
    assert_eq!(
        g.peak_bytes_at(4000, 512),
        (30 * 216 * 4000u64).max(1512 * dense_per + 216 * 1512)
    );
    // Start 0: the first chunk is dense (empty caches are never converted).
    let g = KvGeometry::new(&cfg, &uniform(4, None, Some(0)), false);
    assert_eq!(g.peak_bytes_at(300, 512), 300 * dense_per + 216 * 300);
    // Dense: plain.
    let g = KvGeometry::new(&cfg, &KvScheme::dense(DenseDtype::F16), false);
    assert_eq!(g.peak_bytes_at(4000, 512), 4000 * dense_per);
}

#[test]
fn transient_is_the_chunk_activations_by_hand() {
    let cfg = smollm2();
    let c = 512u64;
    // 5·576 + 2·576 + 2·192 + 3·1536 = 9024 floats per token.
    let layer = c * 9024 * 4 + c * 24 + 49152 * 4;
    let scratch = (c * 1536 * 2292).div_ceil(256);
    // Two workers, each with a score row per query vector of a block (16 rows × 9/3 heads)
    // over 4096 + 16 keys, two 64×64 tiles, the block's queries and outputs, and its sums.
    let scores = 2 * (48 * (4096 + 16) + 2 * 64 * 64 + 2 * 48 * 64 + 48) * 4;
    assert_eq!(
        forward_transient_bytes(&cfg, 512, 4096, 2),
        scratch + scores + layer
    );
    // A shorter context shrinks the chunk.
    assert!(
        forward_transient_bytes(&cfg, 512, 10, 2) < forward_transient_bytes(&cfg, 512, 4096, 2)
    );
}

#[test]
fn fit_adds_up_and_finds_the_largest_safe_context() {
    let cfg = smollm2();
    let w = 100_000_000;
    let scheme = KvScheme::dense(DenseDtype::F32);
    let kv_per = 30 * 1536u64;
    let total_at = |t: usize| {
        w + RUNTIME_OVERHEAD_BYTES + kv_per * t as u64 + forward_transient_bytes(&cfg, 512, t, 2)
    };
    let budget = total_at(3000);
    let r = fit(
        &cpu(),
        &cfg,
        &scheme,
        FitParams {
            weight_bytes: w,
            largest_tensor_bytes: w / 8,
            ctx: 2048,
            chunk: 512,
            threads: 2,
            budget_bytes: budget,
        },
    );
    assert_eq!(r.total_bytes, total_at(2048));
    assert_eq!(r.kv_bytes, kv_per * 2048);
    assert!(r.fits);
    assert_eq!(r.max_safe_context, 3000);
    assert_eq!(
        r.load_peak_bytes,
        load_peak_bytes(w, w / 8, RUNTIME_OVERHEAD_BYTES)
    );
    // Too small for the load peak: nothing fits.
    let r = fit(
        &cpu(),
        &cfg,
        &scheme,
        FitParams {
            weight_bytes: w,
            largest_tensor_bytes: w / 8,
            ctx: 1,
            chunk: 512,
            threads: 2,
            budget_bytes: w + w / 8,
        },
    );
    assert!(!r.fits);
    assert_eq!(r.max_safe_context, 0);
    // Clamped to the trained context.
    let r = fit(
        &cpu(),
        &cfg,
        &scheme,
        FitParams {
            weight_bytes: w,
            largest_tensor_bytes: w / 8,
            ctx: 1,
            chunk: 512,
            threads: 2,
            budget_bytes: u64::MAX / 4,
        },
    );
    assert_eq!(r.max_safe_context, 8192);
}

#[test]
fn budget_sources_parse() {
    assert_eq!(parse_cgroup_limit("max\n"), None);
    assert_eq!(parse_cgroup_limit("1073741824\n"), Some(1 << 30));
    assert_eq!(parse_cgroup_limit("9223372036854771712"), None);
    let meminfo = "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n";
    assert_eq!(parse_mem_available(meminfo), Some(8_000_000 * 1024));
    assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
}
