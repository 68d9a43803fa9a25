//! The adapter's JSON files: the scale each module is served with (spec §8.4's order) and the
//! rest of what they say ([`AdapterInfo`]). Fields that change the arithmetic (scales, ranks,
//! alphas, rs-LoRA) must have the right type or the adapter is refused; descriptive fields of the
//! wrong type are ignored, since other tools write them loosely (PEFT's `target_modules` may be
//! a regular expression string).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::peft::PeftRule;
use super::tensors::Layout;
use super::{ADAPTER_CONFIG_FILE, AdapterInfo, LoraWeights, OPTIQ_CONFIG_FILE, short_name};
use crate::ModelError;

/// Real configs are kilobytes, even with a per-module `rank_pattern`.
const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// mlx-lm's scale when `lora_parameters` has none (spec §8.4).
const MLX_DEFAULT_SCALE: f32 = 20.0;

/// One parsed JSON object, with its path for errors.
pub(super) struct JsonFile {
    pub(super) path: PathBuf,
    json: Value,
}

impl JsonFile {
    /// The file if it exists; it must then be a JSON object of sane size.
    fn read_opt(path: PathBuf) -> Result<Option<Self>, ModelError> {
        if !path.exists() {
            return Ok(None);
        }
        let len = std::fs::metadata(&path)
            .map_err(|e| ModelError::io(&path, e))?
            .len();
        let err = |reason: String| ModelError::Config {
            path: path.clone(),
            field: "(file)".into(),
            reason,
        };
        if len > MAX_CONFIG_BYTES {
            return Err(err(format!(
                "{len} bytes is too large for an adapter config"
            )));
        }
        let bytes = std::fs::read(&path).map_err(|e| ModelError::io(&path, e))?;
        let json: Value = serde_json::from_slice(&bytes).map_err(|e| err(e.to_string()))?;
        if !json.is_object() {
            return Err(err("not a JSON object".into()));
        }
        Ok(Some(Self { path, json }))
    }

    /// The value at a key path; `null` counts as absent.
    pub(super) fn get(&self, keys: &[&str]) -> Option<&Value> {
        let mut v = &self.json;
        for k in keys {
            v = v.get(k)?;
        }
        (!v.is_null()).then_some(v)
    }

    /// An error naming the field.
    pub(super) fn err(&self, field: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Config {
            path: self.path.clone(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// A finite number, if present.
    pub(super) fn number(&self, keys: &[&str]) -> Result<Option<f64>, ModelError> {
        let Some(v) = self.get(keys) else {
            return Ok(None);
        };
        match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(self.err(&keys.join("."), format!("{v} is not a finite number"))),
        }
    }

    /// A number that must fit a finite f32 (scales).
    fn scale(&self, keys: &[&str]) -> Result<Option<f32>, ModelError> {
        match self.number(keys)? {
            Some(x) if !(x as f32).is_finite() => {
                Err(self.err(&keys.join("."), format!("{x} does not fit an f32")))
            }
            x => Ok(x.map(|x| x as f32)),
        }
    }

    /// A boolean, if present.
    pub(super) fn bool(&self, keys: &[&str]) -> Result<Option<bool>, ModelError> {
        match self.get(keys) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(&keys.join("."), format!("{v} is not true or false"))),
        }
    }

    /// A positive integer (a rank), if present; `what` names the field in the error.
    pub(super) fn rank_value(&self, what: &str, v: &Value) -> Result<usize, ModelError> {
        match v.as_u64().and_then(|r| usize::try_from(r).ok()) {
            Some(r) if r >= 1 => Ok(r),
            _ => Err(self.err(what, format!("{v} is not a positive integer rank"))),
        }
    }

    /// Lenient: a positive integer, or nothing.
    fn loose_rank(&self, keys: &[&str]) -> Option<usize> {
        let r = self.get(keys)?.as_u64()?;
        usize::try_from(r).ok().filter(|r| *r >= 1)
    }

    /// Lenient: a string, or nothing.
    fn loose_str(&self, keys: &[&str]) -> Option<String> {
        self.get(keys)?.as_str().map(String::from)
    }

