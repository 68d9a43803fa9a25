//! Adapters laid out for serving (spec §3.7, §8.4): every module of a checked adapter indexed by
//! (layer, projection), so that a forward finds a layer's deltas without a string lookup, and
//! the stack of adapters one sequence runs with (`"a+b"`: their deltas sum in order).
//!
//! A [`ServedAdapter`] is immutable and shared (`Arc`): a sequence holds its stack for its whole
//! life, so unmounting an adapter never changes what a running sequence computes.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kiln_kernels::arena::WeightBuf;

use super::{AdapterInfo, LoraAdapter, LoraWeights, parse_layer_path};
use crate::ModelError;
use crate::arch::LAYER_MATRICES;
use crate::config::ModelConfig;

/// The id that names the base model (no adapter) in a request's `adapter` field.
pub const NO_ADAPTER: &str = "none";

/// What separates the ids of a stack (`"a+b"`).
pub const STACK_SEPARATOR: char = '+';

/// Checks an adapter id: 1 to 128 characters of ASCII letters, digits, `.`, `_`, `-` (so it fits
/// a URL path and a stack spec), not `none`.
pub fn check_adapter_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("an adapter id must not be empty".into());
    }
    if id.len() > 128 {
        return Err(format!("adapter id {id:?} is longer than 128 characters"));
    }
    if id == NO_ADAPTER {
        return Err(format!(
            "{NO_ADAPTER:?} names the base model and cannot be an adapter id"
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "adapter id {id:?} contains {c:?}; ids use letters, digits, '.', '_' and '-' ('+' stacks adapters)"
        ));
    }
    Ok(())
}

/// One adapted module as a forward reads it: `y += scale·(x·A)·B`, A `[in, rank]` and B
/// `[rank, out]` row-major (what [`crate::backend::Backend::lora_add`] takes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraModule<'a> {
    /// Input width of the adapted linear.
    pub in_features: usize,
    /// Output width of the adapted linear.
    pub out_features: usize,
    /// Rank.
    pub rank: usize,
    /// A, `[in, rank]`.
    pub a: &'a [f32],
    /// B, `[rank, out]`.
    pub b: &'a [f32],
    /// The s multiplying (x·A)·B.
    pub scale: f32,
}

impl LoraWeights {
    /// The module as a forward reads it.
    pub fn view(&self) -> LoraModule<'_> {
        LoraModule {
            in_features: self.in_features,
            out_features: self.out_features,
            rank: self.rank,
            a: &self.a,
            b: &self.b,
            scale: self.scale,
        }
    }
}

/// Where one module's A and B lie in the adapter's buffer.
#[derive(Debug, Clone, Copy)]
struct Slot {
    in_features: usize,
    out_features: usize,
    rank: usize,
    scale: f32,
    a: usize,
    b: usize,
}

/// f32 values in one mapping of their own, on huge pages where the OS allows
/// (`kiln_kernels::arena`): a decoded token reads every module of the adapter once, and a
/// stream over 4 KiB pages of separate allocations reads at a fraction of the bandwidth the
/// base weights get. Unmounting gives the memory back at once.
enum F32Store {
    Mapped(WeightBuf),
    Heap(Vec<f32>),
}

impl F32Store {
    fn zeroed(len: usize) -> Self {
        let buf = WeightBuf::zeroed_dedicated(len * 4);
        if (buf.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f32>()) {
            Self::Mapped(buf)
        } else {
            Self::Heap(vec![0.0; len])
        }
    }

