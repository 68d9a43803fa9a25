//! Adapter files: kiln's round trip, PEFT- and mlx-made folders, the scale order, and hostile
//! files (each must give an error naming the file, never a panic).

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

use super::*;
use crate::config::config_from_hf_json;

/// Deterministic values that differ per module and per position.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + seed * 13) % 23) as f32 / 23.0 - 0.5)
        .collect()
}

fn weights(in_f: usize, out: usize, rank: usize, scale: f32, seed: usize) -> LoraWeights {
    LoraWeights {
        in_features: in_f,
        out_features: out,
        rank,
        a: values(in_f * rank, seed),
        b: values(rank * out, seed + 1),
        scale,
    }
}

/// q and v in two layers, layer 1's q of rank 8 while the base rank is 4.
fn sample(scale: f32, rs_lora: bool) -> LoraAdapter {
    let s = |r: usize| config::fixed_scale(scale, rs_lora, r);
    let mut modules = BTreeMap::new();
    modules.insert(
        "model.layers.0.self_attn.q_proj".into(),
        weights(8, 8, 4, s(4), 1),
    );
    modules.insert(
        "model.layers.0.self_attn.v_proj".into(),
        weights(8, 4, 4, s(4), 2),
    );
    modules.insert(
        "model.layers.1.self_attn.q_proj".into(),
        weights(8, 8, 8, s(8), 3),
    );
    modules.insert(
        "model.layers.1.self_attn.v_proj".into(),
        weights(8, 4, 4, s(4), 4),
    );
    LoraAdapter {
        modules,
        base_model: Some("HuggingFaceTB/SmolLM2-135M-Instruct".into()),
        info: AdapterInfo {
            rank: 4,
            scale,
            rs_lora,
            method: "sft".into(),
            rank_scaling: "by_bits".into(),
            target_modules: vec!["q_proj".into(), "v_proj".into()],
            num_layers: -1,
            dropout: 0.05,
        },
    }
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("read json");
    serde_json::from_str(&text).expect("parse json")
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec(v).expect("json")).expect("write json");
}

/// (name, dtype, shape, little-endian bytes).
type OwnedTensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// A safetensors file from (name, dtype, shape, little-endian bytes).
fn write_st(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("write safetensors");
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect()
}

/// Copies only PEFT's two files, as PEFT itself would have left a folder.
fn peft_only(from: &Path, to: &Path) {
    for f in [PEFT_WEIGHTS_FILE, ADAPTER_CONFIG_FILE] {
        std::fs::copy(from.join(f), to.join(f)).expect("copy");
    }
}

/// PEFT's scaling of a module from a written adapter_config.json, computed independently of
/// kiln's code: `alpha_pattern[path] ?? lora_alpha` over `rank_pattern[path] ?? r` (or its √).
fn peft_scaling(cfg: &Value, path: &str) -> f32 {
    let r = cfg["rank_pattern"]
        .get(path)
        .unwrap_or(&cfg["r"])
        .as_f64()
        .expect("r");
    let alpha = cfg["alpha_pattern"]
        .get(path)
        .unwrap_or(&cfg["lora_alpha"])
        .as_f64()
        .expect("alpha");
    let div = if cfg["use_rslora"] == json!(true) {
        r.sqrt()
    } else {
        r
    };
    (alpha / div) as f32
}

#[test]
fn save_load_round_trip_with_a_per_module_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    let adapter = sample(2.5, false);
    adapter.save(dir.path()).expect("save");
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ADAPTER_CONFIG_FILE,
            PEFT_WEIGHTS_FILE,
            MLX_WEIGHTS_FILE,
            OPTIQ_CONFIG_FILE
        ],
        "exactly the four files, no temporary left"
    );
    let back = LoraAdapter::load(dir.path()).expect("load");
    assert_eq!(back, adapter);
    assert_eq!(back.max_rank(), 8);
    assert_eq!(
        back.size_bytes(),
        4 * (2 * (32 + 32 + 32 + 16) + 64 + 64 - 32 - 32)
    );

    // PEFT's view of the same folder: its file alone gives the same adapter.
    let peft = tempfile::tempdir().expect("tempdir");
    peft_only(dir.path(), peft.path());
    let from_peft = LoraAdapter::load(peft.path()).expect("load PEFT");
    assert_eq!(from_peft.modules, adapter.modules);
    assert_eq!(from_peft.info.rank, 4);
    assert_eq!(from_peft.info.scale, 2.5);
}

