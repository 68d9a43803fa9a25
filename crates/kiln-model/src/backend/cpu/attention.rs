//! Causal attention over the cache in whatever format each layer holds. One task per (query,
//! KV head) serves every query head of the GQA group, so each cached row is read — and, for a
//! quantized layer, decoded — once per group. Rows are decoded a tile at a time into a
//! per-thread buffer, never the whole cache. Scores go to a per-thread buffer (one row per
//! head), then an exact two-pass softmax and the weighted sum.
//!
//! TurboQuant layers keep keys and values in a rotated space: the query is rotated in, scores
//! are rotation-invariant, and the output is rotated back once per head.

use std::ops::Range;

use kiln_kernels::attention::block;
use kiln_kernels::attention::tile::{self, Tile};
use kiln_kernels::kv::turbo::TurboCodec;

use super::kv::CpuKv;
use super::kv_cell::{LayerCell, LayerCodec};
use crate::backend::{AttentionParams, BatchLayout, HostAct, KvLayerState};

/// Positions decoded per tile: 64 rows of a 128-wide head are 32 KiB of f32, within L1/L2.
pub const ATTENTION_TILE: usize = 64;
const TILE: usize = ATTENTION_TILE;

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
    let mut out = HostAct::zeros(q.rows, p.n_heads * p.head_dim);
    let kv_ref = &*kv;
    // An encoder's query sees its whole span: up to the span's end in its slot (looked up
    // only then: decoders, on the decode path, allocate nothing here).
    let span_end = |slot: usize| {
        batch
            .spans
            .iter()
            .find(|s| s.slot == slot)
            .map(|s| s.start_pos + s.n_tokens)
    };
    let visible = |slot: usize, pos: usize| match (p.causal, p.window) {
        (false, None) => 0..span_end(slot).unwrap_or(pos + 1),
        (false, Some(w)) => {
            let end = span_end(slot).unwrap_or(pos + 1);
            (pos + 1).saturating_sub(w)..end.min(pos + w)
        }
        (true, Some(w)) => (pos + 1).saturating_sub(w)..pos + 1,
        (true, None) => 0..pos + 1,
    };
    // Chosen per span, never from the whole batch: a one-token span (decode) always takes the
    // split path and a longer one the block path, so a sequence's numbers do not depend on
    // what else shares the forward (the two paths agree only to rounding).
    let (mut decode_rows, mut prefill_runs) = (Vec::new(), Vec::new());
    let mut first = 0;
    for span in &batch.spans {
        if span.n_tokens == 1 {
            decode_rows.push(first);
        } else {
            prefill_runs.push(first..first + span.n_tokens);
        }
        first += span.n_tokens;
    }
    if !decode_rows.is_empty() {
        split_attention(
            kv_ref,
            layer,
            q,
            &queries,
            &decode_rows,
            &visible,
            p,
            &mut out,
        );
    }
    if !prefill_runs.is_empty() {
        block_attention(
            kv_ref,
            layer,
            q,
            &queries,
            &prefill_runs,
            &visible,
            p,
            &mut out,
        );
    }
    out
}

/// Query rows a prefill task takes at most: with every query head of a GQA group, the block
/// of query vectors that shares each decoded key and value tile.
pub const QUERY_BLOCK: usize = 16;

