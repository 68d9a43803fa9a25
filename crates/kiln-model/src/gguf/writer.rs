//! GGUF v3 writer. The header (metadata and the tensor directory with every offset) is written
//! first, from the tensors' declared types and shapes; the data then streams one tensor at a
//! time, so writing a model holds one tensor in memory, not the file.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use kiln_kernels::GgmlType;

use super::MetaValue;
use crate::ModelError;

const ALIGNMENT: u64 = 32;

/// A tensor the writer will hold: its name, GGUF dimensions (`dims[0]` innermost) and type.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorSpec {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGUF order.
    pub dims: Vec<u64>,
    /// Storage type.
    pub ty: GgmlType,
}

impl GgufTensorSpec {
    /// Bytes of the tensor's data.
    pub fn size_bytes(&self) -> Result<u64, ModelError> {
        let inner = *self.dims.first().ok_or_else(|| self.bad("no dimensions"))?;
        let row = self
            .ty
            .row_bytes(inner as usize)
            .map_err(|e| self.bad(&e.to_string()))?;
        let rows: u64 = self.dims[1..].iter().product();
        Ok(row as u64 * rows)
    }

    fn bad(&self, reason: &str) -> ModelError {
        ModelError::Tensor {
            path: PathBuf::new(),
            name: self.name.clone(),
            reason: reason.into(),
        }
    }
}

/// Streams a GGUF file: [`GgufWriter::create`] writes the header, then
/// [`GgufWriter::write_tensor`] is called once per tensor in directory order, then
/// [`GgufWriter::finish`].
pub struct GgufWriter {
    path: PathBuf,
    out: BufWriter<std::fs::File>,
    tensors: Vec<(GgufTensorSpec, u64)>,
    next: usize,
}

impl GgufWriter {
    /// Creates `path` and writes the header for `metadata` (written in the order given) and
    /// `tensors`.
    pub fn create(
        path: &Path,
        metadata: &[(String, MetaValue)],
        tensors: Vec<GgufTensorSpec>,
    ) -> Result<Self, ModelError> {
        let file = std::fs::File::create(path).map_err(|e| ModelError::io(path, e))?;
        let mut header = Vec::new();
        header.extend_from_slice(b"GGUF");
        put_u32(&mut header, 3);
        put_u64(&mut header, tensors.len() as u64);
        put_u64(&mut header, metadata.len() as u64);
        for (key, value) in metadata {
            put_string(&mut header, key);
            put_u32(&mut header, value_type(value));
            put_value(&mut header, value);
        }
        let mut offset = 0u64;
        let mut sized = Vec::with_capacity(tensors.len());
        for t in tensors {
            put_string(&mut header, &t.name);
            put_u32(&mut header, t.dims.len() as u32);
            for &d in &t.dims {
                put_u64(&mut header, d);
            }
            put_u32(&mut header, t.ty.id());
            put_u64(&mut header, offset);
            let size = t.size_bytes()?;
            offset += size.div_ceil(ALIGNMENT) * ALIGNMENT;
            sized.push((t, size));
        }
        let padded = (header.len() as u64).div_ceil(ALIGNMENT) * ALIGNMENT;
        header.resize(padded as usize, 0);
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&header)
            .map_err(|e| ModelError::io(path, e))?;
        Ok(Self {
            path: path.into(),
            out,
            tensors: sized,
            next: 0,
        })
    }

    /// Writes the next tensor's data; `name` and the byte count must match the directory.
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<(), ModelError> {
        let Some((spec, size)) = self.tensors.get(self.next) else {
            return Err(self.refuse(name, "more tensors than the header declared"));
        };
        if spec.name != name {
            return Err(self.refuse(name, &format!("expected tensor {:?} next", spec.name)));
        }
        if bytes.len() as u64 != *size {
            return Err(self.refuse(
                name,
                &format!("{} bytes given, the header declared {size}", bytes.len()),
            ));
        }
        let pad = (size.div_ceil(ALIGNMENT) * ALIGNMENT - size) as usize;
        let io = |e| ModelError::io(&self.path, e);
        self.out.write_all(bytes).map_err(io)?;
        self.out
            .write_all(&[0u8; ALIGNMENT as usize][..pad])
            .map_err(io)?;
        self.next += 1;
        Ok(())
    }

    /// Checks that every tensor was written and flushes the file to disk.
    pub fn finish(mut self) -> Result<(), ModelError> {
        if self.next != self.tensors.len() {
            let missing = self.tensors[self.next].0.name.clone();
            return Err(self.refuse(&missing, "never written"));
        }
        let io = |e| ModelError::io(&self.path, e);
        self.out.flush().map_err(io)?;
        self.out.get_ref().sync_all().map_err(io)
    }

    fn refuse(&self, name: &str, reason: &str) -> ModelError {
        ModelError::Tensor {
            path: self.path.clone(),
            name: name.into(),
            reason: reason.into(),
        }
    }
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put_string(b: &mut Vec<u8>, s: &str) {
    put_u64(b, s.len() as u64);
    b.extend_from_slice(s.as_bytes());
}

/// GGUF's value type code for `v`. An empty array has no element to take a type from; it is
/// written as an array of u8, which readers accept for a zero-length array.
fn value_type(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_value(b: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => b.push(*x),
        MetaValue::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => put_u32(b, *x),
        MetaValue::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => put_u64(b, *x),
        MetaValue::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => b.push(u8::from(*x)),
        MetaValue::String(s) => put_string(b, s),
        MetaValue::Array(items) => {
            put_u32(b, items.first().map_or(0, value_type));
            put_u64(b, items.len() as u64);
            for item in items {
                put_value(b, item);
            }
        }
    }
}
