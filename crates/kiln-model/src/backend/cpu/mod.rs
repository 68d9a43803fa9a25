//! The CPU backend: kiln's own kernels (quantized int8 dot products, f32 SIMD) over host memory.

mod attention;
mod elementwise;
mod kv;
mod kv_buf;
mod kv_cell;
mod lora;
pub mod memory;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kiln_kernels::arena::WeightBuf;
use kiln_kernels::head::i16_acts::{Q16Activations, matmul_repacked_q16};
use kiln_kernels::head::q6_k_split::{self, SplitActivations, matmul_q6_k_split};
use kiln_kernels::repack::{RepackedMatrix, matmul_repacked_many_into};
use kiln_kernels::{GgmlType, QMatrix, QuantizedActivations};

pub use attention::{ATTENTION_TILE, QUERY_BLOCK};
pub use kv::CpuKv;

use super::{
    AttentionParams, Backend, BatchLayout, HostAct, HostTensor, KvLayout, KvPlan, KvQuantFormat,
    MatrixRole, MemoryProfile, OpProfile, RopeAngles, TensorBytes,
};
use crate::ModelError;
use crate::config::Activation;
use crate::lora::LoraModule;

/// How the CPU backend keeps weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuOptions {
    /// Dequantize every matrix to f32 at load (the exact "dense" path) instead of running the
    /// quantized kernels.
    pub dense: bool,
}

/// A weight matrix on the CPU.
pub enum CpuMatrix {
    /// f32 values, row-major.
    F32 {
        /// Values.
        data: Vec<f32>,
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
    },
    /// Quantized (or f16/bf16) rows in their file layout.
    Quant {
        /// Storage type.
        ty: GgmlType,
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
        /// Raw row bytes.
        bytes: QuantBytes,
        /// Multiply with unquantized activations instead of 8-bit ones.
        f32_activations: bool,
    },
    /// Quantized rows interleaved 16 at a time for the AVX-512 VNNI kernels
    /// (`kiln_kernels::repack`).
    Repacked(RepackedMatrix),
    /// An output head (see `f32_activations`) of Q8_0 rows interleaved as `Repacked`, run with
    /// 16-bit activations (`kiln_kernels::head::i16_acts`).
    RepackedHead(RepackedMatrix),
}

impl CpuMatrix {
    fn rows(&self) -> usize {
        match self {
            Self::F32 { rows, .. } | Self::Quant { rows, .. } => *rows,
            Self::Repacked(m) | Self::RepackedHead(m) => m.rows(),
        }
    }

    fn cols(&self) -> usize {
        match self {
            Self::F32 { cols, .. } | Self::Quant { cols, .. } => *cols,
            Self::Repacked(m) | Self::RepackedHead(m) => m.cols(),
        }
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        match self {
            Self::F32 { data, .. } => data.len() * 4,
            Self::Quant { bytes, .. } => bytes.len(),
            Self::Repacked(m) | Self::RepackedHead(m) => m.size_bytes(),
        }
    }
}

/// Where a file-layout matrix's bytes live.
pub enum QuantBytes {
    /// Copied onto huge pages where the OS allows (`kiln_kernels::arena`): matrices that are
    /// multiplied, whose every byte a decoded token streams.
    Arena(WeightBuf),
    /// Left in the model file's map: lookup tables, of which a token reads one row.
    Mapped(TensorBytes),
}

impl std::ops::Deref for QuantBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Arena(b) => b,
            Self::Mapped(b) => b,
        }
    }
}

/// The CPU backend.
pub struct CpuBackend {
    options: CpuOptions,
    /// Reused quantized-activation buffer, so a matmul allocates nothing once warm.
    scratch: Mutex<QuantizedActivations>,
    /// The same for the output head's 16-bit activations.
    head_scratch: Mutex<Q16Activations>,
    /// The same for a Q6_K head's 15-bit activations.
    split_scratch: Mutex<SplitActivations>,
    matmul_ns: AtomicU64,
    attention_ns: AtomicU64,
    other_ns: AtomicU64,
}

