//! One fine-tune run: load the base on the recording backend, read the data, train for `iters`
//! optimizer steps with metrics and validation, and write the adapter (also on a stop request).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_engine::load::load_model;
use kiln_model::lora::LoraAdapter;
use kiln_train::loss::{DpoKind, Sequence, SftScope};
use kiln_train::optim::{AdamWConfig, Schedule};
use kiln_train::trainer::{Method, MicroStats, StepConfig, Trainer};
use kiln_train::{TapeBackend, TapeOptions};
use serde::Serialize;
use serde_json::{Value, json};

use super::adapter_out::adapter_from_params;
use super::config::{DpoLoss, FinetuneConfig, LrSchedule, MethodName, SftScopeName};
use super::data::{self, Dataset, Examples, Tokenize};
use super::plan::{lora_plan, read_metadata};
use crate::{LabError, Report};

/// What a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct TrainReport {
    /// The adapter folder.
    pub adapter_path: PathBuf,
    /// The base model.
    pub model: String,
    /// Optimizer steps taken.
    pub steps: u64,
    /// Whether a stop request ended the run early.
    pub stopped: bool,
    /// The data format.
    pub format: data::DataFormat,
    /// Training examples (and validation examples).
    pub n_train: usize,
    /// Validation examples.
    pub n_valid: usize,
    /// Mean train loss of the last report window.
    pub final_train_loss: Option<f64>,
    /// The last validation loss.
    pub final_val_loss: Option<f64>,
    /// The best validation loss.
    pub best_val_loss: Option<f64>,
    /// Mean training throughput (tokens through the model per second, forwards counted once).
    pub tokens_per_sec: f64,
    /// Seconds of the whole run.
    pub wall_secs: f64,
    /// Peak resident memory of the process, in bytes (Linux).
    pub peak_rss_bytes: Option<u64>,
    /// LoRA parameters trained.
    pub trainable_params: usize,
}

/// The trainer's method from the config.
fn method(cfg: &FinetuneConfig) -> Method {
    match cfg.method {
        MethodName::Sft => Method::Sft,
        MethodName::Dpo => Method::Dpo {
            beta: cfg.dpo_beta,
            kind: match cfg.dpo_loss {
                DpoLoss::Sigmoid => DpoKind::Sigmoid {
                    label_smoothing: cfg.dpo_label_smoothing,
                },
                DpoLoss::Ipo => DpoKind::Ipo,
            },
        },
        MethodName::Orpo => Method::Orpo {
            lambda: cfg.orpo_lambda,
            scope: match cfg.sft_scope {
                SftScopeName::Full => SftScope::Full,
                SftScopeName::Response => SftScope::Response,
            },
        },
    }
}

fn step_config(cfg: &FinetuneConfig) -> StepConfig {
    let (warmup, schedule) = cfg.schedule();
    StepConfig {
        method: method(cfg),
        adamw: AdamWConfig {
            weight_decay: cfg.weight_decay,
            lora_plus_ratio: cfg.lora_plus_ratio,
            ..Default::default()
        },
        schedule: Schedule {
            peak: cfg.peak_lr(),
            warmup,
            total: cfg.iters,
            cosine: schedule == LrSchedule::Cosine,
        },
        grad_accumulation: cfg.grad_accumulation_steps,
        grad_clip_norm: cfg.grad_clip_norm,
    }
}

/// The sequences of batch `indices` (pairs as `[chosen, rejected]`).
fn sequences<'a>(examples: &'a Examples, indices: &[usize]) -> Vec<Sequence<'a>> {
    let mut out = Vec::new();
    for &i in indices {
        match examples {
            Examples::Sft(v) => {
                if let Some(e) = v.get(i) {
                    out.push(Sequence {
                        tokens: &e.tokens,
                        prompt_len: e.prompt_len,
                    });
                }
            }
            Examples::Preference(v) => {
                if let Some(p) = v.get(i) {
                    out.push(Sequence {
                        tokens: &p.chosen.tokens,
                        prompt_len: p.chosen.prompt_len,
                    });
                    out.push(Sequence {
                        tokens: &p.rejected.tokens,
                        prompt_len: p.rejected.prompt_len,
                    });
                }
            }
        }
    }
    out
}

