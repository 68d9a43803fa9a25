//! The quantize run end to end on real files: MLX output of the tiny checkpoint reloads with
//! logits equal to its dequantized f32 weights, GGUF output decodes to exactly the blocks kiln's
//! encoder makes, a mixed run allocates and records its choice, and nothing is left under the
//! final name when a run stops.

use std::path::{Path, PathBuf};

use kiln_lab::LabError;
use kiln_lab::Report;
use kiln_lab::quantize::{OutputFormat, QuantizeConfig, quantize};
use kiln_model::arch::{LogitsWanted, Model};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::backend::{Backend, BatchLayout, KvLayout};
use kiln_model::files::ModelFiles;

mod common;

use common::{shared, starter, tiny_with_tokenizer};

fn tiny() -> PathBuf {
    shared().join("tiny/llama")
}

#[derive(Default)]
struct Log {
    stages: Vec<(String, f64)>,
    warnings: Vec<String>,
    stop_at: Option<&'static str>,
}

impl Report for Log {
    fn stage(&mut self, name: &str, progress: f64, _message: &str) -> Result<(), LabError> {
        self.stages.push((name.into(), progress));
        if self.stop_at == Some(name) {
            return Err(LabError::Cancelled);
        }
        Ok(())
    }

    fn warn(&mut self, message: &str) {
        self.warnings.push(message.into());
    }
}

fn logits(path: &Path, tokens: &[u32]) -> Vec<f32> {
    let files = ModelFiles::open(path).unwrap();
    let backend = CpuBackend::new(CpuOptions { dense: true });
    let model = Model::load(&backend, files.tensors(), files.config.clone()).unwrap();
    let mut kv = backend
        .new_kv(KvLayout::for_model(&files.config, 1, tokens.len()))
        .unwrap();
    let batch = BatchLayout::single(0, 0, tokens.len());
    model
        .forward(&backend, &mut kv, tokens, &batch, LogitsWanted::All)
        .unwrap()
}

/// Writes the dequantized f32 weights of an MLX folder as a plain Hugging Face folder.
fn dequantized_copy(mlx: &Path, out: &Path) {
    std::fs::create_dir(out).unwrap();
    let files = ModelFiles::open(mlx).unwrap();
    let src = files.tensors();
    let mut owned = Vec::new();
    for (name, shape) in src.tensor_shapes() {
        let t = src.tensor(&name).unwrap().unwrap();
        let bytes: Vec<u8> = t
            .to_f32()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        owned.push((name, shape, bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
        .iter()
        .map(|(n, s, b)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .unwrap();
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(mlx.join("config.json")).unwrap()).unwrap();
    let obj = config.as_object_mut().unwrap();
    obj.remove("quantization");
    obj.remove("quantization_config");
    std::fs::write(
        out.join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
}

#[test]
fn mlx_output_of_the_tiny_model_reloads_with_the_logits_of_its_dequantized_weights() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny-mlx4");
    let mut cfg = QuantizeConfig::new(tiny(), out.clone(), OutputFormat::Mlx);
    cfg.group_size = 32;
    let mut log = Log::default();
    let report = quantize(&cfg, &mut log).unwrap();
    assert_eq!(report.output, out);
    assert!(
        (report.achieved_bpw - 5.0).abs() < 1e-9,
        "4 bits + 32/32: {}",
        report.achieved_bpw
    );
    let names: Vec<&str> = log.stages.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"starting"));
    assert!(names.contains(&"writing"));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["bits"], 4);
    assert_eq!(config["quantization"], config["quantization_config"]);

    let plain = dir.path().join("tiny-dequantized");
    dequantized_copy(&out, &plain);
    let tokens: Vec<u32> = (1..20).collect();
    let (a, b) = (logits(&out, &tokens), logits(&plain, &tokens));
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1e-5, "max |Δlogit| {worst}");
    let original = logits(&tiny(), &tokens);
    let moved = a
        .iter()
        .zip(&original)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(moved > 0.0, "4-bit weights must change the logits a little");
}

#[test]
fn a_mixed_mlx_run_measures_every_module_and_meets_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny-mixed");
    let mut cfg = QuantizeConfig::new(
        tiny_with_tokenizer(dir.path(), "llama"),
        out.clone(),
        OutputFormat::Mlx,
    );
    cfg.group_size = 32;
    cfg.target_bpw = Some(6.0);
    cfg.candidate_bits = Some(vec![2, 4, 8]);
    cfg.n_calibration = 2;
    cfg.seq_len = 16;
    let calib = dir.path().join("calib.txt");
    std::fs::write(
        &calib,
        "the quick brown fox jumps over the lazy dog. ".repeat(40),
    )
    .unwrap();
    cfg.calibration = Some(calib);
    let mut log = Log::default();
    let report = quantize(&cfg, &mut log).unwrap();
    let sens = report.sensitivity.as_ref().unwrap();
    assert!(
        sens.len() >= 7,
        "every projection is measured: {}",
        sens.len()
    );
    assert!(sens.iter().all(|s| s.kl.len() == 3));
    assert!(report.achieved_bpw <= 6.0 + 1e-9, "{}", report.achieved_bpw);
    let alloc = report.allocation.as_ref().unwrap();
    assert!(
        alloc.iter().any(|(_, b)| *b > 2),
        "some module rises above the lowest width"
    );
    let per_layer = log
        .stages
        .iter()
        .filter(|(n, _)| n == "sensitivity")
        .count();
    assert!(per_layer > sens.len(), "one sensitivity event per module");
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("optiq_metadata.json")).unwrap()).unwrap();
    assert_eq!(meta["per_layer"].as_object().unwrap().len(), alloc.len());
    ModelFiles::open(&out).unwrap();
}

