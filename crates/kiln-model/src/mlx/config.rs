//! The `quantization` block of an MLX model's `config.json` (spec §7.4):
//!
//! ```json
//! "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
//!     "model.layers.0.self_attn.q_proj": {"bits": 8, "group_size": 64},
//!     "lm_head": false}
//! ```
//!
//! The top-level `bits`/`group_size`/`mode` are the default; every other key whose value is an
//! object is a module path (without `.weight`) with its own `{bits, group_size}`; `false` marks a
//! module MLX left unquantized and `true` one that uses the default (mlx-lm's class predicate
//! returns either). `mode: "none"` means no default quantization. MLX writes an identical copy
//! under `quantization_config`, read only when `quantization` is absent — and only as MLX's when
//! it looks like it: Hugging Face's GPTQ/AWQ/… blocks share that key and are refused.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::affine::{SUPPORTED_BITS, SUPPORTED_GROUP_SIZES};
use crate::ModelError;

/// The affine parameters of one quantized module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffineSpec {
    /// Bits per code (2, 3, 4, 5, 6 or 8).
    pub bits: u32,
    /// Elements per scale/bias group (32, 64 or 128).
    pub group_size: usize,
}

/// A model's MLX quantization: the default and the per-module exceptions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MlxQuantization {
    /// What modules not listed in `per_module` use; `None` = left unquantized.
    pub default: Option<AffineSpec>,
    /// Module path (no `.weight`) → its parameters, or `None` for "left unquantized".
    pub per_module: BTreeMap<String, Option<AffineSpec>>,
}

/// Keys of the block that are not module paths.
const RESERVED: [&str; 4] = ["bits", "group_size", "mode", "quant_method"];

impl MlxQuantization {
    /// The quantization of a parsed `config.json`: its `quantization` block, else its
    /// `quantization_config` when that is MLX's; `None` when the model is not quantized.
    /// Errors name the field: a non-MLX `quantization_config` (GPTQ, AWQ, …), unsupported bits
    /// or group sizes, modes other than affine/none, values of the wrong type.
    pub fn from_config(path: &Path, config: &Value) -> Result<Option<Self>, ModelError> {
        if let Some(block) = config.get("quantization").filter(|v| !v.is_null()) {
            return Self::from_block(path, "quantization", block).map(Some);
        }
        let Some(block) = config.get("quantization_config").filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let field = "quantization_config";
        let err = |reason: String| config_err(path, field, reason);
        let obj = block
            .as_object()
            .ok_or_else(|| err(format!("expected an object, found {block}")))?;
        // Hugging Face's GPTQ/AWQ/… blocks name their quant_method, which from_block refuses.
        let has = |k: &str| obj.contains_key(k);
        if !has("quant_method") && !has("bits") && !has("group_size") {
            return Err(err(
                "neither bits nor group_size: not an MLX quantization block".into(),
            ));
        }
        Self::from_block(path, field, block).map(Some)
    }

    /// Parses one block (`field` names it in errors: `quantization` or `quantization_config`).
    pub fn from_block(path: &Path, field: &str, block: &Value) -> Result<Self, ModelError> {
        let obj = block
            .as_object()
            .ok_or_else(|| config_err(path, field, format!("expected an object, found {block}")))?;
        if let Some(method) = obj
            .get("quant_method")
            .filter(|m| m.as_str() != Some("mlx"))
        {
            return Err(config_err(
                path,
                &format!("{field}.quant_method"),
                format!(
                    "{method} is not MLX's affine quantization, the only kind kiln runs from \
                     safetensors"
                ),
            ));
        }
        let default = spec_in(path, field, obj, None)?;
        let mut per_module = BTreeMap::new();
        for (key, value) in obj {
            if RESERVED.contains(&key.as_str()) {
                continue;
            }
            let entry_field = format!("{field}.{key}");
            let spec = match value {
                Value::Bool(false) => None,
                Value::Bool(true) => Some(default.ok_or_else(|| {
                    config_err(
                        path,
                        &entry_field,
                        "true, but there is no default to use".into(),
                    )
                })?),
                Value::Object(entry) => spec_in(path, &entry_field, entry, default)?,
                // Other scalars are not module entries in any MLX writer; an unknown
                // annotation must not stop a model from loading.
                _ => continue,
            };
            per_module.insert(key.clone(), spec);
        }
        Ok(Self {
            default,
            per_module,
        })
    }