#[test]
fn adapter_config_has_peft_fields_and_patterns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let adapter = sample(2.5, false);
    adapter.save(dir.path()).expect("save");
    let cfg = read_json(&dir.path().join(ADAPTER_CONFIG_FILE));
    assert_eq!(cfg["peft_type"], "LORA");
    assert_eq!(cfg["task_type"], "CAUSAL_LM");
    assert_eq!(cfg["r"], 4);
    assert_eq!(cfg["lora_alpha"], 10);
    assert_eq!(cfg["target_modules"], json!(["q_proj", "v_proj"]));
    assert_eq!(cfg["bias"], "none");
    assert_eq!(cfg["fan_in_fan_out"], false);
    assert_eq!(cfg["inference_mode"], true);
    assert_eq!(cfg["use_rslora"], false);
    assert_eq!(cfg["modules_to_save"], Value::Null);
    assert_eq!(cfg["layers_to_transform"], Value::Null);
    assert_eq!(cfg["lora_dropout"], 0.05);
    let q1 = "model.layers.1.self_attn.q_proj";
    assert_eq!(cfg["rank_pattern"], json!({ q1: 8 }));
    assert_eq!(cfg["alpha_pattern"], json!({ q1: 20 }));
    assert_eq!(cfg["fine_tune_type"], "lora");
    assert_eq!(cfg["num_layers"], -1);
    assert_eq!(
        cfg["lora_parameters"],
        json!({"rank": 4, "scale": 2.5, "dropout": 0.05, "keys": null})
    );
    assert_eq!(cfg["optiq"]["applied_ranks"][q1], 8);
    for (path, w) in &adapter.modules {
        assert_eq!(peft_scaling(&cfg, path), w.scale, "{path}");
    }
    // Not every target in every layer: full paths, so that PEFT adds no module of its own.
    let mut sparse = adapter.clone();
    sparse.modules.remove("model.layers.1.self_attn.v_proj");
    let other = tempfile::tempdir().expect("tempdir");
    sparse.save(other.path()).expect("save");
    let sparse_cfg = read_json(&other.path().join(ADAPTER_CONFIG_FILE));
    assert_eq!(
        sparse_cfg["target_modules"],
        json!(sparse.modules.keys().collect::<Vec<_>>())
    );
    let optiq = read_json(&dir.path().join(OPTIQ_CONFIG_FILE));
    assert_eq!(optiq["lora_parameters"]["scale"], 2.5);
    assert_eq!(optiq["source_model"], "HuggingFaceTB/SmolLM2-135M-Instruct");
    assert_eq!(optiq["applied_ranks"][q1], 8);
}

#[test]
fn rs_lora_round_trip_through_both_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let adapter = sample(8.0, true);
    assert_eq!(
        adapter.modules["model.layers.1.self_attn.q_proj"].scale,
        8.0 / 8f32.sqrt()
    );
    adapter.save(dir.path()).expect("save");
    assert_eq!(LoraAdapter::load(dir.path()).expect("load"), adapter);
    let cfg = read_json(&dir.path().join(ADAPTER_CONFIG_FILE));
    assert_eq!(
        cfg["lora_alpha"], 8,
        "alpha/√r is scale/√r when alpha = scale"
    );
    for (path, w) in &adapter.modules {
        assert_eq!(peft_scaling(&cfg, path), w.scale, "{path}");
    }
    let peft = tempfile::tempdir().expect("tempdir");
    peft_only(dir.path(), peft.path());
    let from_peft = LoraAdapter::load(peft.path()).expect("load PEFT");
    assert_eq!(from_peft.modules, adapter.modules);
    assert!(from_peft.info.rs_lora);
}

