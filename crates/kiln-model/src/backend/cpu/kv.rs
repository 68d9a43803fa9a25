//! The CPU KV store: per sequence and layer, a dense cell that converts once to its planned
//! quantized format when the sequence reaches the plan's start.

use std::sync::Arc;

use super::kv_cell::{LayerCell, LayerCodec};
use crate::ModelError;
use crate::backend::{DenseKv, KvLayerState, KvLayout, KvPlan, KvSnapshot, KvStore};

/// Keys and values for `n_slots` sequences of up to `capacity` positions. Every cell is
/// reserved at full capacity but commits memory only as positions are written.
pub struct CpuKv {
    layout: KvLayout,
    plan: KvPlan,
    /// Per layer: the quantizer its cells convert with.
    codecs: Vec<Option<Arc<LayerCodec>>>,
    /// `[slot][layer]`.
    cells: Vec<Vec<LayerCell>>,
    lens: Vec<usize>,
    conversions: u64,
}

impl CpuKv {
    /// A dense f32 store.
    pub(crate) fn new(layout: KvLayout) -> Result<Self, ModelError> {
        Self::planned(layout, &KvPlan::dense(DenseKv::F32, layout.n_layers))
    }

    /// A store that keeps layers as `plan` says.
    pub(crate) fn planned(layout: KvLayout, plan: &KvPlan) -> Result<Self, ModelError> {
        plan.validate(layout.n_layers, layout.head_dim)?;
        layout
            .n_slots
            .checked_mul(layout.capacity)
            .and_then(|n| n.checked_mul(layout.n_kv_heads * layout.head_dim * 4))
            .ok_or_else(|| ModelError::Forward(format!("KV layout {layout:?} overflows")))?;
        let codecs = plan
            .quantized
            .iter()
            .enumerate()
            .map(|(layer, q)| {
                q.map(|f| LayerCodec::new(f, layer, layout.head_dim).map(Arc::new))
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut kv = Self {
            layout,
            plan: plan.clone(),
            codecs,
            cells: Vec::with_capacity(layout.n_slots),
            lens: vec![0; layout.n_slots],
            conversions: 0,
        };
        for _ in 0..layout.n_slots {
            let cells = kv.dense_cells()?;
            kv.cells.push(cells);
        }
        Ok(kv)
    }

    fn dense_cells(&self) -> Result<Vec<LayerCell>, ModelError> {
        let l = self.layout;
        (0..l.n_layers)
            .map(|_| LayerCell::dense(self.plan.dense, l.capacity, l.n_kv_heads, l.head_dim))
            .collect()
    }

    pub(crate) fn kv_width(&self) -> usize {
        self.layout.n_kv_heads * self.layout.head_dim
    }

    /// The cell of `(slot, layer)` and its codec.
    pub(crate) fn cell(&self, slot: usize, layer: usize) -> (&LayerCell, Option<&LayerCodec>) {
        (&self.cells[slot][layer], self.codecs[layer].as_deref())
    }

    /// Stores position `pos` of `slot` at `layer`.
    pub(crate) fn write(&mut self, slot: usize, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let codec = self.codecs[layer].as_deref();
        self.cells[slot][layer].write(codec, pos, k, v);
    }

    /// Puts `slot` back into dense cells (a new sequence starts dense). Allocation failure
    /// leaves the converted cells in place: still the planned format, only converted early.
    fn revert_to_dense(&mut self, slot: usize) {
        let converted = self.cells[slot]
            .iter()
            .any(|c| c.state != KvLayerState::Dense(self.plan.dense));
        if !converted {
            return;
        }
        match self.dense_cells() {
            Ok(cells) => self.cells[slot] = cells,
            Err(e) => tracing::warn!(slot, "KV slot stays quantized for its next sequence: {e}"),
        }
    }
}

impl KvStore for CpuKv {
    fn layout(&self) -> KvLayout {
        self.layout
    }

    fn seq_len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }

    fn set_seq_len(&mut self, slot: usize, len: usize) {
        if slot >= self.layout.n_slots {
            return;
        }
        self.lens[slot] = len.min(self.layout.capacity);
        if len == 0 {
            self.revert_to_dense(slot);
        }
    }

    fn allocated_bytes(&self) -> usize {
        self.cells
            .iter()
            .flatten()
            .map(LayerCell::reserved_bytes)
            .sum()
    }

    fn release(&mut self, slot: usize) -> bool {
        if slot >= self.layout.n_slots {
            return false;
        }
        self.lens[slot] = 0;
        // Fresh mappings: dropping the old cells unmaps their pages at once.
        match self.dense_cells() {
            Ok(cells) => {
                self.cells[slot] = cells;
                true
            }
            Err(e) => {
                tracing::warn!(slot, "KV slot kept its pages: {e}");
                false
            }
        }
    }

    fn export_prefix(&self, slot: usize, len: usize) -> Option<KvSnapshot> {
        if slot >= self.layout.n_slots || len > self.seq_len(slot) {
            return None;
        }
        let w = self.kv_width();
        let mut layers = Vec::with_capacity(self.layout.n_layers);
        for cell in &self.cells[slot] {
            let (mut k, mut v) = (vec![0.0; len * w], vec![0.0; len * w]);
            for (pos, (kr, vr)) in k.chunks_exact_mut(w).zip(v.chunks_exact_mut(w)).enumerate() {
                // A converted layer cannot be exported without changing what it holds.
                if !cell.dense_row(pos, kr, vr) {
                    return None;
                }
            }
            layers.push((k, v));
        }
        Some(KvSnapshot { len, layers })
    }

    fn import_prefix(&mut self, slot: usize, snapshot: &KvSnapshot, len: usize) -> bool {
        let width = self.kv_width();
        let fits = slot < self.layout.n_slots
            && len <= snapshot.len
            && len <= self.layout.capacity
            && snapshot.layers.len() == self.layout.n_layers
            && snapshot
                .layers
                .iter()
                .all(|(k, v)| k.len() == snapshot.len * width && v.len() == snapshot.len * width);
        if !fits {
            return false;
        }
        self.set_seq_len(slot, 0);
        if self.cells[slot]
            .iter()
            .any(|c| c.state != KvLayerState::Dense(self.plan.dense))
        {
            return false;
        }
        for (layer, (k, v)) in snapshot.layers.iter().enumerate() {
            for pos in 0..len {
                let r = pos * width..(pos + 1) * width;
                self.write(slot, layer, pos, &k[r.clone()], &v[r]);
            }
        }
        self.lens[slot] = len;
        true
    }

    fn convert_due(&mut self, slot: usize) -> Result<usize, ModelError> {
        let len = self.seq_len(slot);
        if slot >= self.layout.n_slots || len == 0 || len < self.plan.start {
            return Ok(0);
        }
        let l = self.layout;
        let w = self.kv_width();
        let mut converted = 0;
        let (mut key, mut value) = (vec![0.0; w], vec![0.0; w]);
        for layer in 0..l.n_layers {
            let (Some(format), Some(codec)) =
                (self.plan.quantized[layer], self.codecs[layer].clone())
            else {
                continue;
            };
            if !matches!(self.cells[slot][layer].state, KvLayerState::Dense(_)) {
                continue;
            }
            // One layer at a time: the new cell is filled, then the dense one is dropped, so
            // the transient is a single layer.
            let mut cell =
                LayerCell::quantized(format, &codec, l.capacity, l.n_kv_heads, l.head_dim)?;
            for pos in 0..len {
                self.cells[slot][layer].dense_row(pos, &mut key, &mut value);
                cell.write(Some(&codec), pos, &key, &value);
            }
            self.cells[slot][layer] = cell;
            self.conversions += 1;
            converted += 1;
        }
        Ok(converted)
    }

    fn conversions(&self) -> u64 {
        self.conversions
    }

    fn layer_states(&self, slot: usize) -> Vec<KvLayerState> {
        self.cells
            .get(slot)
            .map(|cells| cells.iter().map(|c| c.state).collect())
            .unwrap_or_default()
    }

    fn slot_bytes(&self, slot: usize) -> usize {
        let len = self.seq_len(slot);
        self.cells.get(slot).map_or(0, |cells| {
            cells.iter().map(|c| c.bytes_per_position() * len).sum()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DenseKv, KvQuantFormat};

    fn layout(n_layers: usize, n_kv_heads: usize, head_dim: usize, capacity: usize) -> KvLayout {
        KvLayout {
            n_layers,
            n_kv_heads,
            head_dim,
            n_slots: 2,
            capacity,
        }
    }

    #[test]
    fn export_import_round_trip_and_bounds() {
        let mut kv = CpuKv::new(layout(2, 1, 2, 4)).unwrap();
        for layer in 0..2 {
            for pos in 0..3 {
                let k = [
                    (layer * 100 + pos * 2) as f32,
                    (layer * 100 + pos * 2 + 1) as f32,
                ];
                kv.write(1, layer, pos, &k, &k);
            }
        }
        kv.set_seq_len(1, 3);
        assert!(kv.export_prefix(1, 4).is_none(), "beyond the slot's length");
        let snap = kv.export_prefix(1, 3).unwrap();
        assert_eq!(snap.len, 3);
        assert_eq!(snap.bytes(), 2 * 2 * 3 * 2 * 4);
        assert_eq!(snap.layers[1].0[..3], [100.0, 101.0, 102.0]);
        assert!(kv.import_prefix(0, &snap, 2));
        assert_eq!(kv.seq_len(0), 2);
        assert_eq!(
            kv.export_prefix(0, 2).unwrap().layers[1].0,
            [100.0, 101.0, 102.0, 103.0]
        );
        assert!(
            !kv.import_prefix(0, &snap, 4),
            "more than the snapshot holds"
        );
        assert!(!kv.import_prefix(5, &snap, 1), "no such slot");
    }

    fn plan(start: usize, format: KvQuantFormat, dense: DenseKv, layers: usize) -> KvPlan {
        KvPlan {
            dense,
            quantized: (0..layers).map(|l| (l != 1).then_some(format)).collect(),
            start,
        }
    }

    #[test]
    fn converts_at_the_start_once_per_layer_and_reverts_for_a_new_sequence() {
        let affine = KvQuantFormat::Affine {
            bits: 8,
            group_size: 32,
        };
        let mut kv =
            CpuKv::planned(layout(3, 2, 64, 16), &plan(4, affine, DenseKv::F32, 3)).unwrap();
        let row: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        for pos in 0..3 {
            for layer in 0..3 {
                kv.write(0, layer, pos, &row, &row);
            }
        }
        kv.set_seq_len(0, 3);
        assert_eq!(kv.convert_due(0).unwrap(), 0, "below the start");
        kv.set_seq_len(0, 4);
        assert_eq!(kv.convert_due(0).unwrap(), 2, "layer 1 stays dense");
        assert_eq!(kv.convert_due(0).unwrap(), 0, "exactly once");
        assert_eq!(kv.conversions(), 2);
        let states = kv.layer_states(0);
        assert_eq!(states[0], KvLayerState::Quantized(affine));
        assert_eq!(states[1], KvLayerState::Dense(DenseKv::F32));
        assert!(
            kv.export_prefix(0, 2).is_none(),
            "converted layers are not exported"
        );
        // 8-bit codes of a smooth row come back within half a step.
        let mut tile = Vec::new();
        let (cell, codec) = kv.cell(0, 0);
        let (rows, stride) = cell.keys(codec, 1, 2, 1, &mut tile);
        assert_eq!(stride, 64);
        for (a, b) in rows[..64].iter().zip(&row[64..]) {
            assert!((a - b).abs() < 2.0 / 255.0, "{a} vs {b}");
        }
        kv.set_seq_len(0, 0);
        assert_eq!(kv.layer_states(0)[0], KvLayerState::Dense(DenseKv::F32));
        kv.set_seq_len(0, 0);
        assert_eq!(kv.convert_due(0).unwrap(), 0, "never while empty");
    }

    #[test]
    fn reserved_bytes_match_the_format_sizes() {
        let turbo = KvQuantFormat::Turbo {
            k_bits: 8,
            v_bits: 3,
        };
        let (kvh, hd, cap) = (3, 64, 32);
        let mut kv =
            CpuKv::planned(layout(2, kvh, hd, cap), &plan(0, turbo, DenseKv::F16, 2)).unwrap();
        assert_eq!(kv.allocated_bytes(), 2 * 2 * cap * 2 * kvh * hd * 2);
        let row = vec![0.5f32; kvh * hd];
        kv.write(0, 0, 0, &row, &row);
        kv.set_seq_len(0, 1);
        assert_eq!(kv.convert_due(0).unwrap(), 1);
        let turbo_row = turbo.kv_row_bytes(hd);
        assert_eq!(turbo_row, 64 + 2 + 24 + 2);
        assert_eq!(kv.slot_bytes(0), kvh * turbo_row + 2 * kvh * hd * 2);
        assert_eq!(
            kv.allocated_bytes(),
            cap * (kvh * turbo_row + 2 * kvh * hd * 2) + 2 * cap * 2 * kvh * hd * 2
        );
    }

    #[test]
    fn a_plan_a_layer_cannot_use_is_refused_naming_the_layer() {
        let turbo = KvQuantFormat::Turbo {
            k_bits: 8,
            v_bits: 3,
        };
        let Err(e) = CpuKv::planned(layout(3, 1, 48, 8), &plan(0, turbo, DenseKv::F32, 3)) else {
            panic!("head dim 48 has no Walsh–Hadamard rotation");
        };
        assert!(e.to_string().contains("layer 0"), "{e}");
    }
}
