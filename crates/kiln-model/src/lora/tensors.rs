//! The two weights files: which one a folder has, reading its A/B pairs into kiln's orientation
//! (every check made before any data is converted), and writing tensors and JSON atomically.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::{LoraWeights, MAX_ADAPTER_BYTES, MLX_WEIGHTS_FILE, PEFT_WEIGHTS_FILE};
use crate::ModelError;

/// Widest in/out accepted, as for every other model size (`config::check_size`).
const MAX_WIDTH: usize = 1 << 24;
/// Highest rank accepted; real adapters use 4 to 256.
const MAX_RANK: usize = 1 << 16;
/// safetensors' own header cap (100 MB) on top of the data cap.
const MAX_FILE_BYTES: u64 = MAX_ADAPTER_BYTES + 100_000_000;

/// Which weights file a folder holds, and so the orientation of its matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// `adapter_model.safetensors`: A `[r, in]`, B `[out, r]` (torch's `Linear.weight` layout).
    Peft,
    /// `adapters.safetensors`: A `[in, r]`, B `[r, out]`, kiln's own orientation.
    Mlx,
}

impl Layout {
    /// mlx's file wins when both are there: it is the one mlx-lm and optiq serve (spec §3.7),
    /// and the one kiln folds any per-module scale into (see `mlx::tensors`).
    pub(super) fn detect(dir: &Path) -> Result<Self, ModelError> {
        if dir.join(MLX_WEIGHTS_FILE).is_file() {
            return Ok(Self::Mlx);
        }
        if dir.join(PEFT_WEIGHTS_FILE).is_file() {
            return Ok(Self::Peft);
        }
        let reason = if dir.join("adapter_model.bin").is_file() {
            "adapter_model.bin (a pickle) is not read; convert it to adapter_model.safetensors"
        } else {
            "neither adapters.safetensors nor adapter_model.safetensors"
        };
        Err(ModelError::Safetensors {
            path: dir.into(),
            reason: reason.into(),
        })
    }

    /// The weights file's name.
    pub(super) fn file_name(self) -> &'static str {
        match self {
            Self::Peft => PEFT_WEIGHTS_FILE,
            Self::Mlx => MLX_WEIGHTS_FILE,
        }
    }

    /// (in, rank, out) from the file's A and B shapes, or what is wrong with them.
    fn dims(self, a: &[usize], b: &[usize]) -> Result<(usize, usize, usize), String> {
        let (&[a0, a1], &[b0, b1]) = (a, b) else {
            return Err(format!("shapes {a:?} and {b:?} are not both 2-D"));
        };
        let (in_f, rank, b_rank, out) = match self {
            Self::Peft => (a1, a0, b1, b0),
            Self::Mlx => (a0, a1, b0, b1),
        };
        if rank != b_rank {
            let want = match self {
                Self::Peft => "A [r, in] and B [out, r]",
                Self::Mlx => "A [in, r] and B [r, out]",
            };
            return Err(format!(
                "shape {b:?} does not match A's {a:?} (this file holds {want})"
            ));
        }
        check_dims(in_f, rank, out)?;
        Ok((in_f, rank, out))
    }
}

/// Ranks and widths a module may have.
pub(super) fn check_dims(in_f: usize, rank: usize, out: usize) -> Result<(), String> {
    if rank == 0 || rank > MAX_RANK {
        return Err(format!("rank {rank} is out of range (1 to {MAX_RANK})"));
    }
    for (what, v) in [("in", in_f), ("out", out)] {
        if v == 0 || v > MAX_WIDTH {
            return Err(format!("{what} = {v} is out of range (1 to {MAX_WIDTH})"));
        }
    }
    Ok(())
}

/// A or B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    A,
    B,
}

/// A tensor name → (module path, A or B). Both files' spellings are taken in both:
/// `lora_a`/`lora_A`, with or without `.weight`, with or without PEFT's `base_model.model.`.
fn parse_key(key: &str) -> Option<(&str, Part)> {
    let key = key.strip_prefix("base_model.model.").unwrap_or(key);
    let key = key.strip_suffix(".weight").unwrap_or(key);
    let (module, last) = key.rsplit_once('.')?;
    let part = match last {
        "lora_a" | "lora_A" => Part::A,
        "lora_b" | "lora_B" => Part::B,
        _ => return None,
    };
    // A second `base_model.` prefix would be stripped by the next load of what kiln writes
    // (the module's name would change); no model has such a module.
    (!module.is_empty() && !module.starts_with("base_model.")).then_some((module, part))
}