#[test]
fn a_per_module_scale_is_kept_by_peft_and_folded_for_mlx() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut adapter = sample(2.0, false);
    let v = "model.layers.0.self_attn.v_proj";
    if let Some(w) = adapter.modules.get_mut(v) {
        w.scale = 0.5;
    }
    adapter.save(dir.path()).expect("save");
    let cfg = read_json(&dir.path().join(ADAPTER_CONFIG_FILE));
    assert_eq!(peft_scaling(&cfg, v), 0.5);

    let mlx = LoraAdapter::load(dir.path()).expect("load");
    let (orig, got) = (&adapter.modules[v], &mlx.modules[v]);
    assert_eq!(got.scale, 2.0, "mlx's file has one scale");
    for (b0, b1) in orig.b.iter().zip(&got.b) {
        assert!((b0 * orig.scale - b1 * got.scale).abs() < 1e-6);
    }
    let peft = tempfile::tempdir().expect("tempdir");
    peft_only(dir.path(), peft.path());
    let from_peft = LoraAdapter::load(peft.path()).expect("load PEFT");
    assert_eq!(from_peft.modules, adapter.modules);
}

/// A PEFT-made folder: A `[r, in]`, B `[out, r]` (B in bf16), scale lora_alpha / r.
#[test]
fn peft_layout_loads_with_transposes_and_alpha_over_r() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (r, in_f, out) = (2, 3, 4);
    let a_file: Vec<f32> = (0..r * in_f).map(|i| i as f32).collect(); // [r, in]
    let b_file: Vec<f32> = (0..out * r).map(|i| i as f32 * 0.5).collect(); // [out, r]
    let key = "base_model.model.model.layers.0.self_attn.q_proj";
    write_st(
        &dir.path().join(PEFT_WEIGHTS_FILE),
        &[
            (
                &format!("{key}.lora_A.weight"),
                Dtype::F32,
                vec![r, in_f],
                f32_bytes(&a_file),
            ),
            (
                &format!("{key}.lora_B.weight"),
                Dtype::BF16,
                vec![out, r],
                bf16_bytes(&b_file),
            ),
        ],
    );
    write_json(
        &dir.path().join(ADAPTER_CONFIG_FILE),
        &json!({"peft_type": "LORA", "r": 2, "lora_alpha": 8, "target_modules": ["q_proj"],
                "base_model_name_or_path": "meta-llama/Llama-3.2-1B"}),
    );
    let adapter = LoraAdapter::load(dir.path()).expect("load");
    let w = &adapter.modules["model.layers.0.self_attn.q_proj"];
    assert_eq!((w.in_features, w.rank, w.out_features), (in_f, r, out));
    for i in 0..in_f {
        for k in 0..r {
            assert_eq!(w.a[i * r + k], a_file[k * in_f + i]);
        }
    }
    for k in 0..r {
        for o in 0..out {
            assert_eq!(w.b[k * out + o], b_file[o * r + k]);
        }
    }
    assert_eq!(w.scale, 4.0);
    assert_eq!(adapter.info.scale, 4.0);
    assert_eq!(adapter.info.rank_scaling, "constant");
    assert_eq!(
        adapter.base_model.as_deref(),
        Some("meta-llama/Llama-3.2-1B")
    );
}

/// An mlx-lm adapter: `model.layers.N….lora_a` `[in, r]`, scale from `lora_parameters`.
fn write_mlx(dir: &Path, a_name: &str, b_name: &str) -> (Vec<f32>, Vec<f32>) {
    let a: Vec<f32> = values(3 * 2, 5);
    let b: Vec<f32> = values(2 * 4, 6);
    write_st(
        &dir.join(MLX_WEIGHTS_FILE),
        &[
            (a_name, Dtype::F32, vec![3, 2], f32_bytes(&a)),
            (b_name, Dtype::F32, vec![2, 4], f32_bytes(&b)),
        ],
    );
    (a, b)
}

