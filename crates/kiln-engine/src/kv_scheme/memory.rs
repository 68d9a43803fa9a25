//! The memory model (spec §6.4, §6.6): KV bytes per token per scheme and layer, the memory the
//! process may really use, and `fit` — what `kiln fit` prints and admission bills. What depends
//! on the backend (its forward transient, runtime overhead, read rates, whether its store caps
//! sliding layers) comes from the backend ([`Backend::memory_profile`],
//! [`Backend::forward_transient_bytes`]).

use std::path::Path;

use kiln_model::backend::{Backend, MemoryProfile};
use kiln_model::config::{LayerAttention, ModelConfig};

use super::{KvLayerKind, KvModelShape, KvScheme, KvSchemeKind, LayerQuant};

/// The prefill chunk kiln's engine uses (`EngineOptions::prefill_chunk`).
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// Per-layer KV cost of one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKvBytes {
    /// The layer's kind.
    pub kind: KvLayerKind,
    /// Sliding window, if any.
    pub window: Option<usize>,
    /// Bytes per token while the layer is dense (keys and values).
    pub dense_per_token: u64,
    /// Bytes per token once converted (equal to `dense_per_token` for a dense layer).
    pub stored_per_token: u64,
}

/// The KV geometry of a model under a scheme: the seed's `kvGeometry`, per layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvGeometry {
    /// One entry per layer.
    pub layers: Vec<LayerKvBytes>,
    /// Length at which the cache converts (0 for dense).
    pub start: usize,
    /// Whether sliding layers are capped at their window.
    pub cap_sliding: bool,
}

/// Bytes per token of one layer's keys plus values stored affine (MLX convention): `bits/8`
/// per element plus a 16-bit scale and a 16-bit bias per `group` elements (spec §6.4's
/// `bits/8 + 4/groupSize`), rounded up to whole bytes per token.
pub fn affine_bytes_per_token(kv_heads: usize, head_dim: usize, bits: u8, group: usize) -> u64 {
    let (kvh, hd) = (kv_heads as u64, head_dim as u64);
    let groups = hd.div_ceil(group as u64);
    (2 * kvh * (hd * u64::from(bits) + groups * 32)).div_ceil(8)
}

/// Bytes per token of one layer's keys plus values stored TurboQuant: per KV head, the packed
/// key and value codebook indices plus each vector's f16 norm.
pub fn turbo_bytes_per_token(kv_heads: usize, head_dim: usize, k_bits: u8, v_bits: u8) -> u64 {
    let hd = head_dim as u64;
    kv_heads as u64
        * ((hd * u64::from(k_bits)).div_ceil(8) + 2 + (hd * u64::from(v_bits)).div_ceil(8) + 2)
}

impl KvGeometry {
    /// The geometry of `cfg` under `scheme`; `cap_sliding` as the store does
    /// ([`MemoryProfile::caps_sliding`]).
    pub fn new(cfg: &ModelConfig, scheme: &KvScheme, cap_sliding: bool) -> Self {
        let shape = KvModelShape::from_config(cfg);
        let (kvh, hd) = (cfg.num_kv_heads, cfg.head_dim);
        let dense = 2 * (kvh * hd * scheme.options.dense.bytes()) as u64;
        let layers = (0..cfg.num_layers)
            .map(|l| {
                let stored = match scheme.layer_quant(l) {
                    None => dense,
                    Some(LayerQuant::Affine { bits, group_size }) => {
                        affine_bytes_per_token(kvh, hd, bits, group_size)
                    }
                    // Spec §6.4 billed turbo as bf16 while it had no storage; kiln's store
                    // exists, so it is billed at what it holds.
                    Some(LayerQuant::Turbo(t)) => {
                        turbo_bytes_per_token(kvh, hd, t.k_bits, t.v_bits)
                    }
                };
                LayerKvBytes {
                    kind: shape.layer_type(l),
                    window: match cfg.layer_attention.get(l) {
                        Some(LayerAttention::Sliding { window }) => Some(*window),
                        _ => None,
                    },
                    dense_per_token: dense,
                    stored_per_token: stored,
                }
            })
            .collect();
        let start = match scheme.kind {
            KvSchemeKind::Dense => 0,
            _ => scheme.effective_start(),
        };
        Self {
            layers,
            start,
            cap_sliding,
        }
    }

    /// KV bytes per token summed over layers, once converted (uncapped).
    pub fn bytes_per_token(&self) -> u64 {
        self.layers.iter().map(|l| l.stored_per_token).sum()
    }

    /// KV bytes per token summed over layers while dense.
    pub fn dense_bytes_per_token(&self) -> u64 {
        self.layers.iter().map(|l| l.dense_per_token).sum()
    }

    fn positions(&self, layer: &LayerKvBytes, t: usize) -> u64 {
        match (layer.window, self.cap_sliding) {
            (Some(w), true) => t.min(w) as u64,
            _ => t as u64,
        }
    }

