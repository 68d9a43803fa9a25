//! The decoder block shared by every supported architecture.

use crate::ModelError;
use crate::backend::{AttentionParams, Backend, BatchLayout, MatrixRole, RopeAngles};
use crate::config::{LayerAttention, ModelConfig};
use crate::lora::AdapterStack;
use crate::weights::{TensorSource, optional, require};

/// Attention projections of one layer.
pub(crate) struct AttentionWeights<B: Backend> {
    pub q: B::Matrix,
    pub k: B::Matrix,
    pub v: B::Matrix,
    pub o: B::Matrix,
    pub q_bias: Option<B::Vector>,
    pub k_bias: Option<B::Vector>,
    pub v_bias: Option<B::Vector>,
    pub q_norm: Option<B::Vector>,
    pub k_norm: Option<B::Vector>,
}

/// Gated MLP of one layer.
pub(crate) struct MlpWeights<B: Backend> {
    pub gate: B::Matrix,
    pub up: B::Matrix,
    pub down: B::Matrix,
}

/// One decoder layer. `post_attn_norm`/`post_mlp_norm` are Gemma's sandwich norms.
pub(crate) struct Layer<B: Backend> {
    pub attn_norm: B::Vector,
    pub attn: AttentionWeights<B>,
    pub post_attn_norm: Option<B::Vector>,
    pub mlp_norm: B::Vector,
    pub mlp: MlpWeights<B>,
    pub post_mlp_norm: Option<B::Vector>,
}

/// What the architecture files ask of the loader.
pub(crate) struct LayerSpec {
    pub biases: bool,
    pub qk_norm: bool,
    pub sandwich_norms: bool,
}

pub(crate) fn vector<B: Backend>(
    b: &B,
    src: &dyn TensorSource,
    name: &str,
    len: usize,
) -> Result<B::Vector, ModelError> {
    b.vector(name, require(src, name, 1, len)?)
}

fn opt_vector<B: Backend>(
    b: &B,
    src: &dyn TensorSource,
    name: &str,
    len: usize,
    needed: bool,
) -> Result<Option<B::Vector>, ModelError> {
    if !needed {
        return Ok(None);
    }
    vector(b, src, name, len).map(Some)
}

/// A layer's projection `name`.
pub(crate) fn matrix<B: Backend>(
    b: &B,
    src: &dyn TensorSource,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<B::Matrix, ModelError> {
    matrix_as(b, src, name, MatrixRole::Projection, rows, cols)
}

/// The matrix `name`, used as `role`.
pub(crate) fn matrix_as<B: Backend>(
    b: &B,
    src: &dyn TensorSource,
    name: &str,
    role: MatrixRole,
    rows: usize,
    cols: usize,
) -> Result<B::Matrix, ModelError> {
    b.matrix(name, role, require(src, name, rows, cols)?)
}

/// Loads layer `i` under the Hugging Face names every supported architecture uses.
pub(crate) fn load_layer<B: Backend>(
    b: &B,
    src: &dyn TensorSource,
    cfg: &ModelConfig,
    i: usize,
    spec: &LayerSpec,
) -> Result<Layer<B>, ModelError> {
    let p = format!("model.layers.{i}");
    let (h, qw, kvw, hd) = (cfg.hidden_size, cfg.q_width(), cfg.kv_width(), cfg.head_dim);
    let bias = |name: &str, len: usize| -> Result<Option<B::Vector>, ModelError> {
        let full = format!("{p}.self_attn.{name}.bias");
        match (spec.biases, optional(src, &full, 1, len)?) {
            (_, Some(t)) => b.vector(&full, t).map(Some),
            (true, None) => Err(ModelError::Tensor {
                path: src.path().into(),
                name: full,
                reason: "missing".into(),
            }),
            (false, None) => Ok(None),
        }
    };
    let attn = AttentionWeights {
        q: matrix(b, src, &format!("{p}.self_attn.q_proj.weight"), qw, h)?,
        k: matrix(b, src, &format!("{p}.self_attn.k_proj.weight"), kvw, h)?,
        v: matrix(b, src, &format!("{p}.self_attn.v_proj.weight"), kvw, h)?,
        o: matrix(b, src, &format!("{p}.self_attn.o_proj.weight"), h, qw)?,
        q_bias: bias("q_proj", qw)?,
        k_bias: bias("k_proj", kvw)?,
        v_bias: bias("v_proj", kvw)?,
        q_norm: opt_vector(
            b,
            src,
            &format!("{p}.self_attn.q_norm.weight"),
            hd,
            spec.qk_norm,
        )?,
        k_norm: opt_vector(
            b,
            src,
            &format!("{p}.self_attn.k_norm.weight"),
            hd,
            spec.qk_norm,
        )?,
    };
    let mlp_norm_name = if spec.sandwich_norms {
        format!("{p}.pre_feedforward_layernorm.weight")
    } else {
        format!("{p}.post_attention_layernorm.weight")
    };
    let inter = cfg.intermediate_size;
    Ok(Layer {
        attn_norm: vector(b, src, &format!("{p}.input_layernorm.weight"), h)?,
        attn,
        post_attn_norm: opt_vector(
            b,
            src,
            &format!("{p}.post_attention_layernorm.weight"),
            h,
            spec.sandwich_norms,
        )?,
        mlp_norm: vector(b, src, &mlp_norm_name, h)?,
        mlp: MlpWeights {
            gate: matrix(b, src, &format!("{p}.mlp.gate_proj.weight"), inter, h)?,
            up: matrix(b, src, &format!("{p}.mlp.up_proj.weight"), inter, h)?,
            down: matrix(b, src, &format!("{p}.mlp.down_proj.weight"), h, inter)?,
        },
        post_mlp_norm: opt_vector(
            b,
            src,
            &format!("{p}.post_feedforward_layernorm.weight"),
            h,
            spec.sandwich_norms,
        )?,
    })
}

/// Per-forward facts every layer needs.
pub(crate) struct ForwardCtx<'a> {
    pub cfg: &'a ModelConfig,
    pub batch: &'a BatchLayout,
    pub rope_global: &'a RopeAngles,
    pub rope_local: &'a RopeAngles,
    /// Runs of activation rows and the adapters they run with (rows without adapters are not
    /// listed; neighbouring spans with the same stack are one run).
    pub adapters: &'a [(std::ops::Range<usize>, &'a AdapterStack)],
}

