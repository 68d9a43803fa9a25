//! The affine quantizer against MLX's own output (`tests/data/mlx_affine_golden.safetensors`,
//! written by `scripts/mlx_affine_golden.py`), and the config block parser.

use std::path::Path;

use half::bf16;
use safetensors::{Dtype, SafeTensors};
use serde_json::json;

use super::*;
use crate::ModelError;

fn golden_bytes() -> Vec<u8> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mlx_affine_golden.safetensors");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn bf16s(st: &SafeTensors<'_>, name: &str) -> Vec<bf16> {
    let t = st.tensor(name).expect(name);
    assert_eq!(t.dtype(), Dtype::BF16, "{name}");
    let raw = t.data().chunks_exact(2);
    raw.map(|c| bf16::from_le_bytes([c[0], c[1]])).collect()
}

fn u32s(st: &SafeTensors<'_>, name: &str) -> (Vec<usize>, Vec<u32>) {
    let t = st.tensor(name).expect(name);
    assert_eq!(t.dtype(), Dtype::U32, "{name}");
    let raw = t.data().chunks_exact(4);
    let words = raw.map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    (t.shape().to_vec(), words.collect())
}

/// The spacing of bf16 values around `x`.
fn bf16_ulp(x: f32) -> f32 {
    let exp = ((x.abs().to_bits() >> 23) & 0xff) as i32;
    f32::from_bits((exp.max(8) - 7).max(1) as u32 * (1 << 23))
}

