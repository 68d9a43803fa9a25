//! Shared helpers for kiln-model's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// `../shared/reference` relative to the workspace root (CI lays `shared/` beside the clone).
pub fn reference_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("KILN_REFERENCE_DIR") {
        return PathBuf::from(dir);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference")
}

/// Reads a little-endian float32 `.npy` file: (shape, values).
pub fn read_npy_f32(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &bytes[..6],
        b"\x93NUMPY",
        "{} is not an npy file",
        path.display()
    );
    let (header_len, start) = if bytes[6] == 1 {
        (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10)
    } else {
        (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        )
    };
    let header = std::str::from_utf8(&bytes[start..start + header_len]).expect("utf8 header");
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape_text = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .expect("shape");
    let shape: Vec<usize> = shape_text
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().expect("dim"))
        .collect();
    let data = bytes[start + header_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (shape, data)
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Index of the largest value (lowest index on ties).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Reads a JSON file.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("json")
}

/// Token ids from a JSON array.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The starter model (SmolLM2-135M-Instruct Q4_1), through the same code path `kiln pull` uses.
pub fn starter_model() -> PathBuf {
    kiln_hub::ensure_starter_model(false).expect("starter model")
}
