//! MLX folders through `ModelFiles::open`: the tiny Llama of `shared/reference/tiny` quantized
//! with `affine_quantize` and written the way MLX writes it, then served back (every tensor
//! equal to what was written), run, and broken in the ways a hostile checkpoint could be.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use half::bf16;
use kiln_kernels::GgmlType;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::{Value, json};

use super::*;
use crate::ModelError;
use crate::files::ModelFiles;

fn tiny_llama() -> PathBuf {
    let reference = match std::env::var("KILN_REFERENCE_DIR") {
        Ok(dir) => PathBuf::from(dir),
        Err(_) => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference"),
    };
    reference.join("tiny/llama")
}

/// A tensor to write: name, dtype, shape, bytes.
type Stored = (String, Dtype, Vec<usize>, Vec<u8>);

/// What a folder holds: the tensors, and per name the values loading must give back.
struct Written {
    stored: Vec<Stored>,
    expected: BTreeMap<String, (GgmlType, Vec<f32>)>,
}

/// Quantizes the tiny Llama as MLX would (weights cast to bf16; a 2-D weight whose module the
/// block quantizes and whose width divides the group is quantized, the rest stays bf16).
fn quantize_tiny(quant: &MlxQuantization) -> Written {
    let bytes = std::fs::read(tiny_llama().join("model.safetensors")).expect("tiny llama");
    let st = SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut names = st.names();
    names.sort();
    let mut w = Written {
        stored: vec![],
        expected: BTreeMap::new(),
    };
    for name in names {
        let t = st.tensor(name).expect("tensor");
        assert_eq!(t.dtype(), Dtype::F32);
        let vals: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|c| bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_f32())
            .collect();
        let shape = t.shape().to_vec();
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let spec = quant.spec_for(module);
        match (shape.as_slice(), spec) {
            (&[rows, cols], Some(s)) if cols % s.group_size == 0 => {
                let m = affine_quantize(&vals, rows, cols, s.bits, s.group_size).expect("quantize");
                let ty = match s.bits {
                    4 => GgmlType::Q4_1,
                    5 => GgmlType::Q5_1,
                    _ => GgmlType::F32,
                };
                w.expected.insert(name.into(), (ty, affine_dequantize(&m)));
                w.stored.extend(affine_tensors(module, &m));
            }
            _ => {
                let raw = vals.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes());
                w.stored
                    .push((name.into(), Dtype::BF16, shape, raw.collect()));
                w.expected.insert(name.into(), (GgmlType::BF16, vals));
            }
        }
    }
    w
}

