//! The memory budget as the scheduler bills it: the bytes left for KV once weights, runtime
//! and the forward's transient are paid, against every slot's pages and the prompt cache.

use serde::Serialize;

use crate::kv_scheme::memory::KvGeometry;

/// KV bytes the scheduler may hold.
#[derive(Debug, Clone, PartialEq)]
pub struct KvBudget {
    /// Bytes for every slot's KV plus the prompt cache.
    pub room_bytes: u64,
    geometry: KvGeometry,
    chunk: usize,
    peak: u64,
}

/// The bill as `/stats` shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BillStats {
    /// Bytes for KV the budget leaves.
    pub room_bytes: u64,
    /// Billed now: slots at their high-water marks plus the prompt cache.
    pub billed_bytes: u64,
    /// The most billed before any forward so far.
    pub peak_billed_bytes: u64,
}

impl KvBudget {
    /// `room_bytes` for KV under `geometry`, prefills in chunks of `chunk`.
    pub fn new(room_bytes: u64, geometry: KvGeometry, chunk: usize) -> Self {
        Self {
            room_bytes,
            geometry,
            chunk,
            peak: 0,
        }
    }

    /// The most bytes a slot that has written `positions` holds (a delayed scheme's
    /// conversion moment included).
    pub fn slot_bytes(&self, positions: usize) -> u64 {
        if positions == 0 {
            return 0;
        }
        self.geometry.peak_bytes_at(positions, self.chunk)
    }

    pub(crate) fn observe(&mut self, billed: u64) {
        self.peak = self.peak.max(billed);
    }

    pub(crate) fn stats(&self, billed: u64) -> BillStats {
        BillStats {
            room_bytes: self.room_bytes,
            billed_bytes: billed,
            peak_billed_bytes: self.peak,
        }
    }
}
