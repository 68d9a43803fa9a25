//! One quantize run, start to finish: open the source, measure and allocate when mixed, write
//! into a temporary name beside the output, rename at the end. Shared by `kiln quantize` and the
//! `quantize` job; both report through [`Reporter`].

use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_kernels::GgmlType;
use kiln_model::arch::LAYER_MATRICES;
use kiln_model::config::ModelConfig;
use kiln_model::files::{ModelFiles, WeightFiles};
use kiln_model::gguf::MetaValue;
use kiln_model::mlx::config::{AffineSpec, MlxQuantization};
use kiln_model::tokenizer::{KilnTokenizer, tokenizer_from_gguf};
use serde::Serialize;
use serde_json::json;

use super::allocate::{AllocatorOptions, LayerSensitivity, allocate};
use super::config::{OutputFormat, QuantizeConfig};
use super::gguf_out::{self, WrittenTensors};
use super::mlx_out::{self, SourceTensor};
use super::plan::{Layout, gguf_fallback, gguf_type_for_width, module_of};
use super::sensitivity::{Module, Probe, measure};
use super::{calibration, hf_export};
use crate::LabError;

/// Where a run reports: stage events (the job's, or the CLI's progress bar) and warnings.
/// `stage` returning an error stops the run there (cancellation).
pub trait Reporter {
    /// A stage with overall progress in 0..1.
    fn stage(&mut self, name: &str, progress: f64, message: &str) -> Result<(), LabError>;
    /// Something the user should know that does not stop the run.
    fn warn(&mut self, message: &str);
    /// A measurement as it is made (one module's sensitivity); the CLI ignores them.
    fn metric(&mut self, _metric: serde_json::Value) -> Result<(), LabError> {
        Ok(())
    }
}

/// What a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct QuantizeReport {
    /// The file or folder written.
    pub output: PathBuf,
    /// `gguf` or `mlx`.
    pub format: &'static str,
    /// Stored bits per weight over the quantized tensors (scales included).
    pub achieved_bpw: f64,
    /// Bytes of tensor data written.
    pub tensor_bytes: u64,
    /// Bytes of the output on disk.
    pub file_bytes: u64,
    /// Each tensor's layout, in file order.
    pub tensors: Vec<(String, String)>,
    /// Mixed runs: the width each measured module got.
    pub allocation: Option<Vec<(String, u32)>>,
    /// Mixed runs: the KL each module measured at each width.
    pub sensitivity: Option<Vec<SensitivityRow>>,
    /// Seconds measuring sensitivity.
    pub sensitivity_secs: f64,
    /// Seconds in all.
    pub total_secs: f64,
}

/// One module's measured sensitivity, as reported.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SensitivityRow {
    /// Module path.
    pub module: String,
    /// Parameters.
    pub params: u64,
    /// KL(reference ‖ module at that width), by width.
    pub kl: std::collections::BTreeMap<u32, f64>,
}

/// Runs `cfg` to completion. On any error (cancellation included) the temporary output is
/// removed and nothing exists under the final name.
pub fn quantize(cfg: &QuantizeConfig, rep: &mut dyn Reporter) -> Result<QuantizeReport, LabError> {
    cfg.validate()?;
    let started = Instant::now();
    rep.stage(
        "starting",
        0.01,
        &format!("reading {}", cfg.source.display()),
    )?;
    let files = ModelFiles::open(&cfg.source)?;
    if let Some(ty) = quantized_source_type(&files) {
        rep.warn(&format!(
            "the source holds {} weights: they are dequantized first, and the new quantization error adds to theirs",
            ty
        ));
    }
    check_format(cfg, &files)?;
    let tmp = temp_path(&cfg.out);
    let result = run_into(cfg, &files, &tmp, rep, started);
    match result {
        Ok(mut report) => {
            if cfg.out.exists() {
                remove(&tmp);
                return Err(LabError::config(
                    "out_dir",
                    format!("{} appeared while quantizing", cfg.out.display()),
                ));
            }
            std::fs::rename(&tmp, &cfg.out).map_err(|e| {
                remove(&tmp);
                LabError::io(&cfg.out, e)
            })?;
            report.output = cfg.out.clone();
            report.file_bytes = disk_bytes(&cfg.out);
            report.total_secs = started.elapsed().as_secs_f64();
            Ok(report)
        }
        Err(e) => {
            remove(&tmp);
            Err(e)
        }
    }
}

