//! BERT encoders (bge, e5, all-MiniLM) for embeddings: word, position and token-type
//! embeddings under a LayerNorm, then per layer bidirectional attention and a GELU MLP, each
//! added back and LayerNormed (post-norm). Hugging Face names (`embeddings.…`, `encoder.layer.N.…`,
//! with or without a `bert.` prefix).

use crate::ModelError;
use crate::backend::{AttentionParams, Backend, BatchLayout, MatrixRole};
use crate::config::ModelConfig;
use crate::embedding::Pooling;
use crate::weights::{TensorSource, require};

/// A LayerNorm's weight and bias.
struct Norm<B: Backend> {
    w: B::Vector,
    b: B::Vector,
}

/// A projection with its bias.
struct Linear<B: Backend> {
    w: B::Matrix,
    b: B::Vector,
}

struct EncoderLayer<B: Backend> {
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    o: Linear<B>,
    attn_norm: Norm<B>,
    up: Linear<B>,
    down: Linear<B>,
    out_norm: Norm<B>,
}

/// A cross-encoder's head, on the host (it scores one row per pair): BERT's pooler
/// (`tanh(W·x + b)` of the first token) when the file has one, and a one-label classifier.
/// llama.cpp's converter leaves a `BertForSequenceClassification`'s pooler out of its GGUF; such
/// a file is scored as llama.cpp scores it, by the classifier on the first token's state.
struct RankHead {
    pooler: Option<(Vec<f32>, Vec<f32>)>,
    class_w: Vec<f32>,
    class_b: f32,
}

impl RankHead {
    fn score(&self, x: &[f32]) -> f32 {
        let h = x.len();
        let dot = |row: &[f32], v: &[f64]| -> f64 {
            row.iter().zip(v).map(|(w, v)| f64::from(*w) * v).sum()
        };
        let x: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let features = match &self.pooler {
            Some((w, b)) => (w.chunks_exact(h).zip(b))
                .map(|(row, b)| (dot(row, &x) + f64::from(*b)).tanh())
                .collect(),
            None => x,
        };
        (dot(&self.class_w, &features) + f64::from(self.class_b)) as f32
    }
}

/// A BERT encoder on backend `B`.
pub struct Encoder<B: Backend> {
    positions: B::Matrix,
    token_types: B::Matrix,
    embed_norm: Norm<B>,
    layers: Vec<EncoderLayer<B>>,
    rank: Option<RankHead>,
}

/// The tensor names of a checkpoint: bare (`BertModel`) or under `bert.` (`BertFor…`).
fn prefix(src: &dyn TensorSource) -> &'static str {
    let bare = src
        .tensor_shapes()
        .iter()
        .any(|(n, _)| n == "embeddings.word_embeddings.weight");
    if bare { "" } else { "bert." }
}

/// The name of the word-embedding table in `src`.
pub fn word_embeddings(src: &dyn TensorSource) -> String {
    format!("{}embeddings.word_embeddings.weight", prefix(src))
}