#[test]
fn mlx_layout_loads_with_its_scale_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = "model.layers.0.self_attn.q_proj";
    let (a, b) = write_mlx(dir.path(), &format!("{m}.lora_a"), &format!("{m}.lora_b"));
    let config = dir.path().join(ADAPTER_CONFIG_FILE);
    write_json(
        &config,
        &json!({"fine_tune_type": "lora", "num_layers": 16,
                "lora_parameters": {"rank": 2, "scale": 10.0, "dropout": 0.0}}),
    );
    let adapter = LoraAdapter::load(dir.path()).expect("load");
    let w = &adapter.modules[m];
    assert_eq!((&w.a, &w.b, w.scale), (&a, &b, 10.0));
    assert_eq!(adapter.info.num_layers, 16);

    // A lora_parameters block without a scale: mlx-lm's 20.
    write_json(&config, &json!({"lora_parameters": {"rank": 2}}));
    assert_eq!(
        LoraAdapter::load(dir.path()).expect("load").modules[m].scale,
        20.0
    );

    // optiq's file wins, and its rs_lora divides by √r.
    write_json(
        &dir.path().join(OPTIQ_CONFIG_FILE),
        &json!({"rank": 2, "scale": 1.0, "rs_lora": true,
                "lora_parameters": {"scale": 6.0, "rank": 2, "rs_lora": true}}),
    );
    let adapter = LoraAdapter::load(dir.path()).expect("load");
    assert_eq!(adapter.modules[m].scale, 6.0 / 2f32.sqrt());
    assert_eq!(adapter.info.scale, 6.0);
    assert!(adapter.info.rs_lora);
}

#[test]
fn mlx_layout_takes_the_other_spellings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = "model.layers.2.mlp.down_proj";
    write_mlx(
        dir.path(),
        &format!("base_model.model.{m}.lora_A.weight"),
        &format!("{m}.lora_B"),
    );
    write_json(
        &dir.path().join(ADAPTER_CONFIG_FILE),
        &json!({"r": 2, "lora_alpha": 16}),
    );
    let adapter = LoraAdapter::load(dir.path()).expect("load");
    assert_eq!(
        adapter.modules[m].scale, 8.0,
        "no lora_parameters: alpha / r"
    );
    assert_eq!(adapter.info.target_modules, ["down_proj"]);
}

#[test]
fn peft_rank_and_alpha_patterns_apply_per_module() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = "model.layers.0.self_attn.q_proj";
    let v = "model.layers.0.self_attn.v_proj";
    let mut tensors = Vec::new();
    for (m, r) in [(q, 2usize), (v, 4)] {
        let key = format!("base_model.model.{m}");
        tensors.push((format!("{key}.lora_A.weight"), vec![r, 3], values(3 * r, 1)));
        tensors.push((format!("{key}.lora_B.weight"), vec![5, r], values(5 * r, 2)));
    }
    let list: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| (n.as_str(), Dtype::F32, s.clone(), f32_bytes(v)))
        .collect();
    write_st(&dir.path().join(PEFT_WEIGHTS_FILE), &list);
    write_json(
        &dir.path().join(ADAPTER_CONFIG_FILE),
        &json!({"peft_type": "LORA", "r": 2, "lora_alpha": 4,
                "rank_pattern": {"v_proj": 4}, "alpha_pattern": {v: 2}}),
    );
    let adapter = LoraAdapter::load(dir.path()).expect("load");
    assert_eq!(adapter.modules[q].scale, 2.0);
    assert_eq!(adapter.modules[v].scale, 0.5);

    // A rank the tensors do not have, and a regular-expression key: refused.
    let cfg = dir.path().join(ADAPTER_CONFIG_FILE);
    write_json(&cfg, &json!({"peft_type": "LORA", "r": 2, "lora_alpha": 4}));
    let err = LoraAdapter::load(dir.path()).expect_err("rank mismatch");
    assert!(err.to_string().contains("rank 2"), "{err}");
    write_json(
        &cfg,
        &json!({"peft_type": "LORA", "r": 2, "rank_pattern": {".*v_proj": 4}}),
    );
    let err = LoraAdapter::load(dir.path()).expect_err("regex");
    assert!(err.to_string().contains("rank_pattern"), "{err}");
}

