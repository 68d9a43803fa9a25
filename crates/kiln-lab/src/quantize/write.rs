//! The writing half of a run: the source's tensors and tokenizer, streamed into a GGUF file or
//! an MLX folder (with its side files) in the layouts the plan gave them.

use std::path::Path;

use kiln_kernels::GgmlType;
use kiln_model::files::{ModelFiles, WeightFiles};
use kiln_model::gguf::MetaValue;
use kiln_model::mlx::config::{AffineSpec, MlxQuantization};
use kiln_model::tokenizer::{KilnTokenizer, tokenizer_from_gguf};
use serde_json::json;

use super::config::QuantizeConfig;
use super::gguf_out::{self, WrittenTensors};
use super::hf_export;
use super::mlx_out::{self, SourceTensor};
use super::plan::{gguf_fallback, gguf_type_for_width, module_of};
use super::run::SensitivityRow;
use crate::{LabError, Report};

/// Writes the GGUF output at `tmp` from a GGUF source: every tensor in the type `allocation`
/// (mixed) or the config's uniform type gives it.
pub(super) fn write_gguf(
    cfg: &QuantizeConfig,
    files: &ModelFiles,
    tmp: &Path,
    allocation: Option<&[(String, u32)]>,
    rep: &mut dyn Report,
) -> Result<WrittenTensors, LabError> {
    let WeightFiles::Gguf(source) = &files.source else {
        return Err(LabError::config(
            "format",
            "GGUF output needs a GGUF source for now (the tokenizer is carried from its metadata); use format mlx for a Hugging Face folder",
        ));
    };
    let uniform = cfg.uniform_gguf_type();
    let choose = |hf: Option<&str>, _rows: usize, cols: usize| -> GgmlType {
        let allocated = hf.and_then(|n| {
            let module = module_of(n);
            allocation?
                .iter()
                .find(|(m, _)| m == module)
                .map(|(_, b)| *b)
        });
        match allocated {
            Some(bits) => gguf_type_for_width(bits, cols),
            None => gguf_fallback(uniform, cols),
        }
    };
    let specs = gguf_out::plan_types(source, &choose);
    let mut extra = vec![(
        "kiln.quantize.method".into(),
        MetaValue::String(if allocation.is_some() {
            "mixed-kl".into()
        } else {
            "uniform".into()
        }),
    )];
    if let Some(t) = cfg.target_bpw {
        extra.push(("kiln.quantize.target_bpw".into(), MetaValue::F32(t as f32)));
    }
    if let Some(a) = allocation {
        let per_layer = a
            .iter()
            .map(|(m, b)| MetaValue::String(format!("{m}={b}")))
            .collect();
        extra.push((
            "kiln.quantize.per_layer_bits".into(),
            MetaValue::Array(per_layer),
        ));
    }
    let written = gguf_out::write(source.file(), specs, tmp, extra, &mut |done, total| {
        rep.stage(
            "writing",
            0.95 + 0.05 * done as f64 / total as f64,
            &format!("{done}/{total} tensors"),
        )
    })?;
    Ok(written)
}

/// Writes the MLX folder at `tmp`: the quantized tensors, then `config.json`, the tokenizer
/// and the other side files.
pub(super) fn write_mlx(
    cfg: &QuantizeConfig,
    files: &ModelFiles,
    tmp: &Path,
    allocation: Option<&[(String, u32)]>,
    sensitivity: Option<&[SensitivityRow]>,
    rep: &mut dyn Report,
) -> Result<WrittenTensors, LabError> {
    std::fs::create_dir(tmp).map_err(|e| LabError::io(tmp, e))?;
    let default = AffineSpec {
        bits: cfg.bits,
        group_size: cfg.group_size,
    };
    let mut quant = MlxQuantization {
        default: Some(default),
        per_module: Default::default(),
    };
    if let Some(a) = allocation {
        for (module, bits) in a {
            quant.per_module.insert(
                module.clone(),
                Some(AffineSpec {
                    bits: *bits,
                    group_size: cfg.group_size,
                }),
            );
        }
    }
    let tensors = source_tensors(files)?;
    let eligible =
        |t: &SourceTensor| !t.vector && t.rows > 1 && t.cols.is_multiple_of(cfg.group_size);
    for t in tensors.iter().filter(|t| !t.vector && !eligible(t)) {
        quant
            .per_module
            .insert(module_of(&t.name).to_string(), None);
    }
    let spec_for = |t: &SourceTensor| -> Option<AffineSpec> {
        if !eligible(t) {
            return None;
        }
        quant.spec_for(module_of(&t.name))
    };
    let written = mlx_out::write_tensors(
        files.tensors(),
        &tensors,
        tmp,
        &spec_for,
        &mut |done, total| {
            rep.stage(
                "writing",
                0.95 + 0.04 * done as f64 / total as f64,
                &format!("{done}/{total} tensors"),
            )
        },
    )?;
    write_mlx_side_files(cfg, files, tmp, &quant, &written, sensitivity)?;
    Ok(written)
}

