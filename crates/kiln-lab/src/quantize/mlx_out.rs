//! Writing an MLX folder: affine-quantized modules (uint32 codes, bf16 scales and biases),
//! other tensors in bf16, `config.json` with the `quantization` block (spec §7.4) and its
//! `quantization_config` copy, and the side files (spec §7.5).

use std::collections::BTreeMap;
use std::path::Path;

use kiln_model::mlx::affine::affine_quantize;
use kiln_model::mlx::affine_tensors;
use kiln_model::mlx::config::{AffineSpec, MlxQuantization};
use kiln_model::weights::TensorSource;
use serde_json::Value;

use super::gguf_out::WrittenTensors;
use super::sensitivity::round_to_bf16;
use super::st_writer::{PlannedTensor, SHARD_BYTES, ShardPlan};
use crate::LabError;

/// Side files copied verbatim from a Hugging Face source (spec §7.5), besides any `*.model`.
pub const AUX_FILES: [&str; 12] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "generation_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "README.md",
    "kv_config.json",
];

/// A tensor of the source with its logical shape (`rows = 1` for vectors).
#[derive(Debug, Clone, PartialEq)]
pub struct SourceTensor {
    /// Hugging Face name.
    pub name: String,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Whether the source holds it as a vector.
    pub vector: bool,
}

/// Writes the tensors of `src` into `dir`: those `spec_for(name)` gives a spec are quantized,
/// the rest stored as bf16. `on_tensor(done, total)` may stop the write.
pub fn write_tensors(
    src: &dyn TensorSource,
    tensors: &[SourceTensor],
    dir: &Path,
    spec_for: &dyn Fn(&SourceTensor) -> Option<AffineSpec>,
    on_tensor: &mut dyn FnMut(usize, usize) -> Result<(), LabError>,
) -> Result<WrittenTensors, LabError> {
    let mut planned = Vec::new();
    let mut owner: BTreeMap<String, (usize, Option<AffineSpec>)> = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        let spec = spec_for(t);
        for p in plan_tensor(t, spec) {
            owner.insert(p.name.clone(), (i, spec));
            planned.push(p);
        }
    }
    let data_bytes = planned.iter().map(|p| p.bytes).sum();
    let plan = ShardPlan::new(planned, SHARD_BYTES);
    let mut report = WrittenTensors::default();
    let mut pending: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut done = 0;
    let total = tensors.len();
    plan.write(dir, |p| {
        if let Some(bytes) = pending.remove(&p.name) {
            return Ok(bytes);
        }
        let Some(&(i, spec)) = owner.get(&p.name) else {
            return Err(LabError::config(
                "out_dir",
                format!("{} is not in the plan", p.name),
            ));
        };
        let t = &tensors[i];
        let parts = encode(src, t, spec, &mut report)?;
        done += 1;
        on_tensor(done, total)?;
        let mut mine = None;
        for (name, bytes) in parts {
            if name == p.name {
                mine = Some(bytes);
            } else {
                pending.insert(name, bytes);
            }
        }
        mine.ok_or_else(|| LabError::config("out_dir", format!("{} was not produced", p.name)))
    })?;
    report.data_bytes = data_bytes;
    Ok(report)
}

/// The safetensors entries one source tensor becomes.
fn plan_tensor(t: &SourceTensor, spec: Option<AffineSpec>) -> Vec<PlannedTensor> {
    let module = t.name.strip_suffix(".weight").unwrap_or(&t.name);
    match spec {
        Some(s) => {
            let groups = t.cols / s.group_size;
            let words = t.cols * s.bits as usize / 32;
            vec![
                PlannedTensor {
                    name: format!("{module}.biases"),
                    dtype: "BF16",
                    shape: vec![t.rows, groups],
                    bytes: (t.rows * groups * 2) as u64,
                },
                PlannedTensor {
                    name: format!("{module}.scales"),
                    dtype: "BF16",
                    shape: vec![t.rows, groups],
                    bytes: (t.rows * groups * 2) as u64,
                },
                PlannedTensor {
                    name: format!("{module}.weight"),
                    dtype: "U32",
                    shape: vec![t.rows, words],
                    bytes: (t.rows * words * 4) as u64,
                },
            ]
        }
        None => {
            let shape = if t.vector {
                vec![t.cols]
            } else {
                vec![t.rows, t.cols]
            };
            vec![PlannedTensor {
                name: t.name.clone(),
                dtype: "BF16",
                shape,
                bytes: (t.rows * t.cols * 2) as u64,
            }]
        }
    }
}

fn encode(
    src: &dyn TensorSource,
    t: &SourceTensor,
    spec: Option<AffineSpec>,
    report: &mut WrittenTensors,
) -> Result<Vec<(String, Vec<u8>)>, LabError> {
    let data = src
        .tensor(&t.name)?
        .ok_or_else(|| LabError::config("model_id", format!("tensor {} vanished", t.name)))?
        .to_f32()?;
    let module = t.name.strip_suffix(".weight").unwrap_or(&t.name);
    let Some(s) = spec else {
        let bytes = data
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        report.tensors.push((t.name.clone(), "bf16".into()));
        return Ok(vec![(t.name.clone(), bytes)]);
    };
    let m = affine_quantize(&round_to_bf16(&data), t.rows, t.cols, s.bits, s.group_size)?;
    report.quantized_params += (t.rows * t.cols) as u64;
    report.quantized_bits +=
        (t.rows * t.cols) as f64 * (s.bits as f64 + 32.0 / s.group_size as f64);
    report
        .tensors
        .push((t.name.clone(), format!("affine{}g{}", s.bits, s.group_size)));
    Ok(affine_tensors(module, &m)
        .into_iter()
        .map(|(name, _, _, bytes)| (name, bytes))
        .collect())
}

/// `config.json` with the quantization block added (both keys, as MLX writes them).
pub fn quantized_config(mut config: Value, q: &MlxQuantization) -> Value {
    let block = q.to_json();
    if let Some(obj) = config.as_object_mut() {
        obj.insert("quantization".into(), block.clone());
        obj.insert("quantization_config".into(), block);
    }
    config
}

/// Copies the side files a Hugging Face source has into `dir`.
pub fn copy_aux_files(src_dir: &Path, dir: &Path) -> Result<(), LabError> {
    let entries = std::fs::read_dir(src_dir).map_err(|e| LabError::io(src_dir, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let wanted = AUX_FILES.contains(&name.as_str()) || name.ends_with(".model");
        if wanted && entry.path().is_file() {
            let to = dir.join(&name);
            std::fs::copy(entry.path(), &to).map_err(|e| LabError::io(&to, e))?;
        }
    }
    Ok(())
}
