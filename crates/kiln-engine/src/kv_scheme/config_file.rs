//! `kv_config.json` (spec §6.2): optiq's per-layer KV bits, read from the model folder.

use std::path::Path;

use super::{AFFINE_KV_BITS, DEFAULT_KV_GROUP_SIZE, KV_GROUP_SIZES, KvQuantSpec, KvSchemeError};

/// The file's name inside a model folder.
pub const KV_CONFIG_FILE: &str = "kv_config.json";

/// Reads `<model_dir>/kv_config.json` for a model of `num_layers` layers: `Ok(None)` when the
/// model has no such file (a GGUF file never has one).
pub fn load_kv_config(
    model_dir: &Path,
    num_layers: usize,
) -> Result<Option<Vec<KvQuantSpec>>, KvSchemeError> {
    if !model_dir.is_dir() {
        return Ok(None);
    }
    let path = model_dir.join(KV_CONFIG_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let name = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|e| KvSchemeError::ConfigFile {
        path: name.clone(),
        reason: e.to_string(),
    })?;
    parse_kv_config(&name, &text, num_layers).map(Some)
}

/// Parses the text of a `kv_config.json` named `path` (for messages): a JSON list of
/// `{layer_idx, bits, group_size?}`, `group_size` defaulting to 64 as optiq's loader does.
/// Entries naming a layer the model does not have, bits or group sizes kiln cannot store, and
/// repeated layers are refused, each message naming the entry.
pub fn parse_kv_config(
    path: &str,
    text: &str,
    num_layers: usize,
) -> Result<Vec<KvQuantSpec>, KvSchemeError> {
    let err = |reason: String| KvSchemeError::ConfigFile {
        path: path.to_string(),
        reason,
    };
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| err(format!("not JSON: {e}")))?;
    let list = json
        .as_array()
        .ok_or_else(|| err("expected a JSON list of {layer_idx, bits, group_size}".into()))?;
    let mut out: Vec<KvQuantSpec> = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let field = |name: &str| -> Result<Option<u64>, KvSchemeError> {
            match entry.get(name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                    err(format!(
                        "entry {i}: {name} must be a nonnegative integer, got {v}"
                    ))
                }),
            }
        };
        if !entry.is_object() {
            return Err(err(format!("entry {i}: expected an object, got {entry}")));
        }
        let layer =
            field("layer_idx")?.ok_or_else(|| err(format!("entry {i}: layer_idx is missing")))?;
        let bits = field("bits")?.ok_or_else(|| err(format!("entry {i}: bits is missing")))?;
        let group = field("group_size")?.unwrap_or(DEFAULT_KV_GROUP_SIZE as u64);
        if layer >= num_layers as u64 {
            return Err(err(format!(
                "entry {i}: layer_idx {layer} is out of range (the model has {num_layers} layers)"
            )));
        }
        let bits = u8::try_from(bits)
            .ok()
            .filter(|b| AFFINE_KV_BITS.contains(b))
            .ok_or_else(|| err(format!("entry {i}: bits must be 4 or 8, got {bits}")))?;
        let group_size = usize::try_from(group)
            .ok()
            .filter(|g| KV_GROUP_SIZES.contains(g))
            .ok_or_else(|| {
                err(format!(
                    "entry {i}: group_size must be 32, 64 or 128, got {group}"
                ))
            })?;
        let layer_idx = layer as usize;
        if out.iter().any(|e| e.layer_idx == layer_idx) {
            return Err(err(format!(
                "entry {i}: layer_idx {layer_idx} is listed twice"
            )));
        }
        out.push(KvQuantSpec {
            layer_idx,
            bits,
            group_size,
        });
    }
    Ok(out)
}