    fn as_slice(&self) -> &[f32] {
        match self {
            // SAFETY: the buffer is aligned for f32 (checked in `zeroed`), holds `len()` bytes
            // that stay borrowed with `self`, and every bit pattern is an f32.
            Self::Mapped(b) => unsafe {
                std::slice::from_raw_parts(b.as_ptr().cast::<f32>(), b.len() / 4)
            },
            Self::Heap(v) => v,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [f32] {
        match self {
            // SAFETY: as `as_slice`; `&mut self` makes this the only access.
            Self::Mapped(b) => unsafe {
                std::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<f32>(), b.len() / 4)
            },
            Self::Heap(v) => v,
        }
    }
}

/// A checked adapter ready for the forward.
pub struct ServedAdapter {
    id: String,
    /// Unique per process: an id mounted again (perhaps from another folder) is another
    /// adapter, and must not reuse the old one's cached prefixes.
    serial: u64,
    path: PathBuf,
    info: AdapterInfo,
    base_model: Option<String>,
    size_bytes: u64,
    max_rank: usize,
    modules: usize,
    /// Per layer, per [`LAYER_MATRICES`] entry.
    layers: Vec<[Option<Slot>; LAYER_MATRICES.len()]>,
    /// Every module's A then B, in the order a forward reads them (layer by layer, the
    /// projections in [`LAYER_MATRICES`] order), each starting on a 64-byte boundary.
    data: F32Store,
}

impl fmt::Debug for ServedAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServedAdapter")
            .field("id", &self.id)
            .field("path", &self.path)
            .field("modules", &self.modules)
            .field("rank", &self.info.rank)
            .finish_non_exhaustive()
    }
}

impl ServedAdapter {
    /// Reads the adapter folder `path` and checks it against `cfg` (all or nothing).
    pub fn load(id: &str, path: &Path, cfg: &ModelConfig) -> Result<Self, ModelError> {
        let adapter = LoraAdapter::load(path)?;
        Self::new(id, path, adapter, cfg)
    }

    /// Checks `adapter` (every module consistent, finite and of the model's shape; at least one
    /// module) against `cfg` and lays it out by layer. Nothing is kept on error.
    pub fn new(
        id: &str,
        path: &Path,
        adapter: LoraAdapter,
        cfg: &ModelConfig,
    ) -> Result<Self, ModelError> {
        check_adapter_id(id).map_err(|reason| ModelError::Adapter {
            module: "adapter".into(),
            reason,
        })?;
        adapter.check_servable(cfg)?;
        let size_bytes = adapter.size_bytes();
        let max_rank = adapter.max_rank();
        let modules = adapter.modules.len();
        let mut placed: Vec<[Option<LoraWeights>; LAYER_MATRICES.len()]> =
            (0..cfg.num_layers).map(|_| Default::default()).collect();
        for (name, w) in adapter.modules {
            // check_against accepted every path and shape.
            let Some((layer, matrix)) = parse_layer_path(&name) else {
                continue;
            };
            let Some(m) = LAYER_MATRICES.iter().position(|x| *x == matrix) else {
                continue;
            };
            placed[layer][m] = Some(w);
        }
        // 16 floats: 64 bytes.
        let align = |n: usize| n.next_multiple_of(16);
        let total: usize = placed
            .iter()
            .flatten()
            .flatten()
            .map(|w| align(w.a.len()) + align(w.b.len()))
            .sum();
        let mut data = F32Store::zeroed(total);
        let buf = data.as_mut_slice();
        let mut at = 0;
        let layers = placed
            .into_iter()
            .map(|row| {
                row.map(|w| {
                    let w = w?;
                    let (a, b) = (at, at + align(w.a.len()));
                    buf[a..a + w.a.len()].copy_from_slice(&w.a);
                    buf[b..b + w.b.len()].copy_from_slice(&w.b);
                    at = b + align(w.b.len());
                    Some(Slot {
                        in_features: w.in_features,
                        out_features: w.out_features,
                        rank: w.rank,
                        scale: w.scale,
                        a,
                        b,
                    })
                })
            })
            .collect();
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        Ok(Self {
            id: id.to_string(),
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            path: path.to_path_buf(),
            info: adapter.info,
            base_model: adapter.base_model,
            size_bytes,
            max_rank,
            modules,
            layers,
            data,
        })
    }

