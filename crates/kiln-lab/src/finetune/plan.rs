//! From a fine-tune config and the base model to the trainer's LoRA plan: targets, the blocks
//! adapted, and each module's rank under `rank_scaling` (spec §8.5).

use std::collections::BTreeMap;
use std::path::Path;

use kiln_model::config::ModelConfig;
use kiln_train::lora::LoraPlan;

use super::config::{FinetuneConfig, RankScaling};

/// The plan for `cfg` on a model with `model`'s shape. `metadata` is the model folder's
/// `optiq_metadata.json` when it has one: its `per_layer` bits drive `by_bits` for modules
/// whose storage no longer says (MLX widths kiln loads as f32), its `sensitivity` KL drives
/// `by_kl`. Returns the plan and a warning when `by_kl` had no KL to use.
pub fn lora_plan(
    cfg: &FinetuneConfig,
    model: &ModelConfig,
    metadata: Option<&serde_json::Value>,
) -> (LoraPlan, Option<String>) {
    let first_layer = match cfg.num_layers {
        n if n > 0 => model.num_layers.saturating_sub(n as usize),
        _ => 0,
    };
    let mut plan = LoraPlan {
        targets: cfg.target_modules.clone(),
        first_layer,
        rank: cfg.rank,
        ranks: BTreeMap::new(),
        scale: cfg.scale,
        rs_lora: cfg.rs_lora,
        seed: cfg.seed,
        dropout: cfg.lora_dropout,
        by_bits: cfg.rank_scaling != RankScaling::Constant,
    };
    if cfg.rank_scaling == RankScaling::Constant {
        plan.rank = plan.rank.max(2);
        return (plan, None);
    }
    let per_layer = metadata
        .and_then(|m| m.get("per_layer"))
        .and_then(|v| v.as_object());
    if let Some(bits) = per_layer {
        for (module, b) in bits {
            if let Some(b) = b.as_u64() {
                plan.ranks
                    .insert(module.clone(), (cfg.rank * b as usize).div_ceil(4).max(2));
            }
        }
    }
    if cfg.rank_scaling == RankScaling::ByKl {
        match kl_ranks(cfg.rank, metadata) {
            Some(ranks) => plan.ranks = ranks,
            None => {
                return (
                    plan,
                    Some(
                        "rank_scaling by_kl: the model has no per-layer KL; ranks follow by_bits"
                            .into(),
                    ),
                );
            }
        }
    }
    (plan, None)
}

/// `max(2, ⌈rank·clip(kl/median, 0.5, 2)⌉)` per module from the metadata's sensitivity rows
/// (the KL at the module's chosen width, else its largest), `median = sorted[⌊n/2⌋]`.
fn kl_ranks(rank: usize, metadata: Option<&serde_json::Value>) -> Option<BTreeMap<String, usize>> {
    let meta = metadata?;
    let rows = meta.get("sensitivity")?.as_array()?;
    let chosen = meta.get("per_layer").and_then(|v| v.as_object());
    let mut kls = Vec::new();
    for row in rows {
        let module = row.get("module")?.as_str()?;
        let table = row.get("kl")?.as_object()?;
        let at_chosen = chosen
            .and_then(|c| c.get(module))
            .and_then(|b| b.as_u64())
            .and_then(|b| table.get(&b.to_string()))
            .and_then(|v| v.as_f64());
        let largest = table
            .values()
            .filter_map(|v| v.as_f64())
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        if let Some(kl) = at_chosen.or(largest).filter(|k| k.is_finite() && *k >= 0.0) {
            kls.push((module.to_string(), kl));
        }
    }
    if kls.is_empty() {
        return None;
    }
    let mut sorted: Vec<f64> = kls.iter().map(|k| k.1).collect();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    if median <= 0.0 {
        return None;
    }
    Some(
        kls.into_iter()
            .map(|(m, kl)| {
                (
                    m,
                    ((rank as f64 * (kl / median).clamp(0.5, 2.0)).ceil() as usize).max(2),
                )
            })
            .collect(),
    )
}

/// A folder model's `optiq_metadata.json`, if it has a readable one.
pub fn read_metadata(model_path: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(model_path.join("optiq_metadata.json")).ok()?;
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(scaling: RankScaling) -> FinetuneConfig {
        FinetuneConfig {
            rank: 8,
            rank_scaling: scaling,
            num_layers: 2,
            ..Default::default()
        }
    }

    fn model() -> ModelConfig {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/reference/tiny/llama");
        kiln_model::files::ModelFiles::open(&dir)
            .map(|f| f.config)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn by_kl_scales_around_the_median_and_falls_back_without_kl() {
        let meta = json!({
            "per_layer": {"model.layers.0.mlp.up_proj": 8},
            "sensitivity": [
                {"module": "model.layers.0.mlp.up_proj", "params": 1, "kl": {"4": 9.0, "8": 0.4}},
                {"module": "model.layers.1.mlp.up_proj", "params": 1, "kl": {"4": 0.1}},
                {"module": "model.layers.2.mlp.up_proj", "params": 1, "kl": {"4": 0.2}}
            ]
        });
        let (plan, warning) = lora_plan(&cfg(RankScaling::ByKl), &model(), Some(&meta));
        assert!(warning.is_none());
        assert_eq!(plan.first_layer, 2);
        assert_eq!(
            plan.ranks["model.layers.0.mlp.up_proj"], 16,
            "0.4 / 0.2 = 2"
        );
        assert_eq!(
            plan.ranks["model.layers.1.mlp.up_proj"], 4,
            "clipped at 0.5"
        );
        assert_eq!(plan.ranks["model.layers.2.mlp.up_proj"], 8);
        let (plan, warning) = lora_plan(&cfg(RankScaling::ByKl), &model(), None);
        assert!(warning.is_some() && plan.by_bits);
        let (plan, _) = lora_plan(&cfg(RankScaling::ByBits), &model(), Some(&meta));
        assert_eq!(
            plan.ranks["model.layers.0.mlp.up_proj"], 16,
            "8-bit: twice the rank"
        );
        let (plan, _) = lora_plan(&cfg(RankScaling::Constant), &model(), Some(&meta));
        assert!(plan.ranks.is_empty() && !plan.by_bits);
    }
}
