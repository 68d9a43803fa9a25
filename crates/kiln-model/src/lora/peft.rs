//! PEFT's side: `adapter_model.safetensors` (keys `base_model.model.<path>.lora_A.weight`
//! `[r, in]` and `….lora_B.weight` `[out, r]`, the adapter name dropped as PEFT's
//! `save_pretrained` does), the `adapter_config.json` PEFT and mlx-lm both read, and PEFT's
//! scale, `lora_alpha / r` per module (`/√r` with `use_rslora`) after `rank_pattern` and
//! `alpha_pattern`.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::config::{JsonFile, derived_targets};
use super::tensors::{OutTensor, transpose};
use super::{LoraAdapter, applied_ranks, json_f32, layer_index, short_name};
use crate::ModelError;

/// PEFT's `lora_alpha` when a config has none, as spec §8.4 reads it (PEFT's own default is 8,
/// but PEFT always writes the field).
const DEFAULT_ALPHA: f64 = 16.0;

/// PEFT's scaling of a module: `alpha / r`, or `alpha / √r` with rs-LoRA, computed in f64 as
/// Python does. The saver uses the same function to know what PEFT will compute.
fn peft_scale(alpha: f64, rank: usize, rs_lora: bool) -> f32 {
    let r = rank as f64;
    (if rs_lora { alpha / r.sqrt() } else { alpha / r }) as f32
}

/// Alphas are kept in f64 (PEFT computes in Python floats) but must give finite f32 scales.
fn fits_f32(x: f64) -> bool {
    x.is_finite() && x.abs() <= f64::from(f32::MAX)
}

/// PEFT's scale rule as a config states it.
pub(super) struct PeftRule {
    file: std::path::PathBuf,
    r: Option<usize>,
    alpha: f64,
    rs_lora: bool,
    rank_pattern: Vec<(String, usize)>,
    alpha_pattern: Vec<(String, f64)>,
}

impl PeftRule {
    /// Reads `peft_type`, `use_dora`, `r`, `lora_alpha`, `use_rslora` and the two patterns.
    pub(super) fn from_config(f: &JsonFile) -> Result<Self, ModelError> {
        if let Some(t) = f.get(&["peft_type"])
            && t.as_str() != Some("LORA")
        {
            return Err(f.err("peft_type", format!("{t} is not \"LORA\"")));
        }
        if f.bool(&["use_dora"])? == Some(true) {
            return Err(f.err("use_dora", "DoRA adapters are not supported"));
        }
        let r = match f.get(&["r"]) {
            Some(v) => Some(f.rank_value("r", v)?),
            None => None,
        };
        let rank_pattern = patterns(f, "rank_pattern", |key, v| {
            f.rank_value(&format!("rank_pattern.{key}"), v)
        })?;
        let alpha_pattern = patterns(f, "alpha_pattern", |key, v| match v.as_f64() {
            Some(a) if fits_f32(a) => Ok(a),
            _ => Err(f.err(
                &format!("alpha_pattern.{key}"),
                "not a number in f32's range",
            )),
        })?;
        let alpha = match f.number(&["lora_alpha"])? {
            Some(a) if !fits_f32(a) => {
                return Err(f.err("lora_alpha", format!("{a} is beyond f32's range")));
            }
            a => a.unwrap_or(DEFAULT_ALPHA),
        };
        Ok(Self {
            file: f.path.clone(),
            r,
            alpha,
            rs_lora: f.bool(&["use_rslora"])?.unwrap_or(false),
            rank_pattern,
            alpha_pattern,
        })
    }

    /// The s of one module: its config rank must be the rank of its tensors (PEFT itself would
    /// refuse to load the weights otherwise).
    pub(super) fn scale_for(&self, module: &str, rank: usize) -> Result<f32, ModelError> {
        let err = |field: &str, reason: String| ModelError::Config {
            path: self.file.clone(),
            field: field.into(),
            reason,
        };
        let (field, stated) = match find_pattern(&self.rank_pattern, module) {
            Some(r) => ("rank_pattern", Some(r)),
            None => ("r", self.r),
        };
        let r = stated.unwrap_or(rank);
        if r != rank {
            return Err(err(
                field,
                format!("says rank {r} for {module}, whose tensors have rank {rank}"),
            ));
        }
        let alpha = find_pattern(&self.alpha_pattern, module).unwrap_or(self.alpha);
        let s = peft_scale(alpha, r, self.rs_lora);
        if !s.is_finite() {
            return Err(err("lora_alpha", format!("scale {s} for {module}")));
        }
        Ok(s)
    }

