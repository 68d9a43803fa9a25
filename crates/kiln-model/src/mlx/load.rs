//! Serving MLX-quantized weights to kiln's kernels: a module's `X.weight` (U32 codes) +
//! `X.scales` + `X.biases` become one [`HostTensor`] named `X.weight`.
//!
//! - 4-bit → `Q4_1` and 5-bit → `Q5_1`: every MLX group (32, 64 or 128) splits into 32-element
//!   ggml blocks with `d = scale`, `m = bias` as f16 and the codes as they are. That is exact
//!   when each scale and bias survives the trip to f16 — or, for a block whose codes are all 0,
//!   when only the bias does (its scale multiplies nothing) — which is checked value by value.
//! - Any other width, or a matrix whose scales or biases f16 cannot hold: dequantized to `F32`,
//!   exactly [`super::affine_dequantize`]'s values (kiln has no kernel for those layouts yet).
//!
//! The sizes are checked when the folder is opened, so a malformed checkpoint fails early.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use half::{bf16, f16};
use kiln_kernels::GgmlType;
use kiln_kernels::format::blocks::{Q4_1_BYTES, Q5_1_BYTES};
use safetensors::Dtype;

use super::affine::{dequantize_codes, unpack_row};
use super::config::{AffineSpec, MlxQuantization};
use crate::backend::HostTensor;

/// A quantized `X.weight` as the header describes it, validated.
#[derive(Debug, Clone)]
pub(crate) struct QuantPlan {
    /// `X` (the module path).
    pub module: String,
    /// Its bits and group size.
    pub spec: AffineSpec,
    /// Output features.
    pub rows: usize,
    /// Logical input features (`packed words · 32 / bits`).
    pub cols: usize,
    /// The type it is planned to load as (the f16 check may still demote it to `F32`).
    pub target: GgmlType,
}

impl QuantPlan {
    /// Bytes of the tensor it is planned to become.
    pub fn served_bytes(&self) -> u64 {
        let row = self.target.row_bytes(self.cols).unwrap_or(self.cols * 4);
        (row as u64).saturating_mul(self.rows as u64)
    }
}

/// Why a matrix was dequantized to f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToF32 {
    /// No kiln kernel for this bit width.
    Width(u32),
    /// A scale or bias is not exact in f16.
    NotF16,
}

/// The quantized weights of one opened folder, and what loading them has done so far.
pub(crate) struct MlxWeights {
    planned: HashMap<String, QuantPlan>,
    log: Mutex<LoadLog>,
}

#[derive(Default)]
struct LoadLog {
    served: HashSet<String>,
    by_width: BTreeMap<u32, usize>,
    not_f16: usize,
    reported: bool,
}

/// Header facts of one tensor: dtype and shape.
pub(crate) type HeaderInfo<'a> = Option<(Dtype, &'a [usize])>;

impl MlxWeights {
    /// How many quantized matrices the folder holds at each code width.
    pub fn widths(&self) -> BTreeMap<u32, usize> {
        let mut out = BTreeMap::new();
        for p in self.planned.values() {
            *out.entry(p.spec.bits).or_insert(0) += 1;
        }
        out
    }

    /// Validates every U32 tensor of a folder (`u32_names`) against `quant` and the headers of
    /// its `.scales` / `.biases` (looked up with `info`). Errors give the tensor and the reason.
    pub fn plan<'a>(
        quant: &MlxQuantization,
        u32_names: impl Iterator<Item = &'a str>,
        info: impl Fn(&str) -> HeaderInfo<'a>,
    ) -> Result<Self, (String, String)> {
        let mut planned = HashMap::new();
        for name in u32_names {
            let plan = plan_one(quant, name, &info).map_err(|r| (name.to_string(), r))?;
            planned.insert(name.to_string(), plan);
        }
        Ok(Self {
            planned,
            log: Mutex::default(),
        })
    }

    /// The plan of `name`, when it is a quantized weight.
    pub fn get(&self, name: &str) -> Option<&QuantPlan> {
        self.planned.get(name)
    }

    /// Whether `name` is the `.scales` or `.biases` of a quantized weight (folded into it).
    pub fn is_companion(&self, name: &str) -> bool {
        let module = name
            .strip_suffix(".scales")
            .or_else(|| name.strip_suffix(".biases"));
        module.is_some_and(|m| self.planned.contains_key(&format!("{m}.weight")))
    }

    /// Notes that `name` was served (through f32 when `to_f32` says why), and once every
    /// quantized matrix has been, logs how many went through f32.
    pub fn record(&self, name: &str, to_f32: Option<ToF32>) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if !log.served.insert(name.to_string()) {
            return;
        }
        match to_f32 {
            Some(ToF32::Width(bits)) => *log.by_width.entry(bits).or_default() += 1,
            Some(ToF32::NotF16) => log.not_f16 += 1,
            None => {}
        }
        if log.served.len() == self.planned.len() {
            report(&mut log, self.planned.len());
        }
    }
}