/// Saves the sample, then replaces one file's bytes.
fn folder_with(file: &str, bytes: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    sample(1.0, false).save(dir.path()).expect("save");
    std::fs::write(dir.path().join(file), bytes).expect("write");
    dir
}

fn load_err(dir: &Path) -> String {
    LoraAdapter::load(dir).expect_err("must refuse").to_string()
}

#[test]
fn a_missing_b_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = "model.layers.0.self_attn.q_proj";
    write_st(
        &dir.path().join(MLX_WEIGHTS_FILE),
        &[(
            &format!("{m}.lora_a"),
            Dtype::F32,
            vec![3, 2],
            f32_bytes(&values(6, 1)),
        )],
    );
    write_json(
        &dir.path().join(ADAPTER_CONFIG_FILE),
        &json!({"lora_parameters": {}}),
    );
    let err = load_err(dir.path());
    assert!(err.contains(MLX_WEIGHTS_FILE), "{err}");
    assert!(err.contains("has A but no B"), "{err}");
}

#[test]
fn a_shape_mismatch_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = "model.layers.0.self_attn.q_proj";
    write_st(
        &dir.path().join(MLX_WEIGHTS_FILE),
        &[
            (
                &format!("{m}.lora_a"),
                Dtype::F32,
                vec![3, 2],
                f32_bytes(&values(6, 1)),
            ),
            (
                &format!("{m}.lora_b"),
                Dtype::F32,
                vec![3, 4],
                f32_bytes(&values(12, 1)),
            ),
        ],
    );
    write_json(
        &dir.path().join(ADAPTER_CONFIG_FILE),
        &json!({"lora_parameters": {}}),
    );
    let err = load_err(dir.path());
    assert!(err.contains(&format!("{m}.lora_b")), "{err}");
    assert!(err.contains("does not match"), "{err}");
}