#[test]
fn an_unreachable_target_names_target_bpw_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny_with_tokenizer(dir.path(), "llama");
    let out = dir.path().join("too-small");
    let mut cfg = QuantizeConfig::new(src, out.clone(), OutputFormat::Mlx);
    cfg.group_size = 32;
    cfg.target_bpw = Some(1.5);
    cfg.seq_len = 16;
    match quantize(&cfg, &mut Log::default()) {
        Err(LabError::Config { field, reason }) => {
            assert_eq!(field, "target_bpw");
            assert!(reason.contains("smallest"), "{reason}");
        }
        other => panic!("expected a target_bpw error, got {other:?}"),
    }
    assert!(!out.exists());
}

#[test]
fn a_run_stopped_mid_sensitivity_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny_with_tokenizer(dir.path(), "llama");
    let out = dir.path().join("stopped");
    let mut cfg = QuantizeConfig::new(src, out.clone(), OutputFormat::Mlx);
    cfg.group_size = 32;
    cfg.target_bpw = Some(5.0);
    cfg.seq_len = 16;
    let mut log = Log {
        stop_at: Some("sensitivity"),
        ..Log::default()
    };
    assert!(matches!(quantize(&cfg, &mut log), Err(LabError::Cancelled)));
    let others = |d: &Path| -> Vec<_> {
        let entries = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name());
        entries.filter(|n| n != "llama").collect()
    };
    assert!(others(dir.path()).is_empty(), "{:?}", others(dir.path()));
    let mut log = Log {
        stop_at: Some("writing"),
        ..Log::default()
    };
    cfg.target_bpw = None;
    assert!(quantize(&cfg, &mut log).is_err());
    assert!(
        others(dir.path()).is_empty(),
        "a half-written folder is removed: {:?}",
        others(dir.path())
    );
}

#[test]
fn gguf_output_blocks_decode_to_what_the_encoder_made_and_metadata_carries_over() {
    let Some(src) = starter() else {
        eprintln!("starter model not downloaded; skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q5k.gguf");
    let mut cfg = QuantizeConfig::new(src.clone(), out.clone(), OutputFormat::Gguf);
    cfg.gguf_type = Some(kiln_kernels::GgmlType::Q5_K);
    let mut log = Log::default();
    quantize(&cfg, &mut log).unwrap();
    assert!(
        log.warnings.iter().any(|w| w.contains("dequantized first")),
        "{:?}",
        log.warnings
    );
    let (a, b) = (
        ModelFiles::open(&src).unwrap(),
        ModelFiles::open(&out).unwrap(),
    );
    let (ga, gb) = (a.gguf().unwrap(), b.gguf().unwrap());
    assert_eq!(
        gb.header().get("tokenizer.chat_template"),
        ga.header().get("tokenizer.chat_template")
    );
    for name in [
        "blk.0.ffn_down.weight",
        "blk.3.attn_q.weight",
        "token_embd.weight",
    ] {
        let (ia, ib) = (
            ga.header().tensor(name).unwrap(),
            gb.header().tensor(name).unwrap(),
        );
        let expected = kiln_lab::quantize::plan::gguf_fallback(
            kiln_kernels::GgmlType::Q5_K,
            ia.dims[0] as usize,
        );
        assert_eq!(ib.ty, expected, "{name}");
        let cols = ia.dims[0] as usize;
        let rows = (ia.elem_count() / ia.dims[0]) as usize;
        let source = kiln_model::backend::HostTensor {
            ty: ia.ty,
            rows,
            cols,
            bytes: ga.tensor_bytes(ia),
        }
        .to_f32()
        .unwrap();
        let encoded = kiln_kernels::encode::encode_rows(ib.ty, &source, rows, cols).unwrap();
        assert_eq!(
            &gb.tensor_bytes(ib)[..],
            &encoded[..],
            "{name}: the file holds the encoder's blocks"
        );
        let decoded = kiln_model::backend::HostTensor {
            ty: ib.ty,
            rows,
            cols,
            bytes: encoded.into(),
        }
        .to_f32()
        .unwrap();
        let err = decoded
            .iter()
            .zip(&source)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let range = source.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            err > 0.0 && err < range * 0.1,
            "{name}: error {err} against range {range}"
        );
    }
}
