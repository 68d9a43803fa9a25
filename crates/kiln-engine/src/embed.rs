//! Embeddings on the engine: many inputs in one forward, each in its own KV slot from position
//! 0, pooled as the model says (`kiln_model::embedding`). Truncating to fewer dimensions and
//! normalizing ([`normalize`]) are the caller's.

use kiln_model::backend::{Backend, BatchLayout, KvStore, SeqSpan};

use crate::{Engine, EngineError};

impl<B: Backend> Engine<B> {
    /// Whether the model is an embedding model (it then embeds and does not generate).
    pub fn is_embedding_model(&self) -> bool {
        self.model.embedding.is_some()
    }

    /// The pooled state of each of `inputs` (token ids) through the model's Dense modules,
    /// unnormalized, in order. Inputs run
    /// together, at most one per KV slot and `batch_tokens` tokens per forward (an input
    /// longer than that runs alone); each must fit the context.
    pub fn embed(&mut self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.embed_typed(inputs, None)
    }

    /// [`Engine::embed`] with each input's token types (an encoder's pair inputs: a reranker's
    /// query and document); a reranker gives one score per input.
    pub fn embed_typed(
        &mut self,
        inputs: &[Vec<u32>],
        types: Option<&[Vec<u32>]>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let Some(cfg) = self.model.embedding.clone() else {
            return Err(EngineError::Request(
                "this model is not an embedding model (it declares no pooling)".into(),
            ));
        };
        if self.has_work() {
            return Err(EngineError::Request(
                "the engine is generating; embeddings run on an idle engine".into(),
            ));
        }
        let ctx = self.options.context_len;
        if let Some((i, t)) = inputs
            .iter()
            .enumerate()
            .find(|(_, t)| t.is_empty() || t.len() > ctx)
        {
            return Err(EngineError::Request(format!(
                "input {i} has {} tokens; an input takes 1 to {ctx} (the context)",
                t.len()
            )));
        }
        if let Some(t) = types
            && (t.len() != inputs.len() || t.iter().zip(inputs).any(|(a, b)| a.len() != b.len()))
        {
            return Err(EngineError::Request(
                "every input needs one token type per token".into(),
            ));
        }
        let slots = self.kv.layout().n_slots.max(1);
        let budget = self.options.batch_tokens;
        let width = match cfg.pooling {
            kiln_model::embedding::Pooling::Rank => 1,
            _ => self.model.config.hidden_size,
        };
        let project =
            |pooled: &[f32]| kiln_model::embedding::apply_all(&cfg.dense, pooled.to_vec());
        let mut out = Vec::with_capacity(inputs.len());
        let mut next = 0;
        while next < inputs.len() {
            let mut spans = Vec::new();
            let mut tokens = Vec::new();
            let mut token_types = Vec::new();
            while next < inputs.len()
                && spans.len() < slots
                && (spans.is_empty() || tokens.len() + inputs[next].len() <= budget)
            {
                spans.push(SeqSpan {
                    slot: spans.len(),
                    start_pos: 0,
                    n_tokens: inputs[next].len(),
                });
                tokens.extend_from_slice(&inputs[next]);
                if let Some(t) = types {
                    token_types.extend_from_slice(&t[next]);
                }
                next += 1;
            }
            let layout = BatchLayout { spans };
            let typed = types.map(|_| token_types.as_slice());
            let pooled = self.model.model.pooled(
                &self.backend,
                &mut self.kv,
                &tokens,
                typed,
                &layout,
                cfg.pooling,
            )?;
            for s in &layout.spans {
                self.kv.set_seq_len(s.slot, 0);
            }
            out.extend(pooled.chunks_exact(width).map(project));
        }
        Ok(out)
    }
}

/// Normalizes `v` in place, as llama-server's `--embd-normalize` numbers it: `p` < 0 leaves it, 0 scales the largest magnitude to 32760 (the
/// int16 range), 1 divides by the sum of magnitudes, 2 by the Euclidean norm, a larger `p` by
/// the p-norm. A zero vector stays zero.
pub fn normalize(v: &mut [f32], p: i32) {
    let norm = match p {
        p if p < 0 => return,
        0 => v.iter().fold(0f64, |m, x| m.max(f64::from(x.abs()))) / 32760.0,
        1 => v.iter().map(|x| f64::from(x.abs())).sum(),
        2 => v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt(),
        p => v
            .iter()
            .map(|x| f64::from(x.abs()).powi(p))
            .sum::<f64>()
            .powf(1.0 / f64::from(p)),
    };
    if norm > 0.0 {
        v.iter_mut()
            .for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn each_norm() {
        let v = [3.0f32, -4.0];
        let norm = |p| {
            let mut x = v;
            normalize(&mut x, p);
            x
        };
        assert_eq!(norm(-1), v);
        assert_eq!(norm(2), [0.6, -0.8]);
        assert_eq!(norm(1), [3.0 / 7.0, -4.0 / 7.0]);
        assert_eq!(norm(0), [24570.0, -32760.0]);
        let p3 = norm(3);
        assert!((p3[0].abs().powi(3) + p3[1].abs().powi(3) - 1.0).abs() < 1e-5);
        let mut zero = [0.0f32; 3];
        normalize(&mut zero, 2);
        assert_eq!(zero, [0.0; 3]);
    }
}