/// One module's two tensors as found in the file.
#[derive(Default)]
struct Pair<'d> {
    a: Option<(String, TensorView<'d>)>,
    b: Option<(String, TensorView<'d>)>,
}

/// Reads every A/B pair of a weights file, converted to f32 and to kiln's orientation. Scales
/// are left at 1.0: they come from the configs.
pub(super) fn read(
    path: &Path,
    layout: Layout,
) -> Result<BTreeMap<String, LoraWeights>, ModelError> {
    let bytes = read_bounded(path)?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| ModelError::Safetensors {
        path: path.into(),
        reason: e.to_string(),
    })?;
    let pairs = pair_up(path, &st)?;
    let mut planned = Vec::with_capacity(pairs.len());
    let mut total = 0u64;
    for (module, pair) in pairs {
        let (a, b, dims) = complete(path, layout, &module, pair)?;
        let (in_f, rank, out) = dims;
        // Bounded by check_dims: at most 2^41 values per module, far from u64's limit.
        total += (in_f as u64 * rank as u64 + rank as u64 * out as u64) * 4;
        if total > MAX_ADAPTER_BYTES {
            return Err(ModelError::Safetensors {
                path: path.into(),
                reason: format!("more than {MAX_ADAPTER_BYTES} bytes of LoRA weights in f32"),
            });
        }
        planned.push((module, a, b, dims));
    }
    let mut modules = BTreeMap::new();
    for (module, a, b, dims) in planned {
        modules.insert(module, convert(path, layout, &a, &b, dims)?);
    }
    if modules.is_empty() {
        return Err(ModelError::Safetensors {
            path: path.into(),
            reason: "no LoRA tensors".into(),
        });
    }
    Ok(modules)
}

/// The whole file, refused before reading when it is larger than any adapter kiln takes.
fn read_bounded(path: &Path) -> Result<Vec<u8>, ModelError> {
    let len = std::fs::metadata(path)
        .map_err(|e| ModelError::io(path, e))?
        .len();
    if len > MAX_FILE_BYTES {
        return Err(ModelError::Safetensors {
            path: path.into(),
            reason: format!("{len} bytes is larger than any adapter kiln loads"),
        });
    }
    std::fs::read(path).map_err(|e| ModelError::io(path, e))
}

/// Groups the file's tensors by module; any tensor that is not a LoRA A or B (DoRA magnitudes,
/// biases, `modules_to_save` copies) refuses the file, since serving without it would be wrong.
fn pair_up<'d>(
    path: &Path,
    st: &SafeTensors<'d>,
) -> Result<BTreeMap<String, Pair<'d>>, ModelError> {
    let mut pairs: BTreeMap<String, Pair<'d>> = BTreeMap::new();
    for (name, view) in st.iter() {
        let bad = |reason: &str| ModelError::Tensor {
            path: path.into(),
            name: name.into(),
            reason: reason.into(),
        };
        let (module, part) = parse_key(name)
            .ok_or_else(|| bad("not a LoRA A or B tensor (kiln serves plain LoRA on linears)"))?;
        let pair = pairs.entry(module.to_string()).or_default();
        let slot = match part {
            Part::A => &mut pair.a,
            Part::B => &mut pair.b,
        };
        if let Some((other, _)) = slot {
            return Err(bad(&format!("same module and matrix as tensor {other}")));
        }
        *slot = Some((name.to_string(), view));
    }
    Ok(pairs)
}

/// A module's A and B, both present, 2-D, of agreeing shapes: (A, B, (in, rank, out)).
type Checked<'d> = (
    (String, TensorView<'d>),
    (String, TensorView<'d>),
    (usize, usize, usize),
);

/// Checks that a module has both tensors, each 2-D, and that their shapes agree.
fn complete<'d>(
    path: &Path,
    layout: Layout,
    module: &str,
    pair: Pair<'d>,
) -> Result<Checked<'d>, ModelError> {
    let bad = |name: &str, reason: String| ModelError::Tensor {
        path: path.into(),
        name: name.into(),
        reason,
    };
    let (a, b) = match (pair.a, pair.b) {
        (Some(a), Some(b)) => (a, b),
        (Some((name, _)), None) => return Err(bad(&name, format!("{module} has A but no B"))),
        (None, Some((name, _))) => return Err(bad(&name, format!("{module} has B but no A"))),
        (None, None) => return Err(bad(module, "no tensors".into())),
    };
    for (name, view) in [&a, &b] {
        if view.shape().len() != 2 {
            return Err(bad(name, format!("shape {:?} is not 2-D", view.shape())));
        }
    }
    let dims = layout
        .dims(a.1.shape(), b.1.shape())
        .map_err(|reason| bad(&b.0, reason))?;
    Ok((a, b, dims))
}