    /// Lenient: a list of strings, or nothing.
    fn loose_strings(&self, keys: &[&str]) -> Option<Vec<String>> {
        let list = self.get(keys)?.as_array()?;
        list.iter().map(|v| v.as_str().map(String::from)).collect()
    }

    /// Lenient: an integer, or nothing.
    fn loose_i64(&self, keys: &[&str]) -> Option<i64> {
        self.get(keys)?.as_i64()
    }
}

/// How each module's scale is computed.
pub(super) enum ScaleRule {
    /// mlx-lm / optiq: one scale, divided by √r of each module with rs-LoRA.
    Fixed { scale: f32, rs_lora: bool },
    /// PEFT: `lora_alpha / r` per module, with its patterns.
    Peft(PeftRule),
}

impl ScaleRule {
    /// The s for a module of this path and (tensor) rank.
    pub(super) fn scale_for(&self, module: &str, rank: usize) -> Result<f32, ModelError> {
        match self {
            Self::Fixed { scale, rs_lora } => Ok(fixed_scale(*scale, *rs_lora, rank)),
            Self::Peft(rule) => rule.scale_for(module, rank),
        }
    }

    /// (configured scale, rs_lora), the way [`AdapterInfo`] states them; `fallback_rank` is
    /// PEFT's `r` when its config has none.
    fn configured(&self, fallback_rank: usize) -> (f32, bool) {
        match self {
            Self::Fixed { scale, rs_lora } => (*scale, *rs_lora),
            Self::Peft(rule) => rule.configured(fallback_rank),
        }
    }
}

/// mlx-lm's and optiq's s: `scale`, or `scale/√r` with rs-LoRA (spec §8.4). The saver uses the
/// same function to know what a reader will compute.
pub(super) fn fixed_scale(scale: f32, rs_lora: bool, rank: usize) -> f32 {
    if rs_lora {
        scale / (rank as f32).sqrt()
    } else {
        scale
    }
}

/// The two config files a folder may have.
pub(super) struct Configs {
    optiq: Option<JsonFile>,
    adapter: Option<JsonFile>,
}

impl Configs {
    /// Reads whichever of the two exist.
    pub(super) fn read(dir: &Path) -> Result<Self, ModelError> {
        Ok(Self {
            optiq: JsonFile::read_opt(dir.join(OPTIQ_CONFIG_FILE))?,
            adapter: JsonFile::read_opt(dir.join(ADAPTER_CONFIG_FILE))?,
        })
    }

    /// Spec §8.4's order: optiq's `lora_parameters.scale` (or its top-level `scale`), then
    /// `adapter_config.json`'s `lora_parameters.scale` (20 when the block has none), then PEFT's
    /// `lora_alpha / r`. PEFT's own weights file with a PEFT config (`peft_type` set) always takes
    /// PEFT's rule: its B was saved for that rule, whatever other blocks say.
    pub(super) fn scale_rule(&self, dir: &Path, layout: Layout) -> Result<ScaleRule, ModelError> {
        if let Some(adapter) = &self.adapter
            && layout == Layout::Peft
            && adapter.get(&["peft_type"]).is_some()
        {
            return Ok(ScaleRule::Peft(PeftRule::from_config(adapter)?));
        }
        if let Some(rule) = self.optiq_rule()? {
            return Ok(rule);
        }
        let Some(adapter) = &self.adapter else {
            return Err(ModelError::Config {
                path: dir.join(ADAPTER_CONFIG_FILE),
                field: "(file)".into(),
                reason: "missing (and no optiq_lora_config.json): the scale is unknown".into(),
            });
        };
        if let Some(params) = adapter.get(&["lora_parameters"]) {
            if !params.is_object() {
                return Err(adapter.err("lora_parameters", "not an object"));
            }
            let scale = adapter.scale(&["lora_parameters", "scale"])?;
            let rs_lora = match adapter.bool(&["lora_parameters", "rs_lora"])? {
                Some(b) => b,
                None => adapter.bool(&["use_rslora"])?.unwrap_or(false),
            };
            return Ok(ScaleRule::Fixed {
                scale: scale.unwrap_or(MLX_DEFAULT_SCALE),
                rs_lora,
            });
        }
        Ok(ScaleRule::Peft(PeftRule::from_config(adapter)?))
    }

