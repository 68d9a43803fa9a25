//! A deliberately naive f32 backend: plain loops, full score vectors, a growable cache. It shares
//! no kernel with [`super::cpu`], so agreement between the two checks both and keeps the
//! [`Backend`] seam honest.

// Index loops are the point of a naive oracle.
#![allow(clippy::needless_range_loop)]

use super::{
    AttentionParams, Backend, BatchLayout, HostAct, HostTensor, KvLayout, KvStore, MatrixRole,
    RopeAngles,
};
use crate::ModelError;
use crate::config::Activation;
use crate::lora::LoraModule;

/// The naive backend.
#[derive(Debug, Default)]
pub struct ReferenceBackend;

/// A weight matrix, f32, row-major.
pub struct RefMatrix {
    data: Vec<f32>,
    rows: usize,
    cols: usize,
}

/// Per slot, per layer: keys and values as one `Vec<f32>` row per position.
pub struct RefKv {
    layout: KvLayout,
    keys: Vec<Vec<Vec<Vec<f32>>>>,
    values: Vec<Vec<Vec<Vec<f32>>>>,
    lens: Vec<usize>,
}

impl KvStore for RefKv {
    fn layout(&self) -> KvLayout {
        self.layout
    }
    fn seq_len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }
    fn set_seq_len(&mut self, slot: usize, len: usize) {
        if let Some(l) = self.lens.get_mut(slot) {
            *l = len;
            for layer in 0..self.layout.n_layers {
                self.keys[slot][layer].truncate(len);
                self.values[slot][layer].truncate(len);
            }
        }
    }
    fn allocated_bytes(&self) -> usize {
        0
    }
}

impl Backend for ReferenceBackend {
    type Matrix = RefMatrix;
    type Vector = Vec<f32>;
    type Act = HostAct;
    type Kv = RefKv;

