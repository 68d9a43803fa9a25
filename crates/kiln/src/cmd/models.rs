//! `kiln models`.

use anyhow::Result;
use kiln_hub::{CachedModel, ModelKind};
use kiln_model::files::ModelFiles;
use serde::Serialize;

use crate::cli::ModelsArgs;

#[derive(Serialize)]
struct Row {
    name: String,
    path: String,
    size_bytes: u64,
    format: String,
    architecture: String,
    quantization: String,
}

/// Lists cached models with what their headers say (no tensor data is read).
pub fn run(args: ModelsArgs) -> Result<()> {
    let rows: Vec<Row> = kiln_hub::list_cached().into_iter().map(describe).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("No models cached. `kiln pull` fetches the starter model.");
        return Ok(());
    }
    println!(
        "{:<40} {:>10} {:<10} {:<8} {:<14} path",
        "name", "size", "format", "arch", "quantization"
    );
    for r in rows {
        println!(
            "{:<40} {:>10} {:<10} {:<8} {:<14} {}",
            r.name,
            human_size(r.size_bytes),
            r.format,
            r.architecture,
            r.quantization,
            r.path
        );
    }
    Ok(())
}

fn describe(m: CachedModel) -> Row {
    let (architecture, quantization) = match ModelFiles::open(&m.path) {
        Ok(files) => {
            let arch = files.config.arch.name().to_string();
            let quant = match (files.gguf(), m.kind) {
                (Some(g), _) => dominant_type(g),
                (None, ModelKind::HfFolder) => match &files.source {
                    kiln_model::files::WeightFiles::Safetensors(st) => match st.mlx_widths() {
                        Some(w) => mlx_label(&w),
                        None => "f32/f16/bf16".into(),
                    },
                    _ => "f32/f16/bf16".into(),
                },
                _ => "-".into(),
            };
            (arch, quant)
        }
        Err(e) => ("?".into(), format!("unreadable: {e}")),
    };
    Row {
        name: m.name,
        path: m.path.display().to_string(),
        size_bytes: m.size_bytes,
        format: m.kind.to_string(),
        architecture,
        quantization,
    }
}

/// The tensor type holding most of the bytes (what people call the file's quantization).
fn dominant_type(g: &kiln_model::gguf::GgufFile) -> String {
    let mut by_type: std::collections::BTreeMap<&'static str, u64> = Default::default();
    for t in &g.header().tensors {
        *by_type.entry(t.ty.name()).or_default() += t.size_bytes;
    }
    by_type
        .into_iter()
        .max_by_key(|(_, b)| *b)
        .map_or("-".into(), |(n, _)| n.to_string())
}

fn human_size(bytes: u64) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    if mib >= 1024.0 {
        format!("{:.1} GiB", mib / 1024.0)
    } else {
        format!("{mib:.1} MiB")
    }
}

/// `mlx affine 4-bit`, or `mlx affine 3-8-bit (mixed)`.
fn mlx_label(widths: &std::collections::BTreeMap<u32, usize>) -> String {
    let bits: Vec<String> = widths.keys().map(u32::to_string).collect();
    match bits.as_slice() {
        [one] => format!("mlx affine {one}-bit"),
        many => format!("mlx affine {}-bit (mixed)", many.join("/")),
    }
}
