//! The ggml block formats: tensor types and their geometry ([`types`]), block layouts
//! ([`blocks`]) and row dequantization ([`dequant`], the K-quants in `dequant_k`).

pub mod blocks;
pub mod dequant;
mod dequant_k;
pub mod types;
