//! Shared helpers for kiln-train's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kiln_model::arch::Model;
use kiln_model::files::ModelFiles;
use kiln_train::lora::LoraPlan;
use kiln_train::{TapeBackend, TapeOptions};

/// `../shared/reference` relative to the workspace root (CI lays `shared/` beside the clone).
pub fn reference_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("KILN_REFERENCE_DIR") {
        return PathBuf::from(dir);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference")
}

/// All seven projections at `rank`, scale `scale`.
pub fn plan(rank: usize, scale: f32) -> LoraPlan {
    LoraPlan {
        targets: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
        .map(String::from)
        .to_vec(),
        first_layer: 0,
        rank,
        ranks: Default::default(),
        scale,
        rs_lora: false,
        seed: 1,
        dropout: 0.0,
        by_bits: false,
    }
}

/// A tiny reference checkpoint loaded for training.
pub fn load(folder: &str, plan: LoraPlan) -> (TapeBackend, Model<TapeBackend>) {
    let dir = reference_dir().join("tiny").join(folder);
    let files = ModelFiles::open(&dir).expect("open");
    let backend = TapeBackend::new(TapeOptions { plan, dense: false });
    let model = Model::load(&backend, files.tensors(), files.config.clone()).expect("load");
    (backend, model)
}

/// Reads a little-endian float32 `.npy` file's values.
pub fn read_npy_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    bytes[10 + header_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The reference inputs of a tiny folder.
pub fn inputs(folder: &str) -> Vec<u32> {
    let path = reference_dir()
        .join("tiny")
        .join(folder)
        .join("inputs.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("inputs")).expect("json");
    v["input_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}
