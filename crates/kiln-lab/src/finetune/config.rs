//! The fine-tune job's configuration (spec §8.3): snake_case JSON with the spec's defaults,
//! unknown fields refused, each field range-checked and named in the error.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::LabError;

/// The projections a LoRA adapts by default: every one of the block.
pub const DEFAULT_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// The objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MethodName {
    /// Supervised fine-tuning.
    Sft,
    /// Direct preference optimisation.
    Dpo,
    /// Odds-ratio preference optimisation.
    Orpo,
}

impl MethodName {
    /// The name as configs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            MethodName::Sft => "sft",
            MethodName::Dpo => "dpo",
            MethodName::Orpo => "orpo",
        }
    }
}

/// How each module's rank follows from the base rank (spec §8.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RankScaling {
    /// `max(2, ⌈rank·bits/4⌉)` from the module's storage bits.
    ByBits,
    /// `max(2, ⌈rank·clip(kl/median, 0.5, 2)⌉)` from the model's `optiq_metadata.json`.
    ByKl,
    /// `max(2, rank)` everywhere.
    Constant,
}

/// The learning-rate schedule after warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedule {
    /// Cosine decay to 10% of the peak.
    Cosine,
    /// The peak throughout.
    Constant,
}

/// DPO's objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DpoLoss {
    /// `−logσ(h)` (with label smoothing).
    Sigmoid,
    /// `(h − 1/(2β))²`.
    Ipo,
}

/// ORPO's NLL term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SftScopeName {
    /// Prompt and response of the chosen sequence.
    Full,
    /// The chosen response only.
    Response,
}

/// Everything a fine-tune run needs, with spec §8.3's defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FinetuneConfig {
    /// The base: a model name, a GGUF file or a folder (resolved like `kiln serve MODEL`).
    pub model_dir: String,
    /// A folder with `train.jsonl` (and optionally `valid.jsonl`), or one JSONL file.
    pub data_dir: PathBuf,
    /// Where the adapter is written.
    pub adapter_path: PathBuf,
    /// Objective.
    pub method: MethodName,
    /// Base LoRA rank.
    pub rank: usize,
    /// LoRA scale `s`.
    pub scale: f32,
    /// Per-module rank rule.
    pub rank_scaling: RankScaling,
    /// Module suffixes to adapt.
    pub target_modules: Vec<String>,
    /// Adapt only the last N blocks (-1: all).
    pub num_layers: i64,
    /// Optimizer steps.
    pub iters: u64,
    /// Peak learning rate (default by method: SFT 2e-4, DPO 5e-5, ORPO 1e-5).
    pub learning_rate: Option<f64>,
    /// Longest sequence kept (longer ones are truncated).
    pub max_seq_length: usize,
    /// Examples per micro-batch.
    pub batch_size: usize,
    /// Micro-batches per optimizer step.
    pub grad_accumulation_steps: usize,
    /// Seeds the init, the shuffle and dropout.
    pub seed: u64,
    /// Steps between `train` metrics.
    pub steps_per_report: u64,
    /// Steps between validation passes.
    pub steps_per_eval: u64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Dropout on the LoRA input.
    pub lora_dropout: f32,
    /// Divide the scale by √rank.
    pub rs_lora: bool,
    /// B's learning rate over A's (LoRA+).
    pub lora_plus_ratio: f64,
    /// Warmup steps of the SFT schedule.
    pub warmup_iters: u64,
    /// SFT's schedule after warmup.
    pub lr_schedule: LrSchedule,
    /// Global gradient-norm cap (0: none).
    pub grad_clip_norm: f64,
    /// Validation examples evaluated per pass.
    pub val_max_examples: usize,
    /// Write a mountable adapter at every validation pass under `checkpoints/`.
    pub save_checkpoints: bool,
    /// DPO's β.
    pub dpo_beta: f64,
    /// DPO's objective.
    pub dpo_loss: DpoLoss,
    /// DPO's label smoothing ε (sigmoid only).
    pub dpo_label_smoothing: f64,
    /// DPO's warmup steps.
    pub dpo_warmup_iters: u64,
    /// DPO's schedule.
    pub dpo_lr_schedule: LrSchedule,
    /// ORPO's λ.
    pub orpo_lambda: f64,
    /// ORPO's warmup steps.
    pub orpo_warmup_iters: u64,
    /// ORPO's schedule.
    pub orpo_lr_schedule: LrSchedule,
    /// ORPO's NLL term.
    pub sft_scope: SftScopeName,
    /// An adapter whose weights start the run (optimizer and schedule restart).
    pub warm_start_adapter: String,
    /// Dequantize the base to f32 at load: faster steps, the f32 model's memory.
    pub dense_base: bool,
}

