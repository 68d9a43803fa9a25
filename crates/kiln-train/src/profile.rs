//! Where a training step's time goes, by kind of operation (forward and backward apart), read by
//! `kiln train --profile`-style callers through [`take`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The kinds timed.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// Projections' forward (dequantization included).
    MatmulForward,
    /// Projections' backward.
    MatmulBackward,
    /// Attention's forward.
    AttentionForward,
    /// Attention's backward.
    AttentionBackward,
    /// Norms, RoPE, activations, adds, both directions.
    Other,
    /// The loss and its gradient over the vocabulary.
    Loss,
}

static NANOS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// Runs `f`, adding its time to `kind`.
pub fn timed<R>(kind: Kind, f: impl FnOnce() -> R) -> R {
    let start = Instant::now();
    let r = f();
    NANOS[kind as usize].fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    r
}

/// Seconds per kind since the last call, in [`Kind`] order, and resets them.
pub fn take() -> [(&'static str, f64); 6] {
    let names = [
        "matmul_fwd",
        "matmul_bwd",
        "attention_fwd",
        "attention_bwd",
        "other",
        "loss",
    ];
    let mut out = [("", 0.0); 6];
    for (i, n) in names.iter().enumerate() {
        out[i] = (n, NANOS[i].swap(0, Ordering::Relaxed) as f64 * 1e-9);
    }
    out
}
