//! Attention's CPU loops: the per-row f32 loops over one tile of cached rows ([`tile`]), the
//! register-blocked loops of prefill ([`block`]), the per-row loops' AVX2 and AVX-512 forms
//! (`avx2`, `avx512`) and the softmax pieces ([`softmax`]).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod block;
pub mod softmax;
pub mod tile;
