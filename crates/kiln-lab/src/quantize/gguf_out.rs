//! Writing a GGUF file from a GGUF source: every tensor is read, dequantized to f32, encoded in
//! the type the plan gives it and streamed out; the source's metadata (architecture, tokenizer,
//! chat template) is carried over with the file type and kiln's quantization record updated.

use std::path::Path;

use kiln_kernels::GgmlType;
use kiln_model::backend::HostTensor;
use kiln_model::gguf::{GgufFile, GgufTensorSpec, GgufWriter, MetaValue};
use kiln_model::weights::GgufSource;

use crate::LabError;

/// What was written, tensor by tensor.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WrittenTensors {
    /// `(tensor name, label of its layout)`, in file order.
    pub tensors: Vec<(String, String)>,
    /// Bytes of tensor data.
    pub data_bytes: u64,
    /// Parameters stored quantized, and the bits they take (scales included).
    pub quantized_params: u64,
    /// Total stored bits of the quantized tensors.
    pub quantized_bits: f64,
}

impl WrittenTensors {
    /// Stored bits per weight over the quantized tensors.
    pub fn achieved_bpw(&self) -> f64 {
        self.quantized_bits / self.quantized_params.max(1) as f64
    }
}

/// The GGUF type each tensor of `source` gets: `choose(hf_name, rows, cols)` for 2-D weights;
/// vectors keep a float type.
pub fn plan_types(
    source: &GgufSource,
    choose: &dyn Fn(Option<&str>, usize, usize) -> GgmlType,
) -> Vec<GgufTensorSpec> {
    let file = source.file();
    file.header()
        .tensors
        .iter()
        .map(|info| {
            let ty = match info.dims.as_slice() {
                [cols, rows] if *rows > 1 => {
                    let hf = source.hf_name(&info.name);
                    choose(hf.as_deref(), *rows as usize, *cols as usize)
                }
                _ if info.ty.is_float() => info.ty,
                _ => GgmlType::F32,
            };
            GgufTensorSpec {
                name: info.name.clone(),
                dims: info.dims.clone(),
                ty,
            }
        })
        .collect()
}

/// Writes `specs` (from [`plan_types`]) to `out`, with `extra` metadata added.
/// `on_tensor(done, total)` runs after each tensor and may stop the write.
pub fn write(
    file: &GgufFile,
    specs: Vec<GgufTensorSpec>,
    out: &Path,
    extra: Vec<(String, MetaValue)>,
    on_tensor: &mut dyn FnMut(usize, usize) -> Result<(), LabError>,
) -> Result<WrittenTensors, LabError> {
    write_edited(
        file,
        specs,
        out,
        extra,
        &|_| false,
        &mut |_, _, _, _| Ok(false),
        on_tensor,
    )
}

/// Changes a tensor's values before it is encoded: `edit(name, values, rows, cols)` returns
/// whether it changed them.
pub type TensorEdit<'a> = dyn FnMut(&str, &mut [f32], usize, usize) -> Result<bool, LabError> + 'a;

/// [`write`], with `edit` offered each 2-D tensor `wants` names in f32 (in the file's row
/// order) first; an edited tensor is re-encoded even when its type stays.
pub fn write_edited(
    file: &GgufFile,
    specs: Vec<GgufTensorSpec>,
    out: &Path,
    extra: Vec<(String, MetaValue)>,
    wants: &dyn Fn(&str) -> bool,
    edit: &mut TensorEdit<'_>,
    on_tensor: &mut dyn FnMut(usize, usize) -> Result<(), LabError>,
) -> Result<WrittenTensors, LabError> {
    let metadata = carried_metadata(file, &specs, extra);
    let total = specs.len();
    let mut writer = GgufWriter::create(out, &metadata, specs.clone())?;
    let mut report = WrittenTensors::default();
    for (i, spec) in specs.iter().enumerate() {
        let info = file.header().tensor(&spec.name).ok_or_else(|| {
            LabError::config("model_id", format!("tensor {} vanished", spec.name))
        })?;
        let cols = info.dims[0] as usize;
        let rows = (info.elem_count() / info.dims[0]) as usize;
        let source = HostTensor {
            ty: info.ty,
            rows,
            cols,
            bytes: file.tensor_bytes(info),
        };
        let mut values = None;
        if info.dims.len() == 2 && wants(&spec.name) {
            let mut v = source.to_f32()?;
            if edit(&spec.name, &mut v, rows, cols)? {
                values = Some(v);
            }
        }
        let bytes = match values {
            Some(v) => kiln_kernels::encode::encode_rows(spec.ty, &v, rows, cols)?.into(),
            None if spec.ty == info.ty => source.bytes,
            None => {
                kiln_kernels::encode::encode_rows(spec.ty, &source.to_f32()?, rows, cols)?.into()
            }
        };
        writer.write_tensor(&spec.name, &bytes)?;
        report.data_bytes += bytes.len() as u64;
        if !spec.ty.is_float() {
            report.quantized_params += (rows * cols) as u64;
            report.quantized_bits += bytes.len() as f64 * 8.0;
        }
        report
            .tensors
            .push((spec.name.clone(), spec.ty.name().to_string()));
        on_tensor(i + 1, total)?;
    }
    writer.finish()?;
    Ok(report)
}

/// The source's metadata, minus what describes the old file (alignment, file type), plus the
/// new file type and `extra`.
fn carried_metadata(
    file: &GgufFile,
    specs: &[GgufTensorSpec],
    extra: Vec<(String, MetaValue)>,
) -> Vec<(String, MetaValue)> {
    let replaced: Vec<&str> = extra.iter().map(|(k, _)| k.as_str()).collect();
    let mut out: Vec<(String, MetaValue)> = file
        .header()
        .metadata
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "general.alignment" | "general.file_type" | "general.quantization_version"
            ) && !replaced.contains(&k.as_str())
                && !k.starts_with("kiln.quantize.")
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.push(("general.file_type".into(), MetaValue::U32(file_type(specs))));
    out.push(("general.quantization_version".into(), MetaValue::U32(2)));
    out.extend(extra);
    out
}

/// llama.cpp's `llama_ftype` for the file: the type most 2-D tensors have (its `_M`/`_S` mixes
/// are not told apart), or 1024 ("guessed") when no type holds most of them.
fn file_type(specs: &[GgufTensorSpec]) -> u32 {
    let matrices: Vec<GgmlType> = specs
        .iter()
        .filter(|s| s.dims.len() == 2)
        .map(|s| s.ty)
        .collect();
    let most = GgmlType::ALL
        .iter()
        .copied()
        .max_by_key(|t| matrices.iter().filter(|m| *m == t).count());
    let count = |t: GgmlType| matrices.iter().filter(|m| **m == t).count();
    match most {
        Some(t) if count(t) * 2 > matrices.len() => ftype_of(t).unwrap_or(1024),
        _ => 1024,
    }
}

fn ftype_of(t: GgmlType) -> Option<u32> {
    Some(match t {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q5_0 => 8,
        GgmlType::Q5_1 => 9,
        GgmlType::Q2_K => 10,
        GgmlType::Q3_K => 12,
        GgmlType::Q4_K => 15,
        GgmlType::Q5_K => 17,
        GgmlType::Q6_K => 18,
        GgmlType::BF16 => 32,
        _ => return None,
    })
}
