//! The trainer's parameters as an adapter file set (PEFT and mlx-lm layouts, spec §8.6).

use kiln_model::lora::{AdapterInfo, LoraAdapter, LoraWeights};
use kiln_train::lora::LoraParam;

use super::config::{FinetuneConfig, MethodName, RankScaling};

/// The adapter of `params`, trained with `cfg` on `base_model`.
pub fn adapter_from_params(
    params: &[LoraParam],
    cfg: &FinetuneConfig,
    base_model: &str,
) -> LoraAdapter {
    let modules = params
        .iter()
        .map(|p| {
            let w = LoraWeights {
                in_features: p.in_features,
                out_features: p.out_features,
                rank: p.rank,
                a: p.a.clone(),
                b: p.b.clone(),
                scale: p.scale,
            };
            (p.path.clone(), w)
        })
        .collect();
    LoraAdapter {
        modules,
        base_model: (!base_model.is_empty()).then(|| base_model.to_string()),
        info: AdapterInfo {
            rank: cfg.rank,
            scale: cfg.scale,
            rs_lora: cfg.rs_lora,
            method: match cfg.method {
                MethodName::Sft => "sft",
                MethodName::Dpo => "dpo",
                MethodName::Orpo => "orpo",
            }
            .into(),
            rank_scaling: match cfg.rank_scaling {
                RankScaling::ByBits => "by_bits",
                RankScaling::ByKl => "by_kl",
                RankScaling::Constant => "constant",
            }
            .into(),
            target_modules: cfg.target_modules.clone(),
            num_layers: cfg.num_layers,
            dropout: cfg.lora_dropout,
        },
    }
}