impl Drop for MlxWeights {
    /// A model that did not load every quantized matrix still reports what it did load.
    fn drop(&mut self) {
        let total = self.planned.len();
        let log = self.log.get_mut().unwrap_or_else(|e| e.into_inner());
        report(log, total);
    }
}

/// The one line per model about matrices that took the f32 path.
fn report(log: &mut LoadLog, total: usize) {
    let widths: usize = log.by_width.values().sum();
    if log.reported || widths + log.not_f16 == 0 {
        return;
    }
    log.reported = true;
    let mut why: Vec<String> = log
        .by_width
        .iter()
        .map(|(bits, n)| format!("{n} at {bits} bits, a layout kiln has no kernel for"))
        .collect();
    if log.not_f16 > 0 {
        why.push(format!(
            "{} whose scales or biases f16 (Q4_1/Q5_1) cannot hold exactly",
            log.not_f16
        ));
    }
    tracing::info!(
        "MLX weights: {} of {total} quantized matrices dequantized to f32 at load ({})",
        widths + log.not_f16,
        why.join("; ")
    );
}

fn plan_one<'a>(
    quant: &MlxQuantization,
    name: &str,
    info: &impl Fn(&str) -> HeaderInfo<'a>,
) -> Result<QuantPlan, String> {
    let module = name.strip_suffix(".weight").ok_or_else(|| {
        "dtype U32 (MLX-packed codes) is only valid for a module's .weight".to_string()
    })?;
    let spec = quant.spec_for(module).ok_or_else(|| {
        format!("dtype U32 (MLX-packed codes), but config.json's quantization leaves {module} unquantized")
    })?;
    let Some((_, shape)) = info(name) else {
        return Err("missing".into());
    };
    let &[rows, words] = shape else {
        return Err(format!(
            "packed shape {shape:?} is not a matrix (kiln reads 2-D MLX-quantized weights)"
        ));
    };
    let bits = spec.bits as usize;
    let stream_bits = words.checked_mul(32).ok_or("packed width overflows")?;
    if !stream_bits.is_multiple_of(bits) {
        return Err(format!(
            "{words} packed words per row are not a whole number of {bits}-bit codes"
        ));
    }
    let cols = stream_bits / bits;
    if cols == 0 || !cols.is_multiple_of(spec.group_size) {
        return Err(format!(
            "{words} packed words per row at {bits} bits are {cols} columns, not a multiple of \
             the group size {}",
            spec.group_size
        ));
    }
    let want = [rows, cols / spec.group_size];
    for part in ["scales", "biases"] {
        let companion = format!("{module}.{part}");
        let Some((dtype, shape)) = info(&companion) else {
            return Err(format!(
                "{companion} is missing (an MLX-packed weight needs it)"
            ));
        };
        if !matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
            return Err(format!(
                "{companion} has dtype {dtype:?} (bf16, f16, f32 are supported)"
            ));
        }
        if shape != want {
            return Err(format!(
                "{companion} has shape {shape:?}, expected {want:?}: {words} packed words per \
                 row at {bits} bits are {cols} columns, in groups of {}",
                spec.group_size
            ));
        }
    }
    let target = match spec.bits {
        4 => GgmlType::Q4_1,
        5 => GgmlType::Q5_1,
        _ => GgmlType::F32,
    };
    Ok(QuantPlan {
        module: module.into(),
        spec,
        rows,
        cols,
        target,
    })
}

/// Widens a little-endian bf16/f16/f32 buffer to f32 (`None` for another dtype).
pub(crate) fn floats(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    let halves = |f: fn(u16) -> f32| {
        let it = bytes.chunks_exact(2);
        it.map(|c| f(u16::from_le_bytes([c[0], c[1]]))).collect()
    };
    match dtype {
        Dtype::BF16 => Some(halves(|b| bf16::from_bits(b).to_f32())),
        Dtype::F16 => Some(halves(|b| f16::from_bits(b).to_f32())),
        Dtype::F32 => Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        _ => None,
    }
}