    /// (configured scale, rs_lora) in [`super::AdapterInfo`]'s terms: `alpha / r` without
    /// rs-LoRA, `alpha` with it (so that `scale/√r` is PEFT's `alpha/√r`). `fallback_rank`
    /// stands for `r` when the config has none.
    pub(super) fn configured(&self, fallback_rank: usize) -> (f32, bool) {
        let r = self.r.unwrap_or(fallback_rank).max(1);
        let scale = if self.rs_lora {
            self.alpha as f32
        } else {
            peft_scale(self.alpha, r, false)
        };
        (scale, self.rs_lora)
    }
}

/// A `*_pattern` object: keys checked (see [`pattern_key`]), values read by `value`.
fn patterns<T>(
    f: &JsonFile,
    field: &str,
    value: impl Fn(&str, &Value) -> Result<T, ModelError>,
) -> Result<Vec<(String, T)>, ModelError> {
    let Some(v) = f.get(&[field]) else {
        return Ok(Vec::new());
    };
    let obj = v.as_object().ok_or_else(|| f.err(field, "not an object"))?;
    let mut out = Vec::with_capacity(obj.len());
    for (key, v) in obj {
        if !pattern_key(key) {
            return Err(f.err(
                &format!("{field}.{key}"),
                "only module names or dotted suffixes are supported, not regular expressions",
            ));
        }
        out.push((key.clone(), value(key, v)?));
    }
    Ok(out)
}

/// PEFT matches a pattern key as the regex `(.*\.)?(key)$` from the start of the module path.
/// kiln takes the keys that regex treats literally (names, dots, an anchoring `^`, a final `$`)
/// and refuses the rest rather than guess a scale.
fn pattern_key(key: &str) -> bool {
    let body = key.strip_prefix('^').unwrap_or(key);
    let body = body.strip_suffix('$').unwrap_or(body);
    !body.is_empty()
        && body
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
}

/// The pattern value for a module: the key equals its path or a dot-separated suffix of it
/// (`^key`: the whole path only). PEFT takes the first match in file order, which a JSON object
/// here does not keep; the longest matching key wins instead (the most specific).
fn find_pattern<T: Copy>(patterns: &[(String, T)], module: &str) -> Option<T> {
    patterns
        .iter()
        .filter_map(|(key, v)| {
            let anchored = key.starts_with('^');
            let body = key.trim_start_matches('^').trim_end_matches('$');
            let suffix = || {
                module
                    .strip_suffix(body)
                    .is_some_and(|rest| rest.ends_with('.'))
            };
            let hit = module == body || (!anchored && suffix());
            hit.then_some((body.len(), *v))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, v)| v)
}

/// PEFT's tensors: A as `[r, in]`, B as `[out, r]`, unscaled (PEFT applies its alpha/r).
pub(super) fn tensors(adapter: &LoraAdapter) -> Vec<OutTensor> {
    let mut out = Vec::with_capacity(adapter.modules.len() * 2);
    for (path, w) in &adapter.modules {
        out.push(OutTensor {
            name: format!("base_model.model.{path}.lora_A.weight"),
            shape: vec![w.rank, w.in_features],
            values: transpose(&w.a, w.in_features, w.rank),
        });
        out.push(OutTensor {
            name: format!("base_model.model.{path}.lora_B.weight"),
            shape: vec![w.out_features, w.rank],
            values: transpose(&w.b, w.rank, w.out_features),
        });
    }
    out
}

/// `adapter_config.json`: PEFT's fields (with patterns making PEFT's scale of every module
/// equal its `scale`), mlx-lm's (`fine_tune_type`, `num_layers`, `lora_parameters`) and optiq's
/// block (spec §8.6). Unknown keys are dropped with a warning by PEFT and ignored by mlx-lm.
pub(super) fn adapter_config(adapter: &LoraAdapter) -> Value {
    let info = &adapter.info;
    let (alpha, rank_pattern, alpha_pattern) = alphas(adapter);
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": info.rank,
        "lora_alpha": alpha,
        "target_modules": targets(adapter),
        "lora_dropout": json_f32(info.dropout),
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": info.rs_lora,
        "base_model_name_or_path": adapter.base_model,
        "modules_to_save": null,
        "layers_to_transform": layers_to_transform(adapter),
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
        "fine_tune_type": "lora",
        "num_layers": info.num_layers,
        "lora_parameters": {
            "rank": info.rank,
            "scale": json_f32(info.scale),
            "dropout": json_f32(info.dropout),
            "keys": null,
        },
        "optiq": {
            "rank_scaling": info.rank_scaling,
            "applied_ranks": applied_ranks(adapter),
        },
    })
}

