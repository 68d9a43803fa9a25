//! Request fields shared by every generation endpoint, and how they become engine settings:
//! precedence request → server flag → `generation_config.json` → built-in default (spec §3.1).

use std::collections::BTreeMap;

use kiln_engine::sampler::{DEFAULT_PENALTY_CONTEXT, SamplingParams};
use serde::Deserialize;
use serde_json::Value;

use crate::errors::ApiError;
use crate::state::AppState;

/// Last-resort temperature when nobody set one (spec §3.1).
pub const FALLBACK_TEMPERATURE: f32 = 0.7;
/// Most stop strings a request may carry.
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes.
pub const MAX_STOP_LEN: usize = 512;

/// Sampling fields of a request (all optional).
#[derive(Debug, Default, Deserialize)]
pub struct SamplingFields {
    /// Softmax temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Top-k (negative means off).
    pub top_k: Option<i64>,
    /// Min-p.
    pub min_p: Option<f32>,
    /// Seed.
    pub seed: Option<i64>,
    /// XTC probability.
    pub xtc_probability: Option<f32>,
    /// XTC threshold.
    pub xtc_threshold: Option<f32>,
    /// Token id → bias.
    pub logit_bias: Option<Value>,
    /// Repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Its window.
    pub repetition_context_size: Option<usize>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Its window.
    pub presence_context_size: Option<usize>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Its window.
    pub frequency_context_size: Option<usize>,
}

impl SamplingFields {
    /// Engine sampling settings for these fields under `state`'s and `model`'s defaults; `top_logprobs`
    /// requested alternatives, `logprobs` whether the chosen token's logprob is reported.
    pub fn resolve(
        &self,
        state: &AppState,
        model: &crate::state::ModelInfo,
        logprobs: bool,
        top_logprobs: usize,
        allow_logit_bias: bool,
    ) -> Result<SamplingParams, ApiError> {
        let defaults = &model.generation;
        let cfg = &state.config;
        let logit_bias = match &self.logit_bias {
            Some(v) if !v.is_null() => {
                if !allow_logit_bias {
                    return Err(ApiError::bad_request("logit_bias is not supported here"));
                }
                parse_logit_bias(v)?
            }
            _ => Vec::new(),
        };
        let params = SamplingParams {
            temperature: self
                .temperature
                .or(cfg.temperature)
                .or(defaults.temperature)
                .unwrap_or(FALLBACK_TEMPERATURE),
            top_p: self.top_p.or(cfg.top_p).or(defaults.top_p).unwrap_or(0.0),
            top_k: match self.top_k {
                Some(k) => k.max(0) as usize,
                None => cfg.top_k.or(defaults.top_k).unwrap_or(0),
            },
            min_p: self.min_p.unwrap_or(0.0),
            xtc_probability: self.xtc_probability.unwrap_or(0.0),
            xtc_threshold: self.xtc_threshold.unwrap_or(0.0),
            seed: match self.seed {
                Some(s) => s as u64,
                None => state.fresh_seed(),
            },
            logit_bias,
            repetition_penalty: self
                .repetition_penalty
                .or(defaults.repetition_penalty)
                .unwrap_or(0.0),
            repetition_context_size: self
                .repetition_context_size
                .unwrap_or(DEFAULT_PENALTY_CONTEXT),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            presence_context_size: self
                .presence_context_size
                .unwrap_or(DEFAULT_PENALTY_CONTEXT),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            frequency_context_size: self
                .frequency_context_size
                .unwrap_or(DEFAULT_PENALTY_CONTEXT),
            logprobs: logprobs || top_logprobs > 0,
            top_logprobs,
            ..SamplingParams::default()
        };
        params
            .validate_for_vocab(model.vocab_size)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        Ok(params)
    }
}

fn parse_logit_bias(v: &Value) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = || ApiError::bad_request("logit_bias must be a dict of int to float");
    let map = v.as_object().ok_or_else(bad)?;
    map.iter()
        .map(|(k, b)| {
            let id: u32 = k.trim().parse().map_err(|_| bad())?;
            let bias = b.as_f64().ok_or_else(bad)? as f32;
            Ok((id, bias))
        })
        .collect()
}

/// `stop` as a string or an array of strings; empty strings are dropped.
pub fn parse_stop(v: Option<&Value>, field: &str) -> Result<Vec<String>, ApiError> {
    let list: Vec<String> = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                ApiError::bad_request(format!("{field} must be a string or an array of strings"))
            })?,
        Some(_) => {
            return Err(ApiError::bad_request(format!(
                "{field} must be a string or an array of strings"
            )));
        }
    };
    let list: Vec<String> = list.into_iter().filter(|s| !s.is_empty()).collect();
    if list.len() > MAX_STOP_STRINGS {
        return Err(ApiError::bad_request(format!(
            "{field} accepts at most {MAX_STOP_STRINGS} strings, got {}",
            list.len()
        )));
    }
    if list.iter().any(|s| s.len() > MAX_STOP_LEN) {
        return Err(ApiError::bad_request(format!(
            "{field} strings must be at most {MAX_STOP_LEN} bytes"
        )));
    }
    Ok(list)
}

/// `top_logprobs`: an int in [0, 11], or -1 meaning unset.
pub fn parse_top_logprobs(v: Option<&Value>) -> Result<usize, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(0),
        Some(v) => {
            let n = v
                .as_i64()
                .ok_or_else(|| ApiError::bad_request("top_logprobs must be of type int"))?;
            if n == -1 {
                return Ok(0);
            }
            if n < 0 {
                return Err(ApiError::bad_request("top_logprobs must be at least 0"));
            }
            if n > kiln_engine::sampler::MAX_TOP_LOGPROBS as i64 {
                return Err(ApiError::bad_request("top_logprobs must be at most 11"));
            }
            Ok(n as usize)
        }
    }
}

/// Whether `map` has a key (used to reject unsupported options loudly).
pub fn has(map: &BTreeMap<String, Value>, key: &str) -> bool {
    map.get(key).is_some_and(|v| !v.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stop_forms() {
        assert_eq!(parse_stop(Some(&json!("x")), "stop").unwrap(), vec!["x"]);
        assert_eq!(
            parse_stop(Some(&json!(["a", "", "b"])), "stop").unwrap(),
            vec!["a", "b"]
        );
        assert!(parse_stop(Some(&json!(3)), "stop").is_err());
        assert!(parse_stop(Some(&json!([1])), "stop").is_err());
        let many: Vec<String> = (0..1000).map(|i| format!("s{i}")).collect();
        let e = parse_stop(Some(&json!(many)), "stop").unwrap_err();
        assert!(e.message.contains("at most"));
    }

    #[test]
    fn top_logprobs_bounds() {
        assert_eq!(parse_top_logprobs(Some(&json!(-1))).unwrap(), 0);
        assert_eq!(parse_top_logprobs(Some(&json!(5))).unwrap(), 5);
        assert!(parse_top_logprobs(Some(&json!(12))).is_err());
        assert!(parse_top_logprobs(Some(&json!("2"))).is_err());
    }

    #[test]
    fn logit_bias_shape() {
        assert_eq!(
            parse_logit_bias(&json!({"12": -100})).unwrap(),
            vec![(12, -100.0)]
        );
        assert!(parse_logit_bias(&json!({"x": 1})).is_err());
        assert!(parse_logit_bias(&json!([1])).is_err());
    }
}
