//! One layer of one sequence: its keys and values in the layer's current format, written a row
//! (position × KV head) at a time and read back by the attention kernel in f32 tiles.

use half::bf16;
use kiln_kernels::kv::affine::AffineCodec;
use kiln_kernels::kv::half_conv;
use kiln_kernels::kv::turbo::TurboCodec;

use super::kv_buf::KvBuf;
use crate::ModelError;
use crate::backend::{DenseKv, KvLayerState, KvQuantFormat};

/// TurboQuant rotation seeds (optiq's convention): keys use `base + layer`, values that plus 500,
/// so keys and values of a layer see independent rotations. Fixed forever: a saved cache must
/// decode the same way.
const TURBO_SEED_BASE: u64 = 42;
const TURBO_VALUE_SEED_OFFSET: u64 = 500;

/// The quantizer of one layer, shared by every sequence.
pub(crate) enum LayerCodec {
    Affine(AffineCodec),
    Turbo { k: TurboCodec, v: TurboCodec },
}

impl LayerCodec {
    pub(crate) fn new(
        format: KvQuantFormat,
        layer: usize,
        head_dim: usize,
    ) -> Result<Self, ModelError> {
        let err = |e: kiln_kernels::KernelError| {
            ModelError::Forward(format!("KV cache layer {layer}: {e}"))
        };
        Ok(match format {
            KvQuantFormat::Affine { bits, group_size } => {
                Self::Affine(AffineCodec::new(head_dim, bits, group_size).map_err(err)?)
            }
            KvQuantFormat::Turbo { k_bits, v_bits } => {
                let seed = TURBO_SEED_BASE + layer as u64;
                Self::Turbo {
                    k: TurboCodec::new(head_dim, k_bits, seed).map_err(err)?,
                    v: TurboCodec::new(head_dim, v_bits, seed + TURBO_VALUE_SEED_OFFSET)
                        .map_err(err)?,
                }
            }
        })
    }

    fn row_bytes(&self) -> (usize, usize) {
        match self {
            Self::Affine(c) => (c.row_bytes(), c.row_bytes()),
            Self::Turbo { k, v } => (k.row_bytes(), v.row_bytes()),
        }
    }

    /// The rotations attention must apply (query in, output out) when keys and values are kept
    /// in TurboQuant's rotated space.
    pub(crate) fn rotations(&self) -> Option<(&TurboCodec, &TurboCodec)> {
        match self {
            Self::Turbo { k, v } => Some((k, v)),
            Self::Affine(_) => None,
        }
    }
}

/// Keys and values of one (sequence, layer), `[kv head][position]` rows: decode attention
/// reads one KV head's rows per task, and a contiguous stream of them is fetched from memory
/// about three times faster than the same rows strided between the other heads'.
pub(crate) struct LayerCell {
    pub(crate) state: KvLayerState,
    keys: KvBuf,
    values: KvBuf,
    /// Bytes of one head row of keys / values.
    k_row: usize,
    v_row: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Positions per head.
    capacity: usize,
}

