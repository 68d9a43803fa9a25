//! `kiln fuse`: an adapter merged into its base, written in the base's own layout (spec §8.7).
//! Each adapted matrix is dequantized, `W += s·(A·B)ᵀ` is added in f32 (the original rounds
//! both factors to bf16 first; kiln keeps them exact), and it is re-encoded in the type that
//! matrix had; every other tensor is copied byte for byte. GGUF bases only for now.

use std::path::{Path, PathBuf};

use kiln_model::files::{ModelFiles, WeightFiles};
use kiln_model::gguf::{GgufTensorSpec, MetaValue};
use kiln_model::lora::LoraAdapter;
use kiln_model::weights::unpermute_order;
use serde::Serialize;

use crate::LabError;
use crate::quantize::gguf_out;

/// What a fuse wrote.
#[derive(Debug, Clone, Serialize)]
pub struct FuseReport {
    /// The merged model.
    pub output: PathBuf,
    /// Adapted matrices merged.
    pub fused_modules: usize,
    /// Bytes of tensor data written.
    pub data_bytes: u64,
}

/// `delta[o][i] = s·Σ_r A[i][r]·B[r][o]`, added to row `o` of `w` (`[out, in]`); `row_of`
/// maps a Hugging Face row to the file's.
fn add_delta(w: &mut [f32], lora: &kiln_model::lora::LoraWeights, row_of: &dyn Fn(usize) -> usize) {
    let (n_in, n_out, r) = (lora.in_features, lora.out_features, lora.rank);
    let mut col = vec![0f32; r];
    for o in 0..n_out {
        for (k, c) in col.iter_mut().enumerate() {
            *c = lora.scale * lora.b[k * n_out + o];
        }
        let dst = &mut w[row_of(o) * n_in..(row_of(o) + 1) * n_in];
        for (i, d) in dst.iter_mut().enumerate() {
            let a = &lora.a[i * r..(i + 1) * r];
            *d += a.iter().zip(&col).map(|(x, y)| x * y).sum::<f32>();
        }
    }
}

/// Merges the adapter at `adapter_dir` into the GGUF `model` and writes `out` (which must not
/// exist).
pub fn fuse(model: &Path, adapter_dir: &Path, out: &Path) -> Result<FuseReport, LabError> {
    if out.exists() {
        return Err(LabError::config("out", format!("{} exists", out.display())));
    }
    let files = ModelFiles::open(model)?;
    let adapter = LoraAdapter::load(adapter_dir)?;
    adapter.check_against(&files.config)?;
    let WeightFiles::Gguf(source) = &files.source else {
        return Err(LabError::config(
            "model",
            "fuse writes GGUF bases for now; this model is a safetensors folder",
        ));
    };
    // Every tensor keeps its own type: only the adapted matrices' values change.
    let specs = source
        .file()
        .header()
        .tensors
        .iter()
        .map(|info| GgufTensorSpec {
            name: info.name.clone(),
            dims: info.dims.clone(),
            ty: info.ty,
        })
        .collect();
    let module_of = |gguf: &str| -> Option<String> {
        let hf = source.hf_name(gguf)?;
        let module = hf.strip_suffix(".weight")?.to_string();
        adapter.modules.contains_key(&module).then_some(module)
    };
    let mut fused = 0usize;
    let tmp = out.with_extension("kiln-partial");
    let extra = vec![(
        "kiln.fuse.adapter".to_string(),
        MetaValue::String(adapter_dir.display().to_string()),
    )];
    let written = gguf_out::write_edited(
        source.file(),
        specs,
        &tmp,
        extra,
        &|name| module_of(name).is_some(),
        &mut |name, values, rows, _cols| {
            let Some(module) = module_of(name) else {
                return Ok(false);
            };
            let lora = &adapter.modules[&module];
            let hf = format!("{module}.weight");
            let order = source
                .permuted_heads(&hf)
                .and_then(|h| unpermute_order(rows, h));
            match order {
                Some(order) => add_delta(values, lora, &|o| order[o]),
                None => add_delta(values, lora, &|o| o),
            }
            fused += 1;
            Ok(true)
        },
        &mut |_, _| Ok(()),
    );
    let written = match written {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, out).map_err(|e| LabError::io(out, e))?;
    Ok(FuseReport {
        output: out.to_path_buf(),
        fused_modules: fused,
        data_bytes: written.data_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delta_is_s_times_a_b_transposed_in_the_given_row_order() {
        let lora = kiln_model::lora::LoraWeights {
            in_features: 3,
            out_features: 2,
            rank: 1,
            a: vec![1.0, 2.0, 3.0],
            b: vec![10.0, 100.0],
            scale: 0.5,
        };
        let mut w = vec![0f32; 6];
        add_delta(&mut w, &lora, &|o| 1 - o);
        assert_eq!(w, vec![50.0, 100.0, 150.0, 5.0, 10.0, 15.0]);
    }
}