    /// Bytes of a `t`-token cache, every layer in its converted form when `converted`
    /// (the seed's `kvBytesAt`: sliding layers capped at the window when the store caps them).
    pub fn bytes_at(&self, t: usize, converted: bool) -> u64 {
        self.layers
            .iter()
            .map(|l| {
                let per = if converted {
                    l.stored_per_token
                } else {
                    l.dense_per_token
                };
                per * self.positions(l, t)
            })
            .sum()
    }

    /// The most KV bytes a sequence growing to `t` tokens holds at any moment, with the
    /// conversion rule of spec §6.1: the cache stays dense until its length reaches the start
    /// (and is never converted while empty, so the first prefill chunk is dense even at start
    /// 0), then converts one layer at a time — the moment before the last layer's dense copy is
    /// freed holds the whole dense cache plus one converted layer. The boundary is billed at
    /// `start + chunk` tokens, the longest a chunk crossing it can make the dense cache.
    pub fn peak_bytes_at(&self, t: usize, chunk: usize) -> u64 {
        let quantized = self
            .layers
            .iter()
            .any(|l| l.stored_per_token != l.dense_per_token);
        if !quantized {
            return self.bytes_at(t, false);
        }
        let boundary = if self.start == 0 {
            chunk.max(1)
        } else {
            self.start.saturating_add(chunk)
        }
        .min(t);
        let one_layer = self
            .layers
            .iter()
            .map(|l| l.stored_per_token * self.positions(l, boundary))
            .max()
            .unwrap_or(0);
        let converting = self.bytes_at(boundary, false) + one_layer;
        if t < self.start {
            self.bytes_at(t, false)
        } else {
            self.bytes_at(t, true).max(converting)
        }
    }
}

/// Peak RSS while loading: each tensor is copied or repacked straight out of the file mapping
/// and its mapped pages released, so at worst the weights so far plus the largest tensor's
/// pages are resident, with the backend's runtime overhead. (A lookup table the backend leaves
/// in the map is counted as if it were copied: an upper bound.)
pub fn load_peak_bytes(weight_bytes: u64, largest_tensor_bytes: u64, overhead: u64) -> u64 {
    weight_bytes + largest_tensor_bytes + overhead
}

/// What `fit` was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FitParams {
    /// Bytes of weight data (file headers: `TensorSource::total_tensor_bytes`).
    pub weight_bytes: u64,
    /// Bytes of the largest tensor (`TensorSource::largest_tensor_bytes`).
    pub largest_tensor_bytes: u64,
    /// Context to evaluate.
    pub ctx: usize,
    /// Prefill chunk.
    pub chunk: usize,
    /// Memory the process may use.
    pub budget_bytes: u64,
    /// Kernel worker threads (each keeps its own attention score buffer).
    pub threads: usize,
}

/// `fit`'s answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FitReport {
    /// The scheme's cache key.
    pub kv_scheme: String,
    /// Weight bytes.
    pub weights_bytes: u64,
    /// KV bytes per token once converted, all layers.
    pub kv_bytes_per_token: u64,
    /// KV bytes per token while dense.
    pub kv_dense_bytes_per_token: u64,
    /// The context evaluated.
    pub ctx: usize,
    /// Peak KV bytes up to `ctx`.
    pub kv_bytes: u64,
    /// Prefill transient at `ctx`.
    pub transient_bytes: u64,
    /// The backend's [`MemoryProfile::runtime_overhead_bytes`].
    pub runtime_overhead_bytes: u64,
    /// Peak while loading.
    pub load_peak_bytes: u64,
    /// weights + KV + transient + overhead at `ctx`.
    pub total_bytes: u64,
    /// The larger of `total_bytes` and `load_peak_bytes`.
    pub peak_bytes: u64,
    /// The budget.
    pub budget_bytes: u64,
    /// `peak_bytes <= budget_bytes`.
    pub fits: bool,
    /// The longest context (at most the model's `max_position_embeddings`) that fits; 0 when
    /// not even one token does.
    pub max_safe_context: usize,
    /// The model's trained context.
    pub max_position_embeddings: usize,
    /// The longest context the memory alone allows, ignoring the trained context (capped at
    /// 2^24 positions): how far the scheme stretches the budget.
    pub memory_context_limit: usize,
    /// Estimated decode speed at `ctx`: a token reads the weights and the cache at the
    /// backend's read rates, but no faster than its cost per cached element
    /// ([`MemoryProfile`]).
    pub predicted_decode_tok_s: f64,
}

