//! Dense f32 KV storage, preallocated per layer for every slot.

use crate::ModelError;
use crate::backend::{KvLayout, KvSnapshot, KvStore};

/// Keys and values for `n_slots` sequences of up to `capacity` positions, `[slot][pos][kv_width]`
/// per layer. The buffers are zero-filled with `vec!`, which the allocator serves from fresh
/// pages: memory is committed only as positions are written.
pub struct CpuKv {
    layout: KvLayout,
    pub(crate) keys: Vec<Vec<f32>>,
    pub(crate) values: Vec<Vec<f32>>,
    lens: Vec<usize>,
}

impl CpuKv {
    pub(crate) fn new(layout: KvLayout) -> Result<Self, ModelError> {
        let per_layer = layout
            .n_slots
            .checked_mul(layout.capacity)
            .and_then(|n| n.checked_mul(layout.n_kv_heads * layout.head_dim))
            .ok_or_else(|| ModelError::Forward(format!("KV layout {layout:?} overflows")))?;
        Ok(Self {
            layout,
            keys: (0..layout.n_layers).map(|_| vec![0.0; per_layer]).collect(),
            values: (0..layout.n_layers).map(|_| vec![0.0; per_layer]).collect(),
            lens: vec![0; layout.n_slots],
        })
    }

    pub(crate) fn kv_width(&self) -> usize {
        self.layout.n_kv_heads * self.layout.head_dim
    }

    /// Offset of `(slot, pos)` in a layer buffer.
    pub(crate) fn offset(&self, slot: usize, pos: usize) -> usize {
        (slot * self.layout.capacity + pos) * self.kv_width()
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
        if let Some(l) = self.lens.get_mut(slot) {
            *l = len.min(self.layout.capacity);
        }
    }

    fn allocated_bytes(&self) -> usize {
        2 * self.layout.n_layers
            * self.keys.first().map_or(0, Vec::len)
            * std::mem::size_of::<f32>()
    }

    fn export_prefix(&self, slot: usize, len: usize) -> Option<KvSnapshot> {
        if slot >= self.layout.n_slots || len > self.seq_len(slot) {
            return None;
        }
        let (start, end) = (self.offset(slot, 0), self.offset(slot, len));
        let layers = self
            .keys
            .iter()
            .zip(&self.values)
            .map(|(k, v)| (k[start..end].to_vec(), v[start..end].to_vec()))
            .collect();
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
        let start = self.offset(slot, 0);
        let n = len * width;
        for (layer, (k, v)) in snapshot.layers.iter().enumerate() {
            self.keys[layer][start..start + n].copy_from_slice(&k[..n]);
            self.values[layer][start..start + n].copy_from_slice(&v[..n]);
        }
        self.lens[slot] = len;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_import_round_trip_and_bounds() {
        let layout = KvLayout {
            n_layers: 2,
            n_kv_heads: 1,
            head_dim: 2,
            n_slots: 2,
            capacity: 4,
        };
        let mut kv = CpuKv::new(layout).unwrap();
        for layer in 0..2 {
            for (i, x) in kv.keys[layer].iter_mut().enumerate() {
                *x = (layer * 100 + i) as f32;
            }
        }
        kv.set_seq_len(1, 3);
        assert!(kv.export_prefix(1, 4).is_none(), "beyond the slot's length");
        let snap = kv.export_prefix(1, 3).unwrap();
        assert_eq!(snap.len, 3);
        assert_eq!(snap.bytes(), 2 * 2 * 3 * 2 * 4);
        assert_eq!(snap.layers[1].0[0], 108.0); // slot 1 starts at position 4 × width 2
        assert!(kv.import_prefix(0, &snap, 2));
        assert_eq!(kv.seq_len(0), 2);
        assert_eq!(kv.keys[1][..4], [108.0, 109.0, 110.0, 111.0]);
        assert!(
            !kv.import_prefix(0, &snap, 4),
            "more than the snapshot holds"
        );
        assert!(!kv.import_prefix(5, &snap, 1), "no such slot");
    }
}