/// Refuses a source the chosen format cannot be written from, before anything is measured.
fn check_format(cfg: &QuantizeConfig, files: &ModelFiles) -> Result<(), LabError> {
    match (cfg.format, &files.source) {
        (OutputFormat::Gguf, WeightFiles::Safetensors(_)) => Err(LabError::config(
            "format",
            "GGUF output needs a GGUF source for now (the tokenizer is carried from its metadata); use format mlx for a Hugging Face folder",
        )),
        (OutputFormat::Mlx, WeightFiles::Gguf(_)) => {
            hf_export::config_json(&files.config).map(|_| ())
        }
        _ => Ok(()),
    }
}

fn run_into(
    cfg: &QuantizeConfig,
    files: &ModelFiles,
    tmp: &Path,
    rep: &mut dyn Reporter,
    started: Instant,
) -> Result<QuantizeReport, LabError> {
    let mut report = QuantizeReport {
        output: tmp.into(),
        format: cfg.format.name(),
        achieved_bpw: 0.0,
        tensor_bytes: 0,
        file_bytes: 0,
        tensors: vec![],
        allocation: None,
        sensitivity: None,
        sensitivity_secs: 0.0,
        total_secs: 0.0,
    };
    check_target_reachable(cfg, &files.config)?;
    let allocation = match cfg.target_bpw {
        Some(target) => {
            let sens = match &cfg.sensitivity_from {
                Some(path) => load_sensitivity(cfg, path, &files.config)?,
                None => sensitivities(cfg, files, rep)?,
            };
            report.sensitivity_secs = started.elapsed().as_secs_f64();
            rep.stage(
                "allocating",
                0.92,
                &format!("{} modules, target {target} bpw", sens.len()),
            )?;
            let bits = allocate_to_size(cfg, &files.config, &sens, target)?;
            report.sensitivity = Some(
                sens.into_iter()
                    .map(|s| SensitivityRow {
                        module: s.name,
                        params: s.param_count,
                        kl: s.kl,
                    })
                    .collect(),
            );
            Some(bits)
        }
        None => None,
    };
    if let Some(a) = &allocation {
        let high = a.iter().filter(|(_, b)| *b > cfg.candidates()[0]).count();
        rep.stage(
            "allocating",
            0.95,
            &format!("{high} of {} modules above the lowest width", a.len()),
        )?;
    }
    let written = match cfg.format {
        OutputFormat::Gguf => write_gguf(cfg, files, tmp, allocation.as_deref(), rep)?,
        OutputFormat::Mlx => write_mlx(
            cfg,
            files,
            tmp,
            allocation.as_deref(),
            report.sensitivity.as_deref(),
            rep,
        )?,
    };
    report.achieved_bpw = written.achieved_bpw();
    report.tensor_bytes = written.data_bytes;
    report.tensors = written.tensors;
    report.allocation = allocation;
    Ok(report)
}

/// Reads the `sensitivity` rows of an earlier report (or `optiq_metadata.json`); each module
/// must be a matrix of this model.
fn load_sensitivity(
    cfg: &QuantizeConfig,
    path: &Path,
    config: &ModelConfig,
) -> Result<Vec<LayerSensitivity>, LabError> {
    let field = "sensitivity_from";
    let text = std::fs::read_to_string(path).map_err(|e| LabError::io(path, e))?;
    let rows = parse_sensitivity(&text)
        .map_err(|e| LabError::config(field, format!("{}: {e}", path.display())))?;
    let candidates = cfg.candidates();
    let mut out = Vec::new();
    for r in rows {
        let name = format!("{}.weight", r.module);
        let Some(module) = module_for(cfg, config, name) else {
            continue; // the embedding, a head, or a row the format cannot group: uniform
        };
        if (module.rows * module.cols) as u64 != r.params {
            return Err(LabError::config(
                field,
                format!("{} is not a matrix of this model", r.module),
            ));
        }
        if let Some(b) = candidates.iter().find(|b| !r.kl.contains_key(b)) {
            return Err(LabError::config(
                field,
                format!("{} has no KL at {b} bits", r.module),
            ));
        }
        out.push(LayerSensitivity {
            name: r.module,
            param_count: r.params,
            kl: r.kl,
        });
    }
    if out.is_empty() {
        return Err(LabError::config(
            field,
            "no row names a projection of this model",
        ));
    }
    Ok(out)
}

