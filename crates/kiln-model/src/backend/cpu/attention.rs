//! Causal attention over the cache in whatever format each layer holds. One task per (query,
//! KV head) serves every query head of the GQA group, so each cached row is read — and, for a
//! quantized layer, decoded — once per group. Rows are decoded a tile at a time into a
//! per-thread buffer, never the whole cache. Scores go to a per-thread buffer (one row per
//! head), then an exact two-pass softmax and the weighted sum.
//!
//! TurboQuant layers keep keys and values in a rotated space: the query is rotated in, scores
//! are rotation-invariant, and the output is rotated back once per head.

use super::kv::CpuKv;
use crate::backend::{AttentionParams, BatchLayout, HostAct, KvLayerState};

/// Positions decoded per tile: 64 rows of a 128-wide head are 32 KiB of f32, within L1/L2.
const TILE: usize = 64;

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
    let mut row = 0;
    for span in &batch.spans {
        for t in 0..span.n_tokens {
            kv.write(
                span.slot,
                layer,
                span.start_pos + t,
                k.row(row + t),
                v.row(row + t),
            );
        }
        row += span.n_tokens;
    }

    // (slot, position) of every query row of the batch.
    let mut queries = Vec::with_capacity(batch.total_tokens());
    for span in &batch.spans {
        for t in 0..span.n_tokens {
            queries.push((span.slot, span.start_pos + t));
        }
    }
    let hd = p.head_dim;
    let group = p.n_heads / p.n_kv_heads;
    let mut out = HostAct::zeros(q.rows, p.n_heads * hd);
    let kv_ref = &*kv;
    kiln_kernels::pool::for_each_chunk_mut(&mut out.data, group * hd, 1, |idx, out_group| {
        let (qi, g) = (idx / p.n_kv_heads, idx % p.n_kv_heads);
        let (slot, pos) = queries[qi];
        let first = match p.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        };
        let n = pos + 1 - first;
        let (cell, codec) = kv_ref.cell(slot, layer);
        // Only a converted cell holds rotated rows; before its conversion a TurboQuant layer
        // attends densely like any other.
        let rotations = match cell.state {
            KvLayerState::Quantized(_) => codec.and_then(|c| c.rotations()),
            KvLayerState::Dense(_) => None,
        };
        SCRATCH.with(|cell_scratch| {
            let scratch = &mut *cell_scratch.borrow_mut();
            let Scratch {
                scores,
                tile,
                query,
            } = scratch;
            query.clear();
            query.extend_from_slice(&q.row(qi)[g * group * hd..(g + 1) * group * hd]);
            if let Some((rk, _)) = rotations {
                query.chunks_exact_mut(hd).for_each(|h| rk.rotate(h));
            }
            scores.clear();
            scores.resize(group * n, 0.0);
            for t0 in (0..n).step_by(TILE) {
                let len = TILE.min(n - t0);
                let (rows, stride) = cell.keys(codec, g, first + t0, len, tile);
                for jj in 0..len {
                    let kj = &rows[jj * stride..jj * stride + hd];
                    for h in 0..group {
                        scores[h * n + t0 + jj] = dot(&query[h * hd..(h + 1) * hd], kj) * p.scale;
                    }
                }
            }
            for h in 0..group {
                let s = &mut scores[h * n..(h + 1) * n];
                let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let inv = 1.0 / kiln_kernels::softmax::exp_shifted_in_place(s, max);
                s.iter_mut().for_each(|x| *x *= inv);
            }
            for t0 in (0..n).step_by(TILE) {
                let len = TILE.min(n - t0);
                let (rows, stride) = cell.values(codec, g, first + t0, len, tile);
                for jj in 0..len {
                    let vj = &rows[jj * stride..jj * stride + hd];
                    for (h, out_head) in out_group.chunks_exact_mut(hd).enumerate() {
                        let w = scores[h * n + t0 + jj];
                        out_head.iter_mut().zip(vj).for_each(|(o, &x)| *o += w * x);
                    }
                }
            }
            if let Some((_, rv)) = rotations {
                out_group.chunks_exact_mut(hd).for_each(|h| rv.unrotate(h));
            }
        });
    });
    out
}

/// Per-thread buffers of the attention tasks, kept between calls: the transient is
/// `(heads per KV head × context + TILE × head_dim + group × head_dim) × 4` bytes per worker.
#[derive(Default)]
struct Scratch {
    /// Softmax weights, `[group][visible keys]`.
    scores: Vec<f32>,
    /// One decoded tile of keys or values.
    tile: Vec<f32>,
    /// The group's query heads (rotated for TurboQuant layers).
    query: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
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
