//! GGUF v2/v3 reader. The header is parsed from untrusted bytes: every count, size, offset and
//! dimension is checked before it is used, and errors name the field that was wrong.

mod metadata;
mod reader;
mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_kernels::GgmlType;
pub use metadata::MetaValue;
use reader::Reader;
pub use writer::{GgufTensorSpec, GgufWriter};

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// More dimensions than this are not used by any tensor type ggml knows.
const MAX_DIMS: u32 = 4;

/// What went wrong while reading a GGUF header.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file ended before a field could be read.
    #[error("truncated at {field}: needs {needed} bytes at offset {offset}")]
    Truncated {
        /// The field being read.
        field: String,
        /// Where it starts.
        offset: u64,
        /// How many bytes it needs.
        needed: u64,
    },
    /// A field holds a value that cannot be right.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The offending field.
        field: String,
        /// Why it was refused.
        reason: String,
    },
}

/// Where one tensor lives in the file and what it holds.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGUF order: `dims[0]` is the innermost (contiguous) one.
    pub dims: Vec<u64>,
    /// Storage type.
    pub ty: GgmlType,
    /// Byte offset from the start of the data section.
    pub offset: u64,
    /// Number of bytes the tensor occupies.
    pub size_bytes: u64,
}

impl GgufTensorInfo {
    /// Total number of elements.
    pub fn elem_count(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF header: metadata, tensor directory and where the data begins.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata key-value pairs.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Tensor directory in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Absolute byte offset of the data section.
    pub data_offset: u64,
}

impl GgufHeader {
    /// Parses the header from the start of a GGUF file; `file_len` is the whole file's length so
    /// that tensor ranges can be checked (it may exceed `bytes.len()` when only a prefix is given).
    pub fn parse(bytes: &[u8], file_len: u64) -> Result<Self, GgufError> {
        let mut r = Reader::new(bytes);
        let magic = r.take(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::Invalid {
                field: "magic".into(),
                reason: format!("expected \"GGUF\", found {magic:02x?}"),
            });
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Invalid {
                field: "version".into(),
                reason: format!("version {version} is not supported (2 and 3 are)"),
            });
        }
        // The smallest tensor-info record is a name length, n_dims, one dim, type and offset.
        let tensor_count = r.count(8 + 4 + 8 + 4 + 8, "tensor_count")?;
        let kv_count = r.count(8 + 4 + 1, "kv_count")?;

        let mut metadata = BTreeMap::new();
        for i in 0..kv_count {
            let key = r.string(&format!("metadata key #{i}"))?;
            let ty = r.u32(&key)?;
            let value = metadata::read_value(&mut r, ty, &key, 0)?;
            metadata.insert(key, value);
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
                _ => {
                    return Err(GgufError::Invalid {
                        field: "general.alignment".into(),
                        reason: format!("{v:?} is not a power of two up to 1 MiB"),
                    });
                }
            },
        };

        let mut tensors = Vec::with_capacity(tensor_count);
        for i in 0..tensor_count {
            tensors.push(read_tensor_info(&mut r, i)?);
        }
        let header_end = r.position() as u64;
        let data_offset = header_end.div_ceil(alignment) * alignment;
        let data_len = file_len
            .checked_sub(data_offset)
            .ok_or_else(|| GgufError::Invalid {
                field: "data section".into(),
                reason: format!(
                    "starts at {data_offset}, past the end of the {file_len}-byte file"
                ),
            })?;
        for t in &tensors {
            check_tensor_range(t, alignment, data_len)?;
        }
        Ok(Self {
            version,
            metadata,
            tensors,
            data_offset,
        })
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// A tensor's directory entry by name.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

