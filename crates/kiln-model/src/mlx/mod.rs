//! MLX's affine-quantized safetensors, both directions: the quantizer itself (bit-compatible
//! with `mx.quantize`), the `config.json` quantization block, the tensors a writer stores per
//! module, and (crate-internal) serving such weights to kiln's kernels when a folder is opened.

pub mod affine;
pub mod config;
pub(crate) mod load;

#[cfg(test)]
mod load_tests;
#[cfg(test)]
mod tests;

pub use affine::{
    AffineMatrix, SUPPORTED_BITS, SUPPORTED_GROUP_SIZES, affine_dequantize, affine_dequantize_bf16,
    affine_quantize,
};
pub use config::{AffineSpec, MlxQuantization};

use safetensors::Dtype;

/// Safetensors tensors for one quantized module: ("<m>.weight" U32, "<m>.scales" BF16, "<m>.biases" BF16).
///
/// Shapes are MLX's: `[rows, cols·bits/32]` for the codes, `[rows, cols/group_size]` for scales
/// and biases; the bytes are little-endian, ready for `safetensors::tensor::TensorView::new`.
pub fn affine_tensors(module: &str, m: &AffineMatrix) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let halves = |v: &[half::bf16]| v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let groups = vec![m.rows, m.groups_per_row()];
    vec![
        (
            format!("{module}.weight"),
            Dtype::U32,
            vec![m.rows, m.packed_cols()],
            m.packed.iter().flat_map(|w| w.to_le_bytes()).collect(),
        ),
        (
            format!("{module}.scales"),
            Dtype::BF16,
            groups.clone(),
            halves(&m.scales),
        ),
        (
            format!("{module}.biases"),
            Dtype::BF16,
            groups,
            halves(&m.biases),
        ),
    ]
}
