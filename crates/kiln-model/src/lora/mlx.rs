//! mlx-lm's and optiq's side: `adapters.safetensors` (keys `<path>.lora_a` `[in, r]` and
//! `<path>.lora_b` `[r, out]`, kiln's own orientation) and `optiq_lora_config.json` (spec §8.6).
//! These files carry one scale for all modules (divided by √r of each with rs-LoRA).

use serde_json::{Value, json};

use super::config::{derived_targets, fixed_scale};
use super::tensors::OutTensor;
use super::{LoraAdapter, applied_ranks, json_f32};
use crate::ModelError;

/// The tensors, B unchanged when the module's scale is the one the config rule gives (the
/// trainer's case); otherwise (an adapter read from PEFT with an `alpha_pattern`) the ratio is
/// folded into B, since these files cannot state a per-module scale.
pub(super) fn tensors(adapter: &LoraAdapter) -> Result<Vec<OutTensor>, ModelError> {
    let info = &adapter.info;
    let mut out = Vec::with_capacity(adapter.modules.len() * 2);
    for (path, w) in &adapter.modules {
        let rule = fixed_scale(info.scale, info.rs_lora, w.rank);
        let b = if rule == w.scale {
            w.b.clone()
        } else {
            folded(&w.b, w.scale, rule).map_err(|reason| ModelError::Adapter {
                module: path.clone(),
                reason,
            })?
        };
        out.push(OutTensor {
            name: format!("{path}.lora_a"),
            shape: vec![w.in_features, w.rank],
            values: w.a.clone(),
        });
        out.push(OutTensor {
            name: format!("{path}.lora_b"),
            shape: vec![w.rank, w.out_features],
            values: b,
        });
    }
    Ok(out)
}

/// B·(scale/rule), so that `rule·(x·A)·B'` is `scale·(x·A)·B`.
fn folded(b: &[f32], scale: f32, rule: f32) -> Result<Vec<f32>, String> {
    if rule == 0.0 {
        return Err(format!(
            "its scale {scale} cannot be folded into B against the configured scale 0"
        ));
    }
    let ratio = f64::from(scale) / f64::from(rule);
    let b: Vec<f32> = b.iter().map(|v| (f64::from(*v) * ratio) as f32).collect();
    if b.iter().any(|v| !v.is_finite()) {
        return Err(format!(
            "B times {ratio} (its scale over the configured one) overflows f32"
        ));
    }
    Ok(b)
}

/// `optiq_lora_config.json` as spec §8.6 lists it.
pub(super) fn optiq_config(adapter: &LoraAdapter) -> Value {
    let info = &adapter.info;
    let targets = if info.target_modules.is_empty() {
        derived_targets(&adapter.modules)
    } else {
        info.target_modules.clone()
    };
    json!({
        "rank": info.rank,
        "scale": json_f32(info.scale),
        "rank_scaling": info.rank_scaling,
        "method": info.method,
        "rs_lora": info.rs_lora,
        "target_modules": targets,
        "num_layers": info.num_layers,
        "lora_parameters": {
            "scale": json_f32(info.scale),
            "rank": info.rank,
            "rs_lora": info.rs_lora,
        },
        "applied_ranks": applied_ranks(adapter),
        "source_model": adapter.base_model,
    })
}