impl Default for FinetuneConfig {
    fn default() -> Self {
        Self {
            model_dir: String::new(),
            data_dir: PathBuf::new(),
            adapter_path: PathBuf::new(),
            method: MethodName::Sft,
            rank: 8,
            scale: 1.0,
            rank_scaling: RankScaling::ByBits,
            target_modules: DEFAULT_TARGETS.map(String::from).to_vec(),
            num_layers: -1,
            iters: 100,
            learning_rate: None,
            max_seq_length: 512,
            batch_size: 1,
            grad_accumulation_steps: 1,
            seed: 0,
            steps_per_report: 10,
            steps_per_eval: 50,
            weight_decay: 0.01,
            lora_dropout: 0.0,
            rs_lora: false,
            lora_plus_ratio: 1.0,
            warmup_iters: 0,
            lr_schedule: LrSchedule::Cosine,
            grad_clip_norm: 1.0,
            val_max_examples: 256,
            save_checkpoints: false,
            dpo_beta: 0.1,
            dpo_loss: DpoLoss::Sigmoid,
            dpo_label_smoothing: 0.0,
            dpo_warmup_iters: 0,
            dpo_lr_schedule: LrSchedule::Cosine,
            orpo_lambda: 0.1,
            orpo_warmup_iters: 0,
            orpo_lr_schedule: LrSchedule::Cosine,
            sft_scope: SftScopeName::Full,
            warm_start_adapter: String::new(),
            dense_base: false,
        }
    }
}

/// Fields of the original's config that steer Metal memory tactics (spec §8.8); kiln accepts
/// them at their defaults and refuses any other value rather than ignore it.
const METAL_LEVERS: [&str; 8] = [
    "grad_checkpoint",
    "mlp_split",
    "segment_size",
    "orpo_chunk_size",
    "orpo_fused_ce",
    "orpo_flash_ce",
    "orpo_prefix_shared",
    "vision",
];

