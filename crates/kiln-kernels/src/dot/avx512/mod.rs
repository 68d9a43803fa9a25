//! AVX-512 (F/BW/VL + VNNI) dot products for the formats that dominate the test models:
//! Q4_1 × Q8_1 and Q8_0 × Q8_0 (`legacy`), Q4_K / Q5_K / Q6_K × Q8_K (`kquant`). Types
//! without a kernel here use their AVX2 kernel at the AVX-512 level.
//!
//! Safety: every function requires [`crate::CpuLevel::Avx512`] (which includes the AVX2 set).

mod kquant;
mod legacy;

pub use kquant::*;
pub use legacy::*;