    fn name(&self) -> &'static str {
        "reference"
    }

    fn matrix(
        &self,
        _name: &str,
        _role: MatrixRole,
        t: HostTensor,
    ) -> Result<RefMatrix, ModelError> {
        Ok(RefMatrix {
            data: t.to_f32()?,
            rows: t.rows,
            cols: t.cols,
        })
    }

    fn vector(&self, _name: &str, t: HostTensor) -> Result<Vec<f32>, ModelError> {
        t.to_f32()
    }

    /// The CPU backend's figures: the same f32 activation rows. Its weights are f32 in memory,
    /// which a file's weight bytes understate; it is an oracle for tests, never served.
    fn memory_profile(&self) -> super::MemoryProfile {
        super::cpu::memory::PROFILE
    }

    fn forward_transient_bytes(
        &self,
        cfg: &crate::config::ModelConfig,
        tokens: usize,
        ctx: usize,
        threads: usize,
    ) -> u64 {
        super::cpu::memory::forward_transient_bytes(cfg, tokens, ctx, threads)
    }

    fn new_kv(&self, layout: KvLayout) -> Result<RefKv, ModelError> {
        let empty = || vec![vec![Vec::new(); layout.n_layers]; layout.n_slots];
        Ok(RefKv {
            layout,
            keys: empty(),
            values: empty(),
            lens: vec![0; layout.n_slots],
        })
    }

    fn embed(
        &self,
        table: &RefMatrix,
        tokens: &[u32],
        scale: Option<f32>,
    ) -> Result<HostAct, ModelError> {
        let mut out = HostAct::zeros(tokens.len(), table.cols);
        for (i, &t) in tokens.iter().enumerate() {
            let t = t as usize;
            if t >= table.rows {
                return Err(ModelError::Forward(format!(
                    "token id {t} is outside the vocabulary"
                )));
            }
            for c in 0..table.cols {
                out.data[i * table.cols + c] =
                    table.data[t * table.cols + c] * scale.unwrap_or(1.0);
            }
        }
        Ok(out)
    }

    fn rms_norm(&self, x: &HostAct, w: &Vec<f32>, eps: f32, offset: f32) -> HostAct {
        let mut out = x.clone();
        self.head_rms_norm(&mut out, x.cols, w, eps, offset);
        out
    }

    fn head_rms_norm(&self, x: &mut HostAct, head_dim: usize, w: &Vec<f32>, eps: f32, offset: f32) {
        for chunk in x.data.chunks_mut(head_dim) {
            let mut ss = 0f64;
            for v in chunk.iter() {
                ss += (*v as f64) * (*v as f64);
            }
            let inv = 1.0 / ((ss / head_dim as f64) + eps as f64).sqrt();
            for (i, v) in chunk.iter_mut().enumerate() {
                *v = ((*v as f64) * inv * (w[i] as f64 + offset as f64)) as f32;
            }
        }
    }

    fn matmul(&self, x: &HostAct, w: &RefMatrix) -> Result<HostAct, ModelError> {
        if x.cols != w.cols {
            return Err(ModelError::Forward("matmul shape mismatch".into()));
        }
        let mut out = HostAct::zeros(x.rows, w.rows);
        for t in 0..x.rows {
            for r in 0..w.rows {
                let mut s = 0f64;
                for c in 0..w.cols {
                    s += x.data[t * x.cols + c] as f64 * w.data[r * w.cols + c] as f64;
                }
                out.data[t * w.rows + r] = s as f32;
            }
        }
        Ok(out)
    }

    fn lora_add(
        &self,
        y: &mut HostAct,
        x: &HostAct,
        rows: std::ops::Range<usize>,
        w: &LoraModule<'_>,
    ) -> Result<(), ModelError> {
        super::check_lora(y, x, &rows, w)?;
        let (n_in, r, n_out) = (w.in_features, w.rank, w.out_features);
        for t in rows {
            let mut xa = vec![0f64; r];
            for j in 0..r {
                for i in 0..n_in {
                    xa[j] += x.data[t * n_in + i] as f64 * w.a[i * r + j] as f64;
                }
            }
            for o in 0..n_out {
                let mut d = 0f64;
                for j in 0..r {
                    d += xa[j] * w.b[j * n_out + o] as f64;
                }
                y.data[t * n_out + o] += (w.scale as f64 * d) as f32;
            }
        }
        Ok(())
    }

    fn add_bias(&self, x: &mut HostAct, b: &Vec<f32>) {
        for t in 0..x.rows {
            for c in 0..x.cols {
                x.data[t * x.cols + c] += b[c];
            }
        }
    }

    fn rope(&self, x: &mut HostAct, head_dim: usize, angles: &RopeAngles) {
        // Recomputed from positions and frequencies: the tables are the CPU backend's business.
        let (positions, inv_freq) = (&angles.positions, &angles.inv_freq);
        let half = head_dim / 2;
        for t in 0..x.rows {
            for h in 0..x.cols / head_dim {
                let base = t * x.cols + h * head_dim;
                for i in 0..half {
                    let angle = (positions[t] as f32 * inv_freq[i]) as f64;
                    let (a, b) = (x.data[base + i] as f64, x.data[base + i + half] as f64);
                    x.data[base + i] = (a * angle.cos() - b * angle.sin()) as f32;
                    x.data[base + i + half] = (b * angle.cos() + a * angle.sin()) as f32;
                }
            }
        }
    }

    fn attention(
        &self,
        kv: &mut RefKv,
        layer: usize,
        q: &HostAct,
        k: &HostAct,
        v: &HostAct,
        batch: &BatchLayout,
        p: &AttentionParams,
    ) -> Result<HostAct, ModelError> {
        let hd = p.head_dim;
        let mut out = HostAct::zeros(q.rows, p.n_heads * hd);
        let mut row = 0;
        for span in &batch.spans {
            let (keys, values) = (
                &mut kv.keys[span.slot][layer],
                &mut kv.values[span.slot][layer],
            );
            keys.truncate(span.start_pos);
            values.truncate(span.start_pos);
            for t in 0..span.n_tokens {
                keys.push(k.row(row + t).to_vec());
                values.push(v.row(row + t).to_vec());
            }
            for t in 0..span.n_tokens {
                let pos = span.start_pos + t;
                let first = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
                // An encoder sees its whole span.
                let last = match (p.causal, p.window) {
                    (true, _) => pos,
                    (false, None) => span.start_pos + span.n_tokens - 1,
                    (false, Some(w)) => (span.start_pos + span.n_tokens - 1).min(pos + w - 1),
                };
                for h in 0..p.n_heads {
                    let kvh = h / (p.n_heads / p.n_kv_heads);
                    let qh = &q.row(row + t)[h * hd..(h + 1) * hd];
                    let scores: Vec<f64> = (first..=last)
                        .map(|j| {
                            let kj = &keys[j][kvh * hd..(kvh + 1) * hd];
                            qh.iter()
                                .zip(kj)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>()
                                * p.scale as f64
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = exps.iter().sum();
                    for d in 0..hd {
                        let mut acc = 0f64;
                        for (e, j) in exps.iter().zip(first..=last) {
                            acc += e * values[j][kvh * hd + d] as f64;
                        }
                        out.data[(row + t) * p.n_heads * hd + h * hd + d] = (acc / total) as f32;
                    }
                }
            }
            row += span.n_tokens;
        }
        Ok(out)
    }

    fn layer_norm(
        &self,
        x: &HostAct,
        w: &Vec<f32>,
        b: &Vec<f32>,
        eps: f32,
    ) -> Result<HostAct, ModelError> {
        let mut out = x.clone();
        for r in 0..x.rows {
            let row = &mut out.data[r * x.cols..(r + 1) * x.cols];
            let n = row.len() as f64;
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
            for (j, v) in row.iter_mut().enumerate() {
                let normed = (*v as f64 - mean) / (var + eps as f64).sqrt();
                *v = (normed * w[j] as f64 + b[j] as f64) as f32;
            }
        }
        Ok(out)
    }

    fn gelu(&self, x: &HostAct) -> Result<HostAct, ModelError> {
        let mut out = x.clone();
        for v in &mut out.data {
            let z = *v as f64;
            *v = (0.5 * z * (1.0 + libm::erf(z / std::f64::consts::SQRT_2))) as f32;
        }
        Ok(out)
    }

    fn glu(&self, gate: &HostAct, up: &HostAct, act: Activation) -> HostAct {
        let mut out = gate.clone();
        for (g, u) in out.data.iter_mut().zip(&up.data) {
            let x = *g as f64;
            let a = match act {
                Activation::Silu => x / (1.0 + (-x).exp()),
                Activation::GeluTanh => {
                    0.5 * x
                        * (1.0
                            + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x))
                                .tanh())
                }
            };
            *g = (a * *u as f64) as f32;
        }
        out
    }

    fn add_assign(&self, x: &mut HostAct, y: &HostAct) {
        for i in 0..x.data.len() {
            x.data[i] += y.data[i];
        }
    }

    fn gather_rows(&self, x: &HostAct, rows: &[usize]) -> HostAct {
        HostAct {
            data: rows.iter().flat_map(|&r| x.row(r).to_vec()).collect(),
            rows: rows.len(),
            cols: x.cols,
        }
    }

    fn to_host(&self, x: &HostAct) -> Vec<f32> {
        x.data.clone()
    }
}