/// The `sensitivity` rows of a report's JSON text (the fuzz target's entry point).
pub fn parse_sensitivity(text: &str) -> Result<Vec<SensitivityRow>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let rows: Vec<SensitivityRow> =
        serde_json::from_value(v.get("sensitivity").cloned().unwrap_or_default())
            .map_err(|e| format!("`sensitivity` rows: {e}"))?;
    if rows.is_empty() {
        return Err("no sensitivity rows".into());
    }
    Ok(rows)
}

/// Measures every eligible matrix at every candidate width.
fn sensitivities(
    cfg: &QuantizeConfig,
    files: &ModelFiles,
    rep: &mut dyn Reporter,
) -> Result<Vec<LayerSensitivity>, LabError> {
    let tokenizer = source_tokenizer(files)?;
    let text = match &cfg.calibration {
        Some(p) => calibration::read_text(p)?,
        None => calibration::BUILTIN.to_string(),
    };
    let chunks = calibration::chunks(&tokenizer, &text, cfg.n_calibration, cfg.seq_len)?;
    rep.stage(
        "sensitivity",
        0.02,
        &format!(
            "reference forward over {} chunks of {}",
            chunks.len(),
            cfg.seq_len
        ),
    )?;
    check_probe_memory(&files.config, chunks.len() * cfg.seq_len)?;
    let mut probe = Probe::new(files.tensors(), &files.config, &chunks)?;
    let modules: Vec<Module> = all_matrices(&files.config)
        .into_iter()
        .filter_map(|(module, _, _)| module_for(cfg, &files.config, format!("{module}.weight")))
        .collect();
    rep.stage(
        "sensitivity",
        0.05,
        &format!("{} modules × {:?} bits", modules.len(), cfg.candidates()),
    )?;
    measure(
        &mut probe,
        files.tensors(),
        &modules,
        &mut |done, total, measured| {
            rep.metric(serde_json::json!({
                "type": "metric",
                "kind": "sensitivity",
                "module": measured.name,
                "params": measured.param_count,
                "index": done,
                "total": total,
                "kl": measured.kl,
            }))?;
            let p = 0.05 + 0.85 * done as f64 / total as f64;
            rep.stage(
                "sensitivity",
                p,
                &format!("{done}/{total} {}", measured.name),
            )
        },
    )
}

/// Refuses a calibration size whose measurement would not fit in memory: the f32 model, the
/// reference log-probabilities and one test forward's logits (`tokens × vocab` each), and the
/// recorded hidden states, against the machine's available memory.
fn check_probe_memory(c: &ModelConfig, tokens: usize) -> Result<(), LabError> {
    let params = all_matrices(c).iter().map(|(_, r, k)| r * k).sum::<usize>() as f64;
    let logits = (tokens * c.vocab_size) as f64 * 4.0 * 2.0;
    let hidden = ((c.num_layers + 1) * tokens * c.hidden_size) as f64 * 4.0;
    let need = params * 4.0 + logits + hidden;
    let Some(available) = available_bytes() else {
        return Ok(());
    };
    if need > available as f64 {
        return Err(LabError::config(
            "n_calibration",
            format!(
                "measuring {tokens} calibration tokens needs about {:.1} GB, {:.1} GB is available; lower n_calibration or seq_len",
                need / 1e9,
                available as f64 / 1e9
            ),
        ));
    }
    Ok(())
}

/// `MemAvailable` from /proc/meminfo, when the platform has it.
fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A module the allocation covers: the attention and MLP projections (spec §7.2.3). The
/// embedding and an untied head keep the uniform layout, as in mlx-bun.
fn module_for(cfg: &QuantizeConfig, config: &ModelConfig, name: String) -> Option<Module> {
    if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
        return None;
    }
    let (rows, cols) = matrix_shape(config, &name)?;
    let eligible = match cfg.format {
        OutputFormat::Gguf => cols.is_multiple_of(32),
        OutputFormat::Mlx => cols.is_multiple_of(cfg.group_size),
    };
    if !eligible {
        return None;
    }
    let layouts = cfg
        .candidates()
        .into_iter()
        .map(|b| (b, layout_for(cfg, b, cols)))
        .collect();
    Some(Module {
        name,
        rows,
        cols,
        layouts,
    })
}

fn layout_for(cfg: &QuantizeConfig, bits: u32, cols: usize) -> Layout {
    match cfg.format {
        OutputFormat::Gguf => Layout::Gguf(gguf_type_for_width(bits, cols)),
        OutputFormat::Mlx => Layout::Affine {
            bits,
            group: cfg.group_size,
        },
    }
}

