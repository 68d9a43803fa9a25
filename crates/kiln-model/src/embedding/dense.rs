//! sentence-transformers' Dense modules after pooling (EmbeddingGemma: hidden → 4·hidden →
//! hidden): `act(W·x + b)` on each pooled embedding, on the host.

use std::path::Path;

use serde_json::Value;

use super::bad;
use crate::ModelError;
use crate::files::read_json;
use crate::weights::{SafetensorsSource, TensorSource, require};

/// One Dense module: `out_features × in_features` weights, an optional bias, an activation.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    /// Width it takes.
    pub in_features: usize,
    /// Width it gives.
    pub out_features: usize,
    /// Row-major `[out_features, in_features]`.
    pub weight: Vec<f32>,
    /// One per output, if the module has a bias.
    pub bias: Option<Vec<f32>>,
    /// Whether `tanh` follows (sentence-transformers' default); otherwise the identity.
    pub tanh: bool,
}

impl Dense {
    /// `act(W·x + b)` of one embedding (`x` is `in_features` long).
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let x: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        (0..self.out_features)
            .map(|o| {
                let row = &self.weight[o * self.in_features..(o + 1) * self.in_features];
                let mut y: f64 = row.iter().zip(&x).map(|(w, v)| f64::from(*w) * v).sum();
                if let Some(b) = &self.bias {
                    y += f64::from(b[o]);
                }
                (if self.tanh { y.tanh() } else { y }) as f32
            })
            .collect()
    }
}

/// Runs `x` through `stack` in order.
pub fn apply_all(stack: &[Dense], x: Vec<f32>) -> Vec<f32> {
    stack.iter().fold(x, |x, d| d.apply(&x))
}

/// The Dense module in folder `dir` (its `config.json` and `model.safetensors`, weights under
/// `linear.`).
pub fn dense_from_folder(dir: &Path) -> Result<Dense, ModelError> {
    let cfg_path = dir.join("config.json");
    let cfg = read_json(&cfg_path)?;
    let size = |key: &str| -> Result<usize, ModelError> {
        cfg.get(key)
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| (1..=1 << 20).contains(n))
            .ok_or_else(|| bad(&cfg_path, key, "must be an integer from 1 to 2^20"))
    };
    let (in_features, out_features) = (size("in_features")?, size("out_features")?);
    let activation = cfg
        .get("activation_function")
        .and_then(Value::as_str)
        .unwrap_or("torch.nn.modules.activation.Tanh");
    let tanh = match activation.rsplit('.').next() {
        Some("Tanh") => true,
        Some("Identity") => false,
        _ => {
            return Err(bad(
                &cfg_path,
                "activation_function",
                format!("{activation:?} is not supported (Tanh and Identity are)"),
            ));
        }
    };
    let src = SafetensorsSource::open(dir)?;
    let weight = require(&src, "linear.weight", out_features, in_features)?.to_f32()?;
    let has_bias = cfg.get("bias").and_then(Value::as_bool).unwrap_or(true);
    let bias = match has_bias {
        true => Some(require(&src, "linear.bias", 1, out_features)?.to_f32()?),
        false => None,
    };
    Ok(Dense {
        in_features,
        out_features,
        weight,
        bias,
        tanh,
    })
}

/// Dense tensor `name` of a GGUF source (llama.cpp writes EmbeddingGemma's as `dense_2` and
/// `dense_3`, bias-free, Identity), when the file has it.
pub fn dense_from_tensor(src: &dyn TensorSource, name: &str) -> Result<Option<Dense>, ModelError> {
    let Some((_, shape)) = src.tensor_shapes().into_iter().find(|(n, _)| n == name) else {
        return Ok(None);
    };
    let [out_features, in_features] = shape[..] else {
        return Err(ModelError::Tensor {
            path: src.path().into(),
            name: name.into(),
            reason: format!("shape {shape:?}, expected a matrix"),
        });
    };
    let weight = require(src, name, out_features, in_features)?.to_f32()?;
    Ok(Some(Dense {
        in_features,
        out_features,
        weight,
        bias: None,
        tanh: false,
    }))
}

/// Checks that `stack` chains from `hidden` (each module takes what the one before gives).
pub fn check_chain(path: &Path, stack: &[Dense], hidden: usize) -> Result<(), ModelError> {
    let mut width = hidden;
    for (i, d) in stack.iter().enumerate() {
        if d.in_features != width {
            return Err(bad(
                path,
                "in_features",
                format!(
                    "Dense module {i} takes {} features but gets {width}",
                    d.in_features
                ),
            ));
        }
        width = d.out_features;
    }
    Ok(())
}
