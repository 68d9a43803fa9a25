//! Causal attention over the dense cache. One task per (query, KV head) serves every query head
//! of the GQA group, so each cached key and value row is read once per group; scores go to a
//! per-thread buffer (one row per head), then an exact two-pass softmax and the weighted sum.

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
    // One task per (query, KV head): the query heads of a GQA group are adjacent in the output
    // row, and each key/value row is loaded once for all of them.
    kiln_kernels::pool::for_each_chunk_mut(&mut out.data, group * hd, 1, |idx, out_group| {
        let (qi, g) = (idx / p.n_kv_heads, idx % p.n_kv_heads);
        let (slot, pos) = queries[qi];
        let first = match p.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        };
        let n = pos + 1 - first;
        let q_group = &q.row(qi)[g * group * hd..(g + 1) * group * hd];
        SCORES.with(|cell| {
            let mut scores = cell.borrow_mut();
            scores.clear();
            scores.resize(group * n, 0.0);
            for (jj, j) in (first..=pos).enumerate() {
                let off = kv_ref.offset(slot, j) + g * hd;
                let kj = &keys[off..off + hd];
                for h in 0..group {
                    scores[h * n + jj] = dot(&q_group[h * hd..(h + 1) * hd], kj) * p.scale;
                }
            }
            for h in 0..group {
                let s = &mut scores[h * n..(h + 1) * n];
                let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let inv = 1.0 / kiln_kernels::softmax::exp_shifted_in_place(s, max);
                s.iter_mut().for_each(|x| *x *= inv);
            }
            for (jj, j) in (first..=pos).enumerate() {
                let off = kv_ref.offset(slot, j) + g * hd;
                let vj = &values[off..off + hd];
                for (h, out_head) in out_group.chunks_exact_mut(hd).enumerate() {
                    let w = scores[h * n + jj];
                    out_head.iter_mut().zip(vj).for_each(|(o, &x)| *o += w * x);
                }
            }
        });
    });
    out
}

thread_local! {
    /// Softmax weights of one task, `[group][visible keys]`: the attention transient is
    /// `heads per KV head × context × 4` bytes per worker thread, reused across calls.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
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
