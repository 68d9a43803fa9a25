//! [`TapeBackend`]: the shared architectures' [`Backend`] operations, recorded on a tape so that
//! a LoRA gradient can be taken through them. The model code is the inference code
//! (`kiln_model::arch`): loading, weight names, Q/K un-permuting, tied heads and each
//! architecture's block all come from there; only the operations differ.

mod backward;
pub(crate) mod linear;
mod node;

use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use kiln_model::ModelError;
use kiln_model::backend::{
    AttentionParams, Backend, BatchLayout, HostTensor, KvLayout, KvStore, MatrixRole,
    MemoryProfile, RopeAngles,
};
use kiln_model::config::{Activation, ModelConfig};

use crate::TrainError;
use crate::lora::{LoraParam, LoraPlan, dropout_mask};
use crate::ops::{attention, glu, norm, rope};
use crate::profile::{Kind, timed};
pub use linear::MatrixData;
use node::{Angles, Node, Op};

/// An activation: a node on the tape.
#[derive(Debug, Clone, Copy)]
pub struct TapeAct {
    id: usize,
    rows: usize,
    cols: usize,
}

/// A frozen weight matrix, with the index of its LoRA parameters when adapted.
pub struct TapeMatrix {
    data: Arc<MatrixData>,
    lora: Option<usize>,
}

/// Training needs no cache: every sequence is attended within its own batch.
pub struct NoKv {
    layout: KvLayout,
    lens: Vec<usize>,
}

impl KvStore for NoKv {
    fn layout(&self) -> KvLayout {
        self.layout
    }
    fn seq_len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }
    fn set_seq_len(&mut self, slot: usize, len: usize) {
        if let Some(l) = self.lens.get_mut(slot) {
            *l = len;
        }
    }
    fn allocated_bytes(&self) -> usize {
        0
    }
}

/// How the backend keeps the base and runs the adapter.
#[derive(Debug, Clone)]
pub struct TapeOptions {
    /// Which matrices get LoRA parameters.
    pub plan: LoraPlan,
    /// Dequantize the base to f32 once at load (faster, the f32 model's memory).
    pub dense: bool,
}

struct Tape {
    nodes: Vec<Node>,
    /// Record for a backward (off: an evaluation or a reference forward).
    recording: bool,
    /// Apply the adapter (off: the base model, DPO's reference).
    lora_on: bool,
    step: u64,
    last_output: Option<usize>,
    error: Option<String>,
}

/// The recording backend (see the module doc).
pub struct TapeBackend {
    tape: Mutex<Tape>,
    lora: RwLock<Vec<LoraParam>>,
    options: TapeOptions,
}

impl TapeBackend {
    /// A backend that adapts the matrices `options.plan` names as they are loaded.
    pub fn new(options: TapeOptions) -> Self {
        Self {
            tape: Mutex::new(Tape {
                nodes: Vec::new(),
                recording: true,
                lora_on: true,
                step: 0,
                last_output: None,
                error: None,
            }),
            lora: RwLock::new(Vec::new()),
            options,
        }
    }

    fn tape(&self) -> MutexGuard<'_, Tape> {
        self.tape.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets what the next forwards do: record for a backward, apply the adapter, and the step
    /// that keys dropout. Clears the tape.
    pub fn begin(&self, recording: bool, lora_on: bool, step: u64) {
        let mut t = self.tape();
        t.nodes.clear();
        t.last_output = None;
        t.error = None;
        (t.recording, t.lora_on, t.step) = (recording, lora_on, step);
    }

    /// Runs `f` on the LoRA parameters (the optimizer's and the writer's access).
    pub fn with_params<R>(&self, f: impl FnOnce(&mut Vec<LoraParam>) -> R) -> R {
        let mut p = self.lora.write().unwrap_or_else(|p| p.into_inner());
        f(&mut p)
    }

    /// Backpropagates `grad` (`∂L/∂logits`, the shape of the last forward's output) into the
    /// LoRA gradients (accumulating) and clears the tape.
    pub fn backward(&self, grad: Vec<f32>) -> Result<(), TrainError> {
        let mut t = self.tape();
        if let Some(e) = t.error.take() {
            return Err(TrainError::Shape(e));
        }
        let out = t
            .last_output
            .ok_or_else(|| TrainError::Shape("no forward recorded".into()))?;
        if !t.recording {
            return Err(TrainError::Shape("the forward was not recorded".into()));
        }
        let nodes = std::mem::take(&mut t.nodes);
        drop(t);
        let mut params = self.lora.write().unwrap_or_else(|p| p.into_inner());
        backward::run(nodes, out, grad, &mut params)
    }