    /// The parameters for module `module` (a path without `.weight`): its own entry, else the
    /// default; `None` = not quantized.
    pub fn spec_for(&self, module: &str) -> Option<AffineSpec> {
        match self.per_module.get(module) {
            Some(spec) => *spec,
            None => self.default,
        }
    }

    /// The block as MLX writes it (the same JSON for `quantization` and `quantization_config`):
    /// the default as `group_size`/`bits`/`mode: "affine"` (or `mode: "none"` without one),
    /// then one `{bits, group_size}` object or `false` per module.
    pub fn to_json(&self) -> Value {
        let mut obj = Map::new();
        match self.default {
            Some(spec) => {
                obj.insert("group_size".into(), spec.group_size.into());
                obj.insert("bits".into(), spec.bits.into());
                obj.insert("mode".into(), "affine".into());
            }
            None => {
                obj.insert("mode".into(), "none".into());
            }
        }
        for (module, spec) in &self.per_module {
            let v = match spec {
                Some(s) => serde_json::json!({"bits": s.bits, "group_size": s.group_size}),
                None => Value::Bool(false),
            };
            obj.insert(module.clone(), v);
        }
        Value::Object(obj)
    }
}

fn config_err(path: &Path, field: &str, reason: String) -> ModelError {
    ModelError::Config {
        path: path.to_path_buf(),
        field: field.into(),
        reason,
    }
}

/// The `{bits, group_size, mode}` of an object: `None` for mode `"none"` or when neither number
/// is given and there is no `fallback`; a missing number is taken from `fallback`.
fn spec_in(
    path: &Path,
    field: &str,
    obj: &Map<String, Value>,
    fallback: Option<AffineSpec>,
) -> Result<Option<AffineSpec>, ModelError> {
    match obj.get("mode") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if m == "affine" => {}
        Some(Value::String(m)) if m == "none" => return Ok(None),
        Some(other) => {
            return Err(config_err(
                path,
                &format!("{field}.mode"),
                format!("mode {other} is not supported (affine and none are)"),
            ));
        }
    }
    let number = |key: &str| -> Result<Option<u64>, ModelError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                config_err(
                    path,
                    &format!("{field}.{key}"),
                    format!("expected a non-negative integer, found {v}"),
                )
            }),
        }
    };
    let (bits, group) = (number("bits")?, number("group_size")?);
    let (bits, group) = match (bits, group, fallback) {
        (None, None, None) => return Ok(None),
        (Some(b), Some(g), _) => (b, g),
        (b, g, Some(f)) => (
            b.unwrap_or(u64::from(f.bits)),
            g.unwrap_or(f.group_size as u64),
        ),
        (None, Some(_), None) => {
            return Err(config_err(path, &format!("{field}.bits"), "missing".into()));
        }
        (Some(_), None, None) => {
            return Err(config_err(
                path,
                &format!("{field}.group_size"),
                "missing".into(),
            ));
        }
    };
    if !SUPPORTED_BITS.iter().any(|&b| u64::from(b) == bits) {
        return Err(config_err(
            path,
            &format!("{field}.bits"),
            format!("{bits} is not supported (2, 3, 4, 5, 6, 8 are)"),
        ));
    }
    if !SUPPORTED_GROUP_SIZES.iter().any(|&g| g as u64 == group) {
        return Err(config_err(
            path,
            &format!("{field}.group_size"),
            format!("{group} is not supported (32, 64, 128 are)"),
        ));
    }
    // Both are now small members of the lists above, so the casts are exact.
    Ok(Some(AffineSpec {
        bits: bits as u32,
        group_size: group as usize,
    }))
}
