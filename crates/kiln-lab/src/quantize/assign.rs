//! Which layout each matrix of the model gets under a config: the uniform layout, the target
//! sizes a config can reach, and the allocation of code widths to a size target from the
//! measured sensitivities.

use kiln_model::arch::LAYER_MATRICES;
use kiln_model::config::ModelConfig;

use super::allocate::{AllocatorOptions, LayerSensitivity, allocate};
use super::config::{OutputFormat, QuantizeConfig};
use super::plan::{Layout, gguf_fallback, gguf_type_for_width};
use super::sensitivity::Module;
use crate::LabError;

/// A module the allocation covers: the attention and MLP projections (spec §7.2.3). The
/// embedding and an untied head keep the uniform layout, as in mlx-bun.
pub(super) fn module_for(
    cfg: &QuantizeConfig,
    config: &ModelConfig,
    name: String,
) -> Option<Module> {
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

/// The layout a module of `cols` columns gets at `bits` in the config's output format.
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
pub(super) fn allocate_to_size(
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
pub(super) fn all_matrices(c: &ModelConfig) -> Vec<(String, usize, usize)> {
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