/// Evaluates a model of `cfg` under `scheme` on `backend` at `p.ctx` and finds its longest
/// safe context.
pub fn fit<B: Backend>(
    backend: &B,
    cfg: &ModelConfig,
    scheme: &KvScheme,
    p: FitParams,
) -> FitReport {
    let profile: MemoryProfile = backend.memory_profile();
    let geo = KvGeometry::new(cfg, scheme, profile.caps_sliding);
    let transient = |t: usize| backend.forward_transient_bytes(cfg, p.chunk, t, p.threads);
    let total = |t: usize| -> u64 {
        p.weight_bytes
            + profile.runtime_overhead_bytes
            + geo.peak_bytes_at(t, p.chunk)
            + transient(t)
    };
    let load_peak = load_peak_bytes(
        p.weight_bytes,
        p.largest_tensor_bytes,
        profile.runtime_overhead_bytes,
    );
    let fits_at = |t: usize| total(t).max(load_peak) <= p.budget_bytes;
    // `total` never decreases with `t`, so the largest fitting context is a binary search.
    let largest_fitting = |limit: usize| {
        let (mut lo, mut hi) = (0usize, limit);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits_at(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        if lo >= 1 && fits_at(lo) { lo } else { 0 }
    };
    let max_safe_context = largest_fitting(cfg.max_position_embeddings);
    let memory_context_limit = largest_fitting(1 << 24);
    let kv_bytes = geo.peak_bytes_at(p.ctx, p.chunk);
    let total_bytes = total(p.ctx);
    let peak_bytes = total_bytes.max(load_peak);
    let kv_read = geo.bytes_at(p.ctx, true);
    let kv_elements: f64 = cfg
        .layer_attention
        .iter()
        .map(|a| match a {
            LayerAttention::Full => p.ctx,
            LayerAttention::Sliding { window } => p.ctx.min(*window),
        })
        .map(|positions| (2 * positions * cfg.kv_width()) as f64)
        .sum();
    let per_element = match scheme.kind {
        KvSchemeKind::Turbo => profile.decode_turbo_seconds_per_element,
        _ => profile.decode_kv_seconds_per_element,
    };
    let kv_seconds =
        (kv_read as f64 / profile.decode_kv_bytes_per_sec).max(kv_elements * per_element);
    let seconds_per_token =
        p.weight_bytes as f64 / profile.decode_weight_bytes_per_sec + kv_seconds;
    FitReport {
        kv_scheme: scheme.cache_key(),
        weights_bytes: p.weight_bytes,
        kv_bytes_per_token: geo.bytes_per_token(),
        kv_dense_bytes_per_token: geo.dense_bytes_per_token(),
        ctx: p.ctx,
        kv_bytes,
        transient_bytes: transient(p.ctx),
        runtime_overhead_bytes: profile.runtime_overhead_bytes,
        load_peak_bytes: load_peak,
        total_bytes,
        peak_bytes,
        budget_bytes: p.budget_bytes,
        fits: peak_bytes <= p.budget_bytes,
        max_safe_context,
        max_position_embeddings: cfg.max_position_embeddings,
        memory_context_limit,
        predicted_decode_tok_s: if seconds_per_token > 0.0 {
            1.0 / seconds_per_token
        } else {
            0.0
        },
    }
}

/// Where the default budget came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemoryBudget {
    /// Bytes the process may still use: the smaller of the cgroup's room and `MemAvailable`.
    pub bytes: u64,
    /// `memory.max − memory.current` (cgroup v2) or `limit_in_bytes − usage_in_bytes` (v1),
    /// when a limit is set.
    pub cgroup_room: Option<u64>,
    /// `MemAvailable` from `/proc/meminfo`.
    pub mem_available: Option<u64>,
}

/// The memory this process may really use on Linux — not total RAM: the room left under its
/// cgroup's limit and the kernel's `MemAvailable`, whichever is smaller. `None` when neither
/// can be read (not Linux).
pub fn default_memory_budget() -> Option<MemoryBudget> {
    let mem_available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| parse_mem_available(&t));
    let cgroup_room = cgroup_room();
    let bytes = match (cgroup_room, mem_available) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return None,
    };
    Some(MemoryBudget {
        bytes,
        cgroup_room,
        mem_available,
    })
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn cgroup_room() -> Option<u64> {
    let root = Path::new("/sys/fs/cgroup");
    // cgroup v2: this process's group from /proc/self/cgroup ("0::/path"), else the mount root
    // (what a container sees as its own group).
    let own = read(Path::new("/proc/self/cgroup")).and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("0::"))
            .map(|p| root.join(p.trim_start_matches('/')))
    });
    for dir in own.into_iter().chain([root.to_path_buf()]) {
        if let Some(limit) = read(&dir.join("memory.max")).and_then(|t| parse_cgroup_limit(&t)) {
            let used = read(&dir.join("memory.current"))
                .and_then(|t| t.trim().parse::<u64>().ok())
                .unwrap_or(0);
            return Some(limit.saturating_sub(used));
        }
    }
    let v1 = root.join("memory");
    let limit = read(&v1.join("memory.limit_in_bytes")).and_then(|t| parse_cgroup_limit(&t))?;
    let used = read(&v1.join("memory.usage_in_bytes"))
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Some(limit.saturating_sub(used))
}

/// A cgroup limit file's value: `None` for no limit (`max` in v2, or v1's near-`i64::MAX`
/// page-rounded sentinel).
pub fn parse_cgroup_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|&v| v < (1u64 << 60))
}

/// `MemAvailable` from the text of `/proc/meminfo`, in bytes.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemAvailable:")?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        kb.checked_mul(1024)
    })
}