/// Adds the time since `start` to `counter` (an `Instant` read costs ~20 ns; a layer runs a
/// dozen timed ops, so this stays far below 0.1% of a token).
fn charge(counter: &AtomicU64, start: Instant) {
    counter.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

impl CpuBackend {
    /// A backend with the given weight policy.
    pub fn new(options: CpuOptions) -> Self {
        Self {
            options,
            scratch: Mutex::new(QuantizedActivations::new()),
            head_scratch: Mutex::new(Q16Activations::new()),
            split_scratch: Mutex::new(SplitActivations::new()),
            matmul_ns: AtomicU64::new(0),
            attention_ns: AtomicU64::new(0),
            other_ns: AtomicU64::new(0),
        }
    }
}

impl Backend for CpuBackend {
    type Matrix = CpuMatrix;
    type Vector = Vec<f32>;
    type Act = HostAct;
    type Kv = CpuKv;

    fn name(&self) -> &'static str {
        if self.options.dense {
            "cpu-dense"
        } else {
            "cpu"
        }
    }

    fn matrix(
        &self,
        _name: &str,
        role: MatrixRole,
        t: HostTensor,
    ) -> Result<CpuMatrix, ModelError> {
        if self.options.dense || t.ty == GgmlType::F32 {
            let data = t.to_f32()?;
            return Ok(CpuMatrix::F32 {
                data,
                rows: t.rows,
                cols: t.cols,
            });
        }
        if role == MatrixRole::Lookup && t.bytes.is_mapped() {
            // `embed` cuts rows by index, so the size is checked here, once.
            QMatrix::new(t.ty, t.rows, t.cols, &t.bytes)?;
            return Ok(CpuMatrix::Quant {
                ty: t.ty,
                rows: t.rows,
                cols: t.cols,
                bytes: QuantBytes::Mapped(t.bytes),
                f32_activations: true,
            });
        }
        // The output head (the embedding table when tied) keeps its activations unrounded
        // (f32, `kiln_kernels::head::f32_acts`, which says what this buys) or, for Q8_0 heads on
        // AVX-512, at 16 bits (`kiln_kernels::head::i16_acts`), or for Q6_K heads at AVX2 and
        // above, at 15 bits (`kiln_kernels::head::q6_k_split`, chosen at the matmul).
        let f32_activations = role != MatrixRole::Projection;
        let level = kiln_kernels::cpu_level();
        // The mapped pages `t` holds are released when it is dropped, below.
        let matrix = if f32_activations && kiln_kernels::head::i16_acts::worthwhile(level, t.ty) {
            CpuMatrix::RepackedHead(RepackedMatrix::from_file_bytes(
                t.ty, t.rows, t.cols, &t.bytes,
            )?)
        } else if !f32_activations && RepackedMatrix::worthwhile(level, t.ty) {
            CpuMatrix::Repacked(RepackedMatrix::from_file_bytes(
                t.ty, t.rows, t.cols, &t.bytes,
            )?)
        } else {
            CpuMatrix::Quant {
                ty: t.ty,
                rows: t.rows,
                cols: t.cols,
                bytes: QuantBytes::Arena(WeightBuf::copy_of(&t.bytes, 0)),
                f32_activations,
            }
        };
        Ok(matrix)
    }

    fn vector(&self, _name: &str, t: HostTensor) -> Result<Vec<f32>, ModelError> {
        t.to_f32()
    }

    fn new_kv(&self, layout: KvLayout) -> Result<CpuKv, ModelError> {
        CpuKv::new(layout)
    }

    fn new_kv_planned(&self, layout: KvLayout, plan: &KvPlan) -> Result<CpuKv, ModelError> {
        CpuKv::planned(layout, plan)
    }

    fn kv_converts_per_slot(&self) -> bool {
        true
    }

    fn memory_profile(&self) -> MemoryProfile {
        memory::PROFILE
    }

    fn forward_transient_bytes(
        &self,
        cfg: &crate::config::ModelConfig,
        tokens: usize,
        ctx: usize,
        threads: usize,
    ) -> u64 {
        memory::forward_transient_bytes(cfg, tokens, ctx, threads)
    }

    fn kv_can_store(&self, format: KvQuantFormat, layer: usize, head_dim: usize) -> bool {
        kv_cell::LayerCodec::new(format, layer, head_dim).is_ok()
    }

    fn embed(
        &self,
        table: &CpuMatrix,
        tokens: &[u32],
        scale: Option<f32>,
    ) -> Result<HostAct, ModelError> {
        let _timer = Timer::new(&self.other_ns);
        let (rows, cols) = (table.rows(), table.cols());
        let mut out = HostAct::zeros(tokens.len(), cols);
        for (i, &tok) in tokens.iter().enumerate() {
            let r = tok as usize;
            if r >= rows {
                return Err(ModelError::Forward(format!(
                    "token id {tok} is outside the vocabulary of {rows}"
                )));
            }
            let dst = &mut out.data[i * cols..(i + 1) * cols];
            match table {
                CpuMatrix::F32 { data, .. } => dst.copy_from_slice(&data[r * cols..(r + 1) * cols]),
                CpuMatrix::Quant { ty, bytes, .. } => {
                    let rb = ty.row_bytes(cols)?;
                    kiln_kernels::dequantize_row(*ty, &bytes[r * rb..(r + 1) * rb], dst)?;
                }
                CpuMatrix::Repacked(m) | CpuMatrix::RepackedHead(m) => {
                    m.dequantize_row(r, dst)?;
                }
            }
            if let Some(s) = scale {
                dst.iter_mut().for_each(|x| *x *= s);
            }
        }
        Ok(out)
    }

    fn rms_norm(&self, x: &HostAct, w: &Vec<f32>, eps: f32, offset: f32) -> HostAct {
        let _timer = Timer::new(&self.other_ns);
        let data = new_par_rows(x.rows, x.cols, |r, row| {
            row.copy_from_slice(x.row(r));
            elementwise::rms_norm_in_place(row, w, eps, offset)
        });
        HostAct {
            data,
            rows: x.rows,
            cols: x.cols,
        }
    }

    fn head_rms_norm(&self, x: &mut HostAct, head_dim: usize, w: &Vec<f32>, eps: f32, offset: f32) {
        let _timer = Timer::new(&self.other_ns);
        for head in x.data.chunks_exact_mut(head_dim) {
            elementwise::rms_norm_in_place(head, w, eps, offset);
        }
    }

    fn matmul(&self, x: &HostAct, w: &CpuMatrix) -> Result<HostAct, ModelError> {
        let _timer = Timer::new(&self.matmul_ns);
        if x.cols != w.cols() {
            return Err(ModelError::Forward(format!(
                "matmul: input width {} != weight cols {}",
                x.cols,
                w.cols()
            )));
        }
        let mut out = HostAct {
            data: Vec::new(),
            rows: x.rows,
            cols: w.rows(),
        };
        // The repacked kernel sizes its output without zeroing it (a prefill's outputs are
        // megabytes); the others, off the hot path, take a zeroed one.
        if !matches!(w, CpuMatrix::Repacked(_)) {
            out.data = vec![0.0; x.rows * w.rows()];
        }
        match w {
            CpuMatrix::F32 { data, rows, cols } => {
                kiln_kernels::matmul_f32(data, *rows, *cols, &x.data, x.rows, &mut out.data)?;
            }
            CpuMatrix::Quant {
                ty,
                rows,
                cols,
                bytes,
                f32_activations: true,
            } => {
                let qm = QMatrix::new(*ty, *rows, *cols, bytes)?;
                if q6_k_split::worthwhile(kiln_kernels::cpu_level(), *ty) {
                    let mut scratch = self.split_scratch.lock().unwrap_or_else(|p| p.into_inner());
                    matmul_q6_k_split(&qm, &x.data, x.rows, &mut out.data, &mut scratch)?;
                } else {
                    kiln_kernels::matmul_f32_activations(&qm, &x.data, x.rows, &mut out.data)?;
                }
            }
            CpuMatrix::Quant {
                ty,
                rows,
                cols,
                bytes,
                f32_activations: false,
            } => {
                let qm = QMatrix::new(*ty, *rows, *cols, bytes)?;
                let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
                kiln_kernels::matmul(&qm, &x.data, x.rows, &mut out.data, &mut scratch)?;
            }
            CpuMatrix::Repacked(m) => {
                let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
                let data = &mut out.data;
                matmul_repacked_many_into([m], &x.data, x.rows, [data], &mut scratch)?;
            }
            CpuMatrix::RepackedHead(m) => {
                let mut scratch = self.head_scratch.lock().unwrap_or_else(|p| p.into_inner());
                matmul_repacked_q16(m, &x.data, x.rows, &mut out.data, &mut scratch)?;
            }
        }
        Ok(out)
    }

    fn matmul_each<const M: usize>(
        &self,
        x: &HostAct,
        ws: [&CpuMatrix; M],
    ) -> Result<[HostAct; M], ModelError> {
        // Repacked matrices that take the same activations share their quantization and one
        // dispatch of the pool; anything else goes one matrix at a time.
        let repacked = ws.map(|w| match w {
            CpuMatrix::Repacked(m) => Some(m),
            _ => None,
        });
        let format = |m: &RepackedMatrix| kiln_kernels::ActFormat::for_weight(m.ty()).ok();
        let first = repacked.first().copied().flatten().and_then(format);
        let shared = first.is_some()
            && repacked
                .iter()
                .all(|m| m.is_some_and(|m| format(m) == first && m.cols() == x.cols));
        if !shared || M < 2 {
            return crate::backend::matmul_separately(self, x, ws);
        }
        let _timer = Timer::new(&self.matmul_ns);
        let mut datas = ws.map(|_| Vec::new());
        let ms = repacked.map(|m| m.expect("checked: every matrix is repacked"));
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        matmul_repacked_many_into(ms, &x.data, x.rows, datas.each_mut(), &mut scratch)?;
        let mut datas = datas.into_iter();
        Ok(ws.map(|w| HostAct {
            data: datas.next().unwrap_or_default(),
            rows: x.rows,
            cols: w.rows(),
        }))
    }

    fn lora_add(
        &self,
        y: &mut HostAct,
        x: &HostAct,
        rows: std::ops::Range<usize>,
        w: &LoraModule<'_>,
    ) -> Result<(), ModelError> {
        let _timer = Timer::new(&self.matmul_ns);
        super::check_lora(y, x, &rows, w)?;
        let (n_in, n_out) = (w.in_features, w.out_features);
        lora::add_delta(
            &x.data[rows.start * n_in..rows.end * n_in],
            &mut y.data[rows.start * n_out..rows.end * n_out],
            w,
        );
        Ok(())
    }

    fn lora_add_each<const M: usize>(
        &self,
        ys: [&mut HostAct; M],
        x: &HostAct,
        rows: std::ops::Range<usize>,
        ws: [Option<LoraModule<'_>>; M],
    ) -> Result<(), ModelError> {
        let _timer = Timer::new(&self.matmul_ns);
        let mut jobs = Vec::with_capacity(M);
        for (y, w) in ys.into_iter().zip(ws) {
            if let Some(w) = w {
                super::check_lora(y, x, &rows, &w)?;
                let (n_in, n_out) = (w.in_features, w.out_features);
                let y = &mut y.data[rows.start * n_out..rows.end * n_out];
                jobs.push((
                    Mutex::new(y),
                    w,
                    &x.data[rows.start * n_in..rows.end * n_in],
                ));
            }
        }
        lora::add_deltas(&jobs);
        Ok(())
    }

    fn add_bias(&self, x: &mut HostAct, b: &Vec<f32>) {
        let _timer = Timer::new(&self.other_ns);
        for row in x.data.chunks_exact_mut(x.cols) {
            row.iter_mut().zip(b).for_each(|(v, bi)| *v += bi);
        }
    }

    fn rope(&self, x: &mut HostAct, head_dim: usize, angles: &RopeAngles) {
        let _timer = Timer::new(&self.other_ns);
        let half = angles.inv_freq.len();
        par_rows(&mut x.data, x.cols, |t, row| {
            let (cos, sin) = (
                &angles.cos[t * half..(t + 1) * half],
                &angles.sin[t * half..(t + 1) * half],
            );
            elementwise::rope_row(row, head_dim, cos, sin);
        });
    }

    fn attention(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        q: &HostAct,
        k: &HostAct,
        v: &HostAct,
        batch: &BatchLayout,
        params: &AttentionParams,
    ) -> Result<HostAct, ModelError> {
        let _timer = Timer::new(&self.attention_ns);
        let group = params.n_heads / params.n_kv_heads.max(1);
        if params.n_kv_heads == 0 || group > attention::MAX_GROUP {
            return Err(ModelError::Forward(format!(
                "{} query heads over {} KV heads: the CPU attention serves at most {} per KV head",
                params.n_heads,
                params.n_kv_heads,
                attention::MAX_GROUP
            )));
        }
        Ok(attention::attention(kv, layer, q, k, v, batch, params))
    }

    fn glu(&self, gate: &HostAct, up: &HostAct, act: Activation) -> HostAct {
        let _timer = Timer::new(&self.other_ns);
        let cols = gate.cols;
        let data = new_par_rows(gate.rows, cols, |r, row| {
            row.copy_from_slice(gate.row(r));
            elementwise::glu_in_place(row, &up.data[r * cols..(r + 1) * cols], act)
        });
        HostAct {
            data,
            rows: gate.rows,
            cols,
        }
    }

    fn layer_norm(
        &self,
        x: &HostAct,
        w: &Vec<f32>,
        b: &Vec<f32>,
        eps: f32,
    ) -> Result<HostAct, ModelError> {
        let _timer = Timer::new(&self.other_ns);
        if w.len() != x.cols || b.len() != x.cols {
            return Err(ModelError::Forward(format!(
                "LayerNorm of width {} on rows of {}",
                w.len(),
                x.cols
            )));
        }
        let data = new_par_rows(x.rows, x.cols, |r, row| {
            row.copy_from_slice(x.row(r));
            elementwise::layer_norm_in_place(row, w, b, eps)
        });
        Ok(HostAct {
            data,
            rows: x.rows,
            cols: x.cols,
        })
    }

    fn gelu(&self, x: &HostAct) -> Result<HostAct, ModelError> {
        let _timer = Timer::new(&self.other_ns);
        let data = new_par_rows(x.rows, x.cols, |r, row| {
            row.copy_from_slice(x.row(r));
            row.iter_mut().for_each(|v| *v = elementwise::gelu_erf(*v));
        });
        Ok(HostAct {
            data,
            rows: x.rows,
            cols: x.cols,
        })
    }

    fn add_assign(&self, x: &mut HostAct, y: &HostAct) {
        let _timer = Timer::new(&self.other_ns);
        let cols = x.cols;
        par_rows(&mut x.data, cols, |r, row| {
            let src = &y.data[r * cols..(r + 1) * cols];
            row.iter_mut().zip(src).for_each(|(a, b)| *a += b);
        });
    }

    fn gather_rows(&self, x: &HostAct, rows: &[usize]) -> HostAct {
        let _timer = Timer::new(&self.other_ns);
        let mut out = HostAct::zeros(rows.len(), x.cols);
        for (dst, &r) in out.data.chunks_exact_mut(x.cols).zip(rows) {
            dst.copy_from_slice(x.row(r));
        }
        out
    }

    fn to_host(&self, x: &HostAct) -> Vec<f32> {
        x.data.clone()
    }

    fn take_profile(&self) -> Option<OpProfile> {
        Some(OpProfile {
            matmul_ns: self.matmul_ns.swap(0, Ordering::Relaxed),
            attention_ns: self.attention_ns.swap(0, Ordering::Relaxed),
            other_ns: self.other_ns.swap(0, Ordering::Relaxed),
        })
    }
}

/// Values in a buffer below which a row-wise step runs on the calling thread.
const MIN_PARALLEL: usize = 1 << 14;

/// Runs `f(row index, row)` on every `cols`-wide row of `data`; across the pool when there is
/// enough work to pay for the dispatch (a prefill chunk), in place otherwise (a decode step).
/// Rows are independent, so the result does not depend on the split.
fn par_rows(data: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if cols == 0 {
        return;
    }
    if data.len() < MIN_PARALLEL {
        data.chunks_exact_mut(cols)
            .enumerate()
            .for_each(|(r, row)| f(r, row));
        return;
    }
    let per_piece = (MIN_PARALLEL / 4 / cols).max(1);
    kiln_kernels::pool::for_each_chunk_mut(data, per_piece * cols, 1, |c, piece| {
        for (i, row) in piece.chunks_exact_mut(cols).enumerate() {
            f(c * per_piece + i, row);
        }
    });
}

/// A new `rows × cols` buffer whose row `r` is what `f(r, row)` leaves in it (the row starts
/// zeroed), split as [`par_rows`] splits: with a prefill's rows on the pool, where each task
/// zeroes its own rows, so no thread clears the whole buffer first.
fn new_par_rows(rows: usize, cols: usize, f: impl Fn(usize, &mut [f32]) + Sync) -> Vec<f32> {
    let len = rows * cols;
    if cols == 0 || len < MIN_PARALLEL {
        let mut data = vec![0.0; len];
        par_rows(&mut data, cols, f);
        return data;
    }
    kiln_kernels::pool::new_rows(rows, cols, (MIN_PARALLEL / 4 / cols).max(1), f)
}

/// Charges the lifetime of the guard to a counter.
struct Timer<'a> {
    counter: &'a AtomicU64,
    start: Instant,
}

