//! Tensors from a Hugging Face folder: `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`. Headers are validated by the `safetensors` crate (offsets,
//! sizes, overlap); kiln then checks dtype and rank.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kiln_kernels::GgmlType;
use safetensors::{Dtype, SafeTensors};

use super::TensorSource;
use crate::ModelError;
use crate::backend::HostTensor;

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
    files: Vec<(PathBuf, memmap2::Mmap)>,
    entries: HashMap<String, Entry>,
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
    /// Opens every weight file of a Hugging Face folder.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
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
            files.push((path, mmap));
        }
        Ok(Self {
            dir: dir.into(),
            files,
            entries,
        })
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
        let bytes = mmap[e.start..e.end].to_vec();
        super::release_pages(mmap, e.start, bytes.len());
        Ok(Some(HostTensor {
            ty,
            rows,
            cols,
            bytes,
        }))
    }

    fn largest_tensor_bytes(&self) -> u64 {
        let sizes = self.entries.values().map(|e| (e.end - e.start) as u64);
        sizes.max().unwrap_or(0)
    }

    fn total_tensor_bytes(&self) -> u64 {
        self.entries
            .values()
            .map(|e| (e.end - e.start) as u64)
            .sum()
    }

    fn file_of(&self, name: &str) -> &Path {
        match self.entries.get(name).and_then(|e| self.files.get(e.file)) {
            Some((path, _)) => path,
            None => &self.dir,
        }
    }
}
