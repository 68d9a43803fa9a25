//! Dense f32 KV storage, preallocated per layer for every slot.

use crate::ModelError;
use crate::backend::{KvLayout, KvStore};

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
}
