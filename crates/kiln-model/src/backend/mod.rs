//! The operations every architecture is written against. A backend implements them for one kind
//! of device: [`cpu::CpuBackend`] with kiln's kernels, [`reference::ReferenceBackend`] as a naive
//! f32 oracle, and later a candle backend for CUDA/Metal and training.
//!
//! Model code owns no KV state: the engine creates a [`Backend::Kv`] store and passes it to each
//! forward together with a [`BatchLayout`] saying which slot each run of tokens belongs to.

pub mod cpu;
mod host;
mod kv_plan;
pub mod reference;
mod tensor_bytes;

pub use host::{HostAct, HostTensor};
pub use kv_plan::{DenseKv, KvLayerState, KvPlan, KvQuantFormat};
pub use tensor_bytes::TensorBytes;

use crate::ModelError;
use crate::config::Activation;
use crate::lora::LoraModule;

/// One sequence's run of tokens in a forward batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSpan {
    /// The KV slot of the sequence.
    pub slot: usize,
    /// Position of the first token; the slot must already hold exactly this many positions.
    pub start_pos: usize,
    /// Number of tokens in this run.
    pub n_tokens: usize,
}

/// How the tokens of one forward are split between sequences, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchLayout {
    /// The runs, concatenated in this order in the activations.
    pub spans: Vec<SeqSpan>,
}

impl BatchLayout {
    /// A batch of one sequence.
    pub fn single(slot: usize, start_pos: usize, n_tokens: usize) -> Self {
        Self {
            spans: vec![SeqSpan {
                slot,
                start_pos,
                n_tokens,
            }],
        }
    }

    /// Total tokens over all runs.
    pub fn total_tokens(&self) -> usize {
        self.spans.iter().map(|s| s.n_tokens).sum()
    }

    /// The position of every token, in activation order.
    pub fn positions(&self) -> Vec<usize> {
        self.spans
            .iter()
            .flat_map(|s| s.start_pos..s.start_pos + s.n_tokens)
            .collect()
    }
}

/// RoPE angles of one forward's tokens: computed once per forward and frequency set, not per
/// layer and head (that was most of a decode step's non-matmul time).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeAngles {
    /// Position of each token.
    pub positions: Vec<usize>,
    /// The `head_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// `cos(pos · f)` as `[token][i]`.
    pub cos: Vec<f32>,
    /// `sin(pos · f)` as `[token][i]`.
    pub sin: Vec<f32>,
}

impl RopeAngles {
    /// The angle of token `t`, frequency `i` is `positions[t] as f32 * inv_freq[i]` in f32 (as
    /// transformers computes it), its sine and cosine taken in f64 and rounded once.
    pub fn new(positions: &[usize], inv_freq: &[f32]) -> Self {
        let mut cos = Vec::with_capacity(positions.len() * inv_freq.len());
        let mut sin = Vec::with_capacity(positions.len() * inv_freq.len());
        for &p in positions {
            for &f in inv_freq {
                let (s, c) = ((p as f32 * f) as f64).sin_cos();
                cos.push(c as f32);
                sin.push(s as f32);
            }
        }
        Self {
            positions: positions.to_vec(),
            inv_freq: inv_freq.to_vec(),
            cos,
            sin,
        }
    }
}

/// Shape of one layer's attention, as the backend's kernel needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Score multiplier.
    pub scale: f32,
    /// Sliding window, if any: positions visible, the query's own included; with `causal` off,
    /// the keys closer than `window` on either side.
    pub window: Option<usize>,
    /// Whether a query sees only earlier positions (decoders) or every position of its span
    /// (encoders: BERT).
    pub causal: bool,
}

/// The size of a KV store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Number of layers.
    pub n_layers: usize,
    /// Key/value heads per layer.
    pub n_kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Sequences held at once.
    pub n_slots: usize,
    /// Positions per sequence.
    pub capacity: usize,
}

impl KvLayout {
    /// The layout a model with `config` needs for `n_slots` sequences of `capacity` positions.
    pub fn for_model(config: &crate::config::ModelConfig, n_slots: usize, capacity: usize) -> Self {
        Self {
            n_layers: config.num_layers,
            n_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
            n_slots,
            capacity,
        }
    }
}

/// What a weight matrix is for, as the architecture code says (never read off its name): a
/// backend may store the token table and the output head unlike the layers' projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixRole {
    /// The token embedding table (the output head too when the model ties them).
    Embedding,
    /// A table only ever read a row at a time, never multiplied: the token embeddings beside
    /// a separate head (or of a model that needs none), an encoder's tables.
    Lookup,
    /// The output head (`lm_head`).
    Head,
    /// A projection inside a layer (attention or MLP).
    Projection,
}