impl<'a> Timer<'a> {
    fn new(counter: &'a AtomicU64) -> Self {
        Self {
            counter,
            start: Instant::now(),
        }
    }
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        charge(self.counter, self.start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q8_0(rows: usize, cols: usize) -> HostTensor {
        let row = GgmlType::Q8_0.row_bytes(cols).expect("row bytes");
        HostTensor {
            ty: GgmlType::Q8_0,
            rows,
            cols,
            bytes: vec![0; rows * row].into(),
        }
    }

    fn is_head(m: &CpuMatrix) -> bool {
        match m {
            CpuMatrix::RepackedHead(_) => true,
            CpuMatrix::Quant {
                f32_activations, ..
            } => *f32_activations,
            _ => false,
        }
    }

    #[test]
    fn the_role_not_the_name_decides_how_a_matrix_is_stored() {
        let b = CpuBackend::new(CpuOptions { dense: false });
        let head = b
            .matrix(
                "model.layers.0.mlp.up_proj.weight",
                MatrixRole::Head,
                q8_0(64, 64),
            )
            .expect("matrix");
        assert!(is_head(&head));
        let table = b
            .matrix("anything", MatrixRole::Embedding, q8_0(64, 64))
            .expect("matrix");
        assert!(is_head(&table));
        let projection = b
            .matrix("lm_head.weight", MatrixRole::Projection, q8_0(64, 64))
            .expect("matrix");
        assert!(!is_head(&projection));
    }

    /// Q8_0 rows whose values are the row index, as the bytes of a file map.
    fn mapped_q8_0(rows: usize, cols: usize) -> HostTensor {
        use std::io::Write;
        let values: Vec<f32> = (0..rows * cols).map(|i| (i / cols) as f32).collect();
        let encoded =
            kiln_kernels::encode::encode_rows(GgmlType::Q8_0, &values, rows, cols).expect("encode");
        let mut f = tempfile::tempfile().expect("temp file");
        f.write_all(&encoded).expect("write");
        // SAFETY: a private temporary file nothing else writes.
        let map = std::sync::Arc::new(unsafe { memmap2::Mmap::map(&f) }.expect("map"));
        HostTensor {
            ty: GgmlType::Q8_0,
            rows,
            cols,
            bytes: TensorBytes::mapped(map, 0, encoded.len()).expect("range"),
        }
    }

    #[test]
    fn a_lookup_table_stays_in_the_file_map_and_embeds_the_same_rows() {
        let b = CpuBackend::new(CpuOptions { dense: false });
        let lookup = b
            .matrix("t", MatrixRole::Lookup, mapped_q8_0(40, 64))
            .expect("matrix");
        assert!(matches!(
            lookup,
            CpuMatrix::Quant {
                bytes: QuantBytes::Mapped(_),
                ..
            }
        ));
        let copied = b
            .matrix("t", MatrixRole::Embedding, mapped_q8_0(40, 64))
            .expect("matrix");
        assert!(!matches!(
            copied,
            CpuMatrix::Quant {
                bytes: QuantBytes::Mapped(_),
                ..
            }
        ));
        let tokens = [0, 7, 39, 7];
        let (a, c) = (
            b.embed(&lookup, &tokens, None),
            b.embed(&copied, &tokens, None),
        );
        let (a, c) = (a.expect("embed"), c.expect("embed"));
        assert_eq!(a.data, c.data);
        // Q8_0 keeps the row's scale in f16: 39 comes back within its rounding.
        assert!(
            a.row(2).iter().all(|&v| (v - 39.0).abs() < 0.02),
            "{:?}",
            &a.row(2)[..4]
        );
        assert!(b.embed(&lookup, &[40], None).is_err());
    }
}