/// `[rows, cols]` of a model matrix by its Hugging Face name.
fn matrix_shape(c: &ModelConfig, name: &str) -> Option<(usize, usize)> {
    let (h, q, kv, i) = (
        c.hidden_size,
        c.q_width(),
        c.kv_width(),
        c.intermediate_size,
    );
    if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
        return Some((c.vocab_size, h));
    }
    let module = name.strip_suffix(".weight")?.rsplit('.').next()?;
    Some(match module {
        "q_proj" => (q, h),
        "k_proj" | "v_proj" => (kv, h),
        "o_proj" => (h, q),
        "gate_proj" | "up_proj" => (i, h),
        "down_proj" => (h, i),
        _ => return None,
    })
}

/// Stored bits per weight over every quantized matrix when the modules in `bits` take their
/// width and the rest the uniform layout.
fn stored_bpw(
    cfg: &QuantizeConfig,
    matrices: &[(String, usize, usize)],
    bits: &[(String, u32)],
) -> f64 {
    let (mut b, mut p) = (0.0, 0.0);
    for (module, rows, cols) in matrices {
        let layout = match bits.iter().find(|(m, _)| m == module) {
            Some((_, w)) => Some(layout_for(cfg, *w, *cols)),
            None => uniform_layout(cfg, *cols),
        };
        if let Some(layout) = layout {
            let n = (rows * cols) as f64;
            b += n * layout.bits_per_weight();
            p += n;
        }
    }
    b / p.max(1.0)
}

/// Refuses a mixed target below the smallest size the candidates reach: every measurable
/// projection at the lowest width, the rest uniform. Known from the config alone, so it is
/// checked before anything is measured.
pub fn check_target_reachable(cfg: &QuantizeConfig, config: &ModelConfig) -> Result<(), LabError> {
    let Some(target) = cfg.target_bpw else {
        return Ok(());
    };
    let lowest = cfg.candidates().first().copied().unwrap_or(4);
    let matrices = all_matrices(config);
    let bits: Vec<(String, u32)> = (matrices.iter())
        .filter(|(m, _, _)| module_for(cfg, config, format!("{m}.weight")).is_some())
        .map(|(m, _, _)| (m.clone(), lowest))
        .collect();
    let smallest = stored_bpw(cfg, &matrices, &bits);
    if smallest > target {
        return Err(LabError::config(
            "target_bpw",
            format!(
                "{target} is below the smallest this model reaches with these candidates ({smallest:.3}: every projection at the lowest width, the rest uniform)"
            ),
        ));
    }
    Ok(())
}