impl FinetuneConfig {
    /// Parses and checks a job config. `model_dir`, `data_dir` and `adapter_path` are
    /// required (the CLI fills them from its arguments).
    pub fn from_json(map: &Map<String, Value>) -> Result<Self, LabError> {
        let mut map = map.clone();
        for lever in METAL_LEVERS {
            match map.remove(lever) {
                None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                Some(Value::Number(n)) if n.as_f64() == Some(0.0) => {}
                Some(v) => {
                    return Err(LabError::config(
                        lever,
                        format!(
                            "{v}: not supported by kiln's trainer (the CPU needs no memory lever of this kind)"
                        ),
                    ));
                }
            }
        }
        let de = Value::Object(map);
        let cfg: FinetuneConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            let field = match inner.strip_prefix("unknown field `") {
                Some(rest) => rest.split('`').next().unwrap_or("config").to_string(),
                None if path == "." => "config".to_string(),
                None => path,
            };
            LabError::config(&field, inner)
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The peak learning rate: the configured one or the method's default.
    pub fn peak_lr(&self) -> f64 {
        self.learning_rate.unwrap_or(match self.method {
            MethodName::Sft => 2e-4,
            MethodName::Dpo => 5e-5,
            MethodName::Orpo => 1e-5,
        })
    }

    /// `(warmup, schedule)` of the configured method.
    pub fn schedule(&self) -> (u64, LrSchedule) {
        match self.method {
            MethodName::Sft => (self.warmup_iters, self.lr_schedule),
            MethodName::Dpo => (self.dpo_warmup_iters, self.dpo_lr_schedule),
            MethodName::Orpo => (self.orpo_warmup_iters, self.orpo_lr_schedule),
        }
    }

    /// Range checks, each naming its field.
    pub fn validate(&self) -> Result<(), LabError> {
        let check = |ok: bool, field: &str, why: &str| {
            if ok {
                Ok(())
            } else {
                Err(LabError::config(field, why.to_string()))
            }
        };
        check(!self.model_dir.trim().is_empty(), "model_dir", "missing")?;
        check(!self.data_dir.as_os_str().is_empty(), "data_dir", "missing")?;
        check(
            !self.adapter_path.as_os_str().is_empty(),
            "adapter_path",
            "missing",
        )?;
        check((1..=1024).contains(&self.rank), "rank", "must be 1..=1024")?;
        check(
            self.scale.is_finite() && self.scale > 0.0,
            "scale",
            "must be a positive number",
        )?;
        check(
            !self.target_modules.is_empty(),
            "target_modules",
            "must name at least one module",
        )?;
        for t in &self.target_modules {
            check(
                DEFAULT_TARGETS.contains(&t.as_str()),
                "target_modules",
                &format!("{t:?} is not one of {DEFAULT_TARGETS:?}"),
            )?;
        }
        check(
            self.num_layers == -1 || self.num_layers > 0,
            "num_layers",
            "-1 (all) or a positive count",
        )?;
        check(
            (1..=10_000_000).contains(&self.iters),
            "iters",
            "must be 1..=10000000",
        )?;
        let lr = self.peak_lr();
        check(
            lr.is_finite() && lr > 0.0 && lr < 1.0,
            "learning_rate",
            "must be in (0, 1)",
        )?;
        check(
            (2..=131_072).contains(&self.max_seq_length),
            "max_seq_length",
            "must be 2..=131072",
        )?;
        check(
            (1..=1024).contains(&self.batch_size),
            "batch_size",
            "must be 1..=1024",
        )?;
        check(
            (1..=4096).contains(&self.grad_accumulation_steps),
            "grad_accumulation_steps",
            "must be 1..=4096",
        )?;
        check(
            self.steps_per_report >= 1,
            "steps_per_report",
            "must be at least 1",
        )?;
        check(
            self.steps_per_eval >= 1,
            "steps_per_eval",
            "must be at least 1",
        )?;
        check(
            (0.0..1.0).contains(&self.weight_decay),
            "weight_decay",
            "must be in [0, 1)",
        )?;
        check(
            (0.0..1.0).contains(&self.lora_dropout),
            "lora_dropout",
            "must be in [0, 1)",
        )?;
        check(
            self.lora_plus_ratio.is_finite() && self.lora_plus_ratio > 0.0,
            "lora_plus_ratio",
            "must be positive",
        )?;
        check(
            self.grad_clip_norm.is_finite() && self.grad_clip_norm >= 0.0,
            "grad_clip_norm",
            "must be 0 (off) or positive",
        )?;
        check(
            self.val_max_examples >= 1,
            "val_max_examples",
            "must be at least 1",
        )?;
        check(
            self.dpo_beta.is_finite() && self.dpo_beta > 0.0,
            "dpo_beta",
            "must be positive",
        )?;
        check(
            (0.0..0.5).contains(&self.dpo_label_smoothing),
            "dpo_label_smoothing",
            "must be in [0, 0.5)",
        )?;
        check(
            self.orpo_lambda.is_finite() && self.orpo_lambda >= 0.0,
            "orpo_lambda",
            "must be 0 or positive",
        )?;
        Ok(())
    }

    /// The warm-start adapter's folder, if any.
    pub fn warm_start(&self) -> Option<&Path> {
        (!self.warm_start_adapter.is_empty()).then(|| Path::new(&self.warm_start_adapter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Map<String, Value> {
        json!({"model_dir": "m", "data_dir": "d", "adapter_path": "a"})
            .as_object()
            .cloned()
            .unwrap()
    }

    fn field_of(extra: Value) -> String {
        let mut m = base();
        m.extend(extra.as_object().cloned().unwrap());
        match FinetuneConfig::from_json(&m) {
            Err(LabError::Config { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_follow_the_spec() {
        let c = FinetuneConfig::from_json(&base()).unwrap();
        assert_eq!(
            (c.rank, c.scale, c.iters, c.max_seq_length),
            (8, 1.0, 100, 512)
        );
        assert_eq!(c.peak_lr(), 2e-4);
        assert_eq!(c.grad_clip_norm, 1.0);
        assert_eq!(c.target_modules.len(), 7);
        let mut m = base();
        m.insert("method".into(), json!("dpo"));
        assert_eq!(FinetuneConfig::from_json(&m).unwrap().peak_lr(), 5e-5);
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(field_of(json!({"rank": 0})), "rank");
        assert_eq!(field_of(json!({"rank": "eight"})), "rank");
        assert_eq!(field_of(json!({"method": "ppo"})), "method");
        assert_eq!(field_of(json!({"sft_scope": "prompt"})), "sft_scope");
        assert_eq!(
            field_of(json!({"target_modules": ["lm_head"]})),
            "target_modules"
        );
        assert_eq!(field_of(json!({"no_such_field": 1})), "no_such_field");
        assert_eq!(
            field_of(json!({"grad_checkpoint": true})),
            "grad_checkpoint"
        );
        assert_eq!(field_of(json!({"learning_rate": -1.0})), "learning_rate");
        assert_eq!(field_of(json!({"model_dir": ""})), "model_dir");
        assert_eq!(field_of(json!({"lora_dropout": 1.0})), "lora_dropout");
        let mut m = base();
        m.insert("grad_checkpoint".into(), json!(false));
        assert!(FinetuneConfig::from_json(&m).is_ok());
    }
}
