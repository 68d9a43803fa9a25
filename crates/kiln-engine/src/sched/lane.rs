//! Which lane an engine's sequences run in: the batch, when the KV scheme is batchable on the
//! backend (spec §6.3, [`crate::kv_scheme::KvScheme::batchable`]), else one at a time.

use kiln_model::backend::{Backend, KvQuantFormat};
use serde::Serialize;

use crate::kv_scheme::{BatchCapabilities, KvModelShape, KvScheme, LayerQuant};

/// Whether sequences share forwards.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Lane {
    /// Sequences join the running batch.
    pub batched: bool,
    /// Why they run alone, when they do.
    pub solo_reason: Option<String>,
}

/// What a backend's KV store offers the batch rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreAbilities {
    /// Each slot converts on its own at the scheme's start.
    pub converts_per_slot: bool,
}

impl Lane {
    /// The lane of `scheme` on `backend` for a model of `shape` with heads `head_dim` wide.
    pub fn for_backend<B: Backend>(
        backend: &B,
        scheme: &KvScheme,
        shape: &KvModelShape,
        head_dim: usize,
    ) -> Self {
        let can_convert = |layer: usize| {
            format_of(scheme, layer).is_none_or(|f| backend.kv_can_store(f, layer, head_dim))
        };
        let abilities = StoreAbilities {
            converts_per_slot: backend.kv_converts_per_slot(),
        };
        Self::decide(scheme, shape, &can_convert, abilities, backend.name())
    }

    /// The lane `batchable()` gives: batched when it says so, else solo with the reason.
    pub fn decide(
        scheme: &KvScheme,
        shape: &KvModelShape,
        can_convert: &dyn Fn(usize) -> bool,
        abilities: StoreAbilities,
        backend: &str,
    ) -> Self {
        let caps = BatchCapabilities {
            delayed_affine: abilities.converts_per_slot,
        };
        if scheme.batchable(shape, Some(can_convert), shape.num_hidden_layers, caps) {
            return Self {
                batched: true,
                solo_reason: None,
            };
        }
        let reason = if !(0..shape.num_hidden_layers).all(can_convert) {
            format!(
                "KV scheme {}: the {backend} backend cannot store every layer it quantizes",
                scheme.cache_key()
            )
        } else {
            format!(
                "KV scheme {} converts at {} tokens, and the {backend} backend cannot convert each sequence at its own length",
                scheme.cache_key(),
                scheme.effective_start()
            )
        };
        Self {
            batched: false,
            solo_reason: Some(reason),
        }
    }
}

/// The storage format `scheme` gives `layer`, if it quantizes it.
fn format_of(scheme: &KvScheme, layer: usize) -> Option<KvQuantFormat> {
    scheme.layer_quant(layer).map(|q| match q {
        LayerQuant::Affine { bits, group_size } => KvQuantFormat::Affine { bits, group_size },
        LayerQuant::Turbo(t) => KvQuantFormat::Turbo {
            k_bits: t.k_bits,
            v_bits: t.v_bits,
        },
    })
}