/// Bit-identical codes, scales and biases for every width and group size MLX offers;
/// `affine_dequantize_bf16` identical to `mx.dequantize`; `affine_dequantize` (plain f32) within
/// the double rounding MLX's bf16 arithmetic adds (½ ulp of `q·scale` plus ½ ulp of the result).
#[test]
fn quantize_matches_mlx_bit_for_bit() {
    let bytes = golden_bytes();
    let st = SafeTensors::deserialize(&bytes).expect("golden file");
    let (_, meta) = SafeTensors::read_metadata(&bytes).expect("header");
    let version = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("mlx_version").cloned())
        .unwrap_or_default();
    let input: Vec<f32> = bf16s(&st, "input").iter().map(|v| v.to_f32()).collect();
    let (rows, cols) = (8, 256);
    assert_eq!(input.len(), rows * cols);
    let mut checked = 0;
    for bits in SUPPORTED_BITS {
        for group in SUPPORTED_GROUP_SIZES {
            let key = format!("b{bits}_g{group}");
            let ctx = format!("{key} (mlx {version})");
            let m = affine_quantize(&input, rows, cols, bits, group).expect(&key);
            let (shape, words) = u32s(&st, &format!("{key}.weight"));
            assert_eq!(shape, vec![rows, m.packed_cols()], "{ctx}");
            assert_eq!(m.packed, words, "{ctx}: packed words");
            assert_eq!(
                m.scales,
                bf16s(&st, &format!("{key}.scales")),
                "{ctx}: scales"
            );
            assert_eq!(
                m.biases,
                bf16s(&st, &format!("{key}.biases")),
                "{ctx}: biases"
            );

            let want = bf16s(&st, &format!("{key}.dequantized"));
            let got = affine_dequantize_bf16(&m);
            assert!(got == want, "{ctx}: bf16 dequantization differs from MLX");
            let exact = affine_dequantize(&m);
            let codes = m.codes();
            for (i, (&e, w)) in exact.iter().zip(&want).enumerate() {
                let w = w.to_f32();
                let prod = f32::from(codes[i]) * m.scales[i / group].to_f32();
                let bound = 0.5 * bf16_ulp(bf16::from_f32(prod).to_f32()) + 0.5 * bf16_ulp(w);
                assert!(
                    (e - w).abs() <= bound,
                    "{ctx}: element {i}: f32 {e} vs MLX {w}, bound {bound}"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 18);
}

#[test]
fn codes_round_trip_through_every_packing() {
    for bits in SUPPORTED_BITS {
        let cols = 128;
        let w: Vec<f32> = (0..2 * cols)
            .map(|i| ((i * 37) % 101) as f32 - 50.0)
            .collect();
        let m = affine_quantize(&w, 2, cols, bits, 32).expect("quantize");
        assert_eq!(m.packed.len(), 2 * cols * bits as usize / 32);
        let codes = m.codes();
        let max = (1u32 << bits) - 1;
        assert!(codes.iter().all(|&q| u32::from(q) <= max), "{bits}");
        // Repacking the unpacked codes gives the same words.
        let mut again = vec![0u32; m.packed.len()];
        for (src, dst) in codes.chunks(cols).zip(again.chunks_mut(m.packed_cols())) {
            super::affine::pack_row(src, bits, dst);
        }
        assert_eq!(again, m.packed, "{bits}");
    }
}

#[test]
fn the_larger_magnitude_extreme_is_exact() {
    // max dominates: the scale is negative and the bias is the max itself.
    let mut w = vec![0.01f32; 32];
    w[3] = 0.8;
    w[9] = -0.1;
    let m = affine_quantize(&w, 1, 32, 4, 32).expect("quantize");
    assert!(m.scales[0].to_f32() < 0.0);
    assert_eq!(m.biases[0].to_f32(), bf16::from_f32(0.8).to_f32());
    // min dominates: positive scale, bias = min.
    let neg: Vec<f32> = w.iter().map(|x| -x).collect();
    let m = affine_quantize(&neg, 1, 32, 4, 32).expect("quantize");
    assert!(m.scales[0].to_f32() > 0.0);
    assert_eq!(m.biases[0].to_f32(), bf16::from_f32(-0.8).to_f32());
    // An all-zero group: the scale falls to -1e-7 and the bias is 0.
    let m = affine_quantize(&[0.0; 32], 1, 32, 4, 32).expect("quantize");
    assert_eq!(m.scales[0], bf16::from_f32(-1e-7));
    assert_eq!(m.biases[0].to_f32(), 0.0);
    assert!(affine_dequantize(&m).iter().all(|&v| v == 0.0));
}

#[test]
fn bad_quantize_arguments_are_errors() {
    let w = vec![0.5f32; 64];
    for (bits, group, rows, cols) in [
        (7, 32, 1, 64),
        (4, 16, 1, 64),
        (4, 0, 1, 64),
        (4, 64, 2, 64),
    ] {
        let r = affine_quantize(&w, rows, cols, bits, group);
        assert!(
            matches!(r, Err(ModelError::Quantization(_))),
            "{bits} {group}"
        );
    }
    assert!(
        affine_quantize(&w, 1, 48, 4, 32).is_err(),
        "width not a group multiple"
    );
    let mut nan = w.clone();
    nan[5] = f32::NAN;
    let e = affine_quantize(&nan, 1, 64, 4, 32).expect_err("NaN");
    assert!(e.to_string().contains("column 5"), "{e}");
}

#[test]
fn inconsistent_matrices_dequantize_to_nothing_without_panicking() {
    let mut m = affine_quantize(&[1.0; 64], 1, 64, 4, 32).expect("quantize");
    m.group_size = 0;
    assert!(affine_dequantize(&m).is_empty());
    assert!(affine_dequantize_bf16(&m).is_empty());
    m.group_size = 32;
    m.packed.pop();
    assert!(affine_dequantize(&m).is_empty());
}

#[test]
fn writer_tensors_have_mlx_names_and_shapes() {
    let m = affine_quantize(&[0.25; 2 * 96], 2, 96, 3, 32).expect("quantize");
    let t = affine_tensors("model.layers.0.mlp.up_proj", &m);
    let names: Vec<_> = t
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.len()))
        .collect();
    assert_eq!(
        names,
        vec![
            (
                "model.layers.0.mlp.up_proj.weight",
                Dtype::U32,
                vec![2, 9],
                72
            ),
            (
                "model.layers.0.mlp.up_proj.scales",
                Dtype::BF16,
                vec![2, 3],
                12
            ),
            (
                "model.layers.0.mlp.up_proj.biases",
                Dtype::BF16,
                vec![2, 3],
                12
            ),
        ]
    );
}

// ---- config.json's quantization block ----

fn parse(v: serde_json::Value) -> Result<Option<MlxQuantization>, ModelError> {
    MlxQuantization::from_config(Path::new("config.json"), &v)
}

fn field_of(e: ModelError) -> String {
    match e {
        ModelError::Config { field, .. } => field,
        other => panic!("not a config error: {other}"),
    }
}

