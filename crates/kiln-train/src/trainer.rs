//! One optimizer step over a batch: the forwards a method needs (SFT and ORPO one, DPO a
//! reference forward at LoRA scale 0 and a recorded one), its loss, the backward, gradient
//! accumulation, clipping and the AdamW update.

use kiln_model::arch::{LogitsWanted, Model};
use kiln_model::backend::{Backend, BatchLayout, KvLayout, SeqSpan};

use crate::loss::{self, DpoKind, LossOut, Sequence, SftScope};
use crate::optim::{AdamW, AdamWConfig, Schedule, clip_grad_norm};
use crate::profile::{Kind, timed};
use crate::{TapeBackend, TrainError};

/// The training objective (spec §8.1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Method {
    /// Cross-entropy on response tokens.
    Sft,
    /// Direct preference optimisation against the model without its adapter.
    Dpo {
        /// β.
        beta: f64,
        /// Sigmoid (with label smoothing) or IPO.
        kind: DpoKind,
    },
    /// Odds-ratio preference optimisation (no reference).
    Orpo {
        /// λ, the weight of the odds-ratio term.
        lambda: f64,
        /// What the NLL term covers.
        scope: SftScope,
    },
}

impl Method {
    /// Whether batches hold preference pairs (`[chosen, rejected]` per example).
    pub fn is_preference(&self) -> bool {
        !matches!(self, Method::Sft)
    }
}

/// The optimizer side of a run.
#[derive(Debug, Clone, Copy)]
pub struct StepConfig {
    /// Objective.
    pub method: Method,
    /// AdamW's settings.
    pub adamw: AdamWConfig,
    /// Learning-rate schedule.
    pub schedule: Schedule,
    /// Micro-batches per optimizer step.
    pub grad_accumulation: usize,
    /// Global gradient-norm cap (0: none).
    pub grad_clip_norm: f64,
}

/// What one micro-batch measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct MicroStats {
    /// Loss.
    pub loss: f64,
    /// Tokens run through the model.
    pub tokens: usize,
    /// Preference accuracy (DPO, ORPO).
    pub accuracy: Option<f64>,
    /// Preference margin (DPO, ORPO).
    pub margin: Option<f64>,
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy)]
pub struct StepStats {
    /// The learning rate used.
    pub learning_rate: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
}

/// A model on the recording backend with its optimizer.
pub struct Trainer {
    backend: TapeBackend,
    model: Model<TapeBackend>,
    config: StepConfig,
    optimizer: AdamW,
    step: u64,
    micro: usize,
}

impl Trainer {
    /// A trainer for `model`, loaded onto `backend` (which created the LoRA parameters).
    pub fn new(backend: TapeBackend, model: Model<TapeBackend>, config: StepConfig) -> Self {
        let optimizer = backend.with_params(|p| AdamW::new(config.adamw, p));
        Self {
            backend,
            model,
            config,
            optimizer,
            step: 0,
            micro: 0,
        }
    }

    /// The backend (its LoRA parameters).
    pub fn backend(&self) -> &TapeBackend {
        &self.backend
    }

    /// The model.
    pub fn model(&self) -> &Model<TapeBackend> {
        &self.model
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Logits of `seqs` run as one batch (each its own span from position 0).
    pub fn logits(
        &self,
        seqs: &[Sequence<'_>],
        recording: bool,
        lora_on: bool,
    ) -> Result<Vec<f32>, TrainError> {
        let cfg = self.model.config();
        let capacity = seqs.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        let mut kv = self
            .backend
            .new_kv(KvLayout::for_model(cfg, seqs.len(), capacity))?;
        let spans = seqs
            .iter()
            .enumerate()
            .map(|(slot, s)| SeqSpan {
                slot,
                start_pos: 0,
                n_tokens: s.tokens.len(),
            })
            .collect();
        let tokens: Vec<u32> = seqs.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        self.backend.begin(recording, lora_on, self.step);
        Ok(self.model.forward(
            &self.backend,
            &mut kv,
            &tokens,
            &BatchLayout { spans },
            LogitsWanted::All,
        )?)
    }

    /// The method's loss on `seqs` without recording (validation).
    pub fn evaluate(&self, seqs: &[Sequence<'_>]) -> Result<MicroStats, TrainError> {
        let out = self.loss(seqs, false)?;
        Ok(stats(&out, seqs))
    }

    fn loss(&self, seqs: &[Sequence<'_>], recording: bool) -> Result<LossOut, TrainError> {
        let vocab = self.model.config().vocab_size;
        match self.config.method {
            Method::Sft => {
                let logits = self.logits(seqs, recording, true)?;
                timed(Kind::Loss, || loss::sft(&logits, vocab, seqs))
            }
            Method::Dpo { beta, kind } => {
                let reference =
                    loss::sequence_logps(&self.logits(seqs, false, false)?, vocab, seqs)?;
                let pairs: Vec<(f64, f64)> =
                    reference.chunks_exact(2).map(|c| (c[0], c[1])).collect();
                loss::dpo(
                    &self.logits(seqs, recording, true)?,
                    vocab,
                    seqs,
                    &pairs,
                    beta,
                    kind,
                )
            }
            Method::Orpo { lambda, scope } => loss::orpo(
                &self.logits(seqs, recording, true)?,
                vocab,
                seqs,
                lambda,
                scope,
            ),
        }
    }

    /// Forward and backward of one micro-batch, adding its share of the gradient.
    pub fn accumulate(&mut self, seqs: &[Sequence<'_>]) -> Result<MicroStats, TrainError> {
        let out = self.loss(seqs, true)?;
        let stats = stats(&out, seqs);
        let mut grad = out.grad;
        let accumulation = self.config.grad_accumulation.max(1);
        if accumulation > 1 {
            let k = 1.0 / accumulation as f32;
            grad.iter_mut().for_each(|g| *g *= k);
        }
        self.backend.backward(grad)?;
        self.micro += 1;
        Ok(stats)
    }

    /// Whether enough micro-batches have accumulated for an optimizer step.
    pub fn step_due(&self) -> bool {
        self.micro >= self.config.grad_accumulation.max(1)
    }

    /// Clips, updates and zeroes the gradients.
    pub fn optimizer_step(&mut self) -> StepStats {
        let learning_rate = self.config.schedule.lr(self.step);
        let grad_norm = self.backend.with_params(|p| {
            let norm = clip_grad_norm(p, self.config.grad_clip_norm);
            self.optimizer.step(p, learning_rate);
            p.iter_mut().for_each(|q| q.zero_grad());
            norm
        });
        self.step += 1;
        self.micro = 0;
        StepStats {
            learning_rate,
            grad_norm,
        }
    }
}

fn stats(out: &LossOut, seqs: &[Sequence<'_>]) -> MicroStats {
    MicroStats {
        loss: out.loss,
        tokens: seqs.iter().map(|s| s.tokens.len()).sum(),
        accuracy: out.accuracy,
        margin: out.margin,
    }
}