    /// Bytes of activations the tape holds now.
    pub fn tape_bytes(&self) -> usize {
        let t = self.tape();
        t.nodes
            .iter()
            .map(|n| n.value.as_ref().map_or(0, |v| v.len() * 4))
            .sum()
    }

    fn value(t: &Tape, a: &TapeAct) -> Result<Vec<f32>, String> {
        t.nodes
            .get(a.id)
            .and_then(|n| n.value.clone())
            .ok_or_else(|| format!("activation {} was freed", a.id))
    }

    /// Runs `op` on the values of `inputs` and records its output; an internal failure is kept
    /// for [`TapeBackend::backward`] to report (the trait's in-place operations return nothing).
    fn record(
        &self,
        inputs: &[&TapeAct],
        cols: usize,
        f: impl FnOnce(&[&[f32]], &Tape) -> Result<(Vec<f32>, Op), String>,
    ) -> TapeAct {
        let mut t = self.tape();
        let rows = inputs.first().map_or(0, |a| a.rows);
        let result = {
            let tape: &Tape = &t;
            let values: Result<Vec<&[f32]>, String> = inputs
                .iter()
                .map(|a| {
                    tape.nodes
                        .get(a.id)
                        .and_then(|n| n.value.as_deref())
                        .ok_or_else(|| format!("activation {} was freed", a.id))
                })
                .collect();
            values.and_then(|v| f(&v, tape))
        };
        let (value, op) = result.unwrap_or_else(|e| {
            t.error.get_or_insert(e);
            (vec![0.0; rows * cols], Op::Leaf)
        });
        self.push(&mut t, value, rows, cols, op)
    }

    fn push(&self, t: &mut Tape, value: Vec<f32>, rows: usize, cols: usize, op: Op) -> TapeAct {
        let requires_grad = t.recording
            && match &op {
                Op::Leaf => false,
                Op::Linear { x, saved } => saved.lora.is_some() || t.nodes[*x].requires_grad,
                other => inputs_of(other).iter().any(|&i| t.nodes[i].requires_grad),
            };
        let op = if requires_grad { op } else { Op::Leaf };
        let id = t.nodes.len();
        t.nodes.push(Node {
            value: Some(value),
            rows,
            cols,
            requires_grad,
            op,
        });
        TapeAct { id, rows, cols }
    }

    /// Replaces `x` (an in-place operation of the trait) and drops the old value when no
    /// backward reads it (RoPE and bias inputs).
    fn replace(&self, x: &mut TapeAct, new: TapeAct, free_old: bool) {
        if free_old {
            let mut t = self.tape();
            let needed = t
                .nodes
                .iter()
                .skip(x.id + 1)
                .any(|n| n.op.needs().contains(&x.id));
            if !needed && let Some(n) = t.nodes.get_mut(x.id) {
                n.value = None;
            }
        }
        *x = new;
    }
}

fn inputs_of(op: &Op) -> Vec<usize> {
    match op {
        Op::Leaf => Vec::new(),
        Op::RmsNorm { x, .. }
        | Op::Linear { x, .. }
        | Op::AddBias { x }
        | Op::Rope { x, .. }
        | Op::Gather { x, .. } => vec![*x],
        Op::Attention { q, k, v, .. } => vec![*q, *k, *v],
        Op::Glu { gate, up, .. } => vec![*gate, *up],
        Op::Add { x, y } => vec![*x, *y],
    }
}

fn model_error(e: TrainError) -> ModelError {
    ModelError::Forward(e.to_string())
}

impl Backend for TapeBackend {
    type Matrix = TapeMatrix;
    type Vector = Arc<Vec<f32>>;
    type Act = TapeAct;
    type Kv = NoKv;