/// Prefill: tasks of up to [`QUERY_BLOCK`] consecutive query rows of one span (`runs`, row
/// ranges), each attending per KV head with [`attend_block`]. Results do not depend on the
/// blocking (see `attn_block`), so the block size may follow the thread count.
#[allow(clippy::too_many_arguments)]
fn block_attention(
    kv: &CpuKv,
    layer: usize,
    q: &HostAct,
    queries: &[(usize, usize)],
    runs: &[Range<usize>],
    visible: &(dyn Fn(usize, usize) -> Range<usize> + Sync),
    p: &AttentionParams,
    out: &mut HostAct,
) {
    let threads = kiln_kernels::pool::global().threads();
    let rows: usize = runs.iter().map(|r| r.len()).sum();
    let block = rows.div_ceil(threads * 4).clamp(1, QUERY_BLOCK);
    let width = p.n_heads * p.head_dim;
    let blocks: Vec<Range<usize>> = runs
        .iter()
        .flat_map(|run| {
            run.clone()
                .step_by(block)
                .map(move |a| a..(a + block).min(run.end))
        })
        .collect();
    let pieces: Vec<Range<usize>> = blocks
        .iter()
        .map(|b| b.start * width..b.end * width)
        .collect();
    // The last block of the batch (the longest of its sequence: it sees the most keys) first.
    kiln_kernels::pool::for_each_piece_mut_last_first(&mut out.data, &pieces, |i, out_run| {
        let rows = blocks[i].clone();
        let slot = queries[rows.start].0;
        for g in 0..p.n_kv_heads {
            let run = BlockRun {
                slot,
                rows: rows.clone(),
                queries,
                visible,
            };
            attend_block(kv, layer, g, q, &run, p, out_run);
        }
    });
}

/// Consecutive query rows of one sequence.
struct BlockRun<'a> {
    slot: usize,
    rows: Range<usize>,
    queries: &'a [(usize, usize)],
    visible: &'a (dyn Fn(usize, usize) -> Range<usize> + Sync),
}

/// Attention of every query head of KV head `g` for the rows of `run`, written (normalised and
/// unrotated) into `out_rows` (the rows' full output width). The keys scored are the union of
/// the rows' visible ranges; each row's softmax covers only its own, the rest weigh 0.
fn attend_block(
    kv: &CpuKv,
    layer: usize,
    g: usize,
    q: &HostAct,
    run: &BlockRun<'_>,
    p: &AttentionParams,
    out_rows: &mut [f32],
) {
    let (hd, group) = (p.head_dim, p.n_heads / p.n_kv_heads);
    let width = p.n_heads * hd;
    let vis = |r: usize| (run.visible)(run.slot, run.queries[r].1);
    let lo = run.rows.clone().map(|r| vis(r).start).min().unwrap_or(0);
    let hi = run.rows.clone().map(|r| vis(r).end).max().unwrap_or(0);
    let n = hi - lo;
    let nq = run.rows.len() * group;
    let (cell, codec) = kv.cell(run.slot, layer);
    let rotations = rotations_of(cell, codec);
    let level = kiln_kernels::cpu_level();
    SCRATCH.with(|cell_scratch| {
        let scratch = &mut *cell_scratch.borrow_mut();
        let Scratch {
            scores,
            tile,
            query,
            keys_t,
            acc,
            sums,
        } = scratch;
        query.clear();
        for r in run.rows.clone() {
            query.extend_from_slice(&q.row(r)[g * group * hd..(g + 1) * group * hd]);
        }
        if let Some((rk, _)) = rotations {
            query.chunks_exact_mut(hd).for_each(|h| rk.rotate(h));
        }
        // Every score is written by the tiles below: only grow, never clear.
        if scores.len() < nq * n {
            scores.resize(nq * n, 0.0);
        }
        let scores = &mut scores[..nq * n];
        for_each_tile(cell, codec, true, g, lo..lo + n, hd, tile, |t0, t| {
            let ld = block::transpose_tile(level, t, keys_t);
            block::block_scores(
                level,
                query,
                hd,
                (keys_t, ld, t.len),
                p.scale,
                scores,
                n,
                t0,
            );
        });
        sums.clear();
        sums.resize(nq, 0.0);
        for (k, r) in run.rows.clone().enumerate() {
            let v = vis(r);
            let v = v.start - lo..v.end - lo;
            for h in 0..group {
                let s = &mut scores[(k * group + h) * n..(k * group + h + 1) * n];
                let (before, rest) = s.split_at_mut(v.start);
                let (mid, after) = rest.split_at_mut(v.len());
                let max = mid.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                sums[k * group + h] = tile::exp_shifted_in_place_at(level, mid, max);
                before.fill(0.0);
                after.fill(0.0);
            }
        }
        acc.clear();
        acc.resize(nq * hd, 0.0);
        for_each_tile(cell, codec, false, g, lo..lo + n, hd, tile, |t0, t| {
            block::block_weighted_sum(level, scores, n, t0, t, acc);
        });
        for k in 0..run.rows.len() {
            let row = &mut out_rows[k * width..(k + 1) * width];
            for h in 0..group {
                let i = k * group + h;
                let out_head = &mut row[(g * group + h) * hd..(g * group + h + 1) * hd];
                let inv = 1.0 / sums[i];
                for (o, &a) in out_head.iter_mut().zip(&acc[i * hd..(i + 1) * hd]) {
                    *o = a * inv;
                }
                if let Some((_, rv)) = rotations {
                    rv.unrotate(out_head);
                }
            }
        }
    });
}