/// Engine-owned key/value storage for a set of sequence slots.
pub trait KvStore: Send {
    /// The layout it was created with.
    fn layout(&self) -> KvLayout;
    /// Positions currently held by `slot`.
    fn seq_len(&self, slot: usize) -> usize;
    /// Sets the committed length of `slot` (shrinking forgets positions; growing is done by a
    /// forward, which calls this after all layers have written).
    fn set_seq_len(&mut self, slot: usize, len: usize);
    /// Bytes of storage allocated for keys and values.
    fn allocated_bytes(&self) -> usize;
    /// Forgets every position of `slot` and gives their memory back (a length cut to 0 may
    /// keep the pages of a dense slot for its next sequence; this does not); false when the
    /// pages stay (the default only forgets the positions).
    fn release(&mut self, slot: usize) -> bool {
        self.set_seq_len(slot, 0);
        false
    }
    /// A copy of positions `0..len` of `slot` (every layer), for a prompt cache; `None` when
    /// the store cannot export (the default) or `len` exceeds what the slot holds.
    fn export_prefix(&self, slot: usize, len: usize) -> Option<KvSnapshot> {
        let _ = (slot, len);
        None
    }
    /// Writes `snapshot`'s first `len` positions into `slot` and makes that its length; false
    /// (and nothing changed) when the store cannot import or the snapshot does not fit.
    fn import_prefix(&mut self, slot: usize, snapshot: &KvSnapshot, len: usize) -> bool {
        let _ = (slot, snapshot, len);
        false
    }
    /// Converts every layer of `slot` that its plan quantizes and whose sequence has reached the
    /// plan's start (never an empty one), one layer at a time; returns how many layers it
    /// converted. Called after each forward. A dense-only store converts nothing.
    fn convert_due(&mut self, slot: usize) -> Result<usize, ModelError> {
        let _ = slot;
        Ok(0)
    }
    /// Layer conversions performed since the store was created (each layer of each sequence
    /// converts at most once).
    fn conversions(&self) -> u64 {
        0
    }
    /// What each layer of `slot` holds now.
    fn layer_states(&self, slot: usize) -> Vec<KvLayerState> {
        let _ = slot;
        vec![KvLayerState::Dense(DenseKv::F32); self.layout().n_layers]
    }
    /// Bytes the positions `slot` holds take in their current formats, all layers.
    fn slot_bytes(&self, slot: usize) -> usize {
        let l = self.layout();
        self.seq_len(slot) * l.n_layers * 2 * l.n_kv_heads * l.head_dim * 4
    }
}

/// Keys and values of a run of positions, copied out of a [`KvStore`].
#[derive(Debug, Clone, PartialEq)]
pub struct KvSnapshot {
    /// Positions held.
    pub len: usize,
    /// Per layer: keys then values, `len × kv_width` each.
    pub layers: Vec<(Vec<f32>, Vec<f32>)>,
}

impl KvSnapshot {
    /// Bytes of key/value data held.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| (k.len() + v.len()) * std::mem::size_of::<f32>())
            .sum()
    }
}

/// A backend's figures for the engine's memory model: what `fit` and the scheduler's budget
/// bill besides weights and KV, and the rates that predict decode speed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryProfile {
    /// Process memory besides weights, KV and the forward transient.
    pub runtime_overhead_bytes: u64,
    /// Whether the KV store keeps only a sliding layer's window.
    pub caps_sliding: bool,
    /// Weight bytes a decoded token streams per second.
    pub decode_weight_bytes_per_sec: f64,
    /// Cache bytes attention reads per second in decode.
    pub decode_kv_bytes_per_sec: f64,
    /// Attention's floor per cached key or value element in decode.
    pub decode_kv_seconds_per_element: f64,
    /// The same floor for a TurboQuant cache.
    pub decode_turbo_seconds_per_element: f64,
}

/// Where forward time went, in nanoseconds, since the last [`Backend::take_profile`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct OpProfile {
    /// Matrix multiplications (projections, MLP, output head).
    pub matmul_ns: u64,
    /// Attention (cache writes, scores, softmax, weighted sums).
    pub attention_ns: u64,
    /// Everything else the backend timed: embedding, norms, RoPE, activations, adds.
    pub other_ns: u64,
}

