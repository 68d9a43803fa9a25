//! The encoders' tensor layouts, by Hugging Face name: BERT's and RoBERTa's (`embeddings.…`,
//! `encoder.layer.N.…`, bare or under `bert.`/`roberta.`), and nomic-bert's as nomic's hub
//! checkpoints name them (`emb_ln`, `encoder.layers.N.attn.Wqkv`, `mlp.fc11`/`fc12`/`fc2`,
//! `norm1`/`norm2`). GGUF files reach these names through the GGUF source's tables.

use super::{EncoderLayer, Linear, Mlp, Norm, Positions};
use crate::ModelError;
use crate::backend::{Backend, MatrixRole};
use crate::config::ModelConfig;
use crate::weights::{TensorSource, require};

/// The prefix of a checkpoint's tensor names: bare (`BertModel`), `bert.` or `roberta.`
/// (`…ForSequenceClassification`).
pub(super) fn prefix(src: &dyn TensorSource) -> String {
    const WORDS: &str = "embeddings.word_embeddings.weight";
    src.tensor_shapes()
        .iter()
        .filter_map(|(n, _)| n.strip_suffix(WORDS))
        .min_by_key(|p| p.len())
        .unwrap_or("bert.")
        .to_string()
}

/// Reads an encoder's tensors from one source for one backend.
pub(super) struct Loader<'a, B: Backend> {
    pub(super) b: &'a B,
    pub(super) src: &'a dyn TensorSource,
    pub(super) h: usize,
}

impl<B: Backend> Loader<'_, B> {
    fn vector(&self, name: &str, len: usize) -> Result<B::Vector, ModelError> {
        self.b.vector(name, require(self.src, name, 1, len)?)
    }

    /// A LayerNorm's `weight` and `bias` under `name`.
    pub(super) fn norm(&self, name: &str) -> Result<Norm<B>, ModelError> {
        Ok(Norm {
            w: self.vector(&format!("{name}.weight"), self.h)?,
            b: self.vector(&format!("{name}.bias"), self.h)?,
        })
    }

    /// Projection `name` (`rows × cols`), with its bias when `bias`.
    fn linear(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        bias: bool,
    ) -> Result<Linear<B>, ModelError> {
        let w_name = format!("{name}.weight");
        let w = require(self.src, &w_name, rows, cols)?;
        Ok(Linear {
            w: self.b.matrix(&w_name, MatrixRole::Projection, w)?,
            b: match bias {
                true => Some(self.vector(&format!("{name}.bias"), rows)?),
                false => None,
            },
        })
    }

    /// Embedding table `name` of `rows × h`.
    pub(super) fn table(&self, name: &str, rows: usize) -> Result<B::Matrix, ModelError> {
        let t = require(self.src, name, rows, self.h)?;
        self.b.matrix(name, MatrixRole::Lookup, t)
    }

    /// BERT's or RoBERTa's positions and layers.
    pub(super) fn bert(
        &self,
        p: &str,
        cfg: &ModelConfig,
    ) -> Result<(Positions<B>, Vec<EncoderLayer<B>>), ModelError> {
        let (h, i) = (self.h, cfg.intermediate_size);
        let offset = cfg.position_offset;
        let table = self.table(
            &format!("{p}embeddings.position_embeddings.weight"),
            cfg.max_position_embeddings + offset,
        )?;
        let layers = (0..cfg.num_layers)
            .map(|n| {
                let l = format!("{p}encoder.layer.{n}");
                let linear =
                    |m: &str, rows, cols| self.linear(&format!("{l}.{m}"), rows, cols, true);
                Ok(EncoderLayer {
                    q: linear("attention.self.query", h, h)?,
                    k: linear("attention.self.key", h, h)?,
                    v: linear("attention.self.value", h, h)?,
                    o: linear("attention.output.dense", h, h)?,
                    attn_norm: self.norm(&format!("{l}.attention.output.LayerNorm"))?,
                    mlp: Mlp::Gelu {
                        up: linear("intermediate.dense", i, h)?,
                        down: linear("output.dense", h, i)?,
                    },
                    out_norm: self.norm(&format!("{l}.output.LayerNorm"))?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok((Positions::Learned { table, offset }, layers))
    }

    /// nomic-bert's layers: a fused Q/K/V projection, SwiGLU, no biases.
    pub(super) fn nomic_layers(
        &self,
        p: &str,
        cfg: &ModelConfig,
    ) -> Result<Vec<EncoderLayer<B>>, ModelError> {
        let (h, i) = (self.h, cfg.intermediate_size);
        (0..cfg.num_layers)
            .map(|n| {
                let l = format!("{p}encoder.layers.{n}");
                let linear =
                    |m: &str, rows, cols| self.linear(&format!("{l}.{m}"), rows, cols, false);
                let [q, k, v] = self.fused_qkv(&format!("{l}.attn.Wqkv.weight"))?;
                Ok(EncoderLayer {
                    q,
                    k,
                    v,
                    o: linear("attn.out_proj", h, h)?,
                    attn_norm: self.norm(&format!("{l}.norm1"))?,
                    mlp: Mlp::SwiGlu {
                        up: linear("mlp.fc11", i, h)?,
                        gate: linear("mlp.fc12", i, h)?,
                        down: linear("mlp.fc2", h, i)?,
                    },
                    out_norm: self.norm(&format!("{l}.norm2"))?,
                })
            })
            .collect()
    }

    /// The query, key and value projections stacked by rows in tensor `name` (`3h × h`).
    fn fused_qkv(&self, name: &str) -> Result<[Linear<B>; 3], ModelError> {
        let h = self.h;
        let mut parts = require(self.src, name, 3 * h, h)?
            .split_rows(&[h, h, h])?
            .into_iter();
        let mut take = |part: &str| -> Result<Linear<B>, ModelError> {
            let t = parts
                .next()
                .ok_or_else(|| ModelError::Forward(format!("{name}: no {part} rows")))?;
            let w = self
                .b
                .matrix(&format!("{name}[{part}]"), MatrixRole::Projection, t)?;
            Ok(Linear { w, b: None })
        };
        Ok([take("q")?, take("k")?, take("v")?])
    }
}