/// Builds the tensor for `plan` from the bytes of its codes and its (widened) scales and
/// biases; also says why when it took the f32 path.
pub(crate) fn serve(
    plan: &QuantPlan,
    packed: &[u8],
    scales: &[f32],
    biases: &[f32],
) -> Result<(HostTensor, Option<ToF32>), String> {
    let (rows, cols, g) = (plan.rows, plan.cols, plan.spec.group_size);
    let row_bytes = cols * plan.spec.bits as usize / 8;
    let groups = rows * (cols / g);
    if packed.len() != rows * row_bytes || scales.len() != groups || biases.len() != groups {
        return Err("tensor data does not match the header's shape".into());
    }
    if let Some(t) = to_ggml(plan, packed, scales, biases) {
        return Ok((t, None));
    }
    let why = if plan.target == GgmlType::F32 {
        ToF32::Width(plan.spec.bits)
    } else {
        ToF32::NotF16
    };
    // Row by row, so the f32 matrix is the only large allocation.
    let mut bytes = Vec::with_capacity(rows * cols * 4);
    let (mut codes, mut row) = (vec![0u8; cols], vec![0f32; cols]);
    let gpr = cols / g;
    for r in 0..rows {
        let packed_row = &packed[r * row_bytes..(r + 1) * row_bytes];
        unpack_row(words(packed_row), plan.spec.bits, &mut codes);
        let groups = r * gpr..(r + 1) * gpr;
        let (s, b) = (&scales[groups.clone()], &biases[groups]);
        dequantize_codes(&codes, g, s, b, &mut row);
        bytes.extend(row.iter().flat_map(|v| v.to_le_bytes()));
    }
    let t = HostTensor {
        ty: GgmlType::F32,
        rows,
        cols,
        bytes: bytes.into(),
    };
    Ok((t, Some(why)))
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// `v` as f16 when that is exact.
fn exact_f16(v: f32) -> Option<f16> {
    let h = f16::from_f32(v);
    (h.to_f32() == v).then_some(h)
}

/// The Q4_1 / Q5_1 form, or `None` when the plan is f32 or a value does not fit f16 exactly.
fn to_ggml(plan: &QuantPlan, packed: &[u8], scales: &[f32], biases: &[f32]) -> Option<HostTensor> {
    let (rows, cols, g) = (plan.rows, plan.cols, plan.spec.group_size);
    let block_bytes = match plan.target {
        GgmlType::Q4_1 => Q4_1_BYTES,
        GgmlType::Q5_1 => Q5_1_BYTES,
        _ => return None,
    };
    let row_bytes = cols * plan.spec.bits as usize / 8;
    let gpr = cols / g;
    let mut out = Vec::with_capacity(rows * (cols / 32) * block_bytes);
    let mut codes = vec![0u8; cols];
    for r in 0..rows {
        unpack_row(
            words(&packed[r * row_bytes..(r + 1) * row_bytes]),
            plan.spec.bits,
            &mut codes,
        );
        for (b, c) in codes.chunks_exact(32).enumerate() {
            let group = r * gpr + b * 32 / g;
            let m = exact_f16(biases[group])?;
            // A block of zero codes is its bias whatever the scale, so d = 0 is exact there.
            let d = match exact_f16(scales[group]) {
                Some(d) => d,
                None if c.iter().all(|&q| q == 0) => f16::ZERO,
                None => return None,
            };
            out.extend_from_slice(&d.to_le_bytes());
            out.extend_from_slice(&m.to_le_bytes());
            if block_bytes == Q5_1_BYTES {
                let qh = c
                    .iter()
                    .enumerate()
                    .fold(0u32, |h, (i, &q)| h | (u32::from(q >> 4) & 1) << i);
                out.extend_from_slice(&qh.to_le_bytes());
            }
            // ggml's nibble order: low nibbles hold elements 0..15, high nibbles 16..31.
            out.extend((0..16).map(|j| (c[j] & 0xF) | (c[j + 16] & 0xF) << 4));
        }
    }
    Some(HostTensor {
        ty: plan.target,
        rows,
        cols,
        bytes: out.into(),
    })
}
