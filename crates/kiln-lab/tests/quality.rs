//! The quality orderings, as slow checks (`cargo test -p kiln-lab --release --test
//! quality -- --ignored`; docs/testing.md):
//! - on SmolLM2 (an f16 source made from the starter file): kiln's mixed GGUF, no larger than
//!   llama-quantize's Q3_K_M of the same source, has a lower mean KL; needs `LLAMA_BIN`, a
//!   folder with `llama-quantize`;
//! - on SmolLM2 and every tiny checkpoint (other architectures, random weights): kiln's mixed
//!   MLX output at 4.5 bits per weight has a lower mean KL than uniform 4-bit g64, with no more
//!   bytes.
//!
//! KL is `kiln eval kl`'s (docs/benchmarks.md shows it agrees with llama-perplexity's).

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_engine::kv_scheme::{DenseDtype, KvScheme};
use kiln_engine::{Engine, EngineOptions, load_model};
use kiln_lab::LabError;
use kiln_lab::Report;
use kiln_lab::quantize::{OutputFormat, QuantizeConfig, quantize};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};

struct Quiet;

impl Report for Quiet {
    fn stage(&mut self, _: &str, _: f64, _: &str) -> Result<(), LabError> {
        Ok(())
    }
    fn warn(&mut self, _: &str) {}
}

mod common;

use common::{shared, tiny_with_tokenizer};

fn engine(path: &Path, dense: bool, ctx: usize) -> Engine<CpuBackend> {
    let backend = CpuBackend::new(CpuOptions { dense });
    let model = load_model(&backend, path).unwrap();
    let options = EngineOptions {
        context_len: ctx,
        kv_scheme: KvScheme::dense(DenseDtype::F32),
        ..EngineOptions::default()
    };
    Engine::new(backend, model, options).unwrap()
}

/// Mean KL of `model` against `reference` over the KL text, in windows of `window`.
fn mean_kl(model: &Path, reference: &Path, window: usize) -> f64 {
    let text = std::fs::read_to_string(shared().join("smollm2/kl_text.txt")).unwrap();
    let mut r = engine(reference, true, window + 1);
    let mut t = engine(model, false, window + 1);
    let tokens = r.model().tokenizer.encode(&text, false).unwrap();
    kiln_engine::eval::eval_kl(&mut r, &mut t, &tokens, window)
        .unwrap()
        .mean_kl
}

fn bytes(path: &Path) -> u64 {
    if path.is_file() {
        return path.metadata().unwrap().len();
    }
    std::fs::read_dir(path)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

fn starter() -> PathBuf {
    common::starter().expect("run `kiln pull` first")
}

fn llama_quantize(args: &[&str]) {
    let bin = std::env::var("LLAMA_BIN").expect("set LLAMA_BIN to a folder with llama-quantize");
    let status = Command::new(Path::new(&bin).join("llama-quantize"))
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "llama-quantize {args:?}");
}

/// Stored bits per weight of a GGUF's 2-D tensors.
fn gguf_bpw(path: &Path) -> f64 {
    let f = kiln_model::gguf::GgufFile::open(path).unwrap();
    let (mut bits, mut params) = (0f64, 0f64);
    for t in &f.header().tensors {
        if t.dims.len() == 2 && t.dims[1] > 1 {
            bits += t.size_bytes as f64 * 8.0;
            params += t.elem_count() as f64;
        }
    }
    bits / params
}

#[test]
#[ignore = "slow: ~10 min of sensitivity on SmolLM2, and needs LLAMA_BIN"]
fn mixed_gguf_beats_llama_q3_k_m_at_no_larger_size() {
    let dir = tempfile::tempdir().unwrap();
    let f16 = dir.path().join("f16.gguf");
    let q3 = dir.path().join("q3km.gguf");
    let src = starter();
    llama_quantize(&[
        "--allow-requantize",
        src.to_str().unwrap(),
        f16.to_str().unwrap(),
        "F16",
    ]);
    llama_quantize(&[f16.to_str().unwrap(), q3.to_str().unwrap(), "Q3_K_M"]);
    let out = dir.path().join("kiln-mixed.gguf");
    let mut cfg = QuantizeConfig::new(f16.clone(), out.clone(), OutputFormat::Gguf);
    cfg.target_bpw = Some(gguf_bpw(&q3) - 0.01);
    quantize(&cfg, &mut Quiet).unwrap();
    assert!(
        bytes(&out) <= bytes(&q3),
        "{} > {}",
        bytes(&out),
        bytes(&q3)
    );
    let (ours, theirs) = (mean_kl(&out, &f16, 512), mean_kl(&q3, &f16, 512));
    eprintln!(
        "mixed {} bytes KL {ours:.5}; Q3_K_M {} bytes KL {theirs:.5}",
        bytes(&out),
        bytes(&q3)
    );
    assert!(ours < theirs, "kiln mixed {ours} against Q3_K_M {theirs}");
}

/// Uniform 4-bit g64 and mixed 4.5 bpw of `src`: the mixed one has no more tensor bytes (the
/// side files differ: the mixed `config.json` lists every module, its `optiq_metadata.json`
/// holds the KL table) and a lower KL.
fn mixed_mlx_beats_uniform(src: &Path, reference: &Path, window: usize) {
    let dir = tempfile::tempdir().unwrap();
    let uniform = dir.path().join("uniform");
    let mixed = dir.path().join("mixed");
    let mut cfg = QuantizeConfig::new(src.into(), uniform.clone(), OutputFormat::Mlx);
    let u_report = quantize(&cfg, &mut Quiet).unwrap();
    cfg.out = mixed.clone();
    cfg.target_bpw = Some(4.5);
    let m_report = quantize(&cfg, &mut Quiet).unwrap();
    let (u, m) = (
        mean_kl(&uniform, reference, window),
        mean_kl(&mixed, reference, window),
    );
    let (ub, mb) = (u_report.tensor_bytes, m_report.tensor_bytes);
    eprintln!(
        "{}: uniform {ub} tensor bytes KL {u:.5}; mixed {mb} KL {m:.5}",
        src.display()
    );
    assert!(mb <= ub, "{mb} > {ub}");
    assert!(m < u, "mixed {m} against uniform {u}");
}

#[test]
#[ignore = "slow: ~12 min of sensitivity on SmolLM2, and needs LLAMA_BIN"]
fn mixed_mlx_beats_uniform_4bit_on_smollm2() {
    let dir = tempfile::tempdir().unwrap();
    let f16 = dir.path().join("f16.gguf");
    llama_quantize(&[
        "--allow-requantize",
        starter().to_str().unwrap(),
        f16.to_str().unwrap(),
        "F16",
    ]);
    mixed_mlx_beats_uniform(&f16, &f16, 512);
}

#[test]
#[ignore = "slow: sensitivity on every tiny checkpoint"]
fn mixed_mlx_beats_uniform_4bit_on_the_tiny_checkpoints() {
    for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
        let dir = tempfile::tempdir().unwrap();
        let src = tiny_with_tokenizer(dir.path(), arch);
        mixed_mlx_beats_uniform(&src, &src, 128);
    }
}