impl<B: Backend> Encoder<B> {
    /// Loads the encoder's tensors (the word embeddings are the model's own table).
    pub fn load(b: &B, src: &dyn TensorSource, cfg: &ModelConfig) -> Result<Self, ModelError> {
        let p = prefix(src);
        let h = cfg.hidden_size;
        if cfg.num_heads * cfg.head_dim != h || cfg.num_kv_heads != cfg.num_heads {
            return Err(ModelError::Config {
                path: src.path().into(),
                field: "num_attention_heads".into(),
                reason: format!(
                    "{} heads of {} do not make the hidden size {h} (a BERT encoder's heads split it)",
                    cfg.num_heads, cfg.head_dim
                ),
            });
        }
        let vector = |name: String, len: usize| b.vector(&name, require(src, &name, 1, len)?);
        let norm = |name: String| -> Result<Norm<B>, ModelError> {
            Ok(Norm {
                w: vector(format!("{name}.weight"), h)?,
                b: vector(format!("{name}.bias"), h)?,
            })
        };
        let linear = |name: String, rows: usize, cols: usize| -> Result<Linear<B>, ModelError> {
            let w_name = format!("{name}.weight");
            let w = require(src, &w_name, rows, cols)?;
            Ok(Linear {
                w: b.matrix(&w_name, MatrixRole::Projection, w)?,
                b: vector(format!("{name}.bias"), rows)?,
            })
        };
        let pos_name = format!("{p}embeddings.position_embeddings.weight");
        let positions = b.matrix(
            &pos_name,
            MatrixRole::Embedding,
            require(src, &pos_name, cfg.max_position_embeddings, h)?,
        )?;
        let tt_name = format!("{p}embeddings.token_type_embeddings.weight");
        let types = table_rows(src, &tt_name, h);
        let token_types = b.matrix(
            &tt_name,
            MatrixRole::Embedding,
            require(src, &tt_name, types, h)?,
        )?;
        let rank = rank_head(src, p, h)?;
        let embed_norm = norm(format!("{p}embeddings.LayerNorm"))?;
        let i = cfg.intermediate_size;
        let layers = (0..cfg.num_layers)
            .map(|n| {
                let l = format!("{p}encoder.layer.{n}");
                Ok(EncoderLayer {
                    q: linear(format!("{l}.attention.self.query"), h, h)?,
                    k: linear(format!("{l}.attention.self.key"), h, h)?,
                    v: linear(format!("{l}.attention.self.value"), h, h)?,
                    o: linear(format!("{l}.attention.output.dense"), h, h)?,
                    attn_norm: norm(format!("{l}.attention.output.LayerNorm"))?,
                    up: linear(format!("{l}.intermediate.dense"), i, h)?,
                    down: linear(format!("{l}.output.dense"), h, i)?,
                    out_norm: norm(format!("{l}.output.LayerNorm"))?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self {
            positions,
            token_types,
            embed_norm,
            layers,
            rank,
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
        let positions: Vec<u32> = batch.positions().iter().map(|&p| p as u32).collect();
        if positions
            .iter()
            .any(|&p| p as usize >= cfg.max_position_embeddings)
        {
            return Err(ModelError::Forward(format!(
                "an input is longer than the {} positions this encoder has",
                cfg.max_position_embeddings
            )));
        }
        let mut x = b.embed(words, tokens, None)?;
        b.add_assign(&mut x, &b.embed(&self.positions, &positions, None)?);
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
            x = self.layer(b, kv, layer, n, &x, batch, &params, eps)?;
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
        eps: f32,
    ) -> Result<B::Act, ModelError> {
        let linear = |x: &B::Act, lin: &Linear<B>| -> Result<B::Act, ModelError> {
            let mut y = b.matmul(x, &lin.w)?;
            b.add_bias(&mut y, &lin.b);
            Ok(y)
        };
        let (q, k, v) = (linear(x, &l.q)?, linear(x, &l.k)?, linear(x, &l.v)?);
        let attn = b.attention(kv, index, &q, &k, &v, batch, params)?;
        let mut o = linear(&attn, &l.o)?;
        b.add_assign(&mut o, x);
        let x = b.layer_norm(&o, &l.attn_norm.w, &l.attn_norm.b, eps)?;
        let hidden = b.gelu(&linear(&x, &l.up)?)?;
        let mut out = linear(&hidden, &l.down)?;
        b.add_assign(&mut out, &x);
        b.layer_norm(&out, &l.out_norm.w, &l.out_norm.b, eps)
    }
}

/// Rows of table `name` whose rows are `h` wide (1 when it cannot be read: `require` names it).
fn table_rows(src: &dyn TensorSource, name: &str, h: usize) -> usize {
    src.tensor_shapes()
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, s)| match s.as_slice() {
            [r, c] if *c == h => Some(*r),
            [c, r] if *c == h => Some(*r),
            _ => None,
        })
        .unwrap_or(1)
        .max(1)
}

/// A cross-encoder's pooler and classifier, when `src` has them (`BertForSequenceClassification`).
fn rank_head(src: &dyn TensorSource, p: &str, h: usize) -> Result<Option<RankHead>, ModelError> {
    let f32s = |name: &str, rows: usize, cols: usize| -> Result<Vec<f32>, ModelError> {
        require(src, name, rows, cols)?.to_f32()
    };
    let shapes = src.tensor_shapes();
    let has = |name: &str| shapes.iter().any(|(n, _)| n == name);
    if !has("classifier.weight") {
        return Ok(None);
    }
    let labels = table_rows(src, "classifier.weight", h);
    if labels != 1 {
        return Err(ModelError::Tensor {
            path: src.path().into(),
            name: "classifier.weight".into(),
            reason: format!("{labels} labels; a reranker scores with one"),
        });
    }
    let pool_w = format!("{p}pooler.dense.weight");
    let pooler = if has(&pool_w) {
        Some((
            f32s(&pool_w, h, h)?,
            f32s(&format!("{p}pooler.dense.bias"), 1, h)?,
        ))
    } else {
        None
    };
    Ok(Some(RankHead {
        pooler,
        class_w: f32s("classifier.weight", 1, h)?,
        class_b: f32s("classifier.bias", 1, 1)?[0],
    }))
}
