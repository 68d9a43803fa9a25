//! Causal attention over the dense cache with an online softmax: one pass over the visible keys,
//! no score matrix materialised, so the transient memory is one head's accumulator per task.

use super::kv::CpuKv;
use crate::backend::{AttentionParams, BatchLayout, HostAct};

/// Writes the batch's keys/values into the cache, then computes attention for every query row.
pub(crate) fn attention(
    kv: &mut CpuKv,
    layer: usize,
    q: &HostAct,
    k: &HostAct,
    v: &HostAct,
    batch: &BatchLayout,
    p: &AttentionParams,
) -> HostAct {
    let kvw = kv.kv_width();
    let mut row = 0;
    for span in &batch.spans {
        for t in 0..span.n_tokens {
            let off = kv.offset(span.slot, span.start_pos + t);
            kv.keys[layer][off..off + kvw].copy_from_slice(k.row(row + t));
            kv.values[layer][off..off + kvw].copy_from_slice(v.row(row + t));
        }
        row += span.n_tokens;
    }

    // (query row, slot, position) for every token of the batch.
    let mut queries = Vec::with_capacity(batch.total_tokens());
    for span in &batch.spans {
        for t in 0..span.n_tokens {
            queries.push((span.slot, span.start_pos + t));
        }
    }
    let hd = p.head_dim;
    let group = p.n_heads / p.n_kv_heads;
    let mut out = HostAct::zeros(q.rows, p.n_heads * hd);
    let (keys, values) = (&kv.keys[layer], &kv.values[layer]);
    let kv_ref = &*kv;
    kiln_kernels::pool::for_each_chunk_mut(&mut out.data, hd, 1, |idx, out_head| {
        let (qi, h) = (idx / p.n_heads, idx % p.n_heads);
        let (slot, pos) = queries[qi];
        let q_head = &q.row(qi)[h * hd..(h + 1) * hd];
        let kvh = h / group;
        let first = match p.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        };
        let mut max = f32::NEG_INFINITY;
        let mut denom = 0f32;
        for j in first..=pos {
            let off = kv_ref.offset(slot, j) + kvh * hd;
            let score = dot(q_head, &keys[off..off + hd]) * p.scale;
            let vj = &values[off..off + hd];
            if score > max {
                let correction = (max - score).exp();
                denom *= correction;
                out_head.iter_mut().for_each(|o| *o *= correction);
                max = score;
            }
            let w = (score - max).exp();
            denom += w;
            out_head.iter_mut().zip(vj).for_each(|(o, &x)| *o += w * x);
        }
        let inv = 1.0 / denom;
        out_head.iter_mut().for_each(|o| *o *= inv);
    });
    out
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums let the compiler vectorise without -ffast-math.
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8 * 8;
    for (ca, cb) in a[..chunks].chunks_exact(8).zip(b[..chunks].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks..a.len() {
        s += a[i] * b[i];
    }
    s
}
