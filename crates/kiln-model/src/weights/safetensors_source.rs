//! Tensors from a Hugging Face folder: `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`. Headers are validated by the `safetensors` crate (offsets,
//! sizes, overlap); kiln then checks dtype and rank. MLX-quantized modules (U32 codes plus
//! `.scales`/`.biases`, see [`crate::mlx`]) are served as one tensor under their `.weight` name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_kernels::GgmlType;
use safetensors::{Dtype, SafeTensors};

use super::TensorSource;
use crate::ModelError;
use crate::backend::{HostTensor, TensorBytes};
use crate::mlx::MlxQuantization;
use crate::mlx::load::{self, MlxWeights};

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

/// A Hugging Face safetensors checkpoint as a [`TensorSource`].
pub struct SafetensorsSource {
    dir: PathBuf,
    files: Vec<(PathBuf, Arc<memmap2::Mmap>)>,
    entries: HashMap<String, Entry>,
    /// The MLX-quantized weights, when config.json has a quantization block.
    mlx: Option<MlxWeights>,
}

/// Validates a safetensors buffer and returns the tensor names with dtype and shape (the
/// header-parsing entry point, also the fuzz target's).
pub fn parse_safetensors_header(bytes: &[u8]) -> Result<Vec<(String, Dtype, Vec<usize>)>, String> {
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| e.to_string())?;
    let mut out: Vec<_> = meta
        .tensors()
        .into_iter()
        .map(|(n, i)| (n, i.dtype, i.shape.clone()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

impl SafetensorsSource {
    /// Opens every weight file of a Hugging Face folder (no MLX quantization).
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        Self::open_with_quantization(dir, None)
    }

    /// Opens every weight file of a Hugging Face folder whose `config.json` declares the MLX
    /// quantization `mlx` (if any); every U32 tensor must then be a quantized module's `.weight`
    /// with `.scales` and `.biases` of the matching shapes.
    pub fn open_with_quantization(
        dir: &Path,
        mlx: Option<MlxQuantization>,
    ) -> Result<Self, ModelError> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let names: Vec<String> = if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Safetensors {
                    path: index.clone(),
                    reason: e.to_string(),
                })?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Safetensors {
                    path: index.clone(),
                    reason: "no weight_map object".into(),
                })?;
            let mut files: Vec<String> = map
                .values()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            files.sort();
            files.dedup();
            for f in &files {
                if f.contains('/') || f.contains('\\') || f.starts_with('.') {
                    return Err(ModelError::Safetensors {
                        path: index.clone(),
                        reason: format!("shard name {f:?} leaves the folder"),
                    });
                }
            }
            files
        } else if single.is_file() {
            vec!["model.safetensors".into()]
        } else {
            return Err(ModelError::Safetensors {
                path: dir.into(),
                reason: "neither model.safetensors nor model.safetensors.index.json".into(),
            });
        };
        let mut files = Vec::new();
        let mut entries = HashMap::new();
        for name in names {
            let path = dir.join(&name);
            let file = std::fs::File::open(&path).map_err(|e| ModelError::io(&path, e))?;
            // SAFETY: read-only map of a file kiln does not modify while loaded.
            let mmap =
                unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(&path, e))?;
            let (header_len, meta) =
                SafeTensors::read_metadata(&mmap).map_err(|e| ModelError::Safetensors {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            let data_start = 8 + header_len;
            for (tname, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                entries.insert(
                    tname,
                    Entry {
                        file: files.len(),
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start: data_start + s,
                        end: data_start + e,
                    },
                );
            }
            files.push((path, Arc::new(mmap)));
        }
        with_model_prefix(&mut entries);
        let mlx = match mlx {
            Some(q) => Some(plan_mlx(&q, &files, &entries)?),
            None => None,
        };
        Ok(Self {
            dir: dir.into(),
            files,
            entries,
            mlx,
        })
    }

    /// The MLX-quantized weight `name`: its codes, scales and biases turned into one tensor.
    /// Each part is read straight from the mapping, whose pages are then released.
    fn quantized(&self, name: &str, plan: &load::QuantPlan) -> Result<HostTensor, ModelError> {
        let bad = |n: &str, reason: String| ModelError::Tensor {
            path: self.file_of(n).to_path_buf(),
            name: n.into(),
            reason,
        };
        let mapped = |n: &str| -> Result<(&Entry, &memmap2::Mmap), ModelError> {
            let e = (self.entries.get(n)).ok_or_else(|| bad(n, "missing".into()))?;
            Ok((e, &self.files[e.file].1))
        };
        let floats = |n: &str| -> Result<Vec<f32>, ModelError> {
            let (e, mmap) = mapped(n)?;
            let values = load::floats(e.dtype, &mmap[e.start..e.end]);
            super::release_pages(mmap, e.start, e.end - e.start);
            values.ok_or_else(|| bad(n, "scales and biases must be bf16, f16 or f32".into()))
        };
        let scales = floats(&format!("{}.scales", plan.module))?;
        let biases = floats(&format!("{}.biases", plan.module))?;
        let (e, mmap) = mapped(name)?;
        let served = load::serve(plan, &mmap[e.start..e.end], &scales, &biases);
        super::release_pages(mmap, e.start, e.end - e.start);
        let (tensor, to_f32) = served.map_err(|r| bad(name, r))?;
        if let Some(mlx) = &self.mlx {
            mlx.record(name, to_f32);
        }
        Ok(tensor)
    }

    /// Bytes `name` takes once loaded: the planned size for a quantized weight, nothing for its
    /// scales and biases (folded into it), the stored size otherwise.
    fn served_bytes(&self, name: &str, e: &Entry) -> u64 {
        match &self.mlx {
            Some(mlx) if mlx.is_companion(name) => 0,
            Some(mlx) => mlx
                .get(name)
                .map_or((e.end - e.start) as u64, |p| p.served_bytes()),
            None => (e.end - e.start) as u64,
        }
    }
}