/// Converts a checked pair to f32 in kiln's orientation, refusing NaN and infinities.
fn convert(
    path: &Path,
    layout: Layout,
    a: &(String, TensorView<'_>),
    b: &(String, TensorView<'_>),
    (in_f, rank, out): (usize, usize, usize),
) -> Result<LoraWeights, ModelError> {
    let values = |(name, view): &(String, TensorView<'_>)| {
        to_f32(view).map_err(|reason| ModelError::Tensor {
            path: path.into(),
            name: name.clone(),
            reason,
        })
    };
    let (mut a_v, mut b_v) = (values(a)?, values(b)?);
    if layout == Layout::Peft {
        a_v = transpose(&a_v, rank, in_f);
        b_v = transpose(&b_v, out, rank);
    }
    Ok(LoraWeights {
        in_features: in_f,
        out_features: out,
        rank,
        a: a_v,
        b: b_v,
        scale: 1.0,
    })
}

/// A tensor's little-endian values as f32, every one finite.
fn to_f32(view: &TensorView<'_>) -> Result<Vec<f32>, String> {
    let data = view.data();
    let values: Vec<f32> = match view.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F64 => data
            .chunks_exact(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w.copy_from_slice(c);
                f64::from_le_bytes(w) as f32
            })
            .collect(),
        other => return Err(format!("dtype {other:?} is not F32, F16, BF16 or F64")),
    };
    match values.iter().position(|v| !v.is_finite()) {
        // An f64 beyond f32's range turns infinite here and is refused with the rest.
        Some(i) => Err(format!("value {i} is {} (not finite)", values[i])),
        None => Ok(values),
    }
}

/// `[rows, cols]` row-major → `[cols, rows]` row-major.
pub(super) fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for (r, row) in m.chunks_exact(cols).take(rows).enumerate() {
        for (c, v) in row.iter().enumerate() {
            t[c * rows + r] = *v;
        }
    }
    t
}

/// One f32 tensor to write.
pub(super) struct OutTensor {
    /// Its key.
    pub(super) name: String,
    /// Its shape.
    pub(super) shape: Vec<usize>,
    /// Its values, row-major.
    pub(super) values: Vec<f32>,
}

/// Writes f32 tensors as a safetensors file with `__metadata__.format = format` (PEFT writes
/// `pt`, mlx `mlx`; transformers' loader looks at it).
pub(super) fn write(path: &Path, tensors: Vec<OutTensor>, format: &str) -> Result<(), ModelError> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|t| {
            let data = t.values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (t.name, t.shape, data)
        })
        .collect();
    let st_err = |e: safetensors::SafeTensorError| ModelError::Safetensors {
        path: path.into(),
        reason: e.to_string(),
    };
    let mut views = Vec::with_capacity(bytes.len());
    for (name, shape, data) in &bytes {
        views.push((
            name.as_str(),
            TensorView::new(Dtype::F32, shape.clone(), data).map_err(st_err)?,
        ));
    }
    let metadata = HashMap::from([("format".to_string(), format.to_string())]);
    atomic(path, |tmp| {
        safetensors::serialize_to_file(views, Some(metadata), tmp).map_err(st_err)
    })
}

/// Writes pretty-printed JSON atomically.
pub(super) fn write_json(path: &Path, json: &serde_json::Value) -> Result<(), ModelError> {
    let mut text = serde_json::to_vec_pretty(json).map_err(|e| ModelError::Config {
        path: path.into(),
        field: "(file)".into(),
        reason: e.to_string(),
    })?;
    text.push(b'\n');
    atomic(path, |tmp| {
        std::fs::write(tmp, &text).map_err(|e| ModelError::io(tmp, e))
    })
}

/// Runs `write` on a temporary name beside `path`, syncs it, and renames it over `path`; the
/// temporary file is removed when anything fails.
fn atomic(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let tmp = temp_name(path);
    let done = write(&tmp)
        .and_then(|()| sync_file(&tmp))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| ModelError::io(path, e)));
    if done.is_err() {
        // Best effort: the error that matters is the one being returned.
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// `.<name>.tmp-<pid>-<n>`: unique within the process and between processes.
fn temp_name(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

/// The data must be on disk before the rename makes it visible (checkpoints are crash-safe).
fn sync_file(path: &Path) -> Result<(), ModelError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| ModelError::io(path, e))
}

/// Makes the renames durable where the platform allows syncing a folder (best effort: not every
/// filesystem or OS does).
pub(super) fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
