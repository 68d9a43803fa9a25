//! AVX-512 (F/BW/VL + VNNI) dot products for the formats that dominate the test models:
//! Q4_1 × Q8_1, Q5_0 × Q8_0 and Q8_0 × Q8_0 (`legacy`), Q4_K / Q5_K / Q6_K × Q8_K
//! (`kquant`), and the token tiles of prefill: Q8_0 / Q5_0 against interleaved activations
//! (`tile`), Q4_K / Q6_K (`tile_k`) and Q4_1 (in `legacy`); the kernels of the 16-row
//! repacked layout ([`crate::repack`]) for Q4_1 / Q8_0 / Q5_0 (`repack`) and Q4_K / Q6_K (`repack_k`), and the 16-bit head
//! (`head16`). Types without a kernel here use their AVX2 kernel at the AVX-512 level.
//!
//! Safety: every function requires [`crate::CpuLevel::Avx512`] (which includes the AVX2 set).

mod head16;
mod kquant;
mod legacy;
mod repack;
mod repack_k;
mod tile;
mod tile_k;

pub use head16::*;
pub use kquant::*;
pub use legacy::*;
pub use repack::*;
pub use repack_k::*;
pub use tile::*;
pub use tile_k::*;