/// Hands out batches epoch after epoch in the order of spec §8.2.
struct Batches {
    lengths: Vec<usize>,
    batch_size: usize,
    seed: u64,
    epoch: u64,
    queue: std::collections::VecDeque<Vec<usize>>,
}

impl Batches {
    fn next(&mut self) -> Vec<usize> {
        if self.queue.is_empty() {
            self.queue =
                data::epoch_batches(&self.lengths, self.batch_size, self.seed, self.epoch).into();
            self.epoch += 1;
        }
        self.queue.pop_front().unwrap_or_default()
    }
}

fn check_format(cfg: &FinetuneConfig, train: &Dataset) -> Result<(), LabError> {
    let preference = matches!(train.examples, Examples::Preference(_));
    let wants = cfg.method != MethodName::Sft;
    if preference != wants {
        let need = if wants {
            "prompt/chosen/rejected rows"
        } else {
            "messages, prompt/completion or text rows"
        };
        return Err(LabError::config(
            "data_dir",
            format!(
                "method {} needs {need}; the data is {}",
                cfg.method.as_str(),
                train.format
            ),
        ));
    }
    if train.examples.len() < cfg.batch_size {
        return Err(LabError::config(
            "batch_size",
            format!(
                "{} examples cannot fill a batch of {}",
                train.examples.len(),
                cfg.batch_size
            ),
        ));
    }
    Ok(())
}

/// Runs `cfg` on the model at `model_path` (already resolved).
pub fn finetune(
    cfg: &FinetuneConfig,
    model_path: &Path,
    rep: &mut dyn Report,
) -> Result<TrainReport, LabError> {
    let started = Instant::now();
    rep.stage("loading", 0.0, "loading the base model")?;
    std::fs::create_dir_all(&cfg.adapter_path).map_err(|e| LabError::io(&cfg.adapter_path, e))?;
    let files = kiln_model::files::ModelFiles::open(model_path)?;
    let metadata = model_path
        .is_dir()
        .then(|| read_metadata(model_path))
        .flatten();
    let (plan, warning) = lora_plan(cfg, &files.config, metadata.as_ref());
    drop(files);
    if let Some(w) = warning {
        rep.warn(&w);
    }
    let backend = TapeBackend::new(TapeOptions {
        plan,
        dense: cfg.dense_base,
    });
    let loaded = load_model(&backend, model_path)?;
    if let Some(warm) = cfg.warm_start() {
        warm_start(&backend, warm)?;
    }
    rep.stage("data", 0.02, "reading the dataset")?;
    let tk = Tokenize {
        tokenizer: &loaded.tokenizer,
        template: loaded.chat_template.as_ref(),
        max_seq_length: cfg.max_seq_length,
    };
    let (train, valid) = data::load_data_dir(&cfg.data_dir, &tk)?;
    check_format(cfg, &train)?;
    for (name, d) in [("train", Some(&train)), ("valid", valid.as_ref())] {
        if let Some(d) = d.filter(|d| d.dropped + d.truncated > 0) {
            rep.warn(&format!(
                "{name}: {} rows truncated to {} tokens, {} dropped with no loss token left",
                d.truncated, cfg.max_seq_length, d.dropped
            ));
        }
    }
    let model_name = loaded.path.display().to_string();
    let mut trainer = Trainer::new(backend, loaded.model, step_config(cfg));
    let mut state = Loop::new(cfg, &train, valid.as_ref())?;
    state.run(&mut trainer, rep)?;
    rep.stage("saving", 0.99, "writing the adapter")?;
    let adapter = trainer
        .backend()
        .with_params(|p| adapter_from_params(p, cfg, &model_name));
    adapter.save(&cfg.adapter_path)?;
    Ok(TrainReport {
        adapter_path: cfg.adapter_path.clone(),
        model: model_name,
        steps: trainer.steps(),
        stopped: state.stopped,
        format: train.format,
        n_train: train.examples.len(),
        n_valid: valid.as_ref().map_or(0, |v| v.examples.len()),
        final_train_loss: state.last_train,
        final_val_loss: state.last_val,
        best_val_loss: state.best_val,
        tokens_per_sec: state.tokens as f64 / state.train_secs.max(1e-9),
        wall_secs: started.elapsed().as_secs_f64(),
        peak_rss_bytes: Some(kiln_engine::stats::peak_rss_bytes()).filter(|b| *b > 0),
        trainable_params: trainer
            .backend()
            .with_params(|p| p.iter().map(|q| q.a.len() + q.b.len()).sum()),
    })
}