fn write_safetensors(path: &Path, stored: &[Stored]) {
    let views: Vec<(String, TensorView<'_>)> = stored
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    let meta = HashMap::from([("format".to_string(), "mlx".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).expect("write");
}

/// A folder MLX could have written: config.json with the block (twice, as MLX does), the
/// safetensors, and whatever tokenizer / generation files the source has.
fn write_folder(dir: &Path, quant: &Value, stored: &[Stored]) {
    let src = tiny_llama();
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config"))
            .expect("json");
    config["quantization"] = quant.clone();
    config["quantization_config"] = quant.clone();
    let text = serde_json::to_string_pretty(&config).expect("json");
    std::fs::write(dir.join("config.json"), text).expect("write config");
    for aux in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ] {
        if src.join(aux).is_file() {
            std::fs::copy(src.join(aux), dir.join(aux)).expect("copy");
        }
    }
    write_safetensors(&dir.join("model.safetensors"), stored);
}

fn open_written(quant: &MlxQuantization) -> (tempfile::TempDir, Written, ModelFiles) {
    let w = quantize_tiny(quant);
    let dir = tempfile::tempdir().expect("tempdir");
    write_folder(dir.path(), &quant.to_json(), &w.stored);
    let files = ModelFiles::open(dir.path()).expect("open MLX folder");
    (dir, w, files)
}

/// Every tensor served has the expected type and exactly the values of `affine_dequantize`.
fn assert_served_exactly(w: &Written, files: &ModelFiles) -> BTreeMap<&'static str, usize> {
    let mut by_type = BTreeMap::new();
    for (name, (ty, want)) in &w.expected {
        let t = files.tensors().tensor(name).expect(name).expect(name);
        assert_eq!(t.ty, *ty, "{name}");
        let got = t.to_f32().expect("to_f32");
        assert!(
            got == *want,
            "{name}: served values differ from affine_dequantize"
        );
        *by_type.entry(ty.name()).or_default() += 1;
    }
    by_type
}

fn spec(bits: u32, group_size: usize) -> Option<AffineSpec> {
    Some(AffineSpec { bits, group_size })
}

#[test]
fn four_bit_g32_loads_as_exact_q4_1() {
    let quant = MlxQuantization {
        default: spec(4, 32),
        per_module: BTreeMap::new(),
    };
    let (_dir, w, files) = open_written(&quant);
    let by_type = assert_served_exactly(&w, &files);
    // 7 matrices × 4 layers + embedding + head; the 9 norms stay bf16.
    assert_eq!(by_type.get("Q4_1"), Some(&30), "{by_type:?}");
    assert_eq!(by_type.get("BF16"), Some(&9), "{by_type:?}");
    // The estimate counts what loading holds: Q4_1 blocks, no separate scales/biases.
    let q4 = GgmlType::Q4_1.row_bytes(64).expect("row") as u64;
    assert!(files.tensors().total_tensor_bytes() >= 2 * 1024 * q4);
    assert_eq!(files.tensors().largest_tensor_bytes(), 1024 * q4);
}

#[test]
fn mixed_widths_and_unquantized_modules_load_exactly() {
    let per_module = BTreeMap::from([
        ("model.layers.0.self_attn.q_proj".to_string(), spec(8, 64)),
        ("model.layers.1.mlp.down_proj".to_string(), None),
        ("model.layers.1.self_attn.o_proj".to_string(), spec(6, 32)),
        ("model.layers.2.self_attn.v_proj".to_string(), spec(3, 32)),
        ("model.layers.2.mlp.down_proj".to_string(), spec(2, 128)),
        ("model.layers.3.self_attn.k_proj".to_string(), spec(5, 64)),
    ]);
    let quant = MlxQuantization {
        default: spec(4, 32),
        per_module,
    };
    let (_dir, w, files) = open_written(&quant);
    let by_type = assert_served_exactly(&w, &files);
    assert_eq!(by_type.get("Q5_1"), Some(&1), "{by_type:?}");
    assert_eq!(by_type.get("F32"), Some(&4), "{by_type:?}");
    assert_eq!(by_type.get("BF16"), Some(&10), "{by_type:?}");
    assert_eq!(by_type.get("Q4_1"), Some(&24), "{by_type:?}");
}

/// Scales below f16's range cannot be Q4_1's `d`: that matrix dequantizes to f32 instead.
#[test]
fn scales_f16_cannot_hold_take_the_f32_path() {
    let rows = 2;
    let w: Vec<f32> = (0..rows * 64)
        .map(|i| bf16::from_f32((i % 16) as f32 * 1e-7).to_f32())
        .collect();
    let m = affine_quantize(&w, rows, 64, 4, 32).expect("quantize");
    assert!(half::f16::from_f32(m.scales[0].to_f32()).to_f32() != m.scales[0].to_f32());
    let dir = tempfile::tempdir().expect("tempdir");
    let quant = json!({"group_size": 32, "bits": 4, "mode": "affine"});
    let mut stored = quantize_tiny(&MlxQuantization::default()).stored;
    stored.extend(affine_tensors("extra", &m));
    write_folder(dir.path(), &quant, &stored);
    let files = ModelFiles::open(dir.path()).expect("open");
    let t = files
        .tensors()
        .tensor("extra.weight")
        .expect("serve")
        .expect("present");
    assert_eq!(t.ty, GgmlType::F32);
    assert!(t.to_f32().expect("f32") == affine_dequantize(&m));
}

/// The folder runs: the dense CPU path matches the f32 reference (both see exactly the
/// dequantized weights), and the Q4_1 kernels with their 8-bit activations stay as close as
/// kiln's quantized path is held to elsewhere (mean KL against dense ≤ 0.01 nats; measured
/// 0.0022, top-1 23 of 24).
#[test]
fn the_quantized_folder_runs() {
    use crate::arch::{LogitsWanted, Model};
    use crate::backend::cpu::{CpuBackend, CpuOptions};
    use crate::backend::reference::ReferenceBackend;
    use crate::backend::{Backend, BatchLayout, KvLayout};

    fn logits<B: Backend>(b: &B, files: &ModelFiles, tokens: &[u32]) -> Vec<f32> {
        let cfg = files.config.clone();
        let model = Model::load(b, files.tensors(), cfg.clone()).expect("load");
        let mut kv = b.new_kv(KvLayout::for_model(&cfg, 1, 64)).expect("kv");
        let batch = BatchLayout::single(0, 0, tokens.len());
        let out = model.forward(b, &mut kv, tokens, &batch, LogitsWanted::All);
        out.expect("forward")
    }
    fn log_softmax(v: &[f32]) -> Vec<f64> {
        let max = v.iter().fold(f32::MIN, |m, &x| m.max(x)) as f64;
        let lse = v.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln() + max;
        v.iter().map(|&x| x as f64 - lse).collect()
    }
    fn argmax(v: &[f32]) -> usize {
        (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
    }
    let quant = MlxQuantization {
        default: spec(4, 32),
        per_module: BTreeMap::from([("model.layers.0.mlp.up_proj".to_string(), spec(8, 32))]),
    };
    let (_dir, _w, files) = open_written(&quant);
    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 1024).collect();
    let reference = logits(&ReferenceBackend, &files, &tokens);
    let dense = logits(
        &CpuBackend::new(CpuOptions { dense: true }),
        &files,
        &tokens,
    );
    let kernels = logits(
        &CpuBackend::new(CpuOptions { dense: false }),
        &files,
        &tokens,
    );
    let diff = reference
        .iter()
        .zip(&dense)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff <= 1e-4, "dense vs reference: {diff}");
    let (mut kl, mut agree) = (0.0, 0);
    for (d, k) in dense.chunks(1024).zip(kernels.chunks(1024)) {
        let (ld, lk) = (log_softmax(d), log_softmax(k));
        kl += ld
            .iter()
            .zip(&lk)
            .map(|(a, b)| a.exp() * (a - b))
            .sum::<f64>();
        agree += usize::from(argmax(d) == argmax(k));
    }
    kl /= tokens.len() as f64;
    assert!(kl <= 0.01, "kernels vs dense: mean KL {kl}");
    assert!(
        agree >= 20,
        "kernels vs dense: top-1 agrees at {agree} of 24"
    );
}

