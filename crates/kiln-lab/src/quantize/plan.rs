//! Which layout each tensor gets: eligibility (spec §7.1), the GGUF type for a code width on a
//! row of a given length, and the bits-per-weight accounting of both formats.

use kiln_kernels::{GgmlType, QK_K};

/// How one weight is stored in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A GGUF block type.
    Gguf(GgmlType),
    /// MLX affine codes of `bits` with one scale and bias per `group` values.
    Affine {
        /// Code width.
        bits: u32,
        /// Values per scale/bias pair.
        group: usize,
    },
}

impl Layout {
    /// Stored bits per weight, scales and minimums included.
    pub fn bits_per_weight(self) -> f64 {
        match self {
            Layout::Gguf(ty) => gguf_bpw(ty),
            // A bf16 scale and a bf16 bias per group (spec §7.1).
            Layout::Affine { bits, group } => bits as f64 + 32.0 / group as f64,
        }
    }

    /// A short label: `Q4_K`, `affine4g64`.
    pub fn label(self) -> String {
        match self {
            Layout::Gguf(ty) => ty.name().to_string(),
            Layout::Affine { bits, group } => format!("affine{bits}g{group}"),
        }
    }
}

/// Stored bits per weight of a GGUF type.
pub fn gguf_bpw(ty: GgmlType) -> f64 {
    let block = ty.block_elems();
    match ty.row_bytes(block) {
        Ok(bytes) => bytes as f64 * 8.0 / block as f64,
        Err(_) => 32.0,
    }
}

/// The GGUF type for candidate width `bits` on rows of `cols` values. Rows that hold whole
/// 256-value super-blocks take the K-quant of that width (8 → Q8_0). Other rows take the
/// 32-value legacy types, whose smallest code is 4 bits, on a ladder of distinct rungs (the
/// allocator only ever steps to the next candidate, so two widths sharing a layout would stall
/// it): 2 → Q4_0, 3 → Q4_1, then llama-quantize's own fallbacks for the K-quants, 4 → Q5_0
/// (for Q4_K), 5 → Q5_1 (Q5_K), 6 and 8 → Q8_0 (Q6_K).
pub fn gguf_type_for_width(bits: u32, cols: usize) -> GgmlType {
    if cols.is_multiple_of(QK_K) {
        match bits {
            0..=2 => GgmlType::Q2_K,
            3 => GgmlType::Q3_K,
            4 => GgmlType::Q4_K,
            5 => GgmlType::Q5_K,
            6 => GgmlType::Q6_K,
            _ => GgmlType::Q8_0,
        }
    } else {
        match bits {
            0..=2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            4 => GgmlType::Q5_0,
            5 => GgmlType::Q5_1,
            _ => GgmlType::Q8_0,
        }
    }
}

/// A uniform type on rows that cannot hold its blocks falls back the way llama-quantize falls
/// back (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0; Q2_K and Q3_K → Q4_0, since kiln has no
/// IQ4_NL); rows that hold no 32-value block at all stay f16.
pub fn gguf_fallback(ty: GgmlType, cols: usize) -> GgmlType {
    if cols.is_multiple_of(ty.block_elems()) {
        return ty;
    }
    let legacy = match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        other => other,
    };
    if cols.is_multiple_of(legacy.block_elems()) {
        legacy
    } else {
        GgmlType::F16
    }
}

/// Whether a tensor is quantized at all: 2-D weights whose rows hold whole groups of `group`
/// (spec §7.1); 1-D tensors (norms, biases) pass through.
pub fn is_quantizable(name: &str, rows: usize, cols: usize, group: usize) -> bool {
    rows > 1 && name.ends_with(".weight") && cols.is_multiple_of(group)
}

/// The module path of a weight: its name without `.weight`.
pub fn module_of(name: &str) -> &str {
    name.strip_suffix(".weight").unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_map_to_types_that_store_more_bits_at_each_step() {
        for cols in [576, 1536] {
            let bpw: Vec<f64> = [2, 3, 4, 5, 6, 8]
                .iter()
                .map(|&b| gguf_bpw(gguf_type_for_width(b, cols)))
                .collect();
            assert!(bpw.windows(2).all(|w| w[0] <= w[1]), "{cols}: {bpw:?}");
        }
        assert_eq!(gguf_type_for_width(3, 1536), GgmlType::Q3_K);
        assert_eq!(gguf_type_for_width(3, 576), GgmlType::Q4_1);
        assert_eq!(gguf_type_for_width(4, 576), GgmlType::Q5_0);
        assert!((gguf_bpw(GgmlType::Q4_K) - 4.5).abs() < 1e-9);
        assert!((gguf_bpw(GgmlType::Q6_K) - 6.5625).abs() < 1e-9);
        assert!((Layout::Affine { bits: 4, group: 64 }.bits_per_weight() - 4.5).abs() < 1e-9);
    }

    #[test]
    fn fallback_follows_llama_quantize_and_keeps_f16_for_odd_rows() {
        assert_eq!(gguf_fallback(GgmlType::Q4_K, 576), GgmlType::Q5_0);
        assert_eq!(gguf_fallback(GgmlType::Q4_K, 512), GgmlType::Q4_K);
        assert_eq!(gguf_fallback(GgmlType::Q6_K, 576), GgmlType::Q8_0);
        assert_eq!(gguf_fallback(GgmlType::Q8_0, 100), GgmlType::F16);
    }
}
