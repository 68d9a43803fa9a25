//! Where weights come from. Architectures ask for tensors by their Hugging Face names
//! (`model.layers.3.self_attn.q_proj.weight`); each source maps those to its own file layout.

mod gguf_source;
mod safetensors_source;

pub use gguf_source::{GgufSource, unpermute_order};
pub use safetensors_source::{SafetensorsSource, parse_safetensors_header};

use std::path::Path;

use crate::ModelError;
use crate::backend::HostTensor;

/// Drops the resident pages of `map[start..start + len]` once a tensor has been copied out or
/// repacked, so loading holds the weights once (in the backend's storage) rather than twice;
/// the bytes stay in the page cache and fault back in if read again. Best effort: an error
/// changes nothing.
pub(crate) fn release_pages(map: &memmap2::Mmap, start: usize, len: usize) {
    #[cfg(unix)]
    {
        // SAFETY: the mapping is a private read-only file mapping, so no page of it was ever
        // written: DONTNEED only makes later reads of the range (through any slice still
        // alive) fault the same file bytes back in.
        let _ =
            unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
    }
    #[cfg(not(unix))]
    let _ = (map, start, len);
}

/// A model file (or folder of files) that hands out tensors by Hugging Face name.
pub trait TensorSource {
    /// The file or folder, for error messages.
    fn path(&self) -> &Path;
    /// The tensor, or `None` when the file has no tensor of that name.
    fn tensor(&self, name: &str) -> Result<Option<HostTensor>, ModelError>;
    /// Total bytes of tensor data (what loading will hold in memory).
    fn total_tensor_bytes(&self) -> u64;
    /// Bytes of the largest tensor: while it is copied, its mapped pages and its copy are both
    /// resident.
    fn largest_tensor_bytes(&self) -> u64;
    /// Every tensor the source serves, by Hugging Face name, with its logical shape
    /// (`[rows, cols]` or `[len]`), sorted by name.
    fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)>;
    /// The file that holds tensor `name`, so that an error about it names the shard, not only the
    /// folder; [`TensorSource::path`] unless the source spans several files.
    fn file_of(&self, _name: &str) -> &Path {
        self.path()
    }
}

/// Fetches a tensor that must exist and have `rows × cols` elements (rows = 1 for vectors).
pub fn require(
    src: &dyn TensorSource,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<HostTensor, ModelError> {
    let t = src.tensor(name)?.ok_or_else(|| ModelError::Tensor {
        path: src.path().to_path_buf(),
        name: name.into(),
        reason: "missing".into(),
    })?;
    check_shape(src, name, &t, rows, cols)?;
    Ok(t)
}

/// Like [`require`] but for optional tensors (biases, tied heads).
pub fn optional(
    src: &dyn TensorSource,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Option<HostTensor>, ModelError> {
    match src.tensor(name)? {
        None => Ok(None),
        Some(t) => {
            check_shape(src, name, &t, rows, cols)?;
            Ok(Some(t))
        }
    }
}

fn check_shape(
    src: &dyn TensorSource,
    name: &str,
    t: &HostTensor,
    rows: usize,
    cols: usize,
) -> Result<(), ModelError> {
    if t.rows != rows || t.cols != cols {
        return Err(ModelError::Tensor {
            path: src.file_of(name).to_path_buf(),
            name: name.into(),
            reason: format!("shape [{}, {}], expected [{rows}, {cols}]", t.rows, t.cols),
        });
    }
    Ok(())
}