    /// The module of `layer` adapting projection `matrix` (an index into [`LAYER_MATRICES`]).
    pub fn module(&self, layer: usize, matrix: usize) -> Option<LoraModule<'_>> {
        let s = self.layers.get(layer)?.get(matrix)?.as_ref()?;
        let data = self.data.as_slice();
        Some(LoraModule {
            in_features: s.in_features,
            out_features: s.out_features,
            rank: s.rank,
            a: &data[s.a..s.a + s.in_features * s.rank],
            b: &data[s.b..s.b + s.rank * s.out_features],
            scale: s.scale,
        })
    }

    /// Whether every module still fits a model with `cfg` (the one a forward runs).
    pub fn fits(&self, cfg: &ModelConfig) -> bool {
        self.layers.len() == cfg.num_layers
            && self.layers.iter().all(|l| {
                l.iter().zip(LAYER_MATRICES).all(|(w, m)| {
                    w.as_ref().is_none_or(|w| {
                        Some((w.in_features, w.out_features)) == cfg.layer_matrix_shape(m)
                    })
                })
            })
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A number no other adapter of this process has.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// The folder it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What its config files say (base rank, configured scale…).
    pub fn info(&self) -> &AdapterInfo {
        &self.info
    }

    /// The model it was trained on, if its config says.
    pub fn base_model(&self) -> Option<&str> {
        self.base_model.as_deref()
    }

    /// Bytes of A and B in f32.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The largest module rank.
    pub fn max_rank(&self) -> usize {
        self.max_rank
    }

    /// Adapted modules (linear layers): the `mounted_layers` of spec §3.7.
    pub fn mounted_layers(&self) -> usize {
        self.modules
    }
}

/// The adapters one sequence runs with, in order; each adapted projection adds the deltas of
/// every adapter that has a module for it, in this order.
#[derive(Clone)]
pub struct AdapterStack {
    adapters: Vec<Arc<ServedAdapter>>,
    key: String,
    namespace: String,
}

impl AdapterStack {
    /// A stack of `adapters` (in the order their deltas are added).
    pub fn new(adapters: Vec<Arc<ServedAdapter>>) -> Self {
        let key = adapters
            .iter()
            .map(|a| a.id())
            .collect::<Vec<_>>()
            .join(&STACK_SEPARATOR.to_string());
        let namespace = adapters
            .iter()
            .map(|a| format!("{}#{}", a.id(), a.serial()))
            .collect::<Vec<_>>()
            .join(&STACK_SEPARATOR.to_string());
        Self {
            adapters,
            key,
            namespace,
        }
    }

    /// The adapters, in order.
    pub fn adapters(&self) -> &[Arc<ServedAdapter>] {
        &self.adapters
    }

    /// The ids joined with `+` (`""` when empty), as requests name the stack.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The prompt-cache namespace (spec §11.1): the ids joined with `+`, each with its mount's
    /// serial (`a#3+b#7`), so a prefix computed under one adapter is never reused under
    /// another, nor under the same id mounted again from other weights. `""` when empty.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether it holds no adapter (the base model).
    pub fn is_empty(&self) -> bool {
        self.adapters.is_empty()
    }

    /// Whether every adapter fits a model with `cfg`.
    pub fn fits(&self, cfg: &ModelConfig) -> bool {
        self.adapters.iter().all(|a| a.fits(cfg))
    }

    /// Whether two stacks run the same adapters (the same mounted objects, in order).
    pub fn same_as(&self, other: &AdapterStack) -> bool {
        self.adapters.len() == other.adapters.len()
            && self
                .adapters
                .iter()
                .zip(&other.adapters)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

impl fmt::Debug for AdapterStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AdapterStack({:?})", self.key)
    }
}

/// Equal when they run the same mounted adapters in the same order (an id mounted again from
/// another folder is another adapter).
impl PartialEq for AdapterStack {
    fn eq(&self, other: &Self) -> bool {
        self.same_as(other)
    }
}