/// Decode rows (`rows`: the query rows of one-token spans): (query, KV head) pairs alone
/// would leave most workers idle (SmolLM2 has 3 KV heads), so the visible keys are split into
/// parts of [`SPLIT_LEN`] positions computed in parallel and merged with their softmax maxima
/// (flash-decoding). The split depends only on each row's position, never on the thread count
/// or the other rows, so results change with neither `--threads` nor the batch. A row with at
/// most `SPLIT_LEN` keys is one part, which merges to exactly what one `attend` gives.
const SPLIT_LEN: usize = 256;

#[allow(clippy::too_many_arguments)]
fn split_attention(
    kv: &CpuKv,
    layer: usize,
    q: &HostAct,
    queries: &[(usize, usize)],
    rows: &[usize],
    visible: &(dyn Fn(usize, usize) -> std::ops::Range<usize> + Sync),
    p: &AttentionParams,
    out: &mut HostAct,
) {
    let (hd, group) = (p.head_dim, p.n_heads / p.n_kv_heads);
    // (query row, KV head, key range) of every part, parts of one (query, head) adjacent.
    let mut parts = Vec::new();
    for &qi in rows {
        let range = visible(queries[qi].0, queries[qi].1);
        for g in 0..p.n_kv_heads {
            for start in range.clone().step_by(SPLIT_LEN) {
                parts.push((qi, g, start..(start + SPLIT_LEN).min(range.end)));
            }
        }
    }
    // Each part leaves its unnormalised output, then its per-head maxima and sums.
    let stride = group * hd + 2 * group;
    let mut partials = vec![0f32; parts.len() * stride];
    kiln_kernels::pool::for_each_chunk_mut(&mut partials, stride, 1, |i, slot_out| {
        let (qi, g, ref range) = parts[i];
        let (slot, _) = queries[qi];
        let q_group = &q.row(qi)[g * group * hd..(g + 1) * group * hd];
        let (acc, stats) = slot_out.split_at_mut(group * hd);
        let part = attend(kv, slot, layer, g, q_group, range.clone(), p, acc);
        stats[..group].copy_from_slice(&part.maxima[..group]);
        stats[group..].copy_from_slice(&part.sums[..group]);
    });
    let mut i = 0;
    while i < parts.len() {
        let (qi, g, _) = parts[i];
        let n = parts[i..]
            .iter()
            .take_while(|&&(q2, g2, _)| (q2, g2) == (qi, g))
            .count();
        let (slot, _) = queries[qi];
        let (cell, codec) = kv.cell(slot, layer);
        let out_group = &mut out.row_mut(qi)[g * group * hd..(g + 1) * group * hd];
        for (h, out_head) in out_group.chunks_exact_mut(hd).enumerate() {
            let part_stats = |k: usize| {
                let st = &partials[(i + k) * stride + group * hd..(i + k + 1) * stride];
                (st[h], st[group + h])
            };
            let max = (0..n)
                .map(|k| part_stats(k).0)
                .fold(f32::NEG_INFINITY, f32::max);
            let mut denom = 0.0;
            for k in 0..n {
                let (m, sum) = part_stats(k);
                let w = (m - max).exp();
                denom += w * sum;
                let acc = &partials[(i + k) * stride + h * hd..(i + k) * stride + (h + 1) * hd];
                out_head.iter_mut().zip(acc).for_each(|(o, &a)| *o += w * a);
            }
            let inv = 1.0 / denom;
            out_head.iter_mut().for_each(|o| *o *= inv);
            if let Some((_, rv)) = rotations_of(cell, codec) {
                rv.unrotate(out_head);
            }
        }
        i += n;
    }
}