/// [`Backend::matmul_each`] as one `matmul` per matrix: the default, and a backend's fallback
/// for matrices it cannot run as one step.
pub(crate) fn matmul_separately<B: Backend + ?Sized, const M: usize>(
    b: &B,
    x: &B::Act,
    ws: [&B::Matrix; M],
) -> Result<[B::Act; M], ModelError> {
    let mut outs = Vec::with_capacity(M);
    for w in ws {
        outs.push(b.matmul(x, w)?);
    }
    outs.try_into()
        .map_err(|_| ModelError::Forward("matmul_each: output count".into()))
}

/// Checks the shapes of a [`Backend::lora_add`] on host activations: `x` `[tokens, in]`, `y`
/// `[tokens, out]` with the module's widths, `rows` inside both, A and B of their sizes.
pub(crate) fn check_lora(
    y: &HostAct,
    x: &HostAct,
    rows: &std::ops::Range<usize>,
    w: &LoraModule<'_>,
) -> Result<(), ModelError> {
    let ok = x.cols == w.in_features
        && y.cols == w.out_features
        && x.rows == y.rows
        && rows.start <= rows.end
        && rows.end <= x.rows
        && w.a.len() == w.in_features * w.rank
        && w.b.len() == w.rank * w.out_features;
    if ok {
        return Ok(());
    }
    Err(ModelError::Forward(format!(
        "LoRA delta: a module of in={} rank={} out={} (A {} values, B {}) does not fit input \
         [{}, {}], output [{}, {}], rows {rows:?}",
        w.in_features,
        w.rank,
        w.out_features,
        w.a.len(),
        w.b.len(),
        x.rows,
        x.cols,
        y.rows,
        y.cols
    )))
}

/// The operation set. Activations are row-major `[tokens, width]`.
pub trait Backend: Send + Sync {
    /// A weight matrix `[rows = out features, cols = in features]`, possibly quantized.
    type Matrix: Send + Sync;
    /// A 1-D parameter (norm weight, bias) in f32.
    type Vector: Send + Sync;
    /// Activations (cloned when a forward records its hidden states).
    type Act: Clone;
    /// Key/value storage.
    type Kv: KvStore;

    /// Short name for logs and stats.
    fn name(&self) -> &'static str;
    /// Takes ownership of the weight matrix `name` read from a file, used as `role` says.
    fn matrix(
        &self,
        name: &str,
        role: MatrixRole,
        t: HostTensor,
    ) -> Result<Self::Matrix, ModelError>;
    /// Takes a 1-D parameter, converting it to f32.
    fn vector(&self, name: &str, t: HostTensor) -> Result<Self::Vector, ModelError>;
    /// Allocates a dense f32 KV store.
    fn new_kv(&self, layout: KvLayout) -> Result<Self::Kv, ModelError>;
    /// Allocates a KV store that keeps layers as `plan` says; a backend that cannot store a
    /// format refuses with an error rather than falling back to dense.
    fn new_kv_planned(&self, layout: KvLayout, plan: &KvPlan) -> Result<Self::Kv, ModelError> {
        if plan.is_dense_f32() {
            return self.new_kv(layout);
        }
        Err(ModelError::Forward(format!(
            "the {} backend stores the KV cache in f32 only",
            self.name()
        )))
    }

    /// Whether the store made by [`Backend::new_kv_planned`] converts each slot on its own, when
    /// that slot's sequence reaches the plan's start, so sequences of different lengths under a
    /// delayed scheme can share a forward.
    fn kv_converts_per_slot(&self) -> bool {
        false
    }
    /// Whether the store can keep layer `layer` (heads `head_dim` wide) in `format`.
    fn kv_can_store(&self, format: KvQuantFormat, layer: usize, head_dim: usize) -> bool {
        let _ = (format, layer, head_dim);
        false
    }

    /// The figures the engine's memory model bills for this backend.
    fn memory_profile(&self) -> MemoryProfile;
    /// Bytes a forward of `tokens` tokens at a context of `ctx` positions allocates besides
    /// weights and KV, with `threads` kernel workers.
    fn forward_transient_bytes(
        &self,
        cfg: &crate::config::ModelConfig,
        tokens: usize,
        ctx: usize,
        threads: usize,
    ) -> u64;