/// Indices into [`super::LAYER_MATRICES`].
const Q: usize = 0;
const K: usize = 1;
const V: usize = 2;
const O: usize = 3;
const GATE: usize = 4;
const UP: usize = 5;
const DOWN: usize = 6;

/// Adds the LoRA deltas of projection `matrix` of layer `layer` to its output `y` (input `x`):
/// for each run of rows, every adapter of its stack that adapts this projection, in order.
fn lora<B: Backend>(
    b: &B,
    ctx: &ForwardCtx<'_>,
    layer: usize,
    matrix: usize,
    x: &B::Act,
    y: &mut B::Act,
) -> Result<(), ModelError> {
    lora_each(b, ctx, layer, [matrix], x, [y])
}

/// [`lora`] for several projections of the same input (Q/K/V, gate/up), which the backend may
/// run as one step.
fn lora_each<B: Backend, const M: usize>(
    b: &B,
    ctx: &ForwardCtx<'_>,
    layer: usize,
    matrices: [usize; M],
    x: &B::Act,
    mut ys: [&mut B::Act; M],
) -> Result<(), ModelError> {
    for (rows, stack) in ctx.adapters {
        for adapter in stack.adapters() {
            let ws = matrices.map(|m| adapter.module(layer, m));
            if ws.iter().all(Option::is_none) {
                continue;
            }
            b.lora_add_each(ys.each_mut().map(|y| &mut **y), x, rows.clone(), ws)?;
        }
    }
    Ok(())
}

/// Runs layer `index` on the residual stream `x` in place.
pub(crate) fn forward_layer<B: Backend>(
    b: &B,
    layer: &Layer<B>,
    index: usize,
    x: &mut B::Act,
    kv: &mut B::Kv,
    ctx: &ForwardCtx<'_>,
) -> Result<(), ModelError> {
    let cfg = ctx.cfg;
    let (eps, off, hd) = (cfg.rms_norm_eps, cfg.norm_weight_offset, cfg.head_dim);
    let h = b.rms_norm(x, &layer.attn_norm, eps, off);
    let a = &layer.attn;
    let [mut q, mut k, mut v] = b.matmul_each(&h, [&a.q, &a.k, &a.v])?;
    lora_each(b, ctx, index, [Q, K, V], &h, [&mut q, &mut k, &mut v])?;
    if let Some(bias) = &a.q_bias {
        b.add_bias(&mut q, bias);
    }
    if let Some(bias) = &a.k_bias {
        b.add_bias(&mut k, bias);
    }
    if let Some(bias) = &a.v_bias {
        b.add_bias(&mut v, bias);
    }
    if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
        b.head_rms_norm(&mut q, hd, qn, eps, off);
        b.head_rms_norm(&mut k, hd, kn, eps, off);
    }
    let (window, inv_freq) = match cfg.layer_attention[index] {
        LayerAttention::Full => (None, ctx.rope_global),
        // A bidirectional sliding layer sees `window / 2` positions on each side, as
        // transformers and llama.cpp read EmbeddingGemma's `sliding_window`.
        LayerAttention::Sliding { window } if cfg.bidirectional => {
            (Some(window / 2 + 1), ctx.rope_local)
        }
        LayerAttention::Sliding { window } => (Some(window), ctx.rope_local),
    };
    b.rope(&mut q, hd, inv_freq);
    b.rope(&mut k, hd, inv_freq);
    let params = AttentionParams {
        n_heads: cfg.num_heads,
        n_kv_heads: cfg.num_kv_heads,
        head_dim: hd,
        scale: cfg.attention_scale,
        window,
        causal: !cfg.bidirectional,
    };
    let attn = b.attention(kv, index, &q, &k, &v, ctx.batch, &params)?;
    let mut o = b.matmul(&attn, &a.o)?;
    lora(b, ctx, index, O, &attn, &mut o)?;
    if let Some(n) = &layer.post_attn_norm {
        o = b.rms_norm(&o, n, eps, off);
    }
    b.add_assign(x, &o);

    let h = b.rms_norm(x, &layer.mlp_norm, eps, off);
    let [mut gate, mut up] = b.matmul_each(&h, [&layer.mlp.gate, &layer.mlp.up])?;
    lora_each(b, ctx, index, [GATE, UP], &h, [&mut gate, &mut up])?;
    let act = b.glu(&gate, &up, cfg.activation);
    let mut down = b.matmul(&act, &layer.mlp.down)?;
    lora(b, ctx, index, DOWN, &act, &mut down)?;
    if let Some(n) = &layer.post_mlp_norm {
        down = b.rms_norm(&down, n, eps, off);
    }
    b.add_assign(x, &down);
    Ok(())
}
