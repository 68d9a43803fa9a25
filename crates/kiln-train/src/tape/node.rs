//! What the tape records per operation: enough to run its backward.

use std::sync::Arc;

use kiln_model::config::Activation;

use super::linear::LinearSaved;
use crate::ops::attention::{Shape, Span};

/// One recorded activation.
pub(crate) struct Node {
    /// Its value; dropped once no backward needs it.
    pub value: Option<Vec<f32>>,
    /// Rows (tokens).
    pub rows: usize,
    /// Width.
    pub cols: usize,
    /// Whether a gradient flows into it (it depends on a LoRA parameter).
    pub requires_grad: bool,
    /// How it was made.
    pub op: Op,
}

/// RoPE angles of one forward, shared by the layers that used them.
pub(crate) struct Angles {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub freqs: usize,
}

/// The operation that produced a node, with its inputs' ids and saved state.
pub(crate) enum Op {
    /// An input (embedding rows): no gradient.
    Leaf,
    /// RMSNorm over `width` slices; `inv` holds each slice's 1/rms.
    RmsNorm {
        x: usize,
        w: Arc<Vec<f32>>,
        inv: Vec<f32>,
        width: usize,
        offset: f32,
    },
    /// `x·Wᵀ` (+ LoRA).
    Linear { x: usize, saved: Box<LinearSaved> },
    /// `x + bias`: the gradient passes through.
    AddBias { x: usize },
    /// RoPE on `head_dim` slices.
    Rope {
        x: usize,
        head_dim: usize,
        angles: Arc<Angles>,
    },
    /// Causal attention; `probs` per (span, head).
    Attention {
        q: usize,
        k: usize,
        v: usize,
        probs: Vec<Vec<f32>>,
        spans: Vec<Span>,
        shape: Shape,
    },
    /// `act(gate)·up`.
    Glu {
        gate: usize,
        up: usize,
        act: Activation,
    },
    /// `x + y`.
    Add { x: usize, y: usize },
    /// Rows of `x`, in this order.
    Gather { x: usize, rows: Vec<usize> },
}

impl Op {
    /// The inputs whose values this op's backward reads.
    pub fn needs(&self) -> Vec<usize> {
        match self {
            Op::RmsNorm { x, .. } | Op::Linear { x, .. } => vec![*x],
            Op::Attention { q, k, v, .. } => vec![*q, *k, *v],
            Op::Glu { gate, up, .. } => vec![*gate, *up],
            Op::Leaf
            | Op::AddBias { .. }
            | Op::Rope { .. }
            | Op::Add { .. }
            | Op::Gather { .. } => Vec::new(),
        }
    }
}