    fn name(&self) -> &'static str {
        "train"
    }

    fn matrix(
        &self,
        name: &str,
        _role: MatrixRole,
        t: HostTensor,
    ) -> Result<TapeMatrix, ModelError> {
        let bits = crate::lora::storage_bits(t.ty);
        let data = MatrixData::new(name, t, self.options.dense).map_err(model_error)?;
        let path = name.strip_suffix(".weight").unwrap_or(name);
        let lora = match self.options.plan.rank_for(path, bits) {
            Some(rank) => self.with_params(|p| {
                p.push(LoraParam::init(
                    path,
                    data.cols,
                    data.rows,
                    rank,
                    &self.options.plan,
                ));
                Some(p.len() - 1)
            }),
            None => None,
        };
        Ok(TapeMatrix {
            data: Arc::new(data),
            lora,
        })
    }

    fn vector(&self, _name: &str, t: HostTensor) -> Result<Self::Vector, ModelError> {
        Ok(Arc::new(t.to_f32()?))
    }

    fn new_kv(&self, layout: KvLayout) -> Result<NoKv, ModelError> {
        Ok(NoKv {
            layout,
            lens: vec![0; layout.n_slots],
        })
    }

    fn memory_profile(&self) -> MemoryProfile {
        MemoryProfile {
            runtime_overhead_bytes: 0,
            caps_sliding: false,
            decode_weight_bytes_per_sec: 1.0,
            decode_kv_bytes_per_sec: 1.0,
            decode_kv_seconds_per_element: 0.0,
            decode_turbo_seconds_per_element: 0.0,
        }
    }

    fn forward_transient_bytes(
        &self,
        cfg: &ModelConfig,
        tokens: usize,
        _ctx: usize,
        _threads: usize,
    ) -> u64 {
        crate::memory::tape_bytes(cfg, tokens) as u64
    }

    fn embed(
        &self,
        table: &TapeMatrix,
        tokens: &[u32],
        scale: Option<f32>,
    ) -> Result<TapeAct, ModelError> {
        let cols = table.data.cols;
        let mut out = vec![0f32; tokens.len() * cols];
        for (row, &tok) in out.chunks_exact_mut(cols).zip(tokens) {
            table.data.row(tok as usize, row).map_err(model_error)?;
            if let Some(s) = scale {
                row.iter_mut().for_each(|v| *v *= s);
            }
        }
        let mut t = self.tape();
        Ok(self.push(&mut t, out, tokens.len(), cols, Op::Leaf))
    }

    fn rms_norm(&self, x: &TapeAct, w: &Self::Vector, eps: f32, offset: f32) -> TapeAct {
        self.record(&[x], x.cols, |v, _| {
            let (y, inv) = norm::forward(v[0], w, x.cols, eps, offset);
            Ok((
                y,
                Op::RmsNorm {
                    x: x.id,
                    w: w.clone(),
                    inv,
                    width: x.cols,
                    offset,
                },
            ))
        })
    }

    fn head_rms_norm(
        &self,
        x: &mut TapeAct,
        head_dim: usize,
        w: &Self::Vector,
        eps: f32,
        offset: f32,
    ) {
        let new = self.record(&[x], x.cols, |v, _| {
            let (y, inv) = norm::forward(v[0], w, head_dim, eps, offset);
            Ok((
                y,
                Op::RmsNorm {
                    x: x.id,
                    w: w.clone(),
                    inv,
                    width: head_dim,
                    offset,
                },
            ))
        });
        self.replace(x, new, false);
    }

    fn matmul(&self, x: &TapeAct, w: &TapeMatrix) -> Result<TapeAct, ModelError> {
        let out = self.record(&[x], w.data.rows, |v, t| {
            let lora_index = w.lora.filter(|_| t.lora_on);
            let params = self.lora.read().unwrap_or_else(|p| p.into_inner());
            let lora = lora_index.and_then(|i| params.get(i));
            let p = self.options.plan.dropout;
            let mask = (p > 0.0 && t.recording && lora.is_some())
                .then(|| dropout_mask(v[0].len(), p, self.options.plan.seed, t.step, &w.data.name));
            let (y, xa) = timed(Kind::MatmulForward, || {
                linear::forward(v[0], x.rows, &w.data, lora, mask.as_deref())
            })
            .map_err(|e| e.to_string())?;
            let saved = linear::LinearSaved {
                w: w.data.clone(),
                lora: lora_index.filter(|_| lora.is_some()),
                xa,
                mask,
            };
            Ok((
                y,
                Op::Linear {
                    x: x.id,
                    saved: Box::new(saved),
                },
            ))
        });
        let t = self.tape();
        match &t.error {
            Some(e) => Err(ModelError::Forward(e.clone())),
            None => Ok(out),
        }
    }

    fn add_bias(&self, x: &mut TapeAct, b: &Self::Vector) {
        let new = self.record(&[x], x.cols, |v, _| {
            let mut y = v[0].to_vec();
            for row in y.chunks_exact_mut(x.cols) {
                row.iter_mut().zip(b.iter()).for_each(|(a, c)| *a += c);
            }
            Ok((y, Op::AddBias { x: x.id }))
        });
        self.replace(x, new, true);
    }

    fn rope(&self, x: &mut TapeAct, head_dim: usize, angles: &RopeAngles) {
        let freqs = angles.inv_freq.len();
        let shared = Arc::new(Angles {
            cos: angles.cos.clone(),
            sin: angles.sin.clone(),
            freqs,
        });
        let new = self.record(&[x], x.cols, |v, _| {
            let mut y = v[0].to_vec();
            rope::forward(&mut y, x.cols, head_dim, &shared.cos, &shared.sin, freqs);
            Ok((
                y,
                Op::Rope {
                    x: x.id,
                    head_dim,
                    angles: shared.clone(),
                },
            ))
        });
        self.replace(x, new, true);
    }

    fn attention(
        &self,
        _kv: &mut NoKv,
        _layer: usize,
        q: &TapeAct,
        k: &TapeAct,
        v: &TapeAct,
        batch: &BatchLayout,
        params: &AttentionParams,
    ) -> Result<TapeAct, ModelError> {
        let mut spans = Vec::with_capacity(batch.spans.len());
        let mut start = 0;
        for s in &batch.spans {
            if s.start_pos != 0 {
                return Err(ModelError::Forward(
                    "training attends whole sequences from position 0".into(),
                ));
            }
            spans.push((start, s.n_tokens));
            start += s.n_tokens;
        }
        if !params.causal {
            return Err(ModelError::Forward(
                "training runs decoders: bidirectional attention has no backward".into(),
            ));
        }
        let shape = attention::Shape {
            n_heads: params.n_heads,
            n_kv_heads: params.n_kv_heads,
            head_dim: params.head_dim,
            scale: params.scale,
            window: params.window,
        };
        Ok(self.record(&[q, k, v], q.cols, |vals, _| {
            let (out, probs) = timed(Kind::AttentionForward, || {
                attention::forward(vals[0], vals[1], vals[2], &spans, &shape)
            });
            Ok((
                out,
                Op::Attention {
                    q: q.id,
                    k: k.id,
                    v: v.id,
                    probs,
                    spans: spans.clone(),
                    shape,
                },
            ))
        }))
    }

    fn glu(&self, gate: &TapeAct, up: &TapeAct, act: Activation) -> TapeAct {
        self.record(&[gate, up], gate.cols, |v, _| {
            Ok((
                glu::forward(v[0], v[1], act),
                Op::Glu {
                    gate: gate.id,
                    up: up.id,
                    act,
                },
            ))
        })
    }

    fn add_assign(&self, x: &mut TapeAct, y: &TapeAct) {
        let new = self.record(&[x, y], x.cols, |v, _| {
            let sum = v[0].iter().zip(v[1]).map(|(a, b)| a + b).collect();
            Ok((sum, Op::Add { x: x.id, y: y.id }))
        });
        self.replace(x, new, false);
    }

    fn gather_rows(&self, x: &TapeAct, rows: &[usize]) -> TapeAct {
        let cols = x.cols;
        let mut out = self.record(&[x], cols, |v, _| {
            let mut y = Vec::with_capacity(rows.len() * cols);
            for &r in rows {
                let src = v[0]
                    .get(r * cols..(r + 1) * cols)
                    .ok_or("gather: row out of range")?;
                y.extend_from_slice(src);
            }
            Ok((
                y,
                Op::Gather {
                    x: x.id,
                    rows: rows.to_vec(),
                },
            ))
        });
        out.rows = rows.len();
        let mut t = self.tape();
        if let Some(n) = t.nodes.get_mut(out.id) {
            n.rows = rows.len();
        }
        out
    }

    fn to_host(&self, x: &TapeAct) -> Vec<f32> {
        let mut t = self.tape();
        t.last_output = Some(x.id);
        let value = Self::value(&t, x).unwrap_or_default();
        // The loss reads the host copy; no backward reads the logits themselves.
        if let Some(n) = t.nodes.get_mut(x.id) {
            n.value = None;
        }
        value
    }
}