/// What one (query, KV head, key range) computation leaves besides its output.
struct Part {
    /// Per query head of the group: the largest score.
    maxima: [f32; MAX_GROUP],
    /// Per query head: `Σ exp(score − max)`.
    sums: [f32; MAX_GROUP],
}

/// Query heads per KV head this kernel serves (GQA groups of today's models are ≤ 16; the
/// backend refuses larger ones before calling it).
pub(crate) const MAX_GROUP: usize = 256;

/// Only a converted cell holds rotated rows; before its conversion a TurboQuant layer attends
/// densely like any other.
fn rotations_of<'a>(
    cell: &LayerCell,
    codec: Option<&'a LayerCodec>,
) -> Option<(&'a TurboCodec, &'a TurboCodec)> {
    match cell.state {
        KvLayerState::Quantized(_) => codec.and_then(|c| c.rotations()),
        KvLayerState::Dense(_) => None,
    }
}

/// Scores `q_group` (the group's query heads) against the keys of `range`, and accumulates
/// `Σ exp(score − max) · value` per head into `out_group` (zeroed by the caller), unnormalised
/// and, for a TurboQuant layer, still rotated.
#[allow(clippy::too_many_arguments)]
fn attend(
    kv: &CpuKv,
    slot: usize,
    layer: usize,
    g: usize,
    q_group: &[f32],
    range: std::ops::Range<usize>,
    p: &AttentionParams,
    out_group: &mut [f32],
) -> Part {
    let (hd, group) = (p.head_dim, p.n_heads / p.n_kv_heads);
    let (first, n) = (range.start, range.len());
    let (cell, codec) = kv.cell(slot, layer);
    let rotations = rotations_of(cell, codec);
    let mut part = Part {
        maxima: [f32::NEG_INFINITY; MAX_GROUP],
        sums: [0.0; MAX_GROUP],
    };
    SCRATCH.with(|cell_scratch| {
        let scratch = &mut *cell_scratch.borrow_mut();
        let Scratch {
            scores,
            tile,
            query,
            ..
        } = scratch;
        query.clear();
        query.extend_from_slice(q_group);
        if let Some((rk, _)) = rotations {
            query.chunks_exact_mut(hd).for_each(|h| rk.rotate(h));
        }
        // The tiles write every score: grow the buffer, never clear it.
        if scores.len() < group * n {
            scores.resize(group * n, 0.0);
        }
        let scores = &mut scores[..group * n];
        let level = kiln_kernels::cpu_level();
        for_each_tile(cell, codec, true, g, first..first + n, hd, tile, |t0, t| {
            tile::tile_scores(level, query, t, p.scale, scores, n, t0);
        });
        for h in 0..group {
            let s = &mut scores[h * n..(h + 1) * n];
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            part.maxima[h] = max;
            part.sums[h] = tile::exp_shifted_in_place_at(level, s, max);
        }
        for_each_tile(
            cell,
            codec,
            false,
            g,
            first..first + n,
            hd,
            tile,
            |t0, t| {
                tile::tile_weighted_sum(level, scores, n, t0, t, out_group);
            },
        );
    });
    part
}