#[test]
fn hostile_weights_files_are_errors() {
    let good = tempfile::tempdir().expect("tempdir");
    sample(1.0, false).save(good.path()).expect("save");
    let bytes = std::fs::read(good.path().join(MLX_WEIGHTS_FILE)).expect("read");
    let mut huge_header = bytes.clone();
    huge_header[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let cases: [(&str, &[u8]); 5] = [
        ("truncated", &bytes[..bytes.len() / 2]),
        ("header only", &bytes[..20]),
        ("empty", &[]),
        ("garbage", b"not a safetensors file at all"),
        ("huge header length", &huge_header),
    ];
    for (what, data) in cases {
        let dir = folder_with(MLX_WEIGHTS_FILE, data);
        let err = load_err(dir.path());
        assert!(err.contains(MLX_WEIGHTS_FILE), "{what}: {err}");
    }
    let dir = folder_with(ADAPTER_CONFIG_FILE, b"{\"r\": ");
    std::fs::remove_file(dir.path().join(MLX_WEIGHTS_FILE)).expect("rm");
    assert!(load_err(dir.path()).contains(ADAPTER_CONFIG_FILE));
}

#[test]
fn hostile_tensors_are_errors() {
    let m = "model.layers.0.self_attn.q_proj";
    let a = (format!("{m}.lora_a"), vec![3usize, 2usize]);
    let b = (format!("{m}.lora_b"), vec![2usize, 4usize]);
    let mut nan = values(8, 1);
    nan[3] = f32::NAN;
    let cases: Vec<(&str, Vec<OwnedTensor>, &str)> = vec![
        (
            "NaN",
            vec![
                (
                    a.0.clone(),
                    Dtype::F32,
                    a.1.clone(),
                    f32_bytes(&values(6, 1)),
                ),
                (b.0.clone(), Dtype::F32, b.1.clone(), f32_bytes(&nan)),
            ],
            "not finite",
        ),
        (
            "rank 0",
            vec![
                (a.0.clone(), Dtype::F32, vec![3, 0], vec![]),
                (b.0.clone(), Dtype::F32, vec![0, 4], vec![]),
            ],
            "rank 0",
        ),
        (
            "3-D",
            vec![
                (
                    a.0.clone(),
                    Dtype::F32,
                    vec![3, 2, 1],
                    f32_bytes(&values(6, 1)),
                ),
                (
                    b.0.clone(),
                    Dtype::F32,
                    b.1.clone(),
                    f32_bytes(&values(8, 1)),
                ),
            ],
            "not 2-D",
        ),
        (
            "integer dtype",
            vec![
                (a.0.clone(), Dtype::I32, a.1.clone(), vec![0; 24]),
                (
                    b.0.clone(),
                    Dtype::F32,
                    b.1.clone(),
                    f32_bytes(&values(8, 1)),
                ),
            ],
            "dtype",
        ),
        (
            "DoRA magnitude",
            vec![
                (
                    a.0.clone(),
                    Dtype::F32,
                    a.1.clone(),
                    f32_bytes(&values(6, 1)),
                ),
                (
                    b.0.clone(),
                    Dtype::F32,
                    b.1.clone(),
                    f32_bytes(&values(8, 1)),
                ),
                (
                    format!("{m}.lora_magnitude_vector"),
                    Dtype::F32,
                    vec![4],
                    vec![0; 16],
                ),
            ],
            "not a LoRA A or B",
        ),
        (
            "doubled PEFT prefix",
            vec![
                (
                    format!("base_model.model.base_model.model.{}", a.0),
                    Dtype::F32,
                    a.1.clone(),
                    f32_bytes(&values(6, 1)),
                ),
                (
                    b.0.clone(),
                    Dtype::F32,
                    b.1.clone(),
                    f32_bytes(&values(8, 1)),
                ),
            ],
            "not a LoRA A or B",
        ),
        ("no tensors", vec![], "no LoRA tensors"),
    ];
    for (what, tensors, expect) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let list: Vec<_> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
            .collect();
        write_st(&dir.path().join(MLX_WEIGHTS_FILE), &list);
        write_json(
            &dir.path().join(ADAPTER_CONFIG_FILE),
            &json!({"lora_parameters": {}}),
        );
        let err = load_err(dir.path());
        assert!(err.contains(expect), "{what}: {err}");
    }
}

#[test]
fn configs_that_cannot_give_a_scale_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = "model.layers.0.self_attn.q_proj";
    write_mlx(dir.path(), &format!("{m}.lora_a"), &format!("{m}.lora_b"));
    assert!(load_err(dir.path()).contains("scale is unknown"));
    let cfg = dir.path().join(ADAPTER_CONFIG_FILE);
    for (bad, field) in [
        (
            json!({"lora_parameters": {"scale": "big"}}),
            "lora_parameters.scale",
        ),
        (
            json!({"lora_parameters": {"scale": 1e300}}),
            "lora_parameters.scale",
        ),
        (json!({"lora_parameters": 3}), "lora_parameters"),
        (
            json!({"r": 2, "lora_alpha": 8, "use_rslora": "yes"}),
            "use_rslora",
        ),
        (json!({"peft_type": "LORA", "r": 0}), "r"),
        (json!({"r": 2, "lora_alpha": 1e300}), "lora_alpha"),
        (
            json!({"r": 2, "alpha_pattern": {"q_proj": "x"}}),
            "alpha_pattern.q_proj",
        ),
        (json!({"peft_type": "IA3"}), "peft_type"),
        (json!([1, 2]), "(file)"),
    ] {
        write_json(&cfg, &bad);
        let err = load_err(dir.path());
        assert!(err.contains(field), "{bad}: {err}");
    }
}

#[test]
fn no_weights_file_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(load_err(dir.path()).contains("neither"));
}