/// One hostile folder: the 4-bit tiny Llama with `edit` applied to its tensors or block.
fn open_broken(edit: impl FnOnce(&mut Vec<Stored>, &mut Value)) -> ModelError {
    let quant = MlxQuantization {
        default: spec(4, 32),
        per_module: BTreeMap::new(),
    };
    let mut stored = quantize_tiny(&quant).stored;
    let mut block = quant.to_json();
    edit(&mut stored, &mut block);
    let dir = tempfile::tempdir().expect("tempdir");
    write_folder(dir.path(), &block, &stored);
    match ModelFiles::open(dir.path()) {
        Ok(files) => {
            let name = "model.layers.0.self_attn.q_proj.weight";
            let served = files.tensors().tensor(name);
            served.expect_err("a broken folder must not load")
        }
        Err(e) => e,
    }
}

const Q: &str = "model.layers.0.self_attn.q_proj";

fn remove(stored: &mut Vec<Stored>, name: &str) {
    stored.retain(|t| t.0 != name);
}

#[test]
fn hostile_folders_fail_with_clear_errors() {
    let e = open_broken(|s, _| remove(s, &format!("{Q}.scales")));
    assert!(e.to_string().contains("scales is missing"), "{e}");

    let e = open_broken(|s, _| remove(s, &format!("{Q}.biases")));
    assert!(e.to_string().contains("biases is missing"), "{e}");

    // Scales of the wrong shape.
    let e = open_broken(|s, _| {
        let t = s
            .iter_mut()
            .find(|t| t.0 == format!("{Q}.scales"))
            .expect("scales");
        t.2 = vec![32, 4];
    });
    assert!(e.to_string().contains("expected [64, 2]"), "{e}");

    // The block says 8 bits for a 4-bit matrix: 8 words per row are 32 columns at 8 bits,
    // which the 2 groups of scales contradict.
    let e = open_broken(|_, b| b[Q] = json!({"bits": 8, "group_size": 32}));
    assert!(e.to_string().contains("at 8 bits are 32 columns"), "{e}");

    // Packed width not a whole number of codes (3 bits, 8 words = 85.3 codes).
    let e = open_broken(|_, b| b[Q] = json!({"bits": 3, "group_size": 32}));
    assert!(
        e.to_string().contains("not a whole number of 3-bit codes"),
        "{e}"
    );

    // Codes for a module the block leaves unquantized.
    let e = open_broken(|_, b| b[Q] = json!(false));
    assert!(e.to_string().contains("leaves"), "{e}");

    // U32 codes with no block at all: refused when served.
    let e = open_broken(|_, b| *b = Value::Null);
    assert!(e.to_string().contains("needs a quantization block"), "{e}");

    // Scales in an integer dtype.
    let e = open_broken(|s, _| {
        let t = s
            .iter_mut()
            .find(|t| t.0 == format!("{Q}.scales"))
            .expect("scales");
        t.1 = Dtype::I16;
    });
    assert!(e.to_string().contains("dtype I16"), "{e}");

    // A U32 tensor that is not a weight, and a 3-D packed weight.
    let e = open_broken(|s, _| s.push(("stray".into(), Dtype::U32, vec![2], vec![0; 8])));
    assert!(
        e.to_string().contains("only valid for a module's .weight"),
        "{e}"
    );
    let e = open_broken(|s, _| {
        let t = s
            .iter_mut()
            .find(|t| t.0 == format!("{Q}.weight"))
            .expect("weight");
        t.2 = vec![2, 32, 8];
    });
    assert!(e.to_string().contains("not a matrix"), "{e}");

    // A Hugging Face GPTQ block is refused at open.
    let e = open_broken(|_, b| *b = json!({"quant_method": "gptq", "bits": 4, "group_size": 128}));
    assert!(matches!(e, ModelError::Config { .. }), "{e}");
}
