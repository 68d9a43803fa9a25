//! `batchable` (spec §6.3, seed 0.4.0): whether a sequence under this scheme may join the
//! continuous-batching lane. Used by the scheduler when it lands; tested on its own until then.

use kiln_model::config::{LayerAttention, ModelConfig};

use super::{KvScheme, KvSchemeKind};

/// The kind of one layer's cache, as the seed's `layerTypes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayerKind {
    /// Full attention (`full_attention`, the default for unlisted layers).
    Full,
    /// Sliding-window attention (`sliding_attention`).
    Sliding,
    /// Linear attention / SSM state (`linear_attention`): never quantized. No kiln architecture
    /// has one yet; the rules already skip it.
    Linear,
}

/// The facts about a model's layers the scheme rules read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvModelShape {
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// Per-layer kinds; layers past the end count as full attention, as in the seed.
    pub layer_types: Vec<KvLayerKind>,
}

impl KvModelShape {
    /// The shape of a kiln model config.
    pub fn from_config(cfg: &ModelConfig) -> Self {
        Self {
            num_hidden_layers: cfg.num_layers,
            layer_types: cfg
                .layer_attention
                .iter()
                .map(|a| match a {
                    LayerAttention::Full => KvLayerKind::Full,
                    LayerAttention::Sliding { .. } => KvLayerKind::Sliding,
                })
                .collect(),
        }
    }

    /// Layer `i`'s kind (`layerTypes[i] ?? "full_attention"`).
    pub fn layer_type(&self, i: usize) -> KvLayerKind {
        self.layer_types
            .get(i)
            .copied()
            .unwrap_or(KvLayerKind::Full)
    }
}

/// What the batch engine can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchCapabilities {
    /// It keeps each request's delayed conversion boundary for affine caches.
    pub delayed_affine: bool,
}

impl KvScheme {
    /// The seed's `batchable(config, canConvert?, cacheLayerCount, capabilities)`:
    /// dense always; a quantized scheme needs the `can_convert` probe (config shape alone never
    /// authorizes placement); a delayed start needs `delayed_affine` for affine kinds (turbo is
    /// exempt); uniform and turbo probe every non-linear layer below `cache_layer_count` (some
    /// models share a donor prefix's KV in later layers, so the real cache list is probed);
    /// config entries must name an in-range, non-linear layer that passes the probe.
    pub fn batchable(
        &self,
        shape: &KvModelShape,
        can_convert: Option<&dyn Fn(usize) -> bool>,
        cache_layer_count: usize,
        capabilities: BatchCapabilities,
    ) -> bool {
        // The seed's "other kinds → false" row has no Rust counterpart: the enum is closed.
        if self.kind == KvSchemeKind::Dense {
            return true;
        }
        let Some(can_convert) = can_convert else {
            return false;
        };
        if self.effective_start() > 0
            && self.kind != KvSchemeKind::Turbo
            && !capabilities.delayed_affine
        {
            return false;
        }
        match self.kind {
            KvSchemeKind::Dense => true,
            KvSchemeKind::AffineUniform | KvSchemeKind::Turbo => (0..cache_layer_count)
                .filter(|&l| shape.layer_type(l) != KvLayerKind::Linear)
                .all(can_convert),
            KvSchemeKind::AffineConfig => self
                .options
                .kv_config
                .as_deref()
                .unwrap_or_default()
                .iter()
                .all(|e| {
                    e.layer_idx < shape.num_hidden_layers
                        && shape.layer_type(e.layer_idx) != KvLayerKind::Linear
                        && can_convert(e.layer_idx)
                }),
        }
    }
}