fn warm_start(backend: &TapeBackend, dir: &Path) -> Result<(), LabError> {
    let adapter = LoraAdapter::load(dir)?;
    backend.with_params(|params| {
        for p in params.iter_mut() {
            let Some(w) = adapter.modules.get(&p.path) else {
                continue;
            };
            if (w.in_features, w.out_features, w.rank) != (p.in_features, p.out_features, p.rank) {
                return Err(LabError::config(
                    "warm_start_adapter",
                    format!(
                        "{} has rank {} [{}→{}], the run wants rank {} [{}→{}]",
                        p.path,
                        w.rank,
                        w.in_features,
                        w.out_features,
                        p.rank,
                        p.in_features,
                        p.out_features
                    ),
                ));
            }
            p.a.clone_from(&w.a);
            // The run's scale may differ from the adapter's: keep the product s·B the same.
            let k = if p.scale != 0.0 {
                w.scale / p.scale
            } else {
                1.0
            };
            p.b = w.b.iter().map(|v| v * k).collect();
        }
        Ok(())
    })
}

/// The training loop's state.
struct Loop<'a> {
    cfg: &'a FinetuneConfig,
    train: &'a Dataset,
    valid: Option<&'a Dataset>,
    batches: Batches,
    metrics: std::fs::File,
    window: Vec<MicroStats>,
    window_started: Instant,
    tokens: usize,
    train_secs: f64,
    last_train: Option<f64>,
    last_val: Option<f64>,
    best_val: Option<f64>,
    stopped: bool,
}

impl<'a> Loop<'a> {
    fn new(
        cfg: &'a FinetuneConfig,
        train: &'a Dataset,
        valid: Option<&'a Dataset>,
    ) -> Result<Self, LabError> {
        let path = cfg.adapter_path.join("metrics.jsonl");
        let metrics = std::fs::File::create(&path).map_err(|e| LabError::io(&path, e))?;
        Ok(Self {
            cfg,
            train,
            valid,
            batches: Batches {
                lengths: train.examples.lengths(),
                batch_size: cfg.batch_size,
                seed: cfg.seed,
                epoch: 0,
                queue: Default::default(),
            },
            metrics,
            window: Vec::new(),
            window_started: Instant::now(),
            tokens: 0,
            train_secs: 0.0,
            last_train: None,
            last_val: None,
            best_val: None,
            stopped: false,
        })
    }

    fn record(&mut self, rep: &mut dyn Report, metric: Value) -> Result<(), LabError> {
        let mut line = serde_json::to_vec(&metric).unwrap_or_default();
        line.push(b'\n');
        let path = self.cfg.adapter_path.join("metrics.jsonl");
        self.metrics
            .write_all(&line)
            .map_err(|e| LabError::io(&path, e))?;
        rep.metric(metric)
    }

