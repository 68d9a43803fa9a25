//! Encoders for embeddings and reranking: BERT (bge, e5, all-MiniLM), RoBERTa/XLM-RoBERTa
//! (bge-reranker) and nomic-bert (nomic-embed-text). Word and token-type embeddings (plus learned
//! positions, except nomic-bert's rotary ones) under a LayerNorm, then per layer bidirectional
//! attention and an MLP (GELU, or nomic-bert's SwiGLU), each added back and LayerNormed
//! (post-norm).

mod load;
mod rank;

use crate::ModelError;
use crate::backend::{AttentionParams, Backend, BatchLayout, RopeAngles};
use crate::config::{Activation, Architecture, ModelConfig};
use crate::embedding::Pooling;
use crate::weights::TensorSource;
use load::Loader;
use rank::RankHead;

/// A LayerNorm's weight and bias.
struct Norm<B: Backend> {
    w: B::Vector,
    b: B::Vector,
}

/// A projection, with its bias when the architecture has them.
struct Linear<B: Backend> {
    w: B::Matrix,
    b: Option<B::Vector>,
}

/// An encoder layer's MLP.
enum Mlp<B: Backend> {
    /// `down(gelu(up(x)))` (BERT, RoBERTa).
    Gelu { up: Linear<B>, down: Linear<B> },
    /// `down(silu(gate(x)) * up(x))` (nomic-bert).
    SwiGlu {
        gate: Linear<B>,
        up: Linear<B>,
        down: Linear<B>,
    },
}

/// How a token's position enters the encoder.
enum Positions<B: Backend> {
    /// A learned table added to the embeddings; position `i` is row `offset + i` (RoBERTa's
    /// tables start after the padding index).
    Learned { table: B::Matrix, offset: usize },
    /// Rotary positions on queries and keys (nomic-bert).
    Rotary { inv_freq: Vec<f32> },
}

struct EncoderLayer<B: Backend> {
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    o: Linear<B>,
    attn_norm: Norm<B>,
    mlp: Mlp<B>,
    out_norm: Norm<B>,
}

/// An encoder on backend `B`.
pub struct Encoder<B: Backend> {
    positions: Positions<B>,
    token_types: B::Matrix,
    embed_norm: Norm<B>,
    layers: Vec<EncoderLayer<B>>,
    rank: Option<RankHead>,
}

/// The name of the word-embedding table in `src`.
pub fn word_embeddings(src: &dyn TensorSource) -> String {
    format!("{}embeddings.word_embeddings.weight", load::prefix(src))
}

impl<B: Backend> Encoder<B> {
    /// Loads the encoder's tensors (the word embeddings are the model's own table).
    pub fn load(b: &B, src: &dyn TensorSource, cfg: &ModelConfig) -> Result<Self, ModelError> {
        let p = load::prefix(src);
        let h = cfg.hidden_size;
        if cfg.num_heads * cfg.head_dim != h || cfg.num_kv_heads != cfg.num_heads {
            return Err(ModelError::Config {
                path: src.path().into(),
                field: "num_attention_heads".into(),
                reason: format!(
                    "{} heads of {} do not make the hidden size {h} (an encoder's heads split it)",
                    cfg.num_heads, cfg.head_dim
                ),
            });
        }
        let loader = Loader { b, src, h };
        let tt_name = format!("{p}embeddings.token_type_embeddings.weight");
        let token_types = loader.table(&tt_name, rank::table_rows(src, &tt_name, h))?;
        let (positions, layers, embed_norm) = if cfg.arch == Architecture::NomicBert {
            let inv_freq = cfg.rope_global.inv_freq(cfg.head_dim);
            let layers = loader.nomic_layers(&p, cfg)?;
            (Positions::Rotary { inv_freq }, layers, format!("{p}emb_ln"))
        } else {
            let (positions, layers) = loader.bert(&p, cfg)?;
            (positions, layers, format!("{p}embeddings.LayerNorm"))
        };
        Ok(Self {
            positions,
            token_types,
            embed_norm: loader.norm(&embed_norm)?,
            layers,
            rank: rank::rank_head(src, &p, h)?,
        })
    }