#[test]
fn save_refuses_an_inconsistent_adapter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut adapter = sample(1.0, false);
    if let Some(w) = adapter.modules.get_mut("model.layers.0.self_attn.v_proj") {
        w.b.pop();
    }
    let err = adapter.save(dir.path()).expect_err("short B");
    assert!(err.to_string().contains("v_proj"), "{err}");
    let empty = LoraAdapter {
        modules: BTreeMap::new(),
        base_model: None,
        info: AdapterInfo::default(),
    };
    assert!(empty.save(dir.path()).is_err());
    assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0);
}

fn tiny_config(layers: usize) -> crate::config::ModelConfig {
    let json = json!({
        "model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": layers, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 32,
    });
    config_from_hf_json(Path::new("config.json"), &json).expect("config")
}

#[test]
fn check_against_catches_shapes_layers_and_names() {
    let cfg = tiny_config(2);
    // q: 8→8, v: 8→4 (one kv head of 4).
    sample(1.0, false).check_against(&cfg).expect("fits");

    let mut wrong = sample(1.0, false);
    wrong.modules.insert(
        "model.layers.0.self_attn.k_proj".into(),
        weights(8, 8, 2, 1.0, 9),
    );
    let err = wrong.check_against(&cfg).expect_err("k is 8→4");
    assert!(err.to_string().contains("k_proj"), "{err}");
    assert!(err.to_string().contains("out=4"), "{err}");

    let err = sample(1.0, false)
        .check_against(&tiny_config(1))
        .expect_err("layer 1 of 1");
    assert!(err.to_string().contains("layer 1 does not exist"), "{err}");

    let mut odd = sample(1.0, false);
    odd.modules
        .insert("lm_head".into(), weights(8, 32, 2, 1.0, 9));
    let err = odd.check_against(&cfg).expect_err("not a layer matrix");
    assert!(err.to_string().contains("lm_head"), "{err}");

    let mut down = LoraAdapter {
        modules: BTreeMap::new(),
        base_model: None,
        info: AdapterInfo::default(),
    };
    down.modules.insert(
        "model.layers.1.mlp.down_proj".into(),
        weights(16, 8, 2, 1.0, 1),
    );
    down.modules.insert(
        "model.layers.1.self_attn.o_proj".into(),
        weights(8, 8, 2, 1.0, 1),
    );
    down.check_against(&cfg).expect("down 16→8, o 8→8");
}

#[test]
fn info_survives_serde_with_defaults() {
    let info: AdapterInfo = serde_json::from_value(json!({"rank": 16})).expect("serde");
    assert_eq!(info.rank, 16);
    assert_eq!(info.method, "sft");
    assert_eq!(info.target_modules.len(), 7);
}

#[test]
fn num_layers_writes_layers_to_transform() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut adapter = sample(1.0, false);
    adapter.info.num_layers = 2;
    adapter.save(dir.path()).expect("save");
    let cfg = read_json(&dir.path().join(ADAPTER_CONFIG_FILE));
    assert_eq!(cfg["layers_to_transform"], json!([0, 1]));
    assert_eq!(
        LoraAdapter::load(dir.path()).expect("load").info.num_layers,
        2
    );
}

/// A fuzz input for `fuzz/fuzz_targets/lora_adapter.rs`: the selector byte, the config's length
/// (u16 LE), the config, the safetensors file.
fn fuzz_input(selector: u8, config: &Value, weights: &[u8]) -> Vec<u8> {
    let config = serde_json::to_vec(config).expect("json");
    let len = u16::try_from(config.len()).expect("small config");
    let mut out = vec![selector];
    out.extend(len.to_le_bytes());
    out.extend(config);
    out.extend(weights);
    out
}