/// (`lora_alpha`, `rank_pattern`, `alpha_pattern`): the base alpha is `scale·r` (PEFT's
/// `alpha/r` is then `scale`), or `scale` itself with rs-LoRA (`alpha/√r` is `scale/√r`); a
/// module whose rank differs gets a rank entry, and one whose scale PEFT would not reproduce from
/// the base alpha gets an alpha entry.
fn alphas(adapter: &LoraAdapter) -> (Value, Value, Value) {
    let info = &adapter.info;
    let rs = info.rs_lora;
    let base = if rs {
        json_f32(info.scale)
            .as_f64()
            .unwrap_or(f64::from(info.scale))
    } else {
        alpha_for(info.scale, info.rank, false)
    };
    let (mut ranks, mut alphas) = (Map::new(), Map::new());
    for (path, w) in &adapter.modules {
        if w.rank != info.rank {
            ranks.insert(path.clone(), w.rank.into());
        }
        if peft_scale(base, w.rank, rs) != w.scale {
            alphas.insert(path.clone(), number(alpha_for(w.scale, w.rank, rs)));
        }
    }
    (number(base), Value::Object(ranks), Value::Object(alphas))
}

/// The alpha PEFT turns into the served `scale` of a module of this rank: the short decimal
/// times r (or √r) when that gives `scale` back exactly, else the exact product (which can
/// still be one ulp off with rs-LoRA's √r).
fn alpha_for(scale: f32, rank: usize, rs_lora: bool) -> f64 {
    let k = if rs_lora {
        (rank as f64).sqrt()
    } else {
        rank as f64
    };
    let short = json_f32(scale).as_f64().unwrap_or(f64::from(scale));
    [short * k, f64::from(scale) * k]
        .into_iter()
        .find(|a| peft_scale(*a, rank, rs_lora) == scale)
        .unwrap_or(f64::from(scale) * k)
}

/// An integral value as a JSON integer (PEFT's alphas usually are), else as a float.
fn number(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        Value::from(x as i64)
    } else {
        Value::from(x)
    }
}

/// PEFT adapts every module whose path ends in a `target_modules` entry (within
/// `layers_to_transform`). The short names say exactly that when the modules are every target in
/// every adapted layer, as the trainer makes them; otherwise (a merge of adapters with different
/// targets) the full paths do, so that PEFT creates no module the file lacks.
fn targets(adapter: &LoraAdapter) -> Value {
    let shorts = derived_targets(&adapter.modules);
    // Distinct (layer, name) pairs, one per module, and all of them: the full product.
    let pairs: BTreeSet<(Option<usize>, &str)> = adapter
        .modules
        .keys()
        .map(|p| (layer_index(p), short_name(p)))
        .collect();
    let is_product = module_layers(adapter).is_some_and(|l| {
        pairs.len() == adapter.modules.len() && pairs.len() == l.len() * shorts.len()
    });
    if is_product {
        json!(shorts)
    } else {
        json!(adapter.modules.keys().collect::<Vec<_>>())
    }
}

/// The distinct layer indices of the modules, sorted; `None` when a module has none.
fn module_layers(adapter: &LoraAdapter) -> Option<Vec<usize>> {
    let mut layers: Vec<usize> = adapter
        .modules
        .keys()
        .map(|p| layer_index(p))
        .collect::<Option<_>>()?;
    layers.sort_unstable();
    layers.dedup();
    Some(layers)
}

/// `null` (all layers) unless `num_layers` restricts the blocks; then the layers the modules are
/// in. Every module must have a layer index for the list to say the same thing.
fn layers_to_transform(adapter: &LoraAdapter) -> Value {
    match module_layers(adapter) {
        Some(l) if adapter.info.num_layers >= 0 => json!(l),
        _ => Value::Null,
    }
}
