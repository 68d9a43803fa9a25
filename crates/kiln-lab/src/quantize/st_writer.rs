//! A streaming safetensors writer: the header (every tensor's dtype, shape and byte range) is
//! known before any data is written, so tensors are produced and written one at a time instead
//! of being held together as the `safetensors` crate's serializer needs. Shards at a byte cap
//! the way MLX does (spec §7.5).

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::LabError;

/// MLX's shard size: 5 GiB.
pub const SHARD_BYTES: u64 = 5 << 30;

/// One tensor the folder will hold.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTensor {
    /// Tensor name.
    pub name: String,
    /// Safetensors dtype string (`U32`, `BF16`, `F32`…).
    pub dtype: &'static str,
    /// Shape.
    pub shape: Vec<usize>,
    /// Bytes of data.
    pub bytes: u64,
}

/// Tensors assigned to shards, in write order.
pub struct ShardPlan {
    shards: Vec<Vec<PlannedTensor>>,
}

impl ShardPlan {
    /// Greedy sharding in the given order: a shard closes when the next tensor would pass
    /// `cap` (a tensor larger than `cap` gets a shard of its own).
    pub fn new(tensors: Vec<PlannedTensor>, cap: u64) -> Self {
        let mut shards: Vec<Vec<PlannedTensor>> = vec![Vec::new()];
        let mut size = 0u64;
        for t in tensors {
            if size > 0 && size + t.bytes > cap {
                shards.push(Vec::new());
                size = 0;
            }
            size += t.bytes;
            if let Some(shard) = shards.last_mut() {
                shard.push(t);
            }
        }
        ShardPlan { shards }
    }

    /// File names: `model.safetensors` alone, else `model-0000i-of-0000N.safetensors`.
    pub fn file_names(&self) -> Vec<String> {
        let n = self.shards.len();
        if n == 1 {
            return vec!["model.safetensors".into()];
        }
        (1..=n)
            .map(|i| format!("model-{i:05}-of-{n:05}.safetensors"))
            .collect()
    }

    /// Writes the folder: `produce(tensor)` returns each tensor's bytes when its turn comes.
    /// With several shards, `model.safetensors.index.json` is written too.
    pub fn write(
        &self,
        dir: &Path,
        mut produce: impl FnMut(&PlannedTensor) -> Result<Vec<u8>, LabError>,
    ) -> Result<u64, LabError> {
        let names = self.file_names();
        let mut total = 0u64;
        let mut weight_map = BTreeMap::new();
        for (shard, file) in self.shards.iter().zip(&names) {
            let path = dir.join(file);
            let mut out = ShardWriter::create(&path, shard)?;
            for t in shard {
                let bytes = produce(t)?;
                out.write(t, &bytes)?;
                total += t.bytes;
                weight_map.insert(t.name.clone(), Value::String(file.clone()));
            }
            out.finish()?;
        }
        if names.len() > 1 {
            let params: u64 = self
                .shards
                .iter()
                .flatten()
                .map(|t| t.shape.iter().product::<usize>() as u64)
                .sum();
            let index = json!({
                "metadata": {"total_size": total, "total_parameters": params},
                "weight_map": weight_map,
            });
            let path = dir.join("model.safetensors.index.json");
            std::fs::write(&path, serde_json::to_vec_pretty(&index).unwrap_or_default())
                .map_err(|e| LabError::io(&path, e))?;
        }
        Ok(total)
    }
}

struct ShardWriter {
    path: PathBuf,
    out: BufWriter<std::fs::File>,
    next: usize,
    names: Vec<(String, u64)>,
}

impl ShardWriter {
    fn create(path: &Path, tensors: &[PlannedTensor]) -> Result<Self, LabError> {
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), json!({"format": "mlx"}));
        let mut offset = 0u64;
        for t in tensors {
            header.insert(
                t.name.clone(),
                json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.bytes]}),
            );
            offset += t.bytes;
        }
        let mut text = serde_json::to_vec(&Value::Object(header)).unwrap_or_default();
        // The data section starts 8-byte aligned, padded with spaces as the reference writer does.
        while !(text.len() + 8).is_multiple_of(8) {
            text.push(b' ');
        }
        let file = std::fs::File::create(path).map_err(|e| LabError::io(path, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let io = |e| LabError::io(path, e);
        out.write_all(&(text.len() as u64).to_le_bytes())
            .map_err(io)?;
        out.write_all(&text).map_err(io)?;
        Ok(ShardWriter {
            path: path.into(),
            out,
            next: 0,
            names: tensors.iter().map(|t| (t.name.clone(), t.bytes)).collect(),
        })
    }

    fn write(&mut self, t: &PlannedTensor, bytes: &[u8]) -> Result<(), LabError> {
        match self.names.get(self.next) {
            Some((name, size)) if *name == t.name && *size == bytes.len() as u64 => {}
            _ => {
                return Err(LabError::io(
                    &self.path,
                    std::io::Error::other(format!(
                        "tensor {} ({} bytes) is not the next one planned",
                        t.name,
                        bytes.len()
                    )),
                ));
            }
        }
        self.out
            .write_all(bytes)
            .map_err(|e| LabError::io(&self.path, e))?;
        self.next += 1;
        Ok(())
    }

    fn finish(mut self) -> Result<(), LabError> {
        let io = |e| LabError::io(&self.path, e);
        self.out.flush().map_err(io)?;
        self.out.get_ref().sync_all().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(name: &str, n: usize) -> PlannedTensor {
        PlannedTensor {
            name: name.into(),
            dtype: "F32",
            shape: vec![n],
            bytes: 4 * n as u64,
        }
    }

    #[test]
    fn written_shards_read_back_with_the_safetensors_crate() {
        let dir = tempfile::tempdir().unwrap();
        let plan = ShardPlan::new(vec![planned("a", 3), planned("b", 5), planned("c", 2)], 39);
        assert_eq!(
            plan.file_names().len(),
            2,
            "a+b is 32 bytes, c would pass 39"
        );
        plan.write(dir.path(), |t| {
            let n = t.shape[0];
            Ok((0..n)
                .flat_map(|i| (i as f32 + t.name.len() as f32).to_le_bytes())
                .collect())
        })
        .unwrap();
        let bytes = std::fs::read(dir.path().join("model-00001-of-00002.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let b = st.tensor("b").unwrap();
        assert_eq!(b.shape(), &[5]);
        assert_eq!(&b.data()[4..8], &2f32.to_le_bytes());
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(
            meta.metadata()
                .as_ref()
                .and_then(|m| m.get("format"))
                .map(String::as_str),
            Some("mlx")
        );
        let index: Value = serde_json::from_slice(
            &std::fs::read(dir.path().join("model.safetensors.index.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(index["weight_map"]["c"], "model-00002-of-00002.safetensors");
    }

    #[test]
    fn a_tensor_out_of_plan_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let plan = ShardPlan::new(vec![planned("a", 2)], SHARD_BYTES);
        let err = plan.write(dir.path(), |_| Ok(vec![0; 3])).unwrap_err();
        assert!(
            err.to_string().contains("not the next one planned"),
            "{err}"
        );
    }
}