/// One module (rank 2, in 3, out 4) in either file's orientation, f32 or bf16.
fn one_module_file(layout: tensors::Layout, bf16: bool) -> Vec<u8> {
    let m = "model.layers.0.self_attn.q_proj";
    let (a_name, b_name, a_shape, b_shape) = match layout {
        tensors::Layout::Peft => (
            format!("base_model.model.{m}.lora_A.weight"),
            format!("base_model.model.{m}.lora_B.weight"),
            vec![2, 3],
            vec![4, 2],
        ),
        tensors::Layout::Mlx => (
            format!("{m}.lora_a"),
            format!("{m}.lora_b"),
            vec![3, 2],
            vec![2, 4],
        ),
    };
    let dtype = if bf16 { Dtype::BF16 } else { Dtype::F32 };
    let bytes = |v: &[f32]| if bf16 { bf16_bytes(v) } else { f32_bytes(v) };
    let (a, b) = (bytes(&values(6, 1)), bytes(&values(8, 2)));
    let views = vec![
        (a_name, TensorView::new(dtype, a_shape, &a).expect("view")),
        (b_name, TensorView::new(dtype, b_shape, &b).expect("view")),
    ];
    safetensors::serialize(views, None).expect("serialize")
}

/// The committed seeds of the `lora_adapter` fuzz target: a PEFT folder with patterns, an
/// mlx-lm folder, an optiq folder with rs-LoRA.
fn fuzz_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let q = "model.layers.0.self_attn.q_proj";
    vec![
        (
            "peft.bin",
            fuzz_input(
                0,
                &json!({"peft_type": "LORA", "r": 2, "lora_alpha": 8, "use_rslora": false,
                        "rank_pattern": {q: 2}, "alpha_pattern": {"q_proj": 4},
                        "target_modules": ["q_proj"], "base_model_name_or_path": "m"}),
                &one_module_file(tensors::Layout::Peft, true),
            ),
        ),
        (
            "mlx.bin",
            fuzz_input(
                1,
                &json!({"fine_tune_type": "lora", "num_layers": 4,
                        "lora_parameters": {"rank": 2, "scale": 10.0, "dropout": 0.0, "keys": null}}),
                &one_module_file(tensors::Layout::Mlx, false),
            ),
        ),
        (
            "optiq.bin",
            fuzz_input(
                3,
                &json!({"rank": 2, "scale": 20.0, "rank_scaling": "by_bits", "method": "sft",
                        "rs_lora": true, "target_modules": ["q_proj"], "num_layers": -1,
                        "lora_parameters": {"scale": 20.0, "rank": 2, "rs_lora": true},
                        "applied_ranks": {q: 2}, "source_model": "m"}),
                &one_module_file(tensors::Layout::Mlx, false),
            ),
        ),
    ]
}

/// The seeds load (so the fuzzer starts from valid folders) and match the committed files;
/// `KILN_WRITE_FUZZ_SEEDS=1` rewrites them.
#[test]
fn fuzz_seeds_are_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/lora_adapter");
    let write = std::env::var_os("KILN_WRITE_FUZZ_SEEDS").is_some_and(|v| v == "1");
    for (name, bytes) in fuzz_seeds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let selector = bytes[0];
        let n = usize::from(u16::from_le_bytes([bytes[1], bytes[2]]));
        let (config, weights) = bytes[3..].split_at(n);
        let weights_file = if selector & 1 != 0 {
            MLX_WEIGHTS_FILE
        } else {
            PEFT_WEIGHTS_FILE
        };
        let config_file = if selector & 2 != 0 {
            OPTIQ_CONFIG_FILE
        } else {
            ADAPTER_CONFIG_FILE
        };
        std::fs::write(dir.path().join(weights_file), weights).expect("write");
        std::fs::write(dir.path().join(config_file), config).expect("write");
        LoraAdapter::load(dir.path()).unwrap_or_else(|e| panic!("seed {name}: {e}"));

        let path = root.join(name);
        if write {
            std::fs::create_dir_all(&root).expect("seed dir");
            std::fs::write(&path, &bytes).expect("write seed");
        } else {
            let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (KILN_WRITE_FUZZ_SEEDS=1 writes it)",
                    path.display()
                )
            });
            assert!(
                on_disk == bytes,
                "{} is stale: rerun with KILN_WRITE_FUZZ_SEEDS=1",
                path.display()
            );
        }
    }
}
