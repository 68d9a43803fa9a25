//! kiln's CPU kernels: ggml block formats, dequantization, activation quantization, int8 dot
//! products with scalar / AVX2 / AVX-512 paths, a persistent worker pool and the matmul driver.
//!
//! Numerics follow ggml: dequantization is bit-exact with ggml's reference, activation
//! quantization produces ggml's integer codes, and dot products pair weights with the same
//! activation formats as llama.cpp (Q8_0 / Q8_1 / Q8_K).
//!
//! The crate is grouped by concern: [`format`](mod@format) (ggml types, block layouts, dequantization),
//! [`quantize`] (the activations' 8-bit formats), [`encode`] (weights into ggml blocks), [`dot`]
//! (one weight row against activations, per instruction-set level), [`matmul`](mod@matmul) (the driver and
//! prefill's token tiles), [`repack`] (Q4_1 / Q5_0 / Q8_0 and Q4_K / Q6_K rearranged 16 rows at
//! a time for the AVX2 and AVX-512 VNNI kernels), [`head`] (the output head with unrounded activations),
//! [`attention`] (the attention loops), [`kv`] (the quantized KV cache's row codecs and the
//! f16 / bf16 conversions of a dense 16-bit cache), [`pool`] (the persistent workers) and
//! [`arena`] (weights on huge pages, which decode's bandwidth-bound stream needs).

pub mod act;
pub mod arena;
pub mod attention;
pub mod dot;
pub mod encode;
pub mod error;
pub mod format;
pub mod head;
pub mod kv;
pub mod level;
pub mod matmul;
pub mod pool;
pub mod quantize;
pub mod repack;
pub mod stream;
#[cfg(test)]
mod testutil;

pub use dot::{dot_f32_at, vec_dot, vec_dot_at};
pub use encode::{can_encode, encode_row, encode_rows};
pub use error::{KernelError, Result};
pub use format::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K};
pub use format::dequant::dequantize_row;
pub use format::types::{GgmlType, QK, QK_K};
pub use head::f32_acts::matmul_f32_activations;
pub use level::{CpuLevel, cpu_level, hardware_level, hardware_supports, supported_levels};
pub use matmul::dense::{matmul_f32, matmul_f32_at};
pub use matmul::tile::{TOKEN_TILE, vec_dot_tile_at};
pub use matmul::{QMatrix, dequantize_matrix, matmul, matmul_at};
pub use quantize::{
    ActFormat, ActRow, QuantizedActivations, quantize_row_q8_0, quantize_row_q8_1,
    quantize_row_q8_k,
};