    /// optiq's rule, when its file states a scale.
    fn optiq_rule(&self) -> Result<Option<ScaleRule>, ModelError> {
        let Some(optiq) = &self.optiq else {
            return Ok(None);
        };
        let scale = match optiq.scale(&["lora_parameters", "scale"])? {
            Some(s) => s,
            None => match optiq.scale(&["scale"])? {
                Some(s) => s,
                None => return Ok(None),
            },
        };
        let rs_lora = match optiq.bool(&["lora_parameters", "rs_lora"])? {
            Some(b) => b,
            None => optiq.bool(&["rs_lora"])?.unwrap_or(false),
        };
        Ok(Some(ScaleRule::Fixed { scale, rs_lora }))
    }

    /// `source_model` (optiq) or `base_model_name_or_path` (PEFT, mlx-lm).
    pub(super) fn base_model(&self) -> Option<String> {
        let optiq = self
            .optiq
            .as_ref()
            .and_then(|f| f.loose_str(&["source_model"]));
        optiq.or_else(|| {
            let adapter = self.adapter.as_ref()?;
            adapter.loose_str(&["base_model_name_or_path"])
        })
    }

    /// Everything besides the tensors, each field from the first file that states it.
    pub(super) fn info(
        &self,
        rule: &ScaleRule,
        modules: &BTreeMap<String, LoraWeights>,
    ) -> AdapterInfo {
        let max_rank = modules.values().map(|w| w.rank).max().unwrap_or(0);
        let (scale, rs_lora) = rule.configured(max_rank);
        let defaults = AdapterInfo::default();
        let o = self.optiq.as_ref();
        let a = self.adapter.as_ref();
        AdapterInfo {
            rank: first(&[
                o.and_then(|f| f.loose_rank(&["rank"])),
                o.and_then(|f| f.loose_rank(&["lora_parameters", "rank"])),
                a.and_then(|f| f.loose_rank(&["lora_parameters", "rank"])),
                a.and_then(|f| f.loose_rank(&["r"])),
            ])
            .unwrap_or(max_rank),
            scale,
            rs_lora,
            method: o
                .and_then(|f| f.loose_str(&["method"]))
                .unwrap_or(defaults.method),
            rank_scaling: o
                .and_then(|f| f.loose_str(&["rank_scaling"]))
                .or_else(|| a.and_then(|f| f.loose_str(&["optiq", "rank_scaling"])))
                .unwrap_or_else(|| "constant".into()),
            target_modules: o
                .and_then(|f| f.loose_strings(&["target_modules"]))
                .or_else(|| a.and_then(|f| f.loose_strings(&["target_modules"])))
                .or_else(|| a.and_then(|f| f.loose_strings(&["lora_parameters", "keys"])))
                .unwrap_or_else(|| derived_targets(modules)),
            num_layers: o
                .and_then(|f| f.loose_i64(&["num_layers"]))
                .or_else(|| a.and_then(|f| f.loose_i64(&["num_layers"])))
                .unwrap_or(-1),
            dropout: self.dropout().unwrap_or(defaults.dropout),
        }
    }

    /// mlx-lm's `lora_parameters.dropout`, else PEFT's `lora_dropout`.
    fn dropout(&self) -> Option<f32> {
        let a = self.adapter.as_ref()?;
        let v = a
            .get(&["lora_parameters", "dropout"])
            .or_else(|| a.get(&["lora_dropout"]))?;
        v.as_f64().map(|d| d as f32).filter(|d| d.is_finite())
    }
}

/// The first stated value.
fn first<T: Copy>(values: &[Option<T>]) -> Option<T> {
    values.iter().find_map(|v| *v)
}

/// The modules' distinct last path components, sorted: what PEFT's `target_modules` would be.
pub(super) fn derived_targets(modules: &BTreeMap<String, LoraWeights>) -> Vec<String> {
    let mut names: Vec<String> = modules.keys().map(|p| short_name(p).to_string()).collect();
    names.sort();
    names.dedup();
    names
}