impl LayerCell {
    /// An empty dense cell for `capacity` positions.
    pub(crate) fn dense(
        dtype: DenseKv,
        capacity: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self, ModelError> {
        let row = head_dim * dtype.bytes();
        Self::with_rows(
            KvLayerState::Dense(dtype),
            (row, row),
            capacity,
            n_kv_heads,
            head_dim,
        )
    }

    /// An empty quantized cell for `capacity` positions.
    pub(crate) fn quantized(
        format: KvQuantFormat,
        codec: &LayerCodec,
        capacity: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self, ModelError> {
        Self::with_rows(
            KvLayerState::Quantized(format),
            codec.row_bytes(),
            capacity,
            n_kv_heads,
            head_dim,
        )
    }

    fn with_rows(
        state: KvLayerState,
        (k_row, v_row): (usize, usize),
        capacity: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self, ModelError> {
        let rows = capacity
            .checked_mul(n_kv_heads)
            .ok_or_else(|| ModelError::Forward("KV capacity overflows".into()))?;
        let bytes = |row: usize| {
            rows.checked_mul(row)
                .ok_or_else(|| ModelError::Forward("KV capacity overflows".into()))
        };
        Ok(Self {
            state,
            keys: KvBuf::zeroed(bytes(k_row)?)?,
            values: KvBuf::zeroed(bytes(v_row)?)?,
            k_row,
            v_row,
            n_kv_heads,
            head_dim,
            capacity,
        })
    }

    /// Bytes reserved for keys and values.
    pub(crate) fn reserved_bytes(&self) -> usize {
        self.keys.len() + self.values.len()
    }

    /// Bytes one position takes, keys and values, every head.
    pub(crate) fn bytes_per_position(&self) -> usize {
        (self.k_row + self.v_row) * self.n_kv_heads
    }

    /// Stores the keys and values of position `pos` (`kv_width` floats each).
    pub(crate) fn write(
        &mut self,
        codec: Option<&LayerCodec>,
        pos: usize,
        key: &[f32],
        value: &[f32],
    ) {
        let hd = self.head_dim;
        for head in 0..self.n_kv_heads {
            let (k, v) = (&key[head * hd..][..hd], &value[head * hd..][..hd]);
            let row = self.row(head, pos);
            match (self.state, codec) {
                (KvLayerState::Dense(dtype), _) => {
                    write_dense(&mut self.keys, dtype, row * hd, k);
                    write_dense(&mut self.values, dtype, row * hd, v);
                }
                (KvLayerState::Quantized(_), Some(LayerCodec::Affine(c))) => {
                    c.quantize(
                        k,
                        &mut self.keys.bytes_mut()[row * self.k_row..][..self.k_row],
                    );
                    c.quantize(
                        v,
                        &mut self.values.bytes_mut()[row * self.v_row..][..self.v_row],
                    );
                }
                (KvLayerState::Quantized(_), Some(LayerCodec::Turbo { k: ck, v: cv })) => {
                    ck.quantize(
                        k,
                        &mut self.keys.bytes_mut()[row * self.k_row..][..self.k_row],
                    );
                    cv.quantize(
                        v,
                        &mut self.values.bytes_mut()[row * self.v_row..][..self.v_row],
                    );
                }
                // `CpuKv` pairs every quantized cell with its codec.
                (KvLayerState::Quantized(_), None) => {}
            }
        }
    }

    /// Keys of `head` at positions `first..first + n` as f32 rows: returns the rows and the
    /// distance between consecutive rows. Dense f32 is read in place; every other format is
    /// decoded into `tile` (TurboQuant rows stay in the rotated space).
    pub(crate) fn keys<'a>(
        &'a self,
        codec: Option<&LayerCodec>,
        head: usize,
        first: usize,
        n: usize,
        tile: &'a mut Vec<f32>,
    ) -> (&'a [f32], usize) {
        self.rows(true, codec, head, first, n, tile)
    }

    /// Values of `head`, as [`LayerCell::keys`].
    pub(crate) fn values<'a>(
        &'a self,
        codec: Option<&LayerCodec>,
        head: usize,
        first: usize,
        n: usize,
        tile: &'a mut Vec<f32>,
    ) -> (&'a [f32], usize) {
        self.rows(false, codec, head, first, n, tile)
    }

    fn rows<'a>(
        &'a self,
        keys: bool,
        codec: Option<&LayerCodec>,
        head: usize,
        first: usize,
        n: usize,
        tile: &'a mut Vec<f32>,
    ) -> (&'a [f32], usize) {
        let (buf, row_bytes) = if keys {
            (&self.keys, self.k_row)
        } else {
            (&self.values, self.v_row)
        };
        let hd = self.head_dim;
        debug_assert!(first + n <= self.capacity, "rows past the capacity");
        let first_row = self.row(head, first);
        if self.state == KvLayerState::Dense(DenseKv::F32) {
            return (&buf.f32s()[first_row * hd..], hd);
        }
        // Every value of the tile is written below: grow the buffer, never clear it.
        if tile.len() < n * hd {
            tile.resize(n * hd, 0.0);
        }
        let rows = &mut tile[..n * hd];
        // A head's positions are consecutive rows, so the tile is one run of the buffer.
        let encoded = || &buf.bytes()[first_row * row_bytes..][..n * row_bytes];
        let level = kiln_kernels::cpu_level();
        match (self.state, codec) {
            (KvLayerState::Dense(dtype), _) => read_dense(buf, dtype, first_row * hd, rows),
            (KvLayerState::Quantized(_), Some(LayerCodec::Affine(c))) => {
                c.dequantize_rows_at(level, encoded(), rows)
            }
            (KvLayerState::Quantized(_), Some(LayerCodec::Turbo { k, v })) => {
                let c = if keys { k } else { v };
                c.dequantize_rows_rotated_at(level, encoded(), rows)
            }
            // Quantized cells always come with their codec (`convert_due`); zeros, not stale
            // values, if one ever did not.
            (KvLayerState::Quantized(_), None) => rows.fill(0.0),
        }
        (rows, hd)
    }

    /// Position `pos`'s keys and values as f32 `kv_width` rows; only for dense cells.
    pub(crate) fn dense_row(&self, pos: usize, key: &mut [f32], value: &mut [f32]) -> bool {
        let KvLayerState::Dense(dtype) = self.state else {
            return false;
        };
        let hd = self.head_dim;
        for (head, (k, v)) in key
            .chunks_exact_mut(hd)
            .zip(value.chunks_exact_mut(hd))
            .enumerate()
        {
            let at = self.row(head, pos) * hd;
            read_dense(&self.keys, dtype, at, k);
            read_dense(&self.values, dtype, at, v);
        }
        true
    }

    /// Index of the row of `head` at `pos`. A position past the capacity would land in the
    /// next head's rows, not past the buffer: the model checks positions against the capacity
    /// before any forward, and this re-checks in debug builds.
    fn row(&self, head: usize, pos: usize) -> usize {
        debug_assert!(
            pos < self.capacity,
            "position {pos} ≥ capacity {}",
            self.capacity
        );
        head * self.capacity + pos
    }
}

// bf16 rows are written one value at a time through `half`: one row per token and layer,
// against whole tiles read per token, so only the read side has a vector path.
fn write_dense(buf: &mut KvBuf, dtype: DenseKv, at: usize, x: &[f32]) {
    let level = kiln_kernels::cpu_level();
    match dtype {
        DenseKv::F32 => buf.f32s_mut()[at..at + x.len()].copy_from_slice(x),
        DenseKv::F16 => half_conv::f32_to_f16_at(level, x, &mut buf.u16s_mut()[at..at + x.len()]),
        DenseKv::Bf16 => buf.u16s_mut()[at..at + x.len()]
            .iter_mut()
            .zip(x)
            .for_each(|(o, &v)| *o = bf16::from_f32(v).to_bits()),
    }
}

fn read_dense(buf: &KvBuf, dtype: DenseKv, at: usize, out: &mut [f32]) {
    let level = kiln_kernels::cpu_level();
    let n = out.len();
    match dtype {
        DenseKv::F32 => out.copy_from_slice(&buf.f32s()[at..at + n]),
        DenseKv::F16 => half_conv::f16_to_f32_at(level, &buf.u16s()[at..at + n], out),
        DenseKv::Bf16 => half_conv::bf16_to_f32_at(level, &buf.u16s()[at..at + n], out),
    }
}