/// Runs `f(offset, tile)` over the keys (`keys`) or values of KV head `g` at `positions`,
/// [`TILE`] rows at a time: dense f32 in place, any other format decoded into `buf`.
#[allow(clippy::too_many_arguments)]
fn for_each_tile(
    cell: &LayerCell,
    codec: Option<&LayerCodec>,
    keys: bool,
    g: usize,
    positions: Range<usize>,
    head_dim: usize,
    buf: &mut Vec<f32>,
    mut f: impl FnMut(usize, Tile<'_>),
) {
    let n = positions.len();
    for t0 in (0..n).step_by(TILE) {
        let len = TILE.min(n - t0);
        let first = positions.start + t0;
        let (rows, stride) = if keys {
            cell.keys(codec, g, first, len, buf)
        } else {
            cell.values(codec, g, first, len, buf)
        };
        f(
            t0,
            Tile {
                rows,
                stride,
                len,
                head_dim,
            },
        );
    }
}

/// Per-thread buffers of the attention tasks, kept between calls: the transient is
/// `(heads per KV head × context + TILE × head_dim + group × head_dim) × 4` bytes per worker.
#[derive(Default)]
struct Scratch {
    /// Softmax weights, `[group][visible keys]`.
    scores: Vec<f32>,
    /// One decoded tile of keys or values.
    tile: Vec<f32>,
    /// The group's query heads (rotated for TurboQuant layers); in prefill, for every row of
    /// the block.
    query: Vec<f32>,
    /// Prefill: the decoded key tile transposed to `[head_dim][positions]`.
    keys_t: Vec<f32>,
    /// Prefill: the block's unnormalised outputs, `[query vector][head_dim]`.
    acc: Vec<f32>,
    /// Prefill: each query vector's softmax denominator.
    sums: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DenseKv, KvLayout, KvPlan, KvQuantFormat, KvStore};

    fn noise(n: usize, seed: u64, amp: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * amp
            })
            .collect()
    }

    fn act(rows: usize, cols: usize, seed: u64, amp: f32) -> HostAct {
        let mut a = HostAct::zeros(rows, cols);
        a.data = noise(rows * cols, seed, amp);
        a
    }

    /// One layer of SmolLM2's attention shape: 9 query heads over `kvh` KV heads of `hd`,
    /// one slot of 1,024 positions.
    fn smollm2_shaped(kvh: usize, hd: usize) -> (AttentionParams, KvLayout) {
        let p = AttentionParams {
            n_heads: 9,
            n_kv_heads: kvh,
            head_dim: hd,
            scale: 0.125,
            window: None,
            causal: true,
        };
        let layout = KvLayout {
            n_layers: 1,
            n_kv_heads: kvh,
            head_dim: hd,
            n_slots: 1,
            capacity: 1024,
        };
        (p, layout)
    }

    /// The split (flash-decoding) path agrees with the block (prefill) path, on dense, affine
    /// and TurboQuant cells.
    #[test]
    fn split_decode_matches_the_block_path() {
        let (kvh, hd, n) = (3, 64, 700);
        let (p, layout) = smollm2_shaped(kvh, hd);
        let formats = [
            None,
            Some(KvQuantFormat::Affine {
                bits: 4,
                group_size: 32,
            }),
            Some(KvQuantFormat::Turbo {
                k_bits: 8,
                v_bits: 3,
            }),
        ];
        for format in formats {
            let plan = KvPlan {
                dense: DenseKv::F32,
                quantized: vec![format],
                start: 0,
            };
            let mut kv = CpuKv::planned(layout, &plan).unwrap();
            let (k, v) = (act(n, kvh * hd, 1, 6.0), act(n, kvh * hd, 2, 4.0));
            let q = act(n, 9 * hd, 3, 3.0);
            attention(&mut kv, 0, &q, &k, &v, &BatchLayout::single(0, 0, n), &p);
            kv.set_seq_len(0, n);
            kv.convert_due(0).unwrap();
            // Five query rows take the block (prefill) path, one takes the split path.
            let tail = |rows: usize| {
                let mut a = HostAct::zeros(rows, q.cols);
                for r in 0..rows {
                    a.row_mut(r).copy_from_slice(q.row(n - rows + r));
                }
                a
            };
            let pick = |x: &HostAct, rows: usize| {
                let mut a = HostAct::zeros(rows, x.cols);
                for r in 0..rows {
                    a.row_mut(r).copy_from_slice(x.row(n - rows + r));
                }
                a
            };
            let five = attention(
                &mut kv,
                0,
                &tail(5),
                &pick(&k, 5),
                &pick(&v, 5),
                &BatchLayout::single(0, n - 5, 5),
                &p,
            );
            let one = attention(
                &mut kv,
                0,
                &tail(1),
                &pick(&k, 1),
                &pick(&v, 1),
                &BatchLayout::single(0, n - 1, 1),
                &p,
            );
            let worst = five
                .row(4)
                .iter()
                .zip(one.row(0))
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "{format:?}: split differs by {worst}");
        }
    }

    /// An f16 / bf16 cell attends exactly like an f32 cell holding the same (rounded) values:
    /// prefill blocks, one decode task per KV head and the split decode path, over several
    /// tiles and every KV head.
    #[test]
    fn sixteen_bit_cells_attend_like_f32_cells_with_the_same_values() {
        let (kvh, hd, n) = (3, 64, 700);
        let (p, layout) = smollm2_shaped(kvh, hd);
        let plan = |dense| KvPlan {
            dense,
            quantized: vec![None],
            start: 0,
        };
        type Rounding = fn(f32) -> f32;
        let round = |x: &HostAct, through: Rounding| {
            let mut r = x.clone();
            r.data.iter_mut().for_each(|v| *v = through(*v));
            r
        };
        let (k, v) = (act(n, kvh * hd, 1, 6.0), act(n, kvh * hd, 2, 4.0));
        let q = act(n, 9 * hd, 3, 3.0);
        let cases: [(DenseKv, Rounding); 2] = [
            (DenseKv::F16, |v| half::f16::from_f32(v).to_f32()),
            (DenseKv::Bf16, |v| half::bf16::from_f32(v).to_f32()),
        ];
        for (dtype, through) in cases {
            // Prefill (block tasks), two-row decodes within 256 positions (one task per KV
            // head), another prefill, five rows (block) and one row past 256 (split tasks),
            // on both caches.
            let steps = [(0, 194), (194, 2), (196, 2), (198, 496), (694, 5), (699, 1)];
            assert_eq!(steps.iter().map(|s| s.1).sum::<usize>(), n);
            let run = |dense: DenseKv, k: &HostAct, v: &HostAct| {
                let mut kv = CpuKv::planned(layout, &plan(dense)).unwrap();
                let rows_at = |x: &HostAct, from: usize, rows: usize| {
                    let mut a = HostAct::zeros(rows, x.cols);
                    a.data
                        .copy_from_slice(&x.data[from * x.cols..(from + rows) * x.cols]);
                    a
                };
                let mut outs = Vec::new();
                for (from, rows) in steps {
                    outs.push(attention(
                        &mut kv,
                        0,
                        &rows_at(&q, from, rows),
                        &rows_at(k, from, rows),
                        &rows_at(v, from, rows),
                        &BatchLayout::single(0, from, rows),
                        &p,
                    ));
                }
                outs
            };
            let got = run(dtype, &k, &v);
            let want = run(DenseKv::F32, &round(&k, through), &round(&v, through));
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    g.data
                        .iter()
                        .zip(&w.data)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{dtype:?} differs from f32 holding the same values"
                );
            }
        }
    }
}