    /// One pooled state per span of `batch` (row-major `[spans, hidden]`), each span a whole
    /// input from position 0; its keys and values go through `kv` as a decoder's do.
    #[allow(clippy::too_many_arguments)]
    pub fn pooled(
        &self,
        b: &B,
        kv: &mut B::Kv,
        words: &B::Matrix,
        cfg: &ModelConfig,
        tokens: &[u32],
        types: Option<&[u32]>,
        batch: &BatchLayout,
        pooling: Pooling,
    ) -> Result<Vec<f32>, ModelError> {
        let zeros;
        let types = match types {
            Some(t) if t.len() == tokens.len() => t,
            Some(t) => {
                return Err(ModelError::Forward(format!(
                    "{} token types for {} tokens",
                    t.len(),
                    tokens.len()
                )));
            }
            None => {
                zeros = vec![0u32; tokens.len()];
                &zeros
            }
        };
        let positions = batch.positions();
        if positions.iter().any(|&p| p >= cfg.max_position_embeddings) {
            return Err(ModelError::Forward(format!(
                "an input is longer than the {} positions this encoder has",
                cfg.max_position_embeddings
            )));
        }
        let mut x = b.embed(words, tokens, None)?;
        let rope = match &self.positions {
            Positions::Learned { table, offset } => {
                let rows: Vec<u32> = positions.iter().map(|&p| (p + offset) as u32).collect();
                b.add_assign(&mut x, &b.embed(table, &rows, None)?);
                None
            }
            Positions::Rotary { inv_freq } => Some(RopeAngles::new(&positions, inv_freq)),
        };
        b.add_assign(&mut x, &b.embed(&self.token_types, types, None)?);
        let eps = cfg.rms_norm_eps;
        let mut x = b.layer_norm(&x, &self.embed_norm.w, &self.embed_norm.b, eps)?;
        let params = AttentionParams {
            n_heads: cfg.num_heads,
            n_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            scale: cfg.attention_scale,
            window: None,
            causal: false,
        };
        for (n, layer) in self.layers.iter().enumerate() {
            x = self.layer(b, kv, layer, n, &x, batch, &params, rope.as_ref(), eps)?;
        }
        let h = cfg.hidden_size;
        Ok(match pooling {
            Pooling::Cls | Pooling::Last => {
                let mut start = 0;
                let rows: Vec<usize> = batch
                    .spans
                    .iter()
                    .map(|s| {
                        let row = if pooling == Pooling::Cls {
                            start
                        } else {
                            start + s.n_tokens - 1
                        };
                        start += s.n_tokens;
                        row
                    })
                    .collect();
                b.to_host(&b.gather_rows(&x, &rows))
            }
            Pooling::Mean => super::model::mean_rows(&b.to_host(&x), batch, h),
            Pooling::Rank => {
                let head = self.rank.as_ref().ok_or_else(|| {
                    ModelError::Forward(
                        "rank pooling needs a cross-encoder (a pooler and a one-label classifier)"
                            .into(),
                    )
                })?;
                let rows = super::model::span_rows(batch, |start, _| start);
                let first = b.to_host(&b.gather_rows(&x, &rows));
                first.chunks_exact(h).map(|r| head.score(r)).collect()
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        b: &B,
        kv: &mut B::Kv,
        l: &EncoderLayer<B>,
        index: usize,
        x: &B::Act,
        batch: &BatchLayout,
        params: &AttentionParams,
        rope: Option<&RopeAngles>,
        eps: f32,
    ) -> Result<B::Act, ModelError> {
        let linear = |x: &B::Act, lin: &Linear<B>| -> Result<B::Act, ModelError> {
            let mut y = b.matmul(x, &lin.w)?;
            if let Some(bias) = &lin.b {
                b.add_bias(&mut y, bias);
            }
            Ok(y)
        };
        let (mut q, mut k, v) = (linear(x, &l.q)?, linear(x, &l.k)?, linear(x, &l.v)?);
        if let Some(angles) = rope {
            b.rope(&mut q, params.head_dim, angles);
            b.rope(&mut k, params.head_dim, angles);
        }
        let attn = b.attention(kv, index, &q, &k, &v, batch, params)?;
        let mut o = linear(&attn, &l.o)?;
        b.add_assign(&mut o, x);
        let x = b.layer_norm(&o, &l.attn_norm.w, &l.attn_norm.b, eps)?;
        let mut out = match &l.mlp {
            Mlp::Gelu { up, down } => linear(&b.gelu(&linear(&x, up)?)?, down)?,
            Mlp::SwiGlu { gate, up, down } => {
                let hidden = b.glu(&linear(&x, gate)?, &linear(&x, up)?, Activation::Silu);
                linear(&hidden, down)?
            }
        };
        b.add_assign(&mut out, &x);
        b.layer_norm(&out, &l.out_norm.w, &l.out_norm.b, eps)
    }
}