/// The allocator's target is nominal code bits over the measured modules; the user's is stored
/// bits per weight (the file size) over every quantized matrix, the embedding and head at the
/// uniform layout included. Scales and the GGUF type ladder put stored bits above the nominal
/// width. The allocator's result only grows with its target, so a bisection finds the largest
/// nominal target whose stored size stays at or under the user's.
fn allocate_to_size(
    cfg: &QuantizeConfig,
    config: &ModelConfig,
    sens: &[LayerSensitivity],
    target: f64,
) -> Result<Vec<(String, u32)>, LabError> {
    let candidates = cfg.candidates();
    let matrices = all_matrices(config);
    let stored = |bits: &[(String, u32)]| stored_bpw(cfg, &matrices, bits);
    // optiq boosts the first and last blocks ×100 as a prior that they are the sensitive
    // ones. On a model of few blocks those two are a large share of it and the boost starves
    // the rest (the tiny checkpoints allocate worse than uniform with it), so it is on only
    // when they are at most a quarter of the blocks, unless the config says otherwise.
    let defaults = AllocatorOptions::default();
    let protect = cfg
        .protect_boundary_blocks
        .unwrap_or(config.num_layers >= 8 * defaults.n_protect);
    let run = |t: f64| {
        let opts = AllocatorOptions {
            target_bpw: t,
            candidate_bits: Some(candidates.clone()),
            protect_first_last: protect,
            ..AllocatorOptions::default()
        };
        allocate(sens, &opts).map(|a| best_at_or_below(sens, &a.bits))
    };
    let (mut lo, mut hi) = (
        candidates[0] as f64,
        *candidates.last().unwrap_or(&8) as f64,
    );
    let mut best = run(lo)?;
    let smallest = stored(&best);
    if smallest > target {
        return Err(LabError::config(
            "target_bpw",
            format!(
                "{target} is below the smallest this model reaches with these candidates ({smallest:.3}: every projection at the lowest width, the rest uniform)"
            ),
        ));
    }
    for _ in 0..40 {
        let mid = (lo + hi) / 2.0;
        let bits = run(mid)?;
        if stored(&bits) <= target {
            best = bits;
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(best)
}

/// Every weight matrix of the model by module path, with its shape.
fn all_matrices(c: &ModelConfig) -> Vec<(String, usize, usize)> {
    let mut names = vec!["model.embed_tokens".to_string()];
    for i in 0..c.num_layers {
        for m in LAYER_MATRICES {
            names.push(format!("model.layers.{i}.{m}"));
        }
    }
    if !c.tie_word_embeddings {
        names.push("lm_head".into());
    }
    names
        .into_iter()
        .filter_map(|m| {
            let (rows, cols) = matrix_shape(c, &format!("{m}.weight"))?;
            Some((m, rows, cols))
        })
        .collect()
}

/// The layout a matrix the allocation leaves out is written in (`None`: not quantized).
fn uniform_layout(cfg: &QuantizeConfig, cols: usize) -> Option<Layout> {
    match cfg.format {
        OutputFormat::Gguf => {
            let ty = gguf_fallback(cfg.uniform_gguf_type(), cols);
            (!ty.is_float()).then_some(Layout::Gguf(ty))
        }
        OutputFormat::Mlx => cols
            .is_multiple_of(cfg.group_size)
            .then_some(Layout::Affine {
                bits: cfg.bits,
                group: cfg.group_size,
            }),
    }
}

/// For each module, the measured-best width at or below the allocated one: a lower width is
/// never larger, so where it measured a lower KL (a layout that happens to suit the weights, or
/// measurement noise) it is the better choice at no cost. optiq's allocator reads a higher KL
/// at a higher width as a benefit (its uniform-reference mode), which this undoes.
fn best_at_or_below(sens: &[LayerSensitivity], bits: &[(String, u32)]) -> Vec<(String, u32)> {
    bits.iter()
        .map(|(module, allocated)| {
            let kl = sens.iter().find(|s| &s.name == module).map(|s| &s.kl);
            let best = kl
                .and_then(|kl| {
                    kl.iter()
                        .filter(|(b, _)| *b <= allocated)
                        .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(b.0)))
                        .map(|(b, _)| *b)
                })
                .unwrap_or(*allocated);
            (module.clone(), best)
        })
        .collect()
}

fn write_gguf(
    cfg: &QuantizeConfig,
    files: &ModelFiles,
    tmp: &Path,
    allocation: Option<&[(String, u32)]>,
    rep: &mut dyn Reporter,
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

fn write_mlx(
    cfg: &QuantizeConfig,
    files: &ModelFiles,
    tmp: &Path,
    allocation: Option<&[(String, u32)]>,
    sensitivity: Option<&[SensitivityRow]>,
    rep: &mut dyn Reporter,
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

fn source_tokenizer(files: &ModelFiles) -> Result<KilnTokenizer, LabError> {
    Ok(match files.gguf() {
        Some(g) => tokenizer_from_gguf(g.header())?,
        None => KilnTokenizer::from_hf_folder(&files.path)?,
    })
}

/// The quantized type of a source's matrices, if they are quantized.
fn quantized_source_type(files: &ModelFiles) -> Option<String> {
    if let WeightFiles::Safetensors(st) = &files.source {
        let widths = st.mlx_widths()?;
        let bits: Vec<String> = widths.keys().map(|b| format!("{b}-bit")).collect();
        return Some(format!("MLX affine {}", bits.join("/")));
    }
    let gguf = files.gguf()?;
    gguf.header()
        .tensors
        .iter()
        .find(|t| t.dims.len() == 2 && !t.ty.is_float())
        .map(|t| t.ty.name().to_string())
}

/// `.<name>.kiln-partial-<pid>` beside `out`: never mistaken for a finished output.
fn temp_path(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    out.with_file_name(format!(".{name}.kiln-partial-{}", std::process::id()))
}

fn remove(path: &Path) {
    let _ = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
}

/// Bytes of a file, or of every file in a folder.
fn disk_bytes(path: &Path) -> u64 {
    if path.is_file() {
        return path.metadata().map(|m| m.len()).unwrap_or(0);
    }
    std::fs::read_dir(path)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