/// Validates the folder's U32 tensors against the quantization block (header facts only).
fn plan_mlx(
    quant: &MlxQuantization,
    files: &[(PathBuf, Arc<memmap2::Mmap>)],
    entries: &HashMap<String, Entry>,
) -> Result<MlxWeights, ModelError> {
    let u32_names = entries
        .iter()
        .filter(|(_, e)| e.dtype == Dtype::U32)
        .map(|(n, _)| n.as_str());
    let info = |n: &str| entries.get(n).map(|e| (e.dtype, e.shape.as_slice()));
    MlxWeights::plan(quant, u32_names, info).map_err(|(name, reason)| {
        let path = entries
            .get(&name)
            .and_then(|e| files.get(e.file))
            .map(|(p, _)| p.clone())
            .unwrap_or_default();
        ModelError::Tensor { path, name, reason }
    })
}

impl SafetensorsSource {
    /// For an MLX-quantized folder, how many matrices it holds at each code width.
    pub fn mlx_widths(&self) -> Option<std::collections::BTreeMap<u32, usize>> {
        self.mlx.as_ref().map(MlxWeights::widths)
    }
}

impl TensorSource for SafetensorsSource {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn tensor(&self, name: &str) -> Result<Option<HostTensor>, ModelError> {
        let Some(e) = self.entries.get(name) else {
            return Ok(None);
        };
        if let Some(plan) = self.mlx.as_ref().and_then(|m| m.get(name)) {
            return self.quantized(name, plan).map(Some);
        }
        let (path, mmap) = &self.files[e.file];
        let bad = |reason: String| ModelError::Tensor {
            path: path.clone(),
            name: name.into(),
            reason,
        };
        let ty = match e.dtype {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
            Dtype::U32 => {
                return Err(bad(
                    "dtype U32 (MLX-packed codes) needs a quantization block in config.json".into(),
                ));
            }
            other => {
                return Err(bad(format!(
                    "dtype {other:?} is not supported (f32, f16, bf16 are)"
                )));
            }
        };
        let (rows, cols) = match e.shape.as_slice() {
            [c] => (1, *c),
            [r, c] => (*r, *c),
            other => return Err(bad(format!("shape {other:?} is not a matrix or vector"))),
        };
        let bytes = TensorBytes::mapped(mmap.clone(), e.start, e.end - e.start)
            .ok_or_else(|| bad("data offsets past the end of the file".into()))?;
        Ok(Some(HostTensor {
            ty,
            rows,
            cols,
            bytes,
        }))
    }

    fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mlx = self.mlx.as_ref();
        let mut out: Vec<(String, Vec<usize>)> = (self.entries.iter())
            .filter(|(n, _)| !mlx.is_some_and(|m| m.is_companion(n)))
            .map(|(n, e)| match mlx.and_then(|m| m.get(n)) {
                // A quantized weight's logical shape, not its packed one.
                Some(p) => (n.clone(), vec![p.rows, p.cols]),
                None => (n.clone(), e.shape.clone()),
            })
            .collect();
        out.sort();
        out
    }

    fn largest_tensor_bytes(&self) -> u64 {
        let sizes = self.entries.iter().map(|(n, e)| self.served_bytes(n, e));
        sizes.max().unwrap_or(0)
    }

    fn total_tensor_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|(n, e)| self.served_bytes(n, e))
            .sum()
    }

    fn file_of(&self, name: &str) -> &Path {
        match self.entries.get(name).and_then(|e| self.files.get(e.file)) {
            Some((path, _)) => path,
            None => &self.dir,
        }
    }
}

/// A base model saved without its head (`Qwen3Model`, `LlamaModel`: what sentence-transformers
/// and embedding checkpoints ship) names its tensors without the `model.` prefix the
/// causal-LM checkpoints use; those names get it, so both load the same way.
fn with_model_prefix<E>(entries: &mut HashMap<String, E>) {
    let bare = entries.contains_key("embed_tokens.weight")
        && !entries.contains_key("model.embed_tokens.weight");
    if !bare {
        return;
    }
    let names: Vec<String> = entries
        .keys()
        .filter(|n| {
            n.starts_with("embed_tokens.") || n.starts_with("layers.") || n.starts_with("norm.")
        })
        .cloned()
        .collect();
    for n in names {
        if let Some(e) = entries.remove(&n) {
            entries.insert(format!("model.{n}"), e);
        }
    }
}