fn read_tensor_info(r: &mut Reader<'_>, index: usize) -> Result<GgufTensorInfo, GgufError> {
    let name = r.string(&format!("tensor #{index} name"))?;
    let n_dims = r.u32(&format!("{name}: n_dims"))?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(GgufError::Invalid {
            field: format!("{name}: n_dims"),
            reason: format!("{n_dims} dimensions (1 to {MAX_DIMS} are valid)"),
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    let mut elems: u64 = 1;
    for d in 0..n_dims {
        let dim = r.u64(&format!("{name}: dims[{d}]"))?;
        elems = elems
            .checked_mul(dim)
            .filter(|&e| e > 0 && e < (1 << 40))
            .ok_or_else(|| GgufError::Invalid {
                field: format!("{name}: dims"),
                reason: format!("dimension {dim} makes the element count zero or absurd"),
            })?;
        dims.push(dim);
    }
    let type_id = r.u32(&format!("{name}: type"))?;
    let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::Invalid {
        field: format!("{name}: type"),
        reason: format!("unknown or unsupported tensor type id {type_id}"),
    })?;
    let offset = r.u64(&format!("{name}: offset"))?;
    // Rows are dims[0] long; a quantized row must hold whole blocks.
    let row_bytes = ty
        .row_bytes(dims[0] as usize)
        .map_err(|e| GgufError::Invalid {
            field: format!("{name}: dims[0]"),
            reason: e.to_string(),
        })?;
    let rows = elems / dims[0];
    let size_bytes = (row_bytes as u64)
        .checked_mul(rows)
        .ok_or_else(|| GgufError::Invalid {
            field: format!("{name}: size"),
            reason: "byte size overflows".into(),
        })?;
    Ok(GgufTensorInfo {
        name,
        dims,
        ty,
        offset,
        size_bytes,
    })
}

fn check_tensor_range(t: &GgufTensorInfo, alignment: u64, data_len: u64) -> Result<(), GgufError> {
    if !t.offset.is_multiple_of(alignment) {
        return Err(GgufError::Invalid {
            field: format!("{}: offset", t.name),
            reason: format!("{} is not aligned to {alignment}", t.offset),
        });
    }
    match t.offset.checked_add(t.size_bytes) {
        Some(end) if end <= data_len => Ok(()),
        _ => Err(GgufError::Invalid {
            field: format!("{}: offset", t.name),
            reason: format!(
                "{} bytes at offset {} run past the {data_len}-byte data section",
                t.size_bytes, t.offset
            ),
        }),
    }
}

/// A GGUF file opened for reading: the parsed header over a memory map of the whole file.
pub struct GgufFile {
    path: PathBuf,
    header: GgufHeader,
    mmap: std::sync::Arc<memmap2::Mmap>,
}

impl GgufFile {
    /// Opens and validates a GGUF file. Tensor data is not read until asked for.
    pub fn open(path: &Path) -> Result<Self, crate::ModelError> {
        let file = std::fs::File::open(path).map_err(|e| crate::ModelError::io(path, e))?;
        // SAFETY: the map is read-only; kiln never writes model files while they are loaded, and a
        // file truncated underneath us is the same hazard every mmap-based loader accepts.
        let mmap =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|e| crate::ModelError::io(path, e))?;
        let header = GgufHeader::parse(&mmap, mmap.len() as u64).map_err(|source| {
            crate::ModelError::Gguf {
                path: path.to_path_buf(),
                source,
            }
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            header,
            mmap: std::sync::Arc::new(mmap),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The raw bytes of a tensor (ranges were validated at open).
    pub fn tensor_data(&self, info: &GgufTensorInfo) -> &[u8] {
        let start = (self.header.data_offset + info.offset) as usize;
        &self.mmap[start..start + info.size_bytes as usize]
    }

    /// A tensor's bytes as a range of the file's map: no copy is made, and the map stays
    /// alive while the range does (ranges were validated at open).
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> crate::backend::TensorBytes {
        let start = (self.header.data_offset + info.offset) as usize;
        let len = info.size_bytes as usize;
        crate::backend::TensorBytes::Mapped {
            map: self.mmap.clone(),
            start,
            len,
        }
    }
}

#[cfg(test)]
mod tests;
