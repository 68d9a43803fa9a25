//! kiln's CPU kernels: ggml block formats, dequantization, activation quantization, int8 dot
//! products with scalar / AVX2 / AVX-512 paths, a persistent worker pool and the matmul driver.
//!
//! Numerics follow ggml: dequantization is bit-exact with ggml's reference, activation
//! quantization produces ggml's integer codes, and dot products pair weights with the same
//! activation formats as llama.cpp (Q8_0 / Q8_1 / Q8_K).
//!
//! [`repack`] rearranges Q4_1 / Q5_0 / Q8_0 weights (and, with the layouts of [`repack_k`],
//! Q4_K / Q6_K) 16 rows at a time for the AVX-512 VNNI kernels, [`head16`] runs an output head
//! with 16-bit activations, [`attn_block`] holds prefill attention's register-blocked loops,
//! and [`arena`] keeps weights on huge pages, which decode's bandwidth-bound stream needs.
//!
//! [`kvquant`] holds the row codecs of the quantized KV cache (affine and TurboQuant; both
//! decode whole tiles at the CPU's level), and [`half_conv`] the f16 / bf16 conversions of a dense
//! 16-bit cache.

pub mod act;
pub mod arena;
#[cfg(target_arch = "x86_64")]
mod attn_avx512;
pub mod attn_block;
pub mod attn_tile;
pub mod blocks;
pub mod dense;
pub mod dequant;
mod dequant_k;
pub mod dot;
pub mod encode;
pub mod error;
pub mod exact;
pub mod half_conv;
pub mod head16;
pub mod interleave;
pub mod kvquant;
pub mod level;
pub mod matmul;
pub mod pool;
pub mod quantize;
pub mod repack;
pub mod repack_k;
pub mod softmax;
mod task_ranges;
#[cfg(test)]
mod testutil;
pub mod tile;
pub mod types;

pub use blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K};
pub use dense::{matmul_f32, matmul_f32_at};
pub use dequant::dequantize_row;
pub use dot::{dot_f32_at, vec_dot, vec_dot_at};
pub use encode::{can_encode, encode_row, encode_rows};
pub use error::{KernelError, Result};
pub use exact::matmul_f32_activations;
pub use level::{CpuLevel, cpu_level, hardware_level, supported_levels};
pub use matmul::{QMatrix, dequantize_matrix, matmul, matmul_at};
pub use quantize::{
    ActFormat, ActRow, QuantizedActivations, quantize_row_q8_0, quantize_row_q8_1,
    quantize_row_q8_k,
};
pub use tile::{TOKEN_TILE, vec_dot_tile_at};
pub use types::{GgmlType, QK, QK_K};