#[test]
fn parses_the_spec_example() {
    let q = parse(
        json!({"quantization": {"group_size": 64, "bits": 4, "mode": "affine",
        "model.layers.0.self_attn.q_proj": {"bits": 8, "group_size": 64},
        "model.layers.3.mlp.down_proj": {"bits": 4, "group_size": 32},
        "some.module": false}}),
    )
    .expect("parse")
    .expect("quantized");
    let s = |bits, group_size| Some(AffineSpec { bits, group_size });
    assert_eq!(q.default, s(4, 64));
    assert_eq!(q.spec_for("model.layers.0.self_attn.q_proj"), s(8, 64));
    assert_eq!(q.spec_for("model.layers.3.mlp.down_proj"), s(4, 32));
    assert_eq!(q.spec_for("some.module"), None);
    assert_eq!(q.spec_for("model.layers.1.mlp.up_proj"), s(4, 64));
    // to_json writes a block that parses back to the same thing.
    let again = parse(json!({"quantization": q.to_json()})).expect("reparse");
    assert_eq!(again.as_ref(), Some(&q));
    assert_eq!(q.to_json()["some.module"], json!(false));
    assert_eq!(q.to_json()["mode"], json!("affine"));
}

#[test]
fn reads_quantization_config_only_when_it_is_mlx() {
    let mlx = json!({"quantization_config": {"group_size": 32, "bits": 8}});
    let q = parse(mlx).expect("parse").expect("quantized");
    assert_eq!(
        q.default,
        Some(AffineSpec {
            bits: 8,
            group_size: 32
        })
    );
    // `quantization` wins over a differing copy.
    let both = json!({"quantization": {"group_size": 64, "bits": 4},
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}});
    assert_eq!(
        parse(both)
            .expect("parse")
            .expect("q")
            .default
            .map(|s| s.group_size),
        Some(64)
    );
    for hf in [
        json!({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}),
        json!({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}),
        json!({"quantization_config": {"load_in_4bit": true}}),
    ] {
        let e = parse(hf).expect_err("not MLX");
        assert!(e.to_string().contains("quantization_config"), "{e}");
    }
    assert_eq!(parse(json!({"hidden_size": 8})).expect("parse"), None);
    assert_eq!(
        parse(json!({"quantization_config": null})).expect("parse"),
        None
    );
}

#[test]
fn mode_none_true_and_inherited_fields() {
    let q = parse(json!({"quantization": {"mode": "none", "a.b": {"bits": 4, "group_size": 32}}}))
        .expect("parse")
        .expect("block");
    assert_eq!(q.default, None);
    assert_eq!(q.spec_for("a.b").map(|s| s.bits), Some(4));
    assert_eq!(q.spec_for("c"), None);
    let q = parse(json!({"quantization": {"bits": 4, "group_size": 64,
        "x": true, "y": {"bits": 8}, "z": {"mode": "none"}, "note": "ignored"}}))
    .expect("parse")
    .expect("block");
    assert_eq!(q.spec_for("x"), q.default);
    assert_eq!(
        q.spec_for("y"),
        Some(AffineSpec {
            bits: 8,
            group_size: 64
        })
    );
    assert_eq!(q.spec_for("z"), None);
    assert!(!q.per_module.contains_key("note"));
}

#[test]
fn hostile_blocks_name_the_field() {
    let cases = [
        (
            json!({"quantization": {"bits": 7, "group_size": 64}}),
            "quantization.bits",
        ),
        (
            json!({"quantization": {"bits": 4, "group_size": 0}}),
            "quantization.group_size",
        ),
        (
            json!({"quantization": {"bits": "4", "group_size": 64}}),
            "quantization.bits",
        ),
        (
            json!({"quantization": {"bits": 4, "group_size": 64.5}}),
            "quantization.group_size",
        ),
        (
            json!({"quantization": {"bits": -4, "group_size": 64}}),
            "quantization.bits",
        ),
        (
            json!({"quantization": {"bits": 1e30, "group_size": 64}}),
            "quantization.bits",
        ),
        (
            json!({"quantization": {"bits": 4294967300u64, "group_size": 64}}),
            "quantization.bits",
        ),
        (
            json!({"quantization": {"bits": 4}}),
            "quantization.group_size",
        ),
        (
            json!({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}}),
            "quantization.mode",
        ),
        (
            json!({"quantization": {"group_size": 64, "bits": 4, "mode": 3}}),
            "quantization.mode",
        ),
        (
            json!({"quantization": {"group_size": 64, "bits": 4, "m": {"bits": 9}}}),
            "quantization.m.bits",
        ),
        (
            json!({"quantization": {"m": {"group_size": 32}}}),
            "quantization.m.bits",
        ),
        (json!({"quantization": {"m": true}}), "quantization.m"),
        (json!({"quantization": [4, 64]}), "quantization"),
        (
            json!({"quantization": {"quant_method": "gptq", "bits": 4, "group_size": 64}}),
            "quantization.quant_method",
        ),
    ];
    for (config, want) in cases {
        let e = parse(config.clone()).expect_err(&config.to_string());
        assert_eq!(field_of(e), want, "{config}");
    }
}