/// The MLX folder's files beside the weights: `config.json` with the `quantization` block,
/// the tokenizer and chat template, and the sensitivity record of a mixed run.
fn write_mlx_side_files(
    cfg: &QuantizeConfig,
    files: &ModelFiles,
    dir: &Path,
    quant: &MlxQuantization,
    written: &WrittenTensors,
    sensitivity: Option<&[SensitivityRow]>,
) -> Result<(), LabError> {
    let base_config = match &files.source {
        WeightFiles::Gguf(source) => {
            let header = source.file().header();
            let tokenizer = tokenizer_from_gguf(header)?;
            let template = header
                .get("tokenizer.chat_template")
                .and_then(|v| v.as_str());
            hf_export::write_tokenizer(dir, &tokenizer, template, &files.config)?;
            hf_export::config_json(&files.config)?
        }
        WeightFiles::Safetensors(_) => {
            mlx_out::copy_aux_files(&cfg.source, dir)?;
            let path = cfg.source.join("config.json");
            let text = std::fs::read_to_string(&path).map_err(|e| LabError::io(&path, e))?;
            let mut v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| LabError::config("model_id", format!("{}: {e}", path.display())))?;
            if let Some(o) = v.as_object_mut() {
                o.remove("quantization");
                o.remove("quantization_config");
            }
            v
        }
    };
    hf_export::write_json(
        &dir.join("config.json"),
        &mlx_out::quantized_config(base_config, quant),
    )?;
    let meta = json!({
        "method": if cfg.target_bpw.is_some() { "kiln-mixed-kl" } else { "uniform" },
        "base_model": cfg.source.display().to_string(),
        "bits": cfg.bits,
        "group_size": cfg.group_size,
        "achieved_bpw": written.achieved_bpw(),
        "per_layer_count": quant.per_module.values().filter(|s| s.is_some()).count(),
        "per_layer": quant.per_module.iter().filter_map(|(m, s)| s.map(|s| (m.clone(), s.bits))).collect::<std::collections::BTreeMap<_, _>>(),
        "sensitivity": sensitivity,
    });
    hf_export::write_json(&dir.join("optiq_metadata.json"), &meta)
}

/// The source's tensors by Hugging Face name with their logical shapes.
fn source_tensors(files: &ModelFiles) -> Result<Vec<SourceTensor>, LabError> {
    let shapes = files.tensors().tensor_shapes();
    Ok(shapes
        .into_iter()
        .map(|(name, shape)| {
            let (rows, cols, vector) = match shape.as_slice() {
                [c] => (1, *c, true),
                [r, c] => (*r, *c, false),
                _ => (0, 0, true),
            };
            SourceTensor {
                name,
                rows,
                cols,
                vector,
            }
        })
        .filter(|t| t.cols > 0)
        .collect())
}

/// The source's tokenizer: from a GGUF's metadata, else from the Hugging Face folder.
pub(super) fn source_tokenizer(files: &ModelFiles) -> Result<KilnTokenizer, LabError> {
    Ok(match files.gguf() {
        Some(g) => tokenizer_from_gguf(g.header())?,
        None => KilnTokenizer::from_hf_folder(&files.path)?,
    })
}