    /// Looks up embedding rows, optionally multiplying them by `scale`.
    fn embed(
        &self,
        table: &Self::Matrix,
        tokens: &[u32],
        scale: Option<f32>,
    ) -> Result<Self::Act, ModelError>;
    /// RMSNorm over each row: `x / rms(x) * (w + offset)`.
    fn rms_norm(&self, x: &Self::Act, w: &Self::Vector, eps: f32, offset: f32) -> Self::Act;
    /// RMSNorm applied to every `head_dim` slice of every row, in place.
    fn head_rms_norm(
        &self,
        x: &mut Self::Act,
        head_dim: usize,
        w: &Self::Vector,
        eps: f32,
        offset: f32,
    );
    /// `x · Wᵀ`: `[tokens, cols] → [tokens, rows]`.
    fn matmul(&self, x: &Self::Act, w: &Self::Matrix) -> Result<Self::Act, ModelError>;
    /// `x` times each of `ws` (Q, K and V; gate and up), equal to `matmul` of each; a backend
    /// may share the work on `x` and run them as one step.
    fn matmul_each<const M: usize>(
        &self,
        x: &Self::Act,
        ws: [&Self::Matrix; M],
    ) -> Result<[Self::Act; M], ModelError> {
        matmul_separately(self, x, ws)
    }
    /// One LoRA module's delta for one run of rows, beside the base matmul that made `y` (the
    /// weight is never merged): `y[rows] += s·(x[rows]·A)·B`, with `x` the matmul's input
    /// `[tokens, in]`, `y` its output `[tokens, out]`, A `[in, r]`, B `[r, out]` and s from `w`
    /// (spec §8.4). The default refuses: a backend serves adapters only when it says how.
    fn lora_add(
        &self,
        y: &mut Self::Act,
        x: &Self::Act,
        rows: std::ops::Range<usize>,
        w: &LoraModule<'_>,
    ) -> Result<(), ModelError> {
        let _ = (y, x, rows, w);
        Err(ModelError::Forward(format!(
            "adapters are not supported by the {} backend",
            self.name()
        )))
    }
    /// [`Backend::lora_add`] for several matmuls of one input (Q/K/V, gate/up): for each `i`
    /// with a module, `ys[i][rows] += s_i·(x[rows]·A_i)·B_i`. Equal to `lora_add` of each; a
    /// backend may run them as one step.
    fn lora_add_each<const M: usize>(
        &self,
        ys: [&mut Self::Act; M],
        x: &Self::Act,
        rows: std::ops::Range<usize>,
        ws: [Option<LoraModule<'_>>; M],
    ) -> Result<(), ModelError> {
        for (y, w) in ys.into_iter().zip(ws) {
            if let Some(w) = w {
                self.lora_add(y, x, rows.clone(), &w)?;
            }
        }
        Ok(())
    }
    /// Adds a bias to every row.
    fn add_bias(&self, x: &mut Self::Act, b: &Self::Vector);
    /// Rotates each `head_dim` slice in the rotate-half (NeoX) layout by its token's angles.
    fn rope(&self, x: &mut Self::Act, head_dim: usize, angles: &RopeAngles);
    /// Writes this batch's keys and values into `kv` at `layer` and attends causally.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        batch: &BatchLayout,
        params: &AttentionParams,
    ) -> Result<Self::Act, ModelError>;
    /// `act(gate) * up`.
    fn glu(&self, gate: &Self::Act, up: &Self::Act, act: Activation) -> Self::Act;
    /// LayerNorm of each row, `(x - mean) / sqrt(var + eps) * w + b` (encoders: BERT).
    fn layer_norm(
        &self,
        x: &Self::Act,
        w: &Self::Vector,
        b: &Self::Vector,
        eps: f32,
    ) -> Result<Self::Act, ModelError> {
        let _ = (x, w, b, eps);
        Err(ModelError::Forward(format!(
            "the {} backend has no LayerNorm",
            self.name()
        )))
    }
    /// The exact (erf) GELU of every element (encoders: BERT).
    fn gelu(&self, x: &Self::Act) -> Result<Self::Act, ModelError> {
        let _ = x;
        Err(ModelError::Forward(format!(
            "the {} backend has no GELU",
            self.name()
        )))
    }
    /// `x += y`.
    fn add_assign(&self, x: &mut Self::Act, y: &Self::Act);
    /// Keeps the given rows, in that order.
    fn gather_rows(&self, x: &Self::Act, rows: &[usize]) -> Self::Act;
    /// Copies activations to host memory, row-major.
    fn to_host(&self, x: &Self::Act) -> Vec<f32>;
    /// Returns and clears the time spent per kind of operation, if this backend records it.
    fn take_profile(&self) -> Option<OpProfile> {
        None
    }
}
