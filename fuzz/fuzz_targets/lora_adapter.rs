//! Arbitrary bytes as a LoRA adapter folder. Byte 0 selects the files: bit 0 writes the weights
//! as `adapters.safetensors` (mlx-lm/optiq) instead of `adapter_model.safetensors` (PEFT), bit 1
//! the config as `optiq_lora_config.json` instead of `adapter_config.json`. Bytes 1–2 are the
//! config's length n (u16, little-endian); the next n bytes are the config, the rest the
//! safetensors file (a short input leaves them empty). `LoraAdapter::load` must answer or give
//! an error, never panic; what loads must be consistent (A `[in, r]`, B `[r, out]`, finite
//! values and scales), and must save (or be refused as an inconsistent adapter, never an I/O or
//! format error) and load again with the same modules and ranks.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kiln_model::ModelError;
use kiln_model::lora::{
    ADAPTER_CONFIG_FILE, LoraAdapter, MLX_WEIGHTS_FILE, OPTIQ_CONFIG_FILE, PEFT_WEIGHTS_FILE,
};
use libfuzzer_sys::fuzz_target;

/// This process's scratch folders (input, and the re-saved copy) in the temp folder, left behind
/// at exit (parallel fuzz jobs are separate processes, so the pid keeps them apart).
fn scratch() -> &'static (PathBuf, PathBuf) {
    static DIRS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DIRS.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("kiln-fuzz-lora-{}", std::process::id()));
        let dirs = (base.join("in"), base.join("out"));
        std::fs::create_dir_all(&dirs.0).expect("scratch folder");
        std::fs::create_dir_all(&dirs.1).expect("scratch folder");
        dirs
    })
}

/// Leaves exactly one weights file and one config in `dir`.
fn write_folder(dir: &Path, selector: u8, config: &[u8], weights: &[u8]) {
    for f in [
        PEFT_WEIGHTS_FILE,
        MLX_WEIGHTS_FILE,
        ADAPTER_CONFIG_FILE,
        OPTIQ_CONFIG_FILE,
    ] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let weights_name = if selector & 1 != 0 {
        MLX_WEIGHTS_FILE
    } else {
        PEFT_WEIGHTS_FILE
    };
    let config_name = if selector & 2 != 0 {
        OPTIQ_CONFIG_FILE
    } else {
        ADAPTER_CONFIG_FILE
    };
    std::fs::write(dir.join(weights_name), weights).expect("write weights");
    std::fs::write(dir.join(config_name), config).expect("write config");
}

fn check_consistent(adapter: &LoraAdapter) {
    assert!(!adapter.modules.is_empty(), "loaded without modules");
    for (path, w) in &adapter.modules {
        assert!(w.rank >= 1, "{path}: rank 0");
        assert_eq!(w.a.len(), w.in_features * w.rank, "{path}: A");
        assert_eq!(w.b.len(), w.rank * w.out_features, "{path}: B");
        assert!(w.scale.is_finite(), "{path}: scale {}", w.scale);
        assert!(
            w.a.iter().chain(&w.b).all(|v| v.is_finite()),
            "{path}: values"
        );
    }
    assert!(adapter.info.scale.is_finite(), "info.scale");
}

fuzz_target!(|data: &[u8]| {
    let selector = data.first().copied().unwrap_or(0);
    let n = match data.get(1..3) {
        Some(len) => usize::from(u16::from_le_bytes([len[0], len[1]])),
        None => 0,
    };
    let rest = data.get(3..).unwrap_or(&[]);
    let (config, weights) = rest.split_at(n.min(rest.len()));
    let (input, output) = scratch();
    write_folder(input, selector, config, weights);
    let Ok(adapter) = LoraAdapter::load(input) else {
        return;
    };
    check_consistent(&adapter);
    match adapter.save(output) {
        Ok(()) => {}
        Err(ModelError::Adapter { .. }) => return,
        Err(e) => panic!("a loaded adapter failed to save: {e}"),
    }
    let again = LoraAdapter::load(output).expect("a saved adapter loads");
    check_consistent(&again);
    let ranks = |a: &LoraAdapter| -> Vec<(String, usize)> {
        a.modules.iter().map(|(p, w)| (p.clone(), w.rank)).collect()
    };
    assert_eq!(ranks(&again), ranks(&adapter), "modules or ranks changed");
});