    fn run(&mut self, trainer: &mut Trainer, rep: &mut dyn Report) -> Result<(), LabError> {
        let iters = self.cfg.iters;
        rep.stage("training", 0.05, &format!("{iters} steps"))?;
        // The base's validation loss first, so that every curve starts where training did.
        if self.valid.is_some() {
            self.validate(trainer, rep, 0)?;
        }
        for step in 1..=iters {
            if rep.stop_requested() {
                self.stopped = true;
                rep.warn(&format!(
                    "stop requested: saving the adapter after {} steps",
                    step - 1
                ));
                break;
            }
            let began = Instant::now();
            while !trainer.step_due() {
                let indices = self.batches.next();
                let seqs = sequences(&self.train.examples, &indices);
                let stats = trainer.accumulate(&seqs)?;
                self.tokens += stats.tokens;
                self.window.push(stats);
            }
            let s = trainer.optimizer_step();
            self.train_secs += began.elapsed().as_secs_f64();
            if step % self.cfg.steps_per_report == 0 || step == iters {
                self.report_train(rep, step, s.learning_rate, s.grad_norm)?;
            }
            if self.valid.is_some() && (step % self.cfg.steps_per_eval == 0 || step == iters) {
                self.validate(trainer, rep, step)?;
            }
        }
        Ok(())
    }

    fn report_train(
        &mut self,
        rep: &mut dyn Report,
        step: u64,
        lr: f64,
        grad_norm: f64,
    ) -> Result<(), LabError> {
        let n = self.window.len().max(1) as f64;
        let loss = self.window.iter().map(|w| w.loss).sum::<f64>() / n;
        let tokens: usize = self.window.iter().map(|w| w.tokens).sum();
        let secs = self.window_started.elapsed().as_secs_f64().max(1e-9);
        let mut m = json!({
            "type": "metric", "ts": kiln_jobs::event::now_ms(), "kind": "train", "step": step,
            "loss": loss, "learning_rate": lr, "grad_norm": grad_norm,
            "tokens_per_sec": tokens as f64 / secs,
            "progress": 0.05 + 0.94 * step as f64 / self.cfg.iters as f64,
            "message": format!("step {step}/{}: loss {loss:.4}", self.cfg.iters),
        });
        preference_fields(&mut m, &self.window);
        self.last_train = Some(loss);
        self.window.clear();
        self.window_started = Instant::now();
        self.record(rep, m)
    }

    fn validate(
        &mut self,
        trainer: &Trainer,
        rep: &mut dyn Report,
        step: u64,
    ) -> Result<(), LabError> {
        let Some(valid) = self.valid else {
            return Ok(());
        };
        let n = valid.examples.len().min(self.cfg.val_max_examples);
        let mut stats = Vec::with_capacity(n);
        for i in 0..n {
            stats.push(trainer.evaluate(&sequences(&valid.examples, &[i]))?);
        }
        let loss = stats.iter().map(|s| s.loss).sum::<f64>() / n.max(1) as f64;
        self.last_val = Some(loss);
        let best = self.best_val.is_none_or(|b| loss < b);
        if best {
            self.best_val = Some(loss);
        }
        let mut m = json!({"type": "metric", "ts": kiln_jobs::event::now_ms(), "kind": "val", "step": step, "loss": loss, "examples": n});
        preference_fields(&mut m, &stats);
        if self.cfg.save_checkpoints && step > 0 {
            let dir = self
                .cfg
                .adapter_path
                .join("checkpoints")
                .join(format!("step-{step:05}-val{loss:.4}"));
            let model = String::new();
            trainer
                .backend()
                .with_params(|p| adapter_from_params(p, self.cfg, &model))
                .save(&dir)?;
        }
        self.record(rep, m)
    }
}

/// Mean accuracy and margin of preference stats, when there are any.
fn preference_fields(m: &mut Value, stats: &[MicroStats]) {
    let acc: Vec<f64> = stats.iter().filter_map(|s| s.accuracy).collect();
    let margin: Vec<f64> = stats.iter().filter_map(|s| s.margin).collect();
    if let Some(o) = m.as_object_mut()
        && !acc.is_empty()
    {
        o.insert(
            "accuracy".into(),
            json!(acc.iter().sum::<f64>() / acc.len() as f64),
        );
        o.insert(
            "margin".into(),
            json!(margin.iter().sum::<f64>() / margin.len().max(1) as f64),
        );
    }
}
