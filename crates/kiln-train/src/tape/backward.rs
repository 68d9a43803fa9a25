//! The reverse pass over a recorded forward.

use super::linear;
use super::node::{Node, Op};
use crate::TrainError;
use crate::lora::LoraParam;
use crate::ops::{attention, glu, norm, rope};
use crate::profile::{Kind, timed};

fn accumulate(grads: &mut [Option<Vec<f32>>], nodes: &[Node], id: usize, g: Vec<f32>) {
    if !nodes[id].requires_grad {
        return;
    }
    match &mut grads[id] {
        Some(acc) => acc.iter_mut().zip(&g).for_each(|(a, b)| *a += b),
        slot @ None => *slot = Some(g),
    }
}

fn value(nodes: &[Node], id: usize) -> Result<&[f32], TrainError> {
    nodes[id]
        .value
        .as_deref()
        .ok_or_else(|| TrainError::Shape(format!("activation {id} was freed before its backward")))
}

/// Propagates `grad` from node `out` back to every LoRA parameter, freeing each node's value
/// and gradient as soon as no earlier node needs them.
pub(crate) fn run(
    mut nodes: Vec<Node>,
    out: usize,
    grad: Vec<f32>,
    params: &mut [LoraParam],
) -> Result<(), TrainError> {
    let n = nodes
        .get(out)
        .ok_or_else(|| TrainError::Shape("no output node".into()))?;
    if grad.len() != n.rows * n.cols {
        return Err(TrainError::Shape(format!(
            "output gradient has {} values for a [{}, {}] output",
            grad.len(),
            n.rows,
            n.cols
        )));
    }
    let mut grads: Vec<Option<Vec<f32>>> = (0..nodes.len()).map(|_| None).collect();
    grads[out] = Some(grad);
    for id in (0..=out).rev() {
        let Some(g) = grads[id].take() else {
            nodes[id].value = None;
            continue;
        };
        let kind = match nodes[id].op {
            Op::Linear { .. } => Kind::MatmulBackward,
            Op::Attention { .. } => Kind::AttentionBackward,
            _ => Kind::Other,
        };
        timed(kind, || step(&nodes, id, g, &mut grads, params))?;
        nodes[id].value = None;
        nodes[id].op = Op::Leaf;
    }
    Ok(())
}

fn step(
    nodes: &[Node],
    id: usize,
    g: Vec<f32>,
    grads: &mut [Option<Vec<f32>>],
    params: &mut [LoraParam],
) -> Result<(), TrainError> {
    let node = &nodes[id];
    match &node.op {
        Op::Leaf => {}
        Op::RmsNorm {
            x,
            w,
            inv,
            width,
            offset,
        } => {
            let dx = norm::backward(value(nodes, *x)?, w, inv, &g, *width, *offset);
            accumulate(grads, nodes, *x, dx);
        }
        Op::Linear { x, saved } => {
            let lora = saved.lora.and_then(|i| params.get_mut(i));
            let need_dx = nodes[*x].requires_grad;
            if let Some(dx) =
                linear::backward(value(nodes, *x)?, node.rows, &g, saved, lora, need_dx)?
            {
                accumulate(grads, nodes, *x, dx);
            }
        }
        Op::AddBias { x } => accumulate(grads, nodes, *x, g),
        Op::Rope {
            x,
            head_dim,
            angles,
        } => {
            let mut dx = g;
            rope::backward(
                &mut dx,
                node.cols,
                *head_dim,
                &angles.cos,
                &angles.sin,
                angles.freqs,
            );
            accumulate(grads, nodes, *x, dx);
        }
        Op::Attention {
            q,
            k,
            v,
            probs,
            spans,
            shape,
        } => {
            let (qv, kv, vv) = (value(nodes, *q)?, value(nodes, *k)?, value(nodes, *v)?);
            let (dq, dk, dv) = attention::backward(qv, kv, vv, probs, &g, spans, shape);
            accumulate(grads, nodes, *q, dq);
            accumulate(grads, nodes, *k, dk);
            accumulate(grads, nodes, *v, dv);
        }
        Op::Glu { gate, up, act } => {
            let (dg, du) = glu::backward(value(nodes, *gate)?, value(nodes, *up)?, &g, *act);
            accumulate(grads, nodes, *gate, dg);
            accumulate(grads, nodes, *up, du);
        }
        Op::Add { x, y } => {
            accumulate(grads, nodes, *y, g.clone());
            accumulate(grads, nodes, *x, g);
        }
        Op::Gather { x, rows } => {
            let cols = node.cols;
            let mut dx = vec![0f32; nodes[*x].rows * cols];
            for (i, &r) in rows.iter().enumerate() {
                let dst = &mut dx[r * cols..(r + 1) * cols];
                dst.iter_mut()
                    .zip(&g[i * cols..(i + 1) * cols])
                    .for_each(|(a, b)| *a += b);
            }
            accumulate(grads, nodes, *x, dx);
        }
    }
    Ok(())
}
